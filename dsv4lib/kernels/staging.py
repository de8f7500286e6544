"""The staged prefill's three passes — page scan, dequantization, list join — for one or two caches in ONE launch
(:func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged`; issue #28: a launch costs ~4.5 µs of host time on the
H200, docs/tuning/host.md session 58).

The passes depend on each other across the whole grid: a page is dequantized once every scan CTA has marked its
pages (scanning mode), and a list entry on a given page is joined once every dequantization CTA has written its
page's block into the page map (``pages=`` mode); a scanned list's join depends on nothing (its rows sit at their
key addresses).  One launch keeps those dependencies with **tickets**: each CTA's first thread takes the next number
of a global counter (``atom.add``) and the number, not the CTA's place in the grid, says what the CTA does — the
first numbers scan, the next dequantize, the last join.  A CTA that must wait spins (``ld.acquire`` and
``nanosleep``, one thread) until the CTAs of the pass before have all counted themselves done; those hold smaller
numbers, so they were already running when the waiter took its own: they never wait on a larger number, so the wait
always ends — whatever order the hardware dispatches the grid in, and however few CTAs fit at once.  (Waiting on the
CTA's place in the grid instead would hang whenever waiters filled the GPU before the CTAs they wait for started.)

``mState [4]`` int32, zeros when made: the ticket counter, the scan CTAs done, the dequantization CTAs done, all CTAs
done.  The last CTA done (every ticket taken, every wait over) zeroes all four, so the next call — after this one in
stream order, a CUDA graph's replay included — starts from zeros; nothing is cleared on the host.

Each CTA runs the single kernels' own device code (:meth:`PageScanKernel.scan_block`,
:meth:`Model1DequantKernel.dequant_block`, :meth:`ListJoinKernel.join_token`) with this kernel's 256 threads (the
scan's block; the dequantization's warps and the join's threads stride by it).  Arch-neutral: built for sm_90a and
sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .common import launch_stream, load_acquire_gpu
from .list_join import ListJoinKernel
from .model1_dequant import SLOTS_IN_FLIGHT, Model1DequantKernel
from .page_scan import THREADS, WORDS_PER_CTA, PageScanKernel, token_tiles, word_ranges

TICKET, SCANS_DONE, DEQUANTS_DONE, CTAS_DONE = 0, 1, 2, 3      # the words of mState
WAIT_NS = 256                   # a waiting thread's sleep between two reads of the counter


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None) -> None:
    """``nanosleep.u32 ns``: the spinning thread yields its issue slots to the CTAs it waits for."""
    llvm.inline_asm(None, [], f"nanosleep.u32 {ns};", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


class StagingKernel:
    """One or two caches' page scan (scanned caches only), dequantization into the bf16 table and list join, in one
    launch (module docstring).  ``caches``: per cache ``(scanned, has_lengths)``.  A cache's arguments: ``mIdx [Sq,
    K]`` int32, ``mLen [Sq]`` int32 (read with ``has_lengths``), ``mCache [num_pages, page_bytes]`` uint8, ``mSource``
    (scanned: the page bits, int32 ``[words]``, zeros between calls; given: the page list, int32 ``[n]``),
    ``mPageMap [num_pages]`` int32 (given only), ``page_size``, ``n_keys``, ``row0`` (its first table row), ``col0``
    (its first joined column); with one cache its arguments are passed twice.  Then the table ``[rows, 512]`` bf16,
    the joined list ``[Sq, K_total]`` int32 and ``mState [4]`` int32."""

    def __init__(self, caches: tuple, slots_in_flight: int = SLOTS_IN_FLIGHT, entries_in_flight: int = 1):
        if len(caches) not in (1, 2):
            raise ValueError(f"one or two caches, got {len(caches)}")
        self.caches = tuple((bool(scanned), bool(has_lengths)) for scanned, has_lengths in caches)
        self.scan = PageScanKernel(False)
        self.dequant = Model1DequantKernel(slots_in_flight, "marks")
        self.join = ListJoinKernel(False, False, entries_in_flight)

    def source(self, k: int) -> str:
        return "marks" if self.caches[k][0] else "list+map"

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mSource: cute.Tensor,
                 mPageMap: cute.Tensor, page_size: Int32, n_keys: Int32, row0: Int32, col0: Int32,
                 mIdx2: cute.Tensor, mLen2: cute.Tensor, mCache2: cute.Tensor, mSource2: cute.Tensor,
                 mPageMap2: cute.Tensor, page_size2: Int32, n_keys2: Int32, row02: Int32, col02: Int32,
                 mTable: cute.Tensor, mJoint: cute.Tensor, mState: cute.Tensor, stream: cuda.CUstream = None):
        two = len(self.caches) == 2
        # the CTAs of each pass and cache, in ticket order: scans, dequantizations, joins
        scans = (token_tiles(mIdx) * word_ranges(mSource) if self.caches[0][0] else 0,
                 token_tiles(mIdx2) * word_ranges(mSource2) if two and self.caches[-1][0] else 0)
        dequants = (self.dequant.blocks(self.source(0), mCache, mSource),
                    self.dequant.blocks(self.source(len(self.caches) - 1), mCache2, mSource2) if two else 0)
        tokens = cute.size(mIdx, mode=[0])
        ctas = scans[0] + scans[1] + dequants[0] + dequants[1] + tokens * len(self.caches)
        self.kernel(mIdx, mLen, mCache, mSource, mPageMap, page_size, n_keys, row0, col0, mIdx2, mLen2, mCache2,
                    mSource2, mPageMap2, page_size2, n_keys2, row02, col02, mTable, mJoint, mState,
                    Int32(scans[0]), Int32(scans[1]), Int32(dequants[0]), Int32(dequants[1])).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mCache: cute.Tensor, mSource: cute.Tensor,
               mPageMap: cute.Tensor, page_size: Int32, n_keys: Int32, row0: Int32, col0: Int32,
               mIdx2: cute.Tensor, mLen2: cute.Tensor, mCache2: cute.Tensor, mSource2: cute.Tensor,
               mPageMap2: cute.Tensor, page_size2: Int32, n_keys2: Int32, row02: Int32, col02: Int32,
               mTable: cute.Tensor, mJoint: cute.Tensor, mState: cute.Tensor, scans0: Int32, scans1: Int32,
               dequants0: Int32, dequants1: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        # sWords (WORDS_PER_CTA,) int32: a scan CTA's page bits; sTicket (1,) int32: the CTA's ticket
        sWords = smem.allocate_tensor(Int32, cute.make_layout(WORDS_PER_CTA), byte_alignment=16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(mState.iterator + TICKET, Int32(1), sem="relaxed", scope="gpu")
        cute.arch.sync_threads()
        ticket = sTicket[0]
        scans_end = scans0 + scans1
        dequants_end = scans_end + dequants0 + dequants1
        tokens = cute.size(mIdx, mode=[0])
        two = const_expr(len(self.caches) == 2)
        # ---- page scan (scanned caches only: no CTA of a given cache's gets here; their page bits) ----
        if ticket < scans0:
            if const_expr(self.caches[0][0]):
                tiles = token_tiles(mIdx)
                self.scan.scan_block(self.caches[0][1], mIdx, mLen, mSource, n_keys, page_size, sWords,
                                     ticket % tiles, ticket // tiles, tidx)
                self.count_done(mState, SCANS_DONE, tidx)
        elif ticket < scans_end:
            if const_expr(two and self.caches[-1][0]):
                tiles, own = token_tiles(mIdx2), ticket - scans0
                self.scan.scan_block(self.caches[-1][1], mIdx2, mLen2, mSource2, n_keys2, page_size2, sWords,
                                     own % tiles, own // tiles, tidx)
                self.count_done(mState, SCANS_DONE, tidx)
        elif ticket < dequants_end:
            # ---- dequantization: a page a CTA; a scanned cache's once every scan CTA is done ----
            own = ticket - scans_end
            if own < dequants0:
                if const_expr(self.caches[0][0]):
                    self.wait_for(mState, SCANS_DONE, scans_end, tidx)
                self.dequant.dequant_block(self.source(0), mCache, page_size, mTable, mSource, mPageMap, row0, own,
                                           tidx, THREADS // 32)
            else:
                if const_expr(two):
                    if const_expr(self.caches[-1][0]):
                        self.wait_for(mState, SCANS_DONE, scans_end, tidx)
                    self.dequant.dequant_block(self.source(len(self.caches) - 1), mCache2, page_size2, mTable,
                                               mSource2, mPageMap2, row02, own - dequants0, tidx, THREADS // 32)
            self.count_done(mState, DEQUANTS_DONE, tidx)
        else:
            # ---- join: a token of a list a CTA; a given cache's once every page map entry is written ----
            own = ticket - dequants_end
            if own < tokens:
                if const_expr(not self.caches[0][0]):
                    self.wait_for(mState, DEQUANTS_DONE, dequants0 + dequants1, tidx)
                self.join.join_token(self.caches[0][1], not self.caches[0][0], mIdx, mLen, mPageMap, mSource,
                                     mJoint, n_keys, page_size, row0, col0, own, tidx, THREADS)
            else:
                if const_expr(two):
                    if const_expr(not self.caches[-1][0]):
                        self.wait_for(mState, DEQUANTS_DONE, dequants0 + dequants1, tidx)
                    self.join.join_token(self.caches[-1][1], not self.caches[-1][0], mIdx2, mLen2, mPageMap2,
                                         mSource2, mJoint, n_keys2, page_size2, row02, col02, own - tokens, tidx,
                                         THREADS)
        # the last CTA done (every ticket taken, every wait over) leaves the state zero for the next call
        cute.arch.sync_threads()
        if tidx == 0:
            done = cute.arch.atomic_add(mState.iterator + CTAS_DONE, Int32(1), sem="acq_rel", scope="gpu")
            if done == n_ctas - 1:
                for word in cutlass.range_constexpr(4):
                    mState[word] = Int32(0)

    @cute.jit
    def count_done(self, mState: cute.Tensor, word: cutlass.Constexpr, tidx: Int32):
        """This CTA's pass is done: after every thread's writes (the barrier), one release increment of ``word``."""
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.atomic_add(mState.iterator + word, Int32(1), sem="release", scope="gpu")

    @cute.jit
    def wait_for(self, mState: cute.Tensor, word: cutlass.Constexpr, count: Int32, tidx: Int32):
        """Spin (one thread) until ``word`` reads ``count`` — the CTAs it counts hold smaller tickets — then let the
        CTA go on (what they wrote before their release is visible after the acquire and the barrier)."""
        if tidx == 0:
            while load_acquire_gpu(mState.iterator + word) < count:
                nanosleep(WAIT_NS)
        cute.arch.sync_threads()
