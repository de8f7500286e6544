"""One index list of the staged prefill → its columns of the joined list, in one pass (the staged prefill's glue,
:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged`).

The staged prefill attends over one bf16 table holding both caches' dequantized rows, so each list entry becomes a
table row: kept when it is an address of its own cache (``0 <= i < n_keys``), before its token's valid length, and —
with a page map (the caller's pages packed into the table, a block of rows a page) — on a page given; then
``lo + m · page_size + i % page_size`` with ``m = map[i // page_size]`` (or ``lo + i`` without a map), else ``-1``.
The map is never filled: the dequantization writes ``map[p] = b`` for each block ``b`` it gives page ``p``, so an
entry ``m`` counts only where ``0 <= m < n`` and the page list's ``list[m]`` is ``p`` — whatever else the map holds
(an earlier call's blocks, or nothing ever written) fails that test.  In torch that is
~10 passes over the lists (where / floor-divide / gather / and / cat: 168 / 262 µs at D6's 4096-token prefills on the
H200, H64 / H128, session 47); here a CTA a token reads each entry once and writes its row once: 24 / 38 µs.

A CTA a token (the lists' rows), its threads striding over the token's entries (coalesced int32 loads and stores);
the page map is a few KB to a few hundred KB, read through L1 / L2.  Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .common import launch_stream

THREADS = 128


class ListJoinKernel:
    """``mIdx [Sq, K]`` int32 → ``mJoint[:, col0 : col0 + K]`` (``mJoint [Sq, K_total]`` int32): each entry's table row
    or ``-1`` (module docstring).  ``has_lengths``: ``mLen [Sq]`` int32 bounds each token's entries (else unread);
    ``has_page_map``: ``mPageMap [num_pages]`` int32 and ``mPageList [n]`` int32, a page's block in the table checked
    against the list (module docstring; else both unread: rows at their own addresses)."""

    def __init__(self, has_lengths: bool, has_page_map: bool, entries_in_flight: int = 1):
        self.has_lengths = has_lengths
        self.has_page_map = has_page_map
        self.entries_in_flight = entries_in_flight

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mPageMap: cute.Tensor, mPageList: cute.Tensor,
                 mJoint: cute.Tensor, n_keys: Int32, page_size: Int32, lo: Int32, col0: Int32,
                 stream: cuda.CUstream = None):
        self.kernel(mIdx, mLen, mPageMap, mPageList, mJoint, n_keys, page_size, lo, col0).launch(
            grid=(cute.size(mIdx, mode=[0]), 1, 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mPageMap: cute.Tensor, mPageList: cute.Tensor,
               mJoint: cute.Tensor, n_keys: Int32, page_size: Int32, lo: Int32, col0: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        self.join_token(self.has_lengths, self.has_page_map, mIdx, mLen, mPageMap, mPageList, mJoint, n_keys,
                        page_size, lo, col0, token, tidx)

    @cute.jit
    def join_token(self, has_lengths: cutlass.Constexpr, has_page_map: cutlass.Constexpr, mIdx: cute.Tensor,
                   mLen: cute.Tensor, mPageMap: cute.Tensor, mPageList: cute.Tensor, mJoint: cute.Tensor,
                   n_keys: Int32, page_size: Int32, lo: Int32, col0: Int32, token: Int32, tidx: Int32):
        """Token ``token``'s entries of one list → its columns of ``mJoint`` (the class docstring's flags)."""
        entries = cute.size(mIdx, mode=[1])
        valid = entries                                         # the token's entries that count
        if const_expr(has_lengths):
            valid = mLen[token]
        # a thread's `entries_in_flight` entries (j, j + THREADS, ...) loaded before any is stored — and their page
        # map entries before any store too: with one a thread, 8 KB of loads in flight an SM read ~1 TB/s (session 47)
        n = self.entries_in_flight
        for first in cutlass.range(tidx, entries, THREADS * n, unroll=1):
            rIdx = cute.make_rmem_tensor((n,), Int32)           # the entries, then their table rows
            for e in cutlass.range_constexpr(n):
                j = first + e * THREADS
                rIdx[e] = Int32(-1)
                if j < entries and j < valid:
                    rIdx[e] = mIdx[token, j]
            for e in cutlass.range_constexpr(n):
                i = rIdx[e]
                row = Int32(-1)
                if i >= 0 and i < n_keys:
                    if const_expr(has_page_map):
                        page = i // page_size
                        block = mPageMap[page]                  # the page's block in the table, if this call's
                        if block >= 0 and block < cute.size(mPageList, mode=[0]):
                            if mPageList[block] == page:
                                row = lo + block * page_size + i % page_size
                    else:
                        row = lo + i
                rIdx[e] = row
            for e in cutlass.range_constexpr(n):
                j = first + e * THREADS
                if j < entries:
                    mJoint[token, col0 + j] = rIdx[e]


class ListJoinPairKernel(ListJoinKernel):
    """Both lists of a staged prefill joined by ONE launch (issue #28: a launch costs ~4.8 µs of host time on the
    H200): grid ``(Sq, 2)``, row ``y`` of the grid joins list ``y`` with its own arguments and flags
    (``has_lengths`` / ``has_page_map``: a pair each) by :meth:`ListJoinKernel.join_token`.  The arguments are the
    two single builds' one after the other (the joined list passed twice), then the stream; each CTA's device code is
    the single build's.  Both lists have a row a token (the same ``Sq``)."""

    def __init__(self, has_lengths: tuple, has_page_map: tuple, entries_in_flight: int = 1):
        if len(has_lengths) != 2 or len(has_page_map) != 2:
            raise ValueError(f"a pair takes two flags each, got {has_lengths!r}, {has_page_map!r}")
        super().__init__(False, False, entries_in_flight)
        self.has_lengths, self.has_page_map = tuple(map(bool, has_lengths)), tuple(map(bool, has_page_map))

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mPageMap: cute.Tensor, mPageList: cute.Tensor,
                 mJoint: cute.Tensor, n_keys: Int32, page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor,
                 mLen2: cute.Tensor, mPageMap2: cute.Tensor, mPageList2: cute.Tensor, mJoint2: cute.Tensor,
                 n_keys2: Int32, page_size2: Int32, lo2: Int32, col02: Int32, stream: cuda.CUstream = None):
        self.pair_kernel(mIdx, mLen, mPageMap, mPageList, mJoint, n_keys, page_size, lo, col0, mIdx2, mLen2, mPageMap2,
                         mPageList2, mJoint2, n_keys2, page_size2, lo2, col02).launch(
            grid=(cute.size(mIdx, mode=[0]), 2, 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def pair_kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mPageMap: cute.Tensor, mPageList: cute.Tensor,
                    mJoint: cute.Tensor, n_keys: Int32, page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor,
                    mLen2: cute.Tensor, mPageMap2: cute.Tensor, mPageList2: cute.Tensor, mJoint2: cute.Tensor,
                    n_keys2: Int32, page_size2: Int32, lo2: Int32, col02: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        token, which, _ = cute.arch.block_idx()
        if which == 0:
            self.join_token(self.has_lengths[0], self.has_page_map[0], mIdx, mLen, mPageMap, mPageList, mJoint, n_keys,
                            page_size, lo, col0, token, tidx)
        else:
            self.join_token(self.has_lengths[1], self.has_page_map[1], mIdx2, mLen2, mPageMap2, mPageList2, mJoint2,
                            n_keys2, page_size2, lo2, col02, token, tidx)
