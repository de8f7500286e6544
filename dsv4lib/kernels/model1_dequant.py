"""MODEL1 pages → bf16 key rows: the slots of a list of pages of an FP8 cache dequantized once into a ``[n ·
page_size, 512]`` bf16 table, a block of rows a page (the staged prefill's first pass,
:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged`; the byte layout is :mod:`dsv4lib.reference.model1`'s,
whose ``dequantize_records`` this kernel matches bit for bit).

A CTA a page (of a page list — a prefill reads a few pages of a large cache; a number outside the cache, a page not
needed, costs a CTA that reads one int — or of the cache, dequantized when the scan of the lists marked it), its warps taking the page's slots four at a time (every slot's loads issued before
the first store: one slot a warp left ~37 KB of loads in flight an SM, short of what covers the memory's latency).
The lane map splits the row in halves so that each warp store writes 512 contiguous bytes — four whole 128-byte lines:
lane ``l`` owns dims ``8 l … 8 l + 7`` and ``256 + 8 l … 256 + 8 l + 7``:

* the first half, every lane: 8 e4m3 nope bytes at ``part + 8 l`` (an 8-byte load), the scale byte of tile ``l // 8``;
* the second half, lanes 0-23: the nope bytes ``256 + 8 l`` (tile ``4 + l // 8``); lanes 24-31: 16 rope bytes
  (bf16, copied as they are);
* each pair of e4m3 bytes → ``cvt.rn.f16x2.e4m3x2``, two fp32 multiplies by ``2^(b - 127)``, ``cvt.rn.bf16x2.f32``
  (exact: an e4m3 value times a power of two has 4 significant bits; a scale byte 0 — a slot never written — gives
  zeros).

The map by halves and four slots a warp won on the H200 (session 48: ~118 µs for D6's two caches against ~155 for
two slots with a lane owning 32 contiguous bytes, whose 16-byte warp stores each half-filled 32 sectors;
docs/tuning/d2_d6.md).  Memory-bound (584 bytes read, 1024 written a slot); the conversion's instruction count does not matter here, so the
plain fp32 path is used for every scale (no placed-bits range limit).  Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint32, const_expr

from .common import gmem_view, launch_stream
from .sm90.model1_decode import e4m3x2_to_bf16x2, ue8m0_scale

WARPS = 4
HEAD_DIM = 512
NOPE_DIMS = 448
PART_BYTES = 576                    # a key's [nope e4m3 | rope bf16] part
SCALE_GROUP_BYTES = 8               # its 7 scale bytes + 1 pad
ROW_BYTES = 2 * HEAD_DIM            # a bf16 table row
HALF_DIMS = HEAD_DIM // 2           # 256: the second half of a row
HIGH_NOPE_LANES = (NOPE_DIMS - HALF_DIMS) // 8      # 24 lanes' 8 nope dims past 256; the other 8 lanes: rope
SLOTS_IN_FLIGHT = 4                 # a warp's slots loaded before it stores any (the default build's)


PAGE_SOURCES = ("list", "list+map", "marks")


class Model1DequantKernel:
    """The cache ``[num_pages, page_bytes]`` uint8 (``page_size`` slots a page) → bf16 rows of ``out [rows, 512]``, a
    block of ``page_size`` rows a page from row ``row0`` on (module docstring).  Which pages, by ``page_source``:

    * ``"list"``: ``mPages [n]`` int32, a page list: block ``b`` gets page ``list[b]``; a number outside ``[0,
      num_pages)`` leaves its block as it was;
    * ``"list+map"``: the same, and CTA ``b`` writes ``b`` into ``mPageMap[list[b]]`` (int32 ``[num_pages]``, never
      filled: the list join takes an entry ``m`` of it only where ``list[m]`` is that page — a page given twice
      keeps either block, both hold it);
    * ``"marks"``: ``mPages [words]`` int32, the page bits of :class:`~dsv4lib.kernels.page_scan.PageScanKernel`: a
      CTA a page of the cache, page ``p`` dequantized into block ``p`` (rows at their key addresses) when its bit is
      set, and the bit cleared (the words are zero again after the call).

    ``slots_in_flight``: the slots a warp loads before it converts and stores the first of them."""

    def __init__(self, slots_in_flight: int = SLOTS_IN_FLIGHT, page_source: str = "list"):
        if page_source not in PAGE_SOURCES:
            raise ValueError(f"page_source must be one of {PAGE_SOURCES}, got {page_source!r}")
        self.slots_in_flight = slots_in_flight
        self.page_source = page_source

    @cute.jit
    def __call__(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPages: cute.Tensor,
                 mPageMap: cute.Tensor, row0: Int32, stream: cuda.CUstream = None):
        self.kernel(mCache, page_size, mOut, mPages, mPageMap, row0).launch(
            grid=(self.blocks(self.page_source, mCache, mPages), 1, 1), block=(32 * WARPS, 1, 1),
            **launch_stream(stream))

    @staticmethod
    def blocks(page_source: str, mCache: cute.Tensor, mPages: cute.Tensor):
        """The CTAs of one cache's dequantization: a page of the cache (``marks``) or an entry of the page list."""
        return cute.size(mCache, mode=[0]) if page_source == "marks" else cute.size(mPages, mode=[0])

    @cute.kernel
    def kernel(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPages: cute.Tensor,
               mPageMap: cute.Tensor, row0: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        self.dequant_block(self.page_source, mCache, page_size, mOut, mPages, mPageMap, row0, block, tidx)

    @cute.jit
    def dequant_block(self, page_source: cutlass.Constexpr, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor,
                      mPages: cute.Tensor, mPageMap: cute.Tensor, row0: Int32, block: Int32, tidx: Int32):
        """CTA ``block`` of one cache's dequantization (the class docstring's ``page_source``)."""
        lane = tidx % 32
        page = Int32(-1)
        if const_expr(page_source == "marks"):
            # every thread reads the page's bit (only this CTA changes it: the scan ended before this kernel), then
            # thread 0 clears it once all have read
            bit = Int32(1) << (block % 32)
            if (mPages[block // 32] & bit) != 0:
                page = block
            cute.arch.sync_threads()
            if tidx == 0 and page >= 0:
                cute.arch.atomic_and(mPages.iterator + block // 32, Int32(-1) ^ bit, sem="relaxed", scope="gpu")
        else:
            page = mPages[block]
        if page >= 0 and page < cute.size(mCache, mode=[0]):
            if const_expr(page_source == "list+map"):
                if tidx == 0:
                    mPageMap[page] = block
            page_base = mCache.iterator.toint() + Int64(page) * Int64(cute.size(mCache, mode=[1]))
            self.dequant_by_halves(page_size, mOut, page_base, row0 + block * page_size, tidx // 32, lane)

    @cute.jit
    def dequant_by_halves(self, page_size: Int32, mOut, page_base, first_row, warp, lane):
        """Lane ``l`` owns dims ``8 l … 8 l + 7`` (row bytes ``16 l …``) and ``256 + 8 l …`` (row bytes ``512 + 16 l
        …``), so each warp store writes 512 contiguous bytes — four whole 128-byte lines, no sector written twice.
        First half: 8 nope bytes a lane (an 8-byte load; tile ``l // 8``); second half: lanes 0-23 the nope bytes
        ``256 + 8 l`` (tile ``4 + l // 8``), lanes 24-31 16 rope bytes (bf16, copied)."""
        slots = self.slots_in_flight
        for first in cutlass.range(warp, page_size, slots * WARPS, unroll=1):
            rLow = [cute.make_rmem_tensor((2,), Uint32) for _ in range(slots)]     # 8 e4m3 bytes: dims 8 l …
            rHigh = [cute.make_rmem_tensor((2,), Uint32) for _ in range(slots)]    # 8 e4m3 bytes: dims 256 + 8 l …
            rRope = [cute.make_rmem_tensor((4,), Uint32) for _ in range(slots)]    # or 8 rope bf16: dims 448 + …
            rScale = cute.make_rmem_tensor((2 * slots,), Uint32)                   # the two halves' tile scales
            for s in cutlass.range_constexpr(slots):
                slot = first + s * WARPS
                rScale[2 * s] = Uint32(0)
                rScale[2 * s + 1] = Uint32(0)
                if slot < page_size:
                    load_slot_by_halves(page_base, page_size, slot, lane, rLow[s], rHigh[s], rRope[s], rScale, 2 * s)
            for s in cutlass.range_constexpr(slots):
                slot = first + s * WARPS
                if slot < page_size:
                    row = mOut.iterator.toint() + (Int64(first_row) + Int64(slot)) * Int64(ROW_BYTES)
                    store_row_by_halves(row, lane, rLow[s], rHigh[s], rRope[s], rScale, 2 * s)


@cute.jit
def load_slot_by_halves(page_base: Int64, page_size: Int32, slot, lane, rLow: cute.Tensor, rHigh: cute.Tensor,
                        rRope: cute.Tensor, rScale: cute.Tensor, at: cutlass.Constexpr):
    """Lane ``lane``'s bytes of slot ``slot`` of the page at ``page_base`` by the halves' lane map
    (:meth:`Model1DequantKernel.dequant_by_halves`): 8 nope bytes into ``rLow``, then 8 nope bytes into ``rHigh``
    (lanes 0-23) or 16 rope bytes into ``rRope`` (lanes 24-31); the two halves' scale bytes into ``rScale[at]`` /
    ``rScale[at + 1]``."""
    part = page_base + Int64(slot * PART_BYTES)
    scales = page_base + Int64(page_size * PART_BYTES + slot * SCALE_GROUP_BYTES)
    cute.autovec_copy(gmem_view(Uint32, part + Int64(lane * 8), 2, 8), rLow)
    rScale[at] = Uint32(gmem_view(Uint8, scales + Int64(lane // 8), 1, 1)[0])
    if lane < HIGH_NOPE_LANES:
        cute.autovec_copy(gmem_view(Uint32, part + Int64(HALF_DIMS + lane * 8), 2, 8), rHigh)
        rScale[at + 1] = Uint32(gmem_view(Uint8, scales + Int64(4 + lane // 8), 1, 1)[0])
    else:
        cute.autovec_copy(gmem_view(Uint32, part + Int64(NOPE_DIMS + (lane - HIGH_NOPE_LANES) * 16), 4, 16), rRope)


@cute.jit
def store_row_by_halves(row: Int64, lane, rLow: cute.Tensor, rHigh: cute.Tensor, rRope: cute.Tensor,
                        rScale: cute.Tensor, at: cutlass.Constexpr):
    """What :func:`load_slot_by_halves` loaded, converted, into the bf16 row at address ``row``: each warp store
    512 contiguous bytes."""
    store_nope8(rLow, rScale[at], row + Int64(lane * 16))
    if lane < HIGH_NOPE_LANES:
        store_nope8(rHigh, rScale[at + 1], row + Int64(ROW_BYTES // 2 + lane * 16))
    else:
        cute.autovec_copy(rRope, gmem_view(Uint32, row + Int64(ROW_BYTES // 2 + lane * 16), 4, 16))


@cute.jit
def store_nope8(rW: cute.Tensor, scale_byte: Uint32, address: Int64):
    """8 e4m3 bytes × 2^(scale - 127) → 8 bf16 (first element low), stored as 16 bytes."""
    scale = ue8m0_scale(scale_byte)
    rB = cute.make_rmem_tensor((4,), Uint32)
    for w in cutlass.range_constexpr(2):
        rB[2 * w] = e4m3x2_to_bf16x2(rW[w], scale, False)
        rB[2 * w + 1] = e4m3x2_to_bf16x2(rW[w], scale, True)
    cute.autovec_copy(rB, gmem_view(Uint32, address, 4, 16))


class Model1DequantPairKernel(Model1DequantKernel):
    """Both caches of a staged prefill dequantized by ONE launch (issue #28: a launch costs ~4.8 µs of host time on
    the H200, docs/tuning/host.md session 57): the first cache's CTAs, then the second's, each running
    :meth:`Model1DequantKernel.dequant_block` with its own cache's arguments and ``page_source`` (``page_sources``: the
    two).  The arguments are the two single builds' one after the other (a tensor both read, the table, passed
    twice), then the stream; each CTA's device code is the single build's."""

    def __init__(self, slots_in_flight: int = SLOTS_IN_FLIGHT, page_sources: tuple = ("list", "list")):
        if len(page_sources) != 2:
            raise ValueError(f"a pair takes two page sources, got {page_sources!r}")
        for source in page_sources[1:]:                         # the parent checks the first
            if source not in PAGE_SOURCES:
                raise ValueError(f"page_source must be one of {PAGE_SOURCES}, got {source!r}")
        super().__init__(slots_in_flight, page_sources[0])
        self.page_sources = tuple(page_sources)

    @cute.jit
    def __call__(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPages: cute.Tensor,
                 mPageMap: cute.Tensor, row0: Int32, mCache2: cute.Tensor, page_size2: Int32, mOut2: cute.Tensor,
                 mPages2: cute.Tensor, mPageMap2: cute.Tensor, row02: Int32, stream: cuda.CUstream = None):
        first_blocks = self.blocks(self.page_sources[0], mCache, mPages)
        blocks = first_blocks + self.blocks(self.page_sources[1], mCache2, mPages2)
        self.pair_kernel(mCache, page_size, mOut, mPages, mPageMap, row0, mCache2, page_size2, mOut2, mPages2,
                         mPageMap2, row02, first_blocks).launch(grid=(blocks, 1, 1), block=(32 * WARPS, 1, 1),
                                                                **launch_stream(stream))

    @cute.kernel
    def pair_kernel(self, mCache: cute.Tensor, page_size: Int32, mOut: cute.Tensor, mPages: cute.Tensor,
                    mPageMap: cute.Tensor, row0: Int32, mCache2: cute.Tensor, page_size2: Int32, mOut2: cute.Tensor,
                    mPages2: cute.Tensor, mPageMap2: cute.Tensor, row02: Int32, first_blocks: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        if block < first_blocks:                                # CTA-uniform: the marks' barrier stays legal
            self.dequant_block(self.page_sources[0], mCache, page_size, mOut, mPages, mPageMap, row0, block, tidx)
        else:
            self.dequant_block(self.page_sources[1], mCache2, page_size2, mOut2, mPages2, mPageMap2, row02,
                               block - first_blocks, tidx)
