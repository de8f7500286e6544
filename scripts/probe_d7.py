"""Where the D7 decode's time goes: the same shapes as ``bench_d7.py``, each timed (CUDA-graph replay) with parts of
the kernel switched off, so the difference to the full kernel is that part's cost on the critical path.  Outputs are
garbage except in ``full`` and the variants marked "right" (``SAME_BITS``: asserted equal to ``full``'s on the first
input set) — this is a measurement, never a result.

  full          the kernel as shipped
  fp32_convert  every row through the fp32 conversion (cvt e4m3x2, widen, multiply, cvt bf16x2), not placed bits
  no_convert    producer loads and stores, e4m3 → bf16 conversion replaced by a copy of the raw words
  no_gmem       producer converts and stores, no global loads of key bytes (registers hold a constant)
  no_rope       no rope cp.async: the right halves' rope lanes convert their bytes as e4m3 like every other lane
  lane_t16      the producer's old thread slots (lane t % 16: every warp splits between rope copies and conversion)
  no_l2_256     the key-byte loads without the L2::256B prefetch hint the shipped ones carry (FlashMLA's; adopted
                session 38: −1.3 %); the output is right in this one
  nc_loads      the key-byte loads by the read-only path (ld.global.nc) and the hint; right
  l1_no_allocate  the key-byte loads without L1 allocation (ld.global.L1::no_allocate) and the hint; right
  cg_loads      the key-byte loads cached in L2 only (ld.global.cg) and the hint; right
  register_indices  the next-but-one pair's list entries loaded into registers (the build before session 38), not
                staged by cp.async into shared memory (STAGED_INDICES); right
  staged_rows   the candidate STAGED_ROWS producer (nope bytes by cp.async into the half-tile buffers, two half-
                tiles ahead, converted in place) in the one-CTA builds — H = 128 keeps the crossover's rolling
                producer; right
  staged_rows_nx  STAGED_ROWS with the head-pair cluster off (H = 128 too: each CTA converts every row); right
  two_slots     the candidate TWO_SLOTS_WITH_CROSSOVER (d7_two_slots.patch): the head-pair builds keep two half-
                tiles of rows in flight, even fills' in the registers, odd fills' in a cp.async staging ring; right
  two_slots_late_ring  two_slots with warp 3's ring copies for (1, L) issued after fill 2's rope arrive
                (RING_AFTER_ROPE_ARRIVE, the same patch); right
  no_crossover  H = 128 without the head-pair cluster (each CTA dequantizes every row); right too
  no_pdl_chain  the builds launched without PDL (PDL_CHAIN off: no wait for the grid before, no trigger in the
                unsplit build); the graph replay's back-to-back calls then start each grid after the last one ended;
                right too
  regs216       the consumers at 216 registers, the producer at 72 (shipped 208 / 88; both spill-free, ptxas -v):
                session 33 on the H100 13.5 / 51.2 / 70.4 / 135.4 µs against 13.0 / 50.6 / 70.5 / 136.9 — noise at
                H128, slower at H64: not adopted (200 registers cost 6-9 % at H128, session 32); right too
  early_release each half-tile freed as soon as its consumer has waited for it (the consumers' releases after their
                MMAs do nothing): the producer refills while the buffer is still read — garbage, but the time of a
                pipeline deep enough that no refill waits for the consumers (the bound of a third buffer, session 33)
  no_fence      the producer arrives on a half-tile's barrier without the fence.proxy.async before it (the wgmma
                may read rows not yet visible to it: garbage) — the price of the fence, which waits for every
                earlier shared store of the thread (session 33's question: the fill costs 14 µs beyond its loads)
  idle_producer producer fetches key records and arrives, nothing loaded, converted or stored (consumer-bound)
  no_mma        consumers' wgmmas removed (producer-bound, softmax and barriers kept)
  fp32_partials the split partials in fp32, stored from the accumulators (the build before session 41; shipped:
                bf16 by the output's TMA epilogue); no_partial_store / half_partial_store patch that fp32 store
  o_evict_last  O's TMA stores (output, bf16 partials) with an evict-last L2 hint instead of evict-first
  alternate     the candidate ALTERNATE_HALF_TILES: at H128 each CTA of the head pair converts every row of two of
                a pair's four half-tiles (8 rows of loads in flight a producer thread, not 4); right
  alternate_early  alternate with ALTERNATE_EARLY_RECORDS (three key-record slots, the next pair's records published
                at the second acquire); right
  no_peer_store H128 crossover without its DSMEM traffic: no st.async of the converted rows into the peer, the
                peer's bytes not expected on the full barrier (each CTA's buffers hold its own 32 rows and stale
                ones: garbage) — the cost of shipping 16 KB of bf16 a half-tile over the cluster network
  half_peer_store the same with half of it: the first 16-byte chunk of each row shipped, half the bytes expected
                (both measured on the bf16 peer stores, PEER_FP8 off)
  peer_no_convert  PEER_FP8 with the peer's landed rows waited for but not converted (garbage): what converting them
                costs the producer — the most that moving it elsewhere (to the consumers) can win
  peer_bf16     the H128 crossover as before PEER_FP8: converted bf16 rows shipped to the peer (32 B a row and lane),
                not their e4m3 bytes converted by the peer; right
  floor         idle producer and no wgmma: launch, Q, records, barriers, softmax, epilogue
                (idle_producer and floor HANG at H = 128 since the head-pair crossover: each half-tile barrier
                expects the peer's st.async bytes, which an idle producer never sends — session 33 lost a call to
                it.  Those cells are skipped and printed as "-"; add no_crossover's patch to measure H128 idle.)

``--trace``: the full kernel with a clock64 stamp (first thread of the warpgroup that does it) at each half-tile
pipeline event — producer acquired / committing, consumer waited / releasing — per CTA and pair; prints the median
over CTAs of each event's time from the pair's first event, in SM clocks.

Usage: python scripts/probe_d7.py [--shapes 1,2,4] [--variants full,no_mma] [--trace]"""
import argparse
import copy
import math

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from dsv4lib.bench import d7, time_graph
from dsv4lib.kernels.sm90 import model1_decode as md
from dsv4lib.kernels.sm90 import sparse_fwd as sf
from dsv4lib.kernels.common import L2_EVICT_LAST, inline_ptx
from dsv4lib.ops import decode, launch, sparse

ORIGINAL = dict(convert=md.e4m3x2_to_bf16x2, load_row=md.Model1DecodeSm90.load_row,
                fill=md.Model1DecodeSm90.fill_half_tile, gemm=sf.gemm, rope_lane=md.ROPE_LANE,
                slot=md.Model1DecodeSm90.producer_slot, pipes=md.Model1DecodeSm90.half_tile_pipelines,
                cute=md.cute,
                placed_max=md.PLACED_SCALE_MAX, crossover=decode.HEAD_PAIR_CLUSTER,
                regs=(md.Model1DecodeSm90.PAIRED_PRODUCER_REGS, md.Model1DecodeSm90.PAIRED_CONSUMER_REGS),
                store=sf.SparseAttentionForwardSm90.store_half, bf16_partials=sparse.PAIRED_BF16_PARTIALS,
                st_async=md.st_async_v4, peer_bytes=md.Model1DecodeSm90.peer_bytes,
                peer_convert=md.Model1DecodeSm90.convert_peer_rows)
# the kernel class's knobs a variant may set (part name → class attribute); a candidate patch's knob (off when the
# patch is not applied: the class has no such attribute) is set only where the class has it or a variant turns it on
KNOBS = dict(pdl_chain="PDL_CHAIN", o_policy="O_L2_POLICY",
             alternate="ALTERNATE_HALF_TILES", alternate_early="ALTERNATE_EARLY_RECORDS", load_attributes="NOPE_LOAD_ATTRIBUTES", staged_indices="STAGED_INDICES",
             staged_rows="STAGED_ROWS", two_slots="TWO_SLOTS_WITH_CROSSOVER", ring_late="RING_AFTER_ROPE_ARRIVE",
             peer_fp8="PEER_FP8")
ORIGINAL.update({part: getattr(md.Model1DecodeSm90, attr, False) for part, attr in KNOBS.items()})
SAME_BITS = ("full", "no_crossover", "no_pdl_chain", "no_l2_256", "nc_loads", "l1_no_allocate", "cg_loads",
             "register_indices", "staged_rows", "staged_rows_nx", "two_slots", "two_slots_late_ring", "alternate",
             "alternate_early", "peer_bf16")   # variants that must compute the shipped output


@dsl_user_op
def copy_word(word: Uint32, scale, high: bool, *, loc=None, ip=None) -> Uint32:
    return Uint32(word)


@cute.jit
def load_row_constant(self, records, scale_of, buf, b, h: cutlass.Constexpr, slot,
                      k: cutlass.Constexpr, raw, scale_bytes):
    group, lane, first_k = slot[:3]
    col = h * md.HALF + lane * md.COLS_PER_THREAD
    key = b * md.TILE_N + group + md.ROW_GROUPS * (first_k + k)
    scale_bytes[k] = Uint32(scale_of[col // 64, key, buf])
    for w in cutlass.range_constexpr(4):      # distinct run-time words: no conversion folded away
        raw[k, w] = scale_bytes[k] ^ Uint32(0x38383838 + w)


NV = cute.nvgpu
# the nope loads' CopyG2ROp attributes (NOPE_LOAD_ATTRIBUTES): session 37's open question — is the rows' wait the L1 /
# LSU path rather than the memory behind it: the read-only path (ld.global.nc), no L1 allocation, L2 only (.cg)
HINT = ORIGINAL["load_attributes"]


@cute.jit
def slot_t16(self, tidx):
    return tidx // 16, tidx % 16


def nothing(*args, **kwargs) -> None:
    """A switched-off part: called while the kernel is traced, it emits nothing (plain Python, any signature)."""


class EveryOtherPeerStore:
    """``st_async_v4`` for the first of each row's two 16-byte chunks only.  ``fill_rows`` is unrolled at trace time
    and stores chunk 0 then chunk 1 of every row, so the calls alternate; the toggle starts each trace at chunk 0
    (every fill makes an even number of calls)."""

    def __init__(self):
        self.second = False

    def __call__(self, *args, **kwargs) -> None:
        if not self.second:
            ORIGINAL["st_async"](*args, **kwargs)
        self.second = not self.second


def store_left_half_only(self, thr_pv, acc_O, mO, split, batch, token, head_group, half):
    """``store_half`` for the left column half only (a trace-time choice: ``half`` is a Python int there)."""
    if half == 0:
        sf.SparseAttentionForwardSm90.store_half(self, thr_pv, acc_O, mO, split, batch, token, head_group, half)


def pipe_like(pipe, name: str, **methods):
    """``pipe`` (a shipped half-tile pipeline) as an instance of a subclass of its own class with ``methods``
    replaced (each may call the shipped one as ``type(pipe).<name>``).  Why a subclass, not a wrapper object: when
    the kernel hands its pipes to a ``@cute.jit`` helper that branches at run time (``e0daedc``'s
    ``publish_half_tile`` did), the DSL carries a pipe through the branch field by field, as it carries the shipped
    class — a wrapper holding the pipe in a field did not survive it (operand does not dominate its use, session 34)."""
    probe = copy.copy(pipe)
    object.__setattr__(probe, "__class__", type(f"{name}{type(pipe).__name__}", (type(pipe),), methods))  # frozen too
    return probe


def early_release_pipe(pipe):
    """A half-tile pipeline whose consumer frees the buffer right after waiting for it; the release calls after the
    MMAs are no-ops.  Every half-tile is still waited for exactly once a pair and freed once (the arrival counts of
    the empty barriers hold, so no hang), but the producer may overwrite a buffer the wgmmas still read."""
    shipped = type(pipe)

    def consumer_wait(self, state):
        shipped.consumer_wait(self, state)
        shipped.consumer_release(self, state)

    return pipe_like(pipe, "EarlyRelease", consumer_wait=consumer_wait, consumer_release=nothing)


class _Forward:
    """Every attribute of ``inner`` but those given."""

    def __init__(self, inner, **replaced):
        self._inner, self._replaced = inner, replaced

    def __getattr__(self, name):
        return self._replaced[name] if name in self._replaced else getattr(self._inner, name)


# model1_decode's one fence.proxy.async is the producer's, after each half-tile's stores: the module sees a ``cute``
# whose ``arch.fence_proxy`` emits nothing (the consumers' fences are sparse_fwd's, a module of its own)
CUTE_WITHOUT_FENCE = _Forward(cute, arch=_Forward(cute.arch, fence_proxy=nothing))


def early_release(plain):
    """``half_tile_pipelines`` (a kernel class's method ``plain``) with :func:`early_release_pipe` for each (D6's
    probe uses it too)."""
    return lambda self, barriers: tuple(early_release_pipe(p) for p in plain(self, barriers))


VARIANTS = {
    "full": {},
    "fp32_convert": dict(placed_max=0),
    "no_convert": dict(convert=copy_word, placed_max=0),
    "no_gmem": dict(load_row=load_row_constant),
    "no_rope": dict(rope_lane=16),
    "lane_t16": dict(slot=slot_t16),
    "no_l2_256": dict(load_attributes={}),
    "nc_loads": dict(load_attributes={**HINT, "invariant": True}),
    "l1_no_allocate": dict(load_attributes={**HINT, "l1c_evict_priority": NV.CacheEvictionPriority.NO_ALLOCATE}),
    "cg_loads": dict(load_attributes={**HINT, "load_cache_mode": NV.LoadCacheMode.GLOBAL}),
    "register_indices": dict(staged_indices=False),
    "staged_rows": dict(staged_rows=True),
    "staged_rows_nx": dict(staged_rows=True, crossover=False),
    "two_slots": dict(two_slots=True),
    "two_slots_late_ring": dict(two_slots=True, ring_late=True),
    "no_crossover": dict(crossover=False),
    "no_pdl_chain": dict(pdl_chain=False),
    "regs216": dict(regs=(72, 216)),
    "early_release": dict(pipes=early_release(ORIGINAL["pipes"])),
    "no_fence": dict(cute=CUTE_WITHOUT_FENCE),
    "idle_producer": dict(load_row=nothing, fill=nothing),
    "no_mma": dict(gemm=nothing),
    # H128: the crossover's peer stores (16 KB of bf16 a half-tile into the other CTA over DSMEM) removed, or halved;
    # the buffers' releases still couple the two CTAs (is the cluster network's bandwidth the H128 chain?)
    # (both on the bf16 peer stores, PEER_FP8 off: the build they were measured on, session 43)
    "no_peer_store": dict(peer_fp8=False, st_async=nothing, peer_bytes=lambda self, h: 0),
    "half_peer_store": dict(peer_fp8=False, st_async=EveryOtherPeerStore(),
                            peer_bytes=lambda self, h: ORIGINAL["peer_bytes"](self, h) // 2),
    # the crossover before PEER_FP8: each CTA ships its rows converted (bf16, 32 B a row and lane), not as e4m3
    # bytes the peer converts; right
    "peer_bf16": dict(peer_fp8=False),
    # PEER_FP8's peer rows landed and waited for but left unconverted (garbage).  (Not waiting for them either is
    # not a variant: a CTA could then exit with the peer's stores still on their way into its shared memory.)
    "peer_no_convert": dict(peer_convert=nothing),
    "floor": dict(load_row=nothing, fill=nothing, gemm=nothing),
    # the O halves not written (the split's fp32 partials, 128 KB a CTA at H64 — the build before session 41's bf16
    # partials — or the bf16 output): what the epilogue's register-to-global stores cost (B1: 10 CTAs each storing
    # 64 x 512 fp32 from the accumulators)
    "no_partial_store": dict(bf16_partials=False, store=nothing),
    # only the left warpgroup's half written (64 KB of the 128 KB fp32 partial a CTA at H64): whether the store's
    # cost at B1 (3.6 µs of 13, session 40) scales with its bytes (it did, session 41: 11.4 µs)
    "half_partial_store": dict(bf16_partials=False, store=store_left_half_only),
    # the split partials in fp32 from the accumulators (the build before session 41) against the shipped bf16
    # partials by the output's TMA epilogue; right to bf16 rounding, not bit-equal
    "fp32_partials": dict(bf16_partials=False),
    # O's TMA stores (the output and the bf16 partials) evict-last instead of evict-first: the combine reads the
    # partials right after
    "o_evict_last": dict(o_policy=L2_EVICT_LAST),
    # the candidate ALTERNATE_HALF_TILES (d7_alternate_half_tiles.patch): the H128 crossover split by half-tile, 8 rows
    # of loads in flight a producer thread (the shipped crossover: 4); right
    "alternate": dict(alternate=True),
    # ... with its refinement ALTERNATE_EARLY_RECORDS (three record slots: rank 0 reloads behind its (1, R)); right
    "alternate_early": dict(alternate=True, alternate_early=True),
}


TRACE_CTAS, TRACE_PAIRS, EVENTS = 512, 16, ("acquired", "committing", "waited", "releasing")
HALF_TILES = ("(0,L)", "(0,R)", "(1,L)", "(1,R)")       # pipeline i = 2 b + h; printed in the producer's fill order
FILL_ORDER = (0, 3, 1, 2)


@dsl_user_op
def clock64(*, loc=None, ip=None) -> Int64:
    return inline_ptx(T.i64(), Int64, [], "mov.u64 $0, %clock64;", "=l", loc, ip, side_effects=True)


@cute.jit
def traced_cta():
    """This CTA's flat index, and whether this thread stamps: the first thread of a warpgroup, in a traced CTA."""
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = (bz * gy + by) * gx + bx
    return cta, tidx % 128 == 0 and cta < TRACE_CTAS


@cute.jit
def stamp(address: cutlass.Constexpr, pipe: cutlass.Constexpr, event: cutlass.Constexpr, pair):
    cta, stamps = traced_cta()
    if stamps and pair < TRACE_PAIRS:
        buf = cute.make_tensor(cute.make_ptr(Int64, Int64(address), cute.AddressSpace.gmem, assumed_align=8),
                               cute.make_layout((16, TRACE_PAIRS, TRACE_CTAS)))
        buf[event * 4 + pipe, pair, cta] = clock64()


def traced_pipe(pipe, i: int, address: int):
    """A half-tile pipeline (number ``i``) whose four calls stamp the clock (the acquire / wait after, the commit /
    release before)."""
    shipped = type(pipe)

    def producer_acquire(self, state):
        shipped.producer_acquire(self, state)
        stamp(address, i, 0, state.count)

    def producer_commit(self, state):
        stamp(address, i, 1, state.count)
        shipped.producer_commit(self, state)

    def producer_get_barrier(self, state):     # the rope lanes' arrive (cp.async.mbarrier.arrive.noinc) follows
        stamp(address, i, 1, state.count)
        return shipped.producer_get_barrier(self, state)

    def consumer_wait(self, state):
        shipped.consumer_wait(self, state)
        stamp(address, i, 2, state.count)

    def consumer_release(self, state):
        stamp(address, i, 3, state.count)
        shipped.consumer_release(self, state)

    return pipe_like(pipe, "Traced", producer_acquire=producer_acquire, producer_commit=producer_commit,
                     producer_get_barrier=producer_get_barrier, consumer_wait=consumer_wait,
                     consumer_release=consumer_release)


ROW_SLOTS = 32                   # (half-tile 2 b + h) x row k (8 a thread; 4 with the H128 crossover)
# while a traced build is compiled: the row stamps' buffer address and the load_row the stamps wrap (the variant's)
ROW_TRACE = {"address": 0, "load_row": None}


@cute.jit
def stamp_row(slot_index):
    cta, stamps = traced_cta()
    if stamps:
        buf = cute.make_tensor(cute.make_ptr(Int64, Int64(ROW_TRACE["address"]), cute.AddressSpace.gmem,
                                             assumed_align=8), cute.make_layout((ROW_SLOTS, TRACE_CTAS)))
        buf[slot_index, cta] = clock64()


@cute.jit
def load_row_stamped(self, records, scale_of, buf, b, h: cutlass.Constexpr, slot, k: cutlass.Constexpr, raw,
                     scale_bytes):
    """The traced variant's ``load_row`` after a clock stamp: a fill calls it for row k right after converting and
    storing its row k (the row's next load), so the stamp is "row k of this fill done"; the slot is the half-tile the
    load is for (the next fill's), overwritten each pair — the last pair's times remain."""
    stamp_row((b * 2 + h) * 8 + k)
    ROW_TRACE["load_row"](self, records, scale_of, buf, b, h, slot, k, raw, scale_bytes)


def traced(plain, buf: torch.Tensor):
    """``half_tile_pipelines`` (a kernel class's method ``plain``) with :func:`traced_pipe` for each, stamping into
    ``buf`` (int64 ``[TRACE_CTAS, TRACE_PAIRS, 16]``; D6's probe uses it too)."""
    return lambda self, barriers: tuple(traced_pipe(p, i, buf.data_ptr()) for i, p in enumerate(plain(self, barriers)))


def trace(case) -> None:
    buf = torch.zeros(TRACE_CTAS, TRACE_PAIRS, 16, dtype=torch.int64, device="cuda")
    rows = torch.zeros(TRACE_CTAS, ROW_SLOTS, dtype=torch.int64, device="cuda")
    plain, plain_load_row = md.Model1DecodeSm90.half_tile_pipelines, md.Model1DecodeSm90.load_row
    ROW_TRACE.update(address=rows.data_ptr(), load_row=plain_load_row)
    md.Model1DecodeSm90.half_tile_pipelines = traced(plain, buf)
    md.Model1DecodeSm90.load_row = load_row_stamped
    launch._COMPILED.clear()
    try:
        d7.ours_fn(case)(*case.sets[0])
        torch.cuda.synchronize()
        buf.zero_()
        rows.zero_()
        d7.ours_fn(case)(*case.sets[1])
        torch.cuda.synchronize()
    finally:
        md.Model1DecodeSm90.half_tile_pipelines = plain
        md.Model1DecodeSm90.load_row = plain_load_row
        launch._COMPILED.clear()
    t, used = stamped_ctas(buf)
    row_times(t, rows[used].double(), case)
    print_pairs(t, f"trace B{case.B} H{case.H}")


def stamped_ctas(buf: torch.Tensor):
    """The stamps of the CTAs that stamped, as (cta, pair, event, pipe) float64, and which CTAs those were."""
    t = buf.view(TRACE_CTAS, TRACE_PAIRS, 4, 4).double()        # (cta, pair, event, pipe)
    used = t[:, 0].amax(dim=(1, 2)) > 0
    return t[used], used


def print_pairs(t: torch.Tensor, title: str) -> None:
    """Each pair's four half-tiles' events (median over CTAs, SM clocks from the pair's first event) and when the
    pair began (from the CTA's first event); the CTAs' spans.  A pair only the pipelines' tail acquired (no commit
    stamped) ends the table."""
    print(f"{title}: {t.shape[0]} CTAs, SM clocks from the pair's first event (median)")
    stamped = t.where(t > 0, float("nan")).flatten(1)
    span = stamped.nan_to_num(-float("inf")).amax(1) - stamped.nan_to_num(float("inf")).amin(1)
    q = torch.quantile(span, torch.tensor([0.0, 0.5, 0.9, 1.0], dtype=span.dtype, device=span.device)).tolist()
    print("  CTA span first → last event, clocks: min %.0f  median %.0f  p90 %.0f  max %.0f" % tuple(q))
    kernel0 = t[:, 0].where(t[:, 0] > 0, float("inf")).amin(dim=(1, 2))
    for p in range(TRACE_PAIRS):
        if not bool((t[:, p, 0, 0] > 0).all() and (t[:, p, 1, 0] > 0).all()):
            break
        first = t[:, p].where(t[:, p] > 0, float("inf")).amin(dim=(1, 2))
        rel = (t[:, p] - first.view(-1, 1, 1)).median(dim=0).values
        cells = "  ".join(f"{HALF_TILES[i]} " + "/".join(f"{rel[e, i]:6.0f}" for e in range(4)) for i in FILL_ORDER)
        begin = (first - kernel0).median().item()
        print(f"  pair {p}: at {begin:7.0f}  [acq/commit/wait/release]  {cells}")


def row_times(t, rows, case) -> None:
    """Inside each fill of the last full pair: when each of thread 0's rows was converted and stored (its next load
    issued), from the fill's acquire to its commit — a long first row is the wait for the row's bytes (load latency),
    evenly spaced rows the fill's own work."""
    committed = t[:, :, 1, 0] > 0                                    # (cta, pair): (0, L) committed
    last = (committed.long() * torch.arange(TRACE_PAIRS, device=t.device)).amax(1)
    pair = t[torch.arange(t.shape[0], device=t.device), last]      # (cta, event, pipe)
    n_rows = md.ROWS_PER_THREAD // (md.HEAD_PAIR if case.H == 128 and decode.HEAD_PAIR_CLUSTER else 1)
    print(f"  rows of the last full pair (median over CTAs; clocks from the fill's acquire; thread 0, {n_rows} rows):")
    for j, i in enumerate(FILL_ORDER):
        nxt = FILL_ORDER[(j + 1) % 4]                                # its rows' stamps sit in the next fill's slot
        acq = pair[:, 0, i]
        done = rows[:, nxt * 8: nxt * 8 + n_rows] - acq.view(-1, 1)
        commit = pair[:, 1, i] - acq
        cells = " ".join(f"{x:6.0f}" for x in done.median(dim=0).values.tolist())
        print(f"    {HALF_TILES[i]}  rows done {cells}   commit {commit.median().item():6.0f}")


_APPLIED = [None]          # the variant the kernel class is patched as now (and its builds compiled for)


def apply(variant: str) -> None:
    if variant == _APPLIED[0]:    # the same patches: keep its builds (no recompile of ``full`` after the reference)
        return
    _APPLIED[0] = variant
    parts = {**ORIGINAL, **VARIANTS[variant]}
    md.e4m3x2_to_bf16x2 = parts["convert"]
    md.Model1DecodeSm90.load_row = parts["load_row"]
    md.Model1DecodeSm90.fill_half_tile = parts["fill"]
    sf.gemm = parts["gemm"]
    md.ROPE_LANE = parts["rope_lane"]
    md.Model1DecodeSm90.producer_slot = parts["slot"]
    md.Model1DecodeSm90.half_tile_pipelines = parts["pipes"]
    md.cute = parts["cute"]
    md.PLACED_SCALE_MAX = parts["placed_max"]
    decode.HEAD_PAIR_CLUSTER = parts["crossover"]
    md.Model1DecodeSm90.PAIRED_PRODUCER_REGS, md.Model1DecodeSm90.PAIRED_CONSUMER_REGS = parts["regs"]
    md.Model1DecodeSm90.store_half = parts["store"]
    sparse.PAIRED_BF16_PARTIALS = parts["bf16_partials"]
    md.st_async_v4 = parts["st_async"]
    md.Model1DecodeSm90.peer_bytes = parts["peer_bytes"]
    md.Model1DecodeSm90.convert_peer_rows = parts["peer_convert"]
    launch._CONFIGS.clear()
    for part, attr in KNOBS.items():
        if parts[part] or hasattr(md.Model1DecodeSm90, attr):
            setattr(md.Model1DecodeSm90, attr, parts[part])
    launch.forget_plans()
    launch._COMPILED.clear()


def hangs(variant: str, case) -> bool:
    """A variant whose producer fills nothing waits forever at H = 128 with the crossover: the half-tile barriers
    expect the peer CTA's transaction bytes."""
    idle = VARIANTS[variant].get("fill") is nothing
    return idle and case.H == 128 and decode.HEAD_PAIR_CLUSTER          # as apply(variant) set it


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,4", help="indices into bench.d7.SHAPES, or BxHxWINxCMP (4096x64x128x512: "
                    "the FP8-cache prefill's shape as decode rows, the build sparse_prefill runs)")
    ap.add_argument("--variants", default=None, help="comma-separated (default: all; with --trace: full)")
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window = d7.filled_cache(256 << 10, 64, gen)
    compressed = d7.filled_cache(512 << 10, 64, gen)
    shapes = [d7.parse_shape(i) for i in args.shapes.split(",")]
    cases = [d7.make_case(*shape, window, compressed, sets=4 if shape[0] > 256 else 8) for shape in shapes]
    if args.trace:                 # of the first variant named (full by default)
        apply((args.variants or "full").split(",")[0])
        for c in cases:
            trace(c)
        apply("full")
        return
    variants = (args.variants or ",".join(VARIANTS)).split(",")
    # each row as soon as it is measured (flushed): a run cut off by its time limit still shows what it measured
    print(f"{torch.cuda.get_device_name()}: device µs per call (graph replay)", flush=True)
    print(f"{'variant':<14}" + "".join(f"  B{c.B:<3} H{c.H:<4}" for c in cases), flush=True)
    apply("full")
    want = {(c.B, c.H): d7.ours_fn(c)(*c.sets[0]).clone() for c in cases}
    for v in variants:
        apply(v)
        if v in SAME_BITS:          # a candidate that misses is still timed (and said so), not a crash
            for c in cases:
                got = d7.ours_fn(c)(*c.sets[0])
                if not torch.equal(got, want[c.B, c.H]):
                    diff = (got.float() - want[c.B, c.H].float()).abs()
                    print(f"{v} B{c.B} H{c.H}: NOT the shipped bits (max |diff| {diff.nan_to_num(1e9).max().item():.3g},"
                          f" {int(got.isnan().sum())} NaN)", flush=True)
        row = [math.nan if hangs(v, c) else time_graph(d7.ours_fn(c), c.sets).per_call_ms * 1e3 for c in cases]
        print(f"{v:<14}" + "".join(f"  {t:9.1f}" if t == t else f"  {'-':>9}" for t in row), flush=True)
    apply("full")


if __name__ == "__main__":
    main()
