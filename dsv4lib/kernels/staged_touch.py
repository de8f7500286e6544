"""The staged prefill's scanning mode in ONE pass over the lists (issue #28: the staged call's host time is its
launches, ~4.8 µs each on the H200): each list entry becomes its table row (the list join) and the key it names is
dequantized into that row the first time this call touches it — no page scan, no page-wide dequantization, no
separate join (:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged` without ``pages=``, ``STAGED_TOUCH``).

Scanning mode puts a cache's rows at their key addresses (``lo + i``), so an entry's table row does not depend on any
other entry: the join needs nothing from the dequantization.  Which key to convert: every cache slot has an epoch word
(int32 ``[n_keys]``, zeros when made); a call passes its own epoch number (the host counts calls, never 0), and an
entry's thread swaps it into its key's word (``atom.exch``) — the thread that read another number won the key, every
other entry naming it in this call reads this call's number and skips.  So each listed key is converted once a call
(a key's bytes may have changed between calls: the epoch is new every call), nothing needs clearing between calls,
and only listed keys are converted (the page scan converted every slot of a marked page).  An entry reads its key's
word first and swaps only when it does not hold this call's epoch yet (this call's number can only be there by this
call's swap; a stale copy can only hold an older one), so a key listed by many tokens costs one atomic or a few.

The epoch lives on the device, not in the launch's arguments: a CUDA graph replays its launches' arguments as
captured, so a host-counted epoch would be the same every replay and a replay would convert nothing (reading rows
the cache has since overwritten).  ``mState [2]`` int32 (zeros when made): every CTA takes ``state[0] + 1`` as the
call's epoch when it starts; at its end one thread counts the CTA done in ``state[1]``, and the last CTA done (every
other CTA has read the epoch by then) stores the epoch into ``state[0]`` and zeroes the count.  The next call, after
this one in stream order, reads it.  (2^32 calls later the epochs come round again.)

A CTA a (token, list) — grid ``(Sq, lists)`` — of :data:`WARPS` warps, each warp 32 consecutive entries at a time,
a lane an entry: the lane writes the entry's joint-list column and swaps the epoch, then the warp converts its
winners' rows, :data:`ROWS_IN_FLIGHT` loaded before any is stored, all 32 lanes on each row by the dequantization's
lane map by halves
(:func:`~dsv4lib.kernels.model1_dequant.load_slot_by_halves`: each warp store 512 contiguous bytes; bit-equal to
:class:`~dsv4lib.kernels.model1_dequant.Model1DequantKernel` and the reference).  Arch-neutral: built for sm_90a
and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32, const_expr

from .common import launch_stream
from .model1_dequant import ROW_BYTES, load_slot_by_halves, store_row_by_halves

WARPS = 4
ROWS_IN_FLIGHT = 4              # a warp's winners' rows loaded before it converts and stores any


class StagedTouchKernel:
    """One or two index lists (``lists``), each of its own FP8 cache, → the joined list ``mJoint [Sq, K_total]``
    int32 (a list's entries at columns ``col0 …``: the table row ``lo + i`` of a counted entry ``i``, else ``-1``) and
    the bf16 table ``mTable [rows, 512]`` holding every counted key's row, converted once this call (module
    docstring; ``mState [2]`` int32: the last call's epoch and the CTAs done).  An entry counts when ``0 <= i < n_keys`` and before its token's length (``has_lengths[l]``: ``mLen
    [Sq]`` int32, else unread).  A list's arguments: ``mIdx [Sq, K]`` int32, ``mLen``, ``mCache [num_pages,
    page_bytes]`` uint8, ``mEpoch [n_keys]`` int32, ``page_size``, ``lo``, ``col0``; then the table, the joined list
    and the state."""

    def __init__(self, has_lengths: tuple[bool, ...], rows_in_flight: int = ROWS_IN_FLIGHT):
        if len(has_lengths) not in (1, 2):
            raise ValueError(f"one or two lists, got {len(has_lengths)}")
        self.has_lengths = tuple(bool(h) for h in has_lengths)
        self.rows_in_flight = rows_in_flight

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mEpoch: cute.Tensor,
                 page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor, mLen2: cute.Tensor,
                 mCache2: cute.Tensor, mEpoch2: cute.Tensor, page_size2: Int32, lo2: Int32, col02: Int32,
                 mTable: cute.Tensor, mJoint: cute.Tensor, mState: cute.Tensor, stream: cuda.CUstream = None):
        self.kernel(mIdx, mLen, mCache, mEpoch, page_size, lo, col0, mIdx2, mLen2, mCache2, mEpoch2, page_size2, lo2,
                    col02, mTable, mJoint, mState).launch(grid=(cute.size(mIdx, mode=[0]), len(self.has_lengths), 1),
                                                         block=(32 * WARPS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mEpoch: cute.Tensor,
               page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor, mLen2: cute.Tensor,
               mCache2: cute.Tensor, mEpoch2: cute.Tensor, page_size2: Int32, lo2: Int32, col02: Int32,
               mTable: cute.Tensor, mJoint: cute.Tensor, mState: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        token, which, _ = cute.arch.block_idx()
        n_tokens, n_lists, _ = cute.arch.grid_dim()
        epoch = mState[0] + 1                                   # this call's (module docstring)
        if const_expr(len(self.has_lengths) == 1):
            self.touch_list(mIdx, mLen, mCache, mEpoch, page_size, lo, col0, self.has_lengths[0], mTable, mJoint,
                            epoch, token, tidx)
        else:
            if which == 0:
                self.touch_list(mIdx, mLen, mCache, mEpoch, page_size, lo, col0, self.has_lengths[0], mTable,
                                mJoint, epoch, token, tidx)
            else:
                self.touch_list(mIdx2, mLen2, mCache2, mEpoch2, page_size2, lo2, col02, self.has_lengths[1], mTable,
                                mJoint, epoch, token, tidx)
        # the last CTA done makes this call's epoch the last one (every CTA has read it by then)
        cute.arch.sync_threads()
        if tidx == 0:
            done = cute.arch.atomic_add(mState.iterator + 1, Int32(1), sem="acq_rel", scope="gpu")
            if done == n_tokens * n_lists - 1:
                mState[1] = Int32(0)
                mState[0] = epoch

    @cute.jit
    def touch_list(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mEpoch: cute.Tensor,
                   page_size: Int32, lo: Int32, col0: Int32, has_lengths: cutlass.Constexpr, mTable: cute.Tensor,
                   mJoint: cute.Tensor, epoch: Int32, token, tidx):
        """Token ``token``'s entries of one list: joint columns written, first touches converted (module docstring)."""
        lane, warp = tidx % 32, tidx // 32
        entries = cute.size(mIdx, mode=[1])
        n_keys = cute.size(mCache, mode=[0]) * page_size
        page_bytes = Int64(cute.size(mCache, mode=[1]))
        valid = entries                                         # the token's entries that count
        if const_expr(has_lengths):
            if mLen[token] < entries:
                valid = mLen[token]
        for first in cutlass.range(warp * 32, entries, 32 * WARPS, unroll=1):
            j = first + lane
            key = Int32(-1)
            if j < valid:
                key = mIdx[token, j]
            won = False
            row = Int32(-1)
            if key >= 0 and key < n_keys:
                row = lo + key
                # a plain load first: most entries name a key another entry already won this call (a window key is
                # listed by up to 128 tokens), and a word reading this call's epoch can only have been swapped by it —
                # only the others pay the atomic
                if mEpoch[key] != epoch:
                    won = cute.arch.atomic_exch(mEpoch.iterator + key, epoch, sem="relaxed", scope="gpu") != epoch
            if j < entries:
                mJoint[token, col0 + j] = row
            winners = Uint32(cute.arch.vote_ballot_sync(won))   # warp-uniform: every lane runs every winner's row
            self.convert_winners(winners, key, mCache, page_size, page_bytes, lo, mTable, lane)

    @cute.jit
    def convert_winners(self, winners: Uint32, key: Int32, mCache: cute.Tensor, page_size: Int32, page_bytes: Int64,
                        lo: Int32, mTable: cute.Tensor, lane):
        """The warp's winners' rows (``winners``: a bit a lane, the lane's ``key`` won), ``rows_in_flight`` at a time:
        their bytes all loaded before any is converted and stored (one at a time waited a memory latency a row: 4-14 %
        slower than the page-wide pass at H128, session 57)."""
        n = self.rows_in_flight
        remaining = winners
        for _ in cutlass.range((32 + n - 1) // n, unroll=1):
            if remaining != Uint32(0):
                rKey = cute.make_rmem_tensor((n,), Int32)                     # a winner's key, or -1
                rLow = [cute.make_rmem_tensor((2,), Uint32) for _ in range(n)]    # 8 e4m3 bytes: dims 8 l …
                rHigh = [cute.make_rmem_tensor((2,), Uint32) for _ in range(n)]   # 8 e4m3 bytes: dims 256 + 8 l …
                rRope = [cute.make_rmem_tensor((4,), Uint32) for _ in range(n)]   # or 8 rope bf16: dims 448 + …
                rScale = cute.make_rmem_tensor((2 * n,), Uint32)                # the two halves' tile scales
                for s in cutlass.range_constexpr(n):
                    rKey[s] = Int32(-1)
                    if remaining != Uint32(0):                                  # the lowest winner left
                        from_lane = Int32(cute.arch.clz(cute.arch.brev(Int32(remaining))))
                        remaining = remaining & (remaining - Uint32(1))
                        rKey[s] = cute.arch.shuffle_sync(key, from_lane)
                for s in cutlass.range_constexpr(n):
                    if rKey[s] >= 0:
                        page = rKey[s] // page_size
                        page_base = mCache.iterator.toint() + Int64(page) * page_bytes
                        load_slot_by_halves(page_base, page_size, rKey[s] - page * page_size, lane, rLow[s], rHigh[s],
                                            rRope[s], rScale, 2 * s)
                for s in cutlass.range_constexpr(n):
                    if rKey[s] >= 0:
                        row_at = mTable.iterator.toint() + (Int64(lo) + Int64(rKey[s])) * Int64(ROW_BYTES)
                        store_row_by_halves(row_at, lane, rLow[s], rHigh[s], rRope[s], rScale, 2 * s)
