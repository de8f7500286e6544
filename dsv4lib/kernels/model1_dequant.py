"""MODEL1 pages → bf16 key rows: the slots of a list of pages of an FP8 cache dequantized once into a ``[n ·
page_size, 512]`` bf16 table, a block of rows a page (the staged prefill's first pass,
:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged`; the byte layout is :mod:`dsv4lib.reference.model1`'s,
whose ``dequantize_records`` this kernel matches bit for bit).

A CTA a listed page (a prefill reads a few pages of a large cache; a number outside the cache — a page not needed —
costs a CTA that reads one int), its warps taking the page's slots two at a time; the write kernel's lane map read backwards
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
SLOTS_IN_FLIGHT = 2                 # a warp's slots loaded before it stores any


class Model1DequantKernel:
    """The cache ``[num_pages, page_bytes]`` uint8 (``page_size`` slots a page) and a page list ``[n]`` int32 →
    ``out [n · page_size, 512]`` bf16: the ``b``-th block of ``page_size`` rows gets page ``list[b]``'s slots; a
    number outside ``[0, num_pages)`` leaves its block as it was (module docstring)."""

    @cute.jit
    def __call__(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPageList: cute.Tensor,
                 stream: cuda.CUstream = None):
        self.kernel(mCache, page_size, mOut, mPageList).launch(grid=(cute.size(mPageList, mode=[0]), 1, 1),
                                                               block=(32 * WARPS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPageList: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        page = mPageList[block]
        if page >= 0 and page < cute.size(mCache, mode=[0]):
            page_base = mCache.iterator.toint() + Int64(page) * Int64(cute.size(mCache, mode=[1]))
            # two slots a warp at a time (slot and slot + WARPS), both slots' loads issued before either's stores:
            # a slot a warp left ~37 KB of loads in flight an SM, short of what covers the memory's latency
            for first in cutlass.range(tidx // 32, page_size, SLOTS_IN_FLIGHT * WARPS, unroll=1):
                rNope0 = cute.make_rmem_tensor((4,), Uint32)                # 16 e4m3 bytes of each slot
                rNope1 = cute.make_rmem_tensor((4,), Uint32)
                rRope0 = cute.make_rmem_tensor((8,), Uint32)                # or 16 rope bf16 of each
                rRope1 = cute.make_rmem_tensor((8,), Uint32)
                scale0 = Uint32(0)
                scale1 = Uint32(0)
                second = first + WARPS
                if lane < NOPE_LANES:
                    cute.autovec_copy(gmem_view(Uint32, self.nope_at(page_base, first, lane), 4, 16), rNope0)
                    scale0 = Uint32(gmem_view(Uint8, self.scale_at(page_base, page_size, first, lane), 1, 1)[0])
                    if second < page_size:
                        cute.autovec_copy(gmem_view(Uint32, self.nope_at(page_base, second, lane), 4, 16), rNope1)
                        scale1 = Uint32(gmem_view(Uint8, self.scale_at(page_base, page_size, second, lane), 1, 1)[0])
                    self.store_nope(rNope0, scale0, self.row_at(mOut, block, page_size, first, lane))
                    if second < page_size:
                        self.store_nope(rNope1, scale1, self.row_at(mOut, block, page_size, second, lane))
                else:
                    cute.autovec_copy(gmem_view(Uint32, self.rope_at(page_base, first, lane), 8, 16), rRope0)
                    if second < page_size:
                        cute.autovec_copy(gmem_view(Uint32, self.rope_at(page_base, second, lane), 8, 16), rRope1)
                    cute.autovec_copy(rRope0, gmem_view(Uint32, self.row_at(mOut, block, page_size, first, lane), 8, 16))
                    if second < page_size:
                        cute.autovec_copy(rRope1,
                                          gmem_view(Uint32, self.row_at(mOut, block, page_size, second, lane), 8, 16))

    # byte addresses of a slot's parts: its nope bytes (lane's 16), its tile's scale byte, its rope bytes (lane's 32
    # of the 128), and its bf16 row's lane's 32 bytes
    @staticmethod
    def nope_at(page_base, slot, lane):
        return page_base + Int64(slot * PART_BYTES + lane * 16)

    @staticmethod
    def scale_at(page_base, page_size, slot, lane):
        return page_base + Int64(page_size * PART_BYTES + slot * SCALE_GROUP_BYTES + lane // 4)

    @staticmethod
    def rope_at(page_base, slot, lane):
        return page_base + Int64(slot * PART_BYTES + NOPE_DIMS + (lane - NOPE_LANES) * 32)

    @staticmethod
    def row_at(mOut, block, page_size, slot, lane):
        return (mOut.iterator.toint() + (Int64(block) * Int64(page_size) + Int64(slot)) * Int64(ROW_BYTES)
                + Int64(lane * 32))

    @cute.jit
    def store_nope(self, rW: cute.Tensor, scale_byte: Uint32, row: Int64):
        """16 e4m3 bytes × 2^(scale - 127) → 16 bf16 (first element low), stored as 32 bytes."""
        scale = ue8m0_scale(scale_byte)
        rB = cute.make_rmem_tensor((8,), Uint32)
        for w in cutlass.range_constexpr(4):
            rB[2 * w] = e4m3x2_to_bf16x2(rW[w], scale, False)
            rB[2 * w + 1] = e4m3x2_to_bf16x2(rW[w], scale, True)
        cute.autovec_copy(rB, gmem_view(Uint32, row, 8, 16))

