"""MODEL1 pages → bf16 key rows: every slot of an FP8 cache dequantized once into a ``[num_pages · page_size, 512]``
bf16 table (the staged prefill's first pass, :func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged`; the byte
layout is :mod:`dsv4lib.reference.model1`'s, whose ``dequantize_records`` this kernel matches bit for bit).

A CTA a page whose byte in a page mask is set (a prefill's lists name a few pages of a large cache; the others cost
one byte read), its warps taking the page's slots in turn; the write kernel's lane map read backwards
(:mod:`dsv4lib.kernels.model1_cache`): lane ``l`` owns elements ``16 l … 16 l + 15`` of the row (32 contiguous bytes
of the bf16 table — a warp writes the row's 1 KiB as one coalesced sweep):

* lanes 0-27, the 448 "nope" dims: 16 e4m3 bytes at ``part + 16 l`` (one 16-byte load), the scale byte of tile
  ``l // 4``; each pair of bytes → ``cvt.rn.f16x2.e4m3x2``, two fp32 multiplies by ``2^(b - 127)``,
  ``cvt.rn.bf16x2.f32`` (exact: an e4m3 value times a power of two has 4 significant bits; a scale byte 0 — a slot
  never written — gives zeros);
* lanes 28-31 copy the 64 rope dims as they are (bf16, 32 bytes each).

Memory-bound (584 bytes read, 1024 written a slot); the conversion's instruction count does not matter here, so the
plain fp32 path is used for every scale (no placed-bits range limit).  Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint32

from .common import gmem_view, launch_stream
from .sm90.model1_decode import e4m3x2_to_bf16x2, ue8m0_scale

WARPS = 4
HEAD_DIM = 512
NOPE_DIMS = 448
NOPE_LANES = NOPE_DIMS // 16        # 28
PART_BYTES = 576                    # a key's [nope e4m3 | rope bf16] part
SCALE_GROUP_BYTES = 8               # its 7 scale bytes + 1 pad
ROW_BYTES = 2 * HEAD_DIM            # a bf16 table row


class Model1DequantKernel:
    """The cache ``[num_pages, page_bytes]`` uint8 (``page_size`` slots a page) and a page mask ``[num_pages]`` uint8 →
    ``out [num_pages · page_size, 512]`` bf16, row ``page · page_size + slot``, for the pages whose mask byte is
    non-zero; the other pages' rows are left as they were (module docstring)."""

    @cute.jit
    def __call__(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mMask: cute.Tensor,
                 stream: cuda.CUstream = None):
        self.kernel(mCache, page_size, mOut, mMask).launch(grid=(cute.size(mCache, mode=[0]), 1, 1),
                                                           block=(32 * WARPS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mMask: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        page, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        if mMask[page] != Uint8(0):
            page_base = mCache.iterator.toint() + Int64(page) * Int64(cute.size(mCache, mode=[1]))
            for slot in cutlass.range(tidx // 32, page_size, WARPS, unroll=1):
                part = page_base + Int64(slot * PART_BYTES)
                group = page_base + Int64(page_size * PART_BYTES + slot * SCALE_GROUP_BYTES)
                row = (mOut.iterator.toint() + (Int64(page) * Int64(page_size) + Int64(slot)) * Int64(ROW_BYTES)
                       + Int64(lane * 32))
                if lane < NOPE_LANES:
                    rW = cute.make_rmem_tensor((4,), Uint32)                    # 16 e4m3 bytes
                    cute.autovec_copy(gmem_view(Uint32, part + Int64(lane * 16), 4, 16), rW)
                    scale = ue8m0_scale(Uint32(gmem_view(Uint8, group + Int64(lane // 4), 1, 1)[0]))
                    rB = cute.make_rmem_tensor((8,), Uint32)                    # 16 bf16, first element low
                    for w in cutlass.range_constexpr(4):
                        rB[2 * w] = e4m3x2_to_bf16x2(rW[w], scale, False)
                        rB[2 * w + 1] = e4m3x2_to_bf16x2(rW[w], scale, True)
                    cute.autovec_copy(rB, gmem_view(Uint32, row, 8, 16))
                else:
                    rR = cute.make_rmem_tensor((8,), Uint32)                    # 16 rope bf16 as they are
                    cute.autovec_copy(gmem_view(Uint32, part + Int64(NOPE_DIMS + (lane - NOPE_LANES) * 32), 8, 16),
                                      rR)
                    cute.autovec_copy(rR, gmem_view(Uint32, row, 8, 16))


MARK_THREADS = 256
MARK_PER_THREAD = 16


class PageMarkKernel:
    """``pages [n]`` int32 (a page number per list entry; a dropped entry names the spare page ``num_pages``) →
    ``mask [num_pages + 1]`` uint8: a 1 at every page named.  Each thread reads the page's byte first and stores only
    where it reads 0.  Why not a plain scatter: a prefill's lists name a few thousand pages thousands of times each,
    and a store per entry piles onto the mask's few cache lines (H200, session 46: 526 / 789 µs at D6's two FP8
    shapes, against a dequantization pass of ~130); the loads hit L1 once a line holds the SM's own marks, so the
    stores left are about one per page and SM.  A stale 0 only costs a store (every store writes the same 1)."""

    @cute.jit
    def __call__(self, mPages: cute.Tensor, mMask: cute.Tensor, stream: cuda.CUstream = None):
        chunk = MARK_THREADS * MARK_PER_THREAD
        grid = (cute.size(mPages, mode=[0]) + chunk - 1) // chunk
        self.kernel(mPages, mMask).launch(grid=(grid, 1, 1), block=(MARK_THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mPages: cute.Tensor, mMask: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n = cute.size(mPages, mode=[0])
        spare = cute.size(mMask, mode=[0]) - 1          # the dropped entries' page: past the end, it marks the spare
        first = bidx * (MARK_THREADS * MARK_PER_THREAD) + tidx
        # all the loads first, then the stores: with a store between them the next entry's loads could not pass it
        # (the compiler cannot tell the mask from the list), one entry's two loads' latency after another's
        rPage = cute.make_rmem_tensor((MARK_PER_THREAD,), Int32)
        rSeen = cute.make_rmem_tensor((MARK_PER_THREAD,), Uint8)
        for k in cutlass.range_constexpr(MARK_PER_THREAD):          # coalesced: the block's threads side by side
            e = first + k * MARK_THREADS
            rPage[k] = spare
            if e < n:
                rPage[k] = mPages[e]
        for k in cutlass.range_constexpr(MARK_PER_THREAD):
            rSeen[k] = mMask[rPage[k]]
        for k in cutlass.range_constexpr(MARK_PER_THREAD):
            if rSeen[k] == Uint8(0):
                mMask[rPage[k]] = Uint8(1)
