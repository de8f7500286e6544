"""The staged prefill's ``pages=`` mode in ONE launch (issue #28: the staged call's host time is its launches, ~4.5
µs each on the H200): the caller's pages of one or two FP8 caches dequantized into the bf16 table, a block of rows a
page, and each index list joined into its table rows — the work of the paired dequantization and the paired list
join (:class:`~dsv4lib.kernels.model1_dequant.Model1DequantPairKernel`,
:class:`~dsv4lib.kernels.list_join.ListJoinPairKernel`) in one grid, each CTA running their device code
(:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged` with ``pages=``, ``STAGED_PAGES_ONE_LAUNCH``).

What the join needs from the dequantization is only the page map (``map[page] = its block``, never filled; an entry
``m`` counts where the page list's ``list[m]`` is that page) — not the table's rows.  So the map is written by CTAs of
its own, first, and only the join CTAs wait for it; the dequantization CTAs never wait, and the map is a few KB
(:data:`MAP_ENTRIES_PER_CTA` pages a CTA).  The session-58 one-launch staging lost 32 µs of device time at D6's
``pages=`` shapes because its joins waited for every dequantization CTA (they wrote the map) while holding SM slots;
here a join waits for at most a few map CTAs that started before it.

Order without deadlock: each CTA takes a ticket (``atom.add`` on the state) when it starts and plays the role of that
number — map CTAs first, then the dequantizations, then the joins.  A join that waits holds a larger ticket than
every map CTA, so those were already running when it took its own: the wait always ends, whatever order the hardware
dispatches the grid in and however few CTAs fit at once.

``mState [3]`` int32, zeros when made: the ticket counter, the map CTAs done, all CTAs done.  The last CTA done
(every ticket taken, every wait over) zeroes the three, so the next call — after this one in stream order, a CUDA
graph's replay included — starts from zeros; nothing is cleared on the host.  128 threads a CTA, every role (the
dequantization's 4 warps, the join's 128 threads).  Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .common import launch_stream, load_acquire_gpu
from .list_join import THREADS, ListJoinKernel
from .model1_dequant import SLOTS_IN_FLIGHT, WARPS, Model1DequantKernel

TICKET, MAPS_DONE, CTAS_DONE = 0, 1, 2      # the words of mState
STATE_WORDS = 3
MAP_ENTRIES_PER_CTA = 1024                  # a map CTA's pages (8 a thread): D6's 1024 / 2048-page lists take 1 / 2
WAIT_NS = 128                               # a waiting thread's sleep between two reads of the counter
assert WARPS * 32 == THREADS, "the dequantization's warps and the join's threads are one CTA"


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None) -> None:
    """``nanosleep.u32 ns``: the spinning thread yields its issue slots to the CTAs on its SM."""
    llvm.inline_asm(None, [], f"nanosleep.u32 {ns};", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def map_ctas(mPages: cute.Tensor):
    """The map CTAs of one page list: :data:`MAP_ENTRIES_PER_CTA` pages each."""
    return (cute.size(mPages, mode=[0]) + (MAP_ENTRIES_PER_CTA - 1)) // MAP_ENTRIES_PER_CTA


class StagedPagesKernel:
    """One or two lists (``has_lengths``: a flag a list), each with its cache and the caller's pages of it, → the bf16
    table ``mTable [rows, 512]`` (list ``l``'s page ``b`` in rows ``lo_l + b · page_size …``) and the joined list
    ``mJoint [Sq, K_total]`` int32 (list ``l`` at columns ``col0_l …``: an entry's table row, or ``-1`` where it is
    out of its cache, past its token's length or on a page not given), as the paired dequantization (``"list"``)
    and the paired join (with page maps) compute them (module docstring).  A list's arguments: ``mIdx [Sq, K]``
    int32, ``mLen [Sq]`` int32 (read with its flag), ``mCache [num_pages, page_bytes]`` uint8, ``mPages [n]`` int32
    (the pages given), ``mPageMap [num_pages]`` int32 (never filled), ``page_size``, ``lo``, ``col0``; a one-list
    build reads only the first list's (pass them twice).  Then the table, the joined list and ``mState [3]``."""

    def __init__(self, has_lengths: tuple, slots_in_flight: int = SLOTS_IN_FLIGHT, entries_in_flight: int = 1):
        if len(has_lengths) not in (1, 2):
            raise ValueError(f"one or two lists, got {len(has_lengths)}")
        self.has_lengths = tuple(bool(h) for h in has_lengths)
        self.dequant = Model1DequantKernel(slots_in_flight, "list")
        self.join = ListJoinKernel(False, True, entries_in_flight)

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mPages: cute.Tensor,
                 mPageMap: cute.Tensor, page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor,
                 mLen2: cute.Tensor, mCache2: cute.Tensor, mPages2: cute.Tensor, mPageMap2: cute.Tensor,
                 page_size2: Int32, lo2: Int32, col02: Int32, mTable: cute.Tensor, mJoint: cute.Tensor,
                 mState: cute.Tensor, stream: cuda.CUstream = None):
        lists = len(self.has_lengths)
        ctas = map_ctas(mPages) + cute.size(mPages, mode=[0]) + cute.size(mIdx, mode=[0]) * lists
        if const_expr(lists == 2):
            ctas = ctas + map_ctas(mPages2) + cute.size(mPages2, mode=[0])
        self.kernel(mIdx, mLen, mCache, mPages, mPageMap, page_size, lo, col0, mIdx2, mLen2, mCache2, mPages2,
                    mPageMap2, page_size2, lo2, col02, mTable, mJoint, mState).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mPages: cute.Tensor,
               mPageMap: cute.Tensor, page_size: Int32, lo: Int32, col0: Int32, mIdx2: cute.Tensor,
               mLen2: cute.Tensor, mCache2: cute.Tensor, mPages2: cute.Tensor, mPageMap2: cute.Tensor,
               page_size2: Int32, lo2: Int32, col02: Int32, mTable: cute.Tensor, mJoint: cute.Tensor,
               mState: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        two = const_expr(len(self.has_lengths) == 2)
        sTicket = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(mState.iterator + TICKET, Int32(1), sem="relaxed", scope="gpu")
        cute.arch.sync_threads()
        ticket = sTicket[0]
        # the roles in ticket order: list 0's map CTAs, list 1's; list 0's pages, list 1's; list 0's tokens, list 1's
        maps0 = map_ctas(mPages)
        maps = maps0
        blocks0 = cute.size(mPages, mode=[0])
        blocks = blocks0
        if const_expr(two):
            maps = maps0 + map_ctas(mPages2)
            blocks = blocks0 + cute.size(mPages2, mode=[0])
        tokens = cute.size(mIdx, mode=[0])
        if ticket < maps:
            if ticket < maps0:
                self.write_map(mPages, mPageMap, mCache, ticket, tidx)
            else:
                if const_expr(two):
                    self.write_map(mPages2, mPageMap2, mCache2, ticket - maps0, tidx)
            # this CTA's map entries are written: after every thread's stores (the barrier), one release increment
            cute.arch.sync_threads()
            if tidx == 0:
                cute.arch.fence_acq_rel_gpu()
                cute.arch.atomic_add(mState.iterator + MAPS_DONE, Int32(1), sem="release", scope="gpu")
        elif ticket < maps + blocks:
            block = ticket - maps
            if block < blocks0:
                self.dequant.dequant_block("list", mCache, page_size, mTable, mPages, mPageMap, lo, block, tidx)
            else:
                if const_expr(two):
                    self.dequant.dequant_block("list", mCache2, page_size2, mTable, mPages2, mPageMap2, lo2,
                                               block - blocks0, tidx)
        else:
            # a join: once every map CTA is done (they hold smaller tickets, so they are running or done)
            if tidx == 0:
                while load_acquire_gpu(mState.iterator + MAPS_DONE) < maps:
                    nanosleep(WAIT_NS)
            cute.arch.sync_threads()
            row = ticket - maps - blocks
            if row < tokens:
                self.join.join_token(self.has_lengths[0], True, mIdx, mLen, mPageMap, mPages, mJoint,
                                     cute.size(mCache, mode=[0]) * page_size, page_size, lo, col0, row, tidx)
            else:
                if const_expr(two):
                    self.join.join_token(self.has_lengths[1], True, mIdx2, mLen2, mPageMap2, mPages2, mJoint,
                                         cute.size(mCache2, mode=[0]) * page_size2, page_size2, lo2, col02,
                                         row - tokens, tidx)
        # the last CTA done (every ticket taken, every wait over) leaves the state zero for the next call
        cute.arch.sync_threads()
        if tidx == 0:
            done = cute.arch.atomic_add(mState.iterator + CTAS_DONE, Int32(1), sem="acq_rel", scope="gpu")
            if done == n_ctas - 1:
                for word in cutlass.range_constexpr(STATE_WORDS):
                    mState[word] = Int32(0)

    @cute.jit
    def write_map(self, mPages: cute.Tensor, mPageMap: cute.Tensor, mCache: cute.Tensor, part: Int32, tidx: Int32):
        """Map CTA ``part`` of one list: ``map[list[b]] = b`` for its :data:`MAP_ENTRIES_PER_CTA` entries ``b`` (a
        number outside the cache skipped; a page given twice keeps either block — both hold its rows)."""
        n = cute.size(mPages, mode=[0])
        num_pages = cute.size(mCache, mode=[0])
        first = part * MAP_ENTRIES_PER_CTA
        for i in cutlass.range(tidx, MAP_ENTRIES_PER_CTA, THREADS, unroll=1):
            b = first + i
            if b < n:
                page = mPages[b]
                if page >= 0 and page < num_pages:
                    mPageMap[page] = b
