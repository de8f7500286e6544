"""D1 on Hopper: flash-attention forward in CuTeDSL with P kept on chip (RS-wgmma).

One CTA computes a ``tile_m``-row block of queries (128, or 192 with three consumer warpgroups) for one
(batch, query head):

* warpgroup 0 is the **producer**: warp 0 issues the TMA loads (Q once, then K and V tiles through two
  ``num_stages``-deep mbarrier pipelines); it gives its registers away (``setmaxnreg.dec``).
* warpgroups 1, 2 (and 3 when ``tile_m = 192``) are **consumers**, 64 query rows each: ``S = Q·Kᵀ`` with an SS-wgmma, masking,
  online softmax on the accumulator registers, ``P`` converted to bf16 *in the registers that hold S*
  (the D1.3 proof: for bf16 the accumulator and the RS operand share one thread/value layout), and
  ``O += P·V`` with an RS-wgmma.  P never touches shared memory.

**SMEM-P twin** (``p_in_smem=True``): P is written to a swizzled shared buffer ``sP`` and the PV MMA is an
SS-wgmma.  Where each accumulator element goes is ``thr_mma_qk.partition_C(sP)`` — the layout algebra of
D1.3 (``composition(sP, tv_C)``), proven a bijection there — with the swizzle in the pointer, so the stores
land where the hardware reads.  Each warpgroup writes and reads only its own 64 rows, so one named barrier
per warpgroup (after a generic→async proxy fence) orders the stores before the wgmma.

**D5a, sliding window + sink** (``window=True`` / ``sink=True``): with a window W a query at key position t
sees keys ``t-W < s <= t``; KV tiles wholly left of the window are *skipped* (the loop starts at
``n_block_min``), only the tiles crossing its edges are masked.  The sink is a value-less logit per query head
added once to the final denominator (``exp(σ - m)`` next to the row sum); the LSE excludes it.

**Intra-warpgroup overlap** (``overlap=True``, RS path; the default since it was measured faster at every head dim): QK of the next tile and
PV of the current one are issued back to back; ``wait_group(1)`` retires the QK, the softmax of the next tile
runs while the PV wgmma is in flight, ``wait_group(0)``, then O is rescaled and P converted (O and P's
registers are untouched while a wgmma may read them).

**NVFP4-1.1/1.2, fused output** (``nvfp4_out=True``): the epilogue quantizes the fp32-normalized O straight
from the accumulator registers.  In the wgmma C layout each thread of a quad holds columns (2t, 2t+1) and
(8+2t, 9+2t) of every 16-column block — two whole packed bytes — so the block amax is one quad shuffle-reduce
and every byte is packed by the thread that owns its two values (no shared-memory staging); the quad's lane 0
writes the e4m3 scale byte.  Numerics: TE order from the fp32 O (not from a bf16-rounded O).

**D2, split-KV** (``split_kv=True``): the CTA grid gets a split index (``blockIdx.z = batch·splits + split``);
split i takes its share of the visible KV tiles (``dsv4lib.splitkv.split_block_ranges``) and writes an fp32
partial O normalized over its own keys plus its LSE — no sink: the combine kernel applies it once.

**Epilogue.**  bf16 O leaves by ``stmatrix`` into the Q buffer (each warpgroup's 64 rows are the rows its own QK
read, all retired) and one TMA store of the tile, not by 4-byte register stores (D5 W128 hd128 on the H100: 83 →
123 TFLOP/s; D1 hd128 665 → 690).

**64-row tile** (``tile_m=64``): one consumer warpgroup, built for two CTAs per SM (``minnctapersm 2``: 128
registers a thread at launch, 24 / 232 after setmaxnreg; the shared memory is checked to fit half an SM).  The
small-window default (``dsv4lib.attention.SM90_SMALL_WINDOW_TUNING``): there one CTA's loads and stores overlap
the other's MMAs.

**Persistent CTAs** (``persistent=True``; the small-window and hd128 default, ``dsv4lib.attention``):
``ctas_per_sm · num_sms`` CTAs walk the query blocks; two Q stages and a separate O buffer let the producer load
the next block while the consumers finish this one, and the O store of a block is waited for only when the next
block needs the buffer.  **Dynamic schedule** (``dynamic_schedule=True``): a CTA's first block is its blockIdx.x,
every later one ``gridDim.x`` + a global counter's next value (``atom.add`` by the producer, issued while the
current block's K/V load, so its latency hides); the producer writes the block into ``sWork`` next to its Q stage
before the stage's full barrier is armed (the arrive is a release), and after the last block it completes the
next stage's barrier with a plain arrive and -1 in ``sWork``, which ends the consumers' loop.  The last producer
to finish (a second counter) zeroes both counters for the next launch.  Under a causal mask or a window the last
query blocks of a head come first (longest first).  Why: a static deal ends with the slowest CTAs, and CTAs doing
the same work differ by ~10 % (the SMs the memory system serves last; DSV4_D1_DEBUG=times stamps).

**Window ring** (``ring=True``, small windows; a knob — measured slower than the persistent build, see
``dsv4lib.attention.SM90_RING_TUNING``): each CTA (one per SM, two consumer warpgroups, 128-row items of 64-row
halves; or two CTAs per SM with 64-row items) walks a *chunk* of consecutive items of one head, and the producer streams that head's K/V tiles
once, in key order, into a ring of ``num_stages`` stages.  A 64-row half of W = 128 needs its own tile and the two
before it, so two of every three tiles are already in shared memory from the previous half: each tile is read from
L2 once per chunk instead of three times.  A warpgroup visits its tiles in ascending order and hands a tile back as
soon as its *next* half no longer needs it; the stage and phase of a tile follow from its position in the chunk's
stream (``ring_state``).  O is staged in the item's own Q stage; a *storer* warp (an idle producer warp) takes it
from there: it waits on a named barrier the consumers only arrive at, issues the TMA store, waits for its read and
hands the Q stage back to the producer.  No consumer ever waits for a store (waiting in a consumer warp stalled its
warpgroup's next wgmma by the store's drain time, ~1 µs an item on the H200).  Q is double-buffered, so the next
item's Q was loaded while this one computed.  The 64-row ring has room for one Q stage only; with
``q_in_registers`` its QK is an RS-wgmma: each item copies the next item's Q from the stage into registers before
its O is staged there, so Q(u+1) loads during item u instead of after O(u) is stored (197 → 170 µs on the H200).

**Warpgroup tiles** (``warpgroup_tiles=True``; hd128's small-window default, ``dsv4lib.attention``): a persistent
128-row tile of two consumer warpgroups at W = 128 needs 4 key tiles of 64, but each warpgroup's 64 rows see only
3 of them (the lower half not the last, the upper half not the first).  The producer loads the tile's slots in the
order [upper half's own | shared | lower half's own] (``warpgroup_plan``); the upper warpgroup visits the leading
slots and skips the last, the lower one skips the first — a skipped slot is waited for and released with no wgmma.
So the tile loads 4 K/V tiles per 128 rows where two 64-row blocks load 6, and no warpgroup computes a wholly
masked tile.  With ``split_epilogue`` each warpgroup stores its own 64 rows (its half of sO, its own TMA store,
a 128-thread barrier), so the upper half's epilogue runs beside the lower half's last tile.  The default since
session 16 is the same plan over a **192-row tile** of three consumer warpgroups (the slots: one run of key tiles
descending from the top warpgroup's last; each warpgroup skips those above and below its own 3): 5 K/V tiles per 192
rows, and each warpgroup decides which tiles to mask from its own 64 rows (``mask_row``).

**O in its Q stage** (``o_in_q_stage``, persistent): the consumers put O into the item's own Q stage (each
warpgroup its 64 rows, whose QKs have all retired), arrive on that stage's named barrier and go on; an idle producer
warp (``store_persistent``) waits there, TMA-stores the tile, waits for the store's read and hands the stage back to
the producer.  No O buffer (the 192-row tile's two 48 KB Q stages and 4 K/V stages fit only so) and no consumer
waits for a store.  **L2 hints** (``l2_hints``): Q's loads and O's stores evict first, K/V's loads evict last.

**Cluster pairs** (``cluster_pairs=True``, persistent with a static deal; a knob — measured slower, see
``dsv4lib.attention.SM90_SMALL_WINDOW_TUNING``): the two CTAs of a (2, 1, 1) cluster take two adjacent query blocks
of one head.  At W = 128 with 64-row blocks, block u visits key tiles u-2..u and block u+1 visits u-1..u+1: two of
each block's three tiles are the pair's.  Both CTAs walk the same sequence of K/V *slots* (``pair_plan``): the
shared tiles first — each CTA TMAs half of the tile with ``.multicast::cluster`` into both CTAs' shared memory, so
the L2 serves it once — then each CTA's own tiles, loaded by it alone, then empty slots where it has fewer own
tiles than its peer (the full barrier completed by a plain arrive).  A stage is refilled only when the consumers of
both CTAs have released it (every consumer warp arrives on the stage's empty barrier in both CTAs), so the two
CTAs run in step, two stages apart at most.  The pair's L2 traffic for K/V drops from 6 tiles to 4 (ncu, H200: L2
throughput 88 → 77 % of peak), but the step-lock across two SMs costs more than that saves.

KV tiles are visited from the last to the first, so the tiles that need masking (the ragged end of the
keys, the causal diagonal) come first.  The running row max is kept in raw-score units and the softmax
scale is applied inside ``exp2`` (the seed's double-scaling trap); O is rescaled by
``exp2((m_old - m_new)·scale·log2e)`` on every tile; the final normalization uses the row sum of the very
row each thread owns.  Each K/V TMA is indexed by the loop's KV block, never stuck on tile 0.
"""
from __future__ import annotations

import math
import os

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint8, Uint32, const_expr, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum

from ..common import (L2_EVICT_FIRST, L2_EVICT_LAST, convert_to_bf16_pairs, item_stamp, launch_stream,
                      load_kv_tiles, tma_copy, tma_load_tile, tma_store_tile)
from ..nvfp4 import e2m1_code_magic, nvfp4_block_scale

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


def acc_layout_rows_cols(acc_layout: cute.Layout) -> cute.Layout:
    """View a wgmma accumulator fragment ``((2, 2, V), MMA_M, MMA_N)`` as ``(rows, cols)`` of this thread:
    rows = ((2: row +8), MMA_M), cols = ((2: adjacent column), V, MMA_N).  Same registers, new coordinates."""
    flat = cute.make_layout(acc_layout.shape)                            # column-major over the fragment
    shape = ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[0][2], flat.shape[2]))
    stride = ((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[0][2], flat.stride[2]))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def acc_layout_as_operand_a(acc_layout: cute.Layout) -> cute.Layout:
    """View the QK accumulator ``((2, 2, V), MMA_M, MMA_N)`` as the PV RS-wgmma A fragment
    ``((2, 2, 2), MMA_M, (V/2, MMA_N))``: each 16-column k-block takes two 8-column accumulator groups.
    Proven a same-thread re-view for bf16 by ``dsv4lib.layouts`` (D1.3)."""
    split = cute.logical_divide(acc_layout, ((None, None, 2), None, None))   # ((2, 2, (2, V/2)), M, N)
    s, d = split.shape, split.stride
    return cute.make_layout(((s[0][0], s[0][1], s[0][2][0]), s[1], (s[0][2][1], s[2])),
                            stride=((d[0][0], d[0][1], d[0][2][0]), d[1], (d[0][2][1], d[2])))


def row_major_smem_layout(dtype, rows: int, cols: int, stages: int | None = None):
    """A ``(rows, cols[, stages])`` shared buffer, columns contiguous, in the widest swizzle atom that fits
    ``cols`` (128 B for bf16 ≥ 64 columns): the K-major operand layout of wgmma, stages outermost."""
    atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    return cute.tile_to_shape(atom, shape, order=(0, 1) if stages is None else (0, 1, 2))


def transposed_view(dims: int, rows: int, stages: int):
    """``(dims, rows, stages) → (rows, dims, stages)`` coordinates: composed with a ``(rows, dims, stages)``
    row-major buffer it reads that buffer as ``(dims, rows, stages)`` — V stored like K, seen MN-major by the PV
    wgmma.  (``dsv4lib.layouts.kv_alias`` proves the composition puts every element where it belongs.)"""
    return cute.make_ordered_layout((dims, rows, stages), order=(1, 0, 2))


def default_tile_n(head_dim: int) -> int:
    """KV tile width of a plain build: 128, or 64 at hd256 (where 128 would not leave two K/V stages in smem)."""
    return 64 if head_dim == 256 else 128


class Sm90AttentionOps:
    """The wgmma issue and the online softmax, shared by the Hopper attention kernels of this package."""

    debug_nomma = False          # timing probe (DSV4_D1_DEBUG=nomma in the D1 kernel): the wgmmas left out
    debug_times = False          # timing probe (per-item %globaltimer stamps, timing_stamp); set by a kernel's knob

    @cute.jit
    def timing_stamp(self, mLSE, item_count, k: cutlass.Constexpr, cond=True):
        """debug_times builds only: :func:`dsv4lib.kernels.common.item_stamp` into the LSE buffer (left unwritten by
        such a build: pass return_lse=True and read its bytes) where ``cond`` holds.  What stamp ``k`` marks is the
        kernel's own (its ``debug_times`` comment)."""
        if const_expr(self.debug_times):
            if cond:
                item_stamp(mLSE, item_count, k)

    @cute.jit
    def gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
             zero_init: cutlass.Constexpr, wait: cutlass.Constexpr = True, k_blocks: cutlass.Constexpr = None):
        """acc (+)= A·B over every k-block (or the ``k_blocks = (lo, hi)`` range of them) as one wgmma group;
        then wait for it unless ``wait=False``."""
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
        k_range = k_blocks
        if const_expr(k_blocks is None):
            k_range = (0, cute.size(tCrA.shape[2]))
        for k in cutlass.range_constexpr(k_range[0], k_range[1]):
            if const_expr(not self.debug_nomma):
                cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
            atom.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        if const_expr(wait):
            warpgroup.wait_group(0)

    @cute.jit
    def rescale_rows(self, acc_O_rc, corrections):
        for r in cutlass.range_constexpr(cute.size(corrections)):
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * corrections[r]

    @cute.jit
    def online_softmax(self, acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections,
                       rescale_now: cutlass.Constexpr, floor_max=None):
        """Scores → unnormalized probabilities in place, one row at a time (a row is shared by the 4 threads
        of a quad).  The max stays in raw-score units; the scale lives inside exp2.  With ``rescale_now`` O is
        rescaled right away; otherwise the corrections are kept for after the in-flight PV wgmma.  ``floor_max``
        (per row, optional): a max the new one may not fall below (another warpgroup's, already ahead)."""
        # one dependent fmax / fadd chain per row: FA4's four chains joined by a tree measured no gain on the H200
        # (session 12, hd128, three interleaved rounds, µs, 1 / 4 / 8 chains: D1 3106-3541 / 3143-3390 / 3345-3407,
        # W4096 1482-1552 / 1499-1514 / 1527-1543) — the other consumer warpgroup hides the chain's latency; re-measured
        # in session 14 with the PV wait below the softmax (pv_wait_block), 2 / 4 chains were slower still (ncu)
        for r in cutlass.range_constexpr(cute.size(row_max)):
            mx = acc_S_rc[r, 0]
            for c in cutlass.range_constexpr(1, cute.size(acc_S_rc, mode=[1])):
                mx = cute.arch.fmax(mx, acc_S_rc[r, c])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
            new_max = cute.arch.fmax(row_max[r], mx)
            if const_expr(floor_max is not None):
                new_max = cute.arch.fmax(new_max, floor_max[r])
            base = new_max * softmax_scale_log2
            if new_max == -Float32.inf:
                base = Float32(0.0)                                   # nothing visible yet: keep zeros
            correction = cute.arch.exp2(row_max[r] * softmax_scale_log2 - base)
            row_max[r] = new_max
            tile_sum = Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                p = cute.arch.exp2(acc_S_rc[r, c] * softmax_scale_log2 - base)
                acc_S_rc[r, c] = p
                tile_sum += p
            row_sum[r] = row_sum[r] * correction + tile_sum
            if const_expr(rescale_now):
                for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                    acc_O_rc[r, c] = acc_O_rc[r, c] * correction
            else:
                corrections[r] = correction


def persistent_grid(work_items, slots):
    """CTAs of a persistent launch: at most ``slots`` (ctas_per_sm on every SM), and no more than needed for the
    same number of rounds — 8192 blocks on 264 slots take 32 rounds either way, but 264 CTAs leave 8 of them a
    32nd block while the rest idle (a 3 % tail), where 256 CTAs all finish after 32.  Works on Python ints and on
    the kernel's dynamic Int32s."""
    rounds = cutlass.max((work_items + slots - 1) // slots, 1)
    return (work_items + rounds - 1) // rounds


class FlashAttentionForwardSm90(Sm90AttentionOps):
    """Hopper forward attention, P in registers.  ``head_dim`` 64 / 128 / 256 (Dv = D), bf16."""

    # (producer, consumer) registers per thread after setmaxnreg, by number of consumer warpgroups: the whole
    # 64K-register file is shared out (128·24 + 256·240 = 128·32 + 384·160 = 64K); a 64-row tile (one consumer
    # warpgroup) takes half of it, so that two CTAs share an SM: 128·24 + 128·232 = 32K
    REGS_BY_CONSUMER_WARPGROUPS = {1: (24, 232), 2: (24, 240), 3: (32, 160)}
    SCHEDULER_BARRIER_BASE = 4           # named barriers 4.. order the consumer warpgroups' MMA issue (1..3: SMEM-P)
    EPILOGUE_BARRIER = 7                 # every consumer thread has put its O rows in shared memory
    HALF_EPILOGUE_BARRIER_BASE = 5       # split_epilogue: 5 + warpgroup (the ping-pong ids 4..6 serve non-persistent builds)
    RING_STORE_BARRIERS = 1              # the ring: named barriers 1, 2 (by Q stage; SMEM-P's ids, unused there)

    def __init__(self, head_dim: int, *, causal: bool, has_lse: bool, tile_n: int | None = None,
                 num_stages: int = 2, p_in_smem: bool = False, window: bool = False, sink: bool = False,
                 split_kv: bool = False, overlap: bool = False, nvfp4_out: bool = False, pack_gqa: int = 1,
                 tile_m: int = 128, wg_pingpong: bool = False, rescale_o_early: bool = False,
                 tma_store_o: bool = True, persistent: bool = False, num_sms: int = 132, ring: bool = False,
                 q_in_registers: bool = False, dynamic_schedule: bool = False, pv_wait_block: bool = False,
                 cluster_pairs: bool = False, warpgroup_tiles: bool = False, q_stages: int | None = None,
                 split_epilogue: bool = False, o_in_q_stage: bool = False, l2_hints: bool = False):
        if tile_m not in (64, 128, 192):
            raise ValueError(f"tile_m must be 64 (1 consumer warpgroup, two CTAs per SM), 128 (2) or 192 (3), "
                             f"got {tile_m}")
        if tile_m == 64 and head_dim > 128:
            raise ValueError(f"a 64-row tile shares its SM with a second CTA (at most 128 registers a thread at "
                             f"launch): head_dim {head_dim} does not fit; use tile_m=128")
        if pack_gqa < 1 or tile_m % pack_gqa:
            raise ValueError(f"pack_gqa (q heads per KV head packed into M) must divide the {tile_m}-row tile, "
                             f"got {pack_gqa}")
        if (wg_pingpong or rescale_o_early) and not overlap:
            raise ValueError("wg_pingpong / rescale_o_early shape the overlapped mainloop: they need overlap=True")
        if pack_gqa > 1 and nvfp4_out:
            raise ValueError("the NVFP4 epilogue is built for unpacked rows (pack_gqa=1)")
        if nvfp4_out and split_kv:
            raise ValueError("the NVFP4 output is written by the final kernel, not by split-KV partials")
        if overlap and p_in_smem:
            raise ValueError("the intra-warpgroup overlap is built for the RS path (P in registers) only")
        if split_kv and sink:
            raise ValueError("with split-KV the sink belongs to the combine kernel, not to the splits")
        if head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim {head_dim} not supported by the sm90 kernel (64, 128, 256)")
        self.head_dim = head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.tile_m = tile_m
        self.tile_n = tile_n or default_tile_n(head_dim)
        self.consumer_warpgroups = tile_m // 64
        # a 64-row tile is built to share its SM with a second CTA (registers halved, shared memory checked below)
        self.ctas_per_sm = 2 if tile_m == 64 else 1
        self.NUM_THREADS = 128 * (1 + self.consumer_warpgroups)    # producer warpgroup + consumer warpgroups
        self.PRODUCER_REGS, self.CONSUMER_REGS = self.REGS_BY_CONSUMER_WARPGROUPS[self.consumer_warpgroups]
        # Ping-pong: the consumer warpgroups take turns issuing their QK + PV wgmmas (named barriers), so one's
        # softmax runs while the other's MMAs own the tensor cores instead of both colliding.
        self.wg_pingpong = wg_pingpong
        # Rescale O by the previous tile's correction while QK(j+1) is in flight, before PV(j) is issued (instead
        # of after PV(j) retires, where the multiplies sit between two MMA issues).
        self.rescale_o_early = rescale_o_early
        # The overlapped mainloop's PV wait in a basic block of its own, its V release one tile later (see
        # mainloop_overlapped).  Session 13, H200: under ncu hd128 D1 / causal / W4096 3.79 / 2.08 / 1.87 → 3.76 /
        # 2.02 / 1.78 ms (FA4 3.63 / 2.00 / 1.77); at boost clocks in the pipeline hd64 D1 497 → 462 TFLOP/s and the
        # small-window builds 2-6 % slower.  On for hd128 only (dsv4lib.attention.SM90_TUNING, session 14).
        self.pv_wait_block = pv_wait_block and overlap
        self.num_stages = num_stages
        self.p_in_smem = p_in_smem
        self.has_window = window
        self.has_sink = sink
        self.split_kv = split_kv
        self.overlap = overlap
        self.nvfp4_out = nvfp4_out
        self.pack_gqa = pack_gqa
        # bf16 O leaves through shared memory (stmatrix into the dead Q buffer, one TMA store per tile) instead of
        # 4 B register stores; the fp32 split partials and the NVFP4 bytes keep their register stores.
        self.tma_store_o = tma_store_o and not split_kv and not nvfp4_out
        # Persistent CTAs (``persistent``): a grid of ``ctas_per_sm · num_sms`` CTAs, each walking query blocks
        # blockIdx.x, + gridDim.x, …; the producer loads the next block's Q (two Q stages) and K/V while the consumers
        # still work on this one, and O leaves through its own buffer ``sO`` by a TMA store nobody waits for until
        # the next block's O needs the buffer.  What a CTA spends on its prologue and epilogue is then hidden
        # behind the neighbouring blocks' loads and MMAs — the small-window case, where a block has 2-3 KV tiles.
        # (the NVFP4 epilogue stores from the registers: no sO, nothing to wait for)
        if persistent and not (overlap and (self.tma_store_o or nvfp4_out) and not p_in_smem and not wg_pingpong):
            raise ValueError("persistent CTAs are built for the overlapped RS mainloop with the bf16 TMA-store or the "
                             "NVFP4 epilogue (no split-KV, SMEM-P or ping-pong)")
        self.persistent = persistent
        # Dynamic persistent schedule (``dynamic_schedule``): the producer takes the next work item from a global
        # counter instead of every gdim-th one, so CTAs on SMs that are served faster (or alone on their SM) take
        # more items — a static deal ends with the slowest CTAs (module docstring)
        if dynamic_schedule and not persistent:
            raise ValueError("dynamic_schedule deals the work items of persistent CTAs: it needs persistent=True")
        self.dynamic_schedule = dynamic_schedule
        # Cluster pairs (``cluster_pairs``): the two CTAs of a (2, 1, 1) cluster take two adjacent query blocks of one
        # head and the K/V tiles both blocks visit are loaded once for the pair — each CTA TMAs half of such a tile,
        # multicast into both — so the L2 serves them once instead of twice (module docstring).  Static deal of pairs.
        if cluster_pairs and not (persistent and not dynamic_schedule and not nvfp4_out):
            raise ValueError("cluster_pairs deals query-block pairs to persistent CTAs with the static schedule and the "
                             "bf16 epilogue (persistent=True, dynamic_schedule=False, no NVFP4 out)")
        self.cluster_pairs = cluster_pairs
        # Warpgroup tiles (``warpgroup_tiles``): in a persistent 128-row tile each consumer warpgroup visits only the
        # K/V tiles its own 64 rows see (a small window: 3 of the tile's 4), the other's are waited for and handed
        # back unused — the tile loads 4 K/V tiles for 128 rows where two 64-row blocks load 6 (module docstring)
        if warpgroup_tiles and not (persistent and tile_m > 64 and not cluster_pairs and not nvfp4_out):
            raise ValueError("warpgroup_tiles splits the K/V tiles of a persistent 128- or 192-row tile between its "
                             "consumer warpgroups (persistent=True, tile_m=128 or 192, no cluster pairs or NVFP4 out)")
        self.warpgroup_tiles = warpgroup_tiles
        # Split epilogue (``split_epilogue``): each consumer warpgroup of a persistent 128-row tile stores its own 64
        # rows (its half of sO, its own TMA store, a 128-thread barrier), so one warpgroup's epilogue overlaps the
        # other's last tile instead of both meeting at a 256-thread barrier
        if split_epilogue and not (persistent and tile_m == 128 and self.tma_store_o):
            raise ValueError("split_epilogue stores the two 64-row halves of a persistent 128-row tile's O by TMA "
                             "(persistent=True, tile_m=128, bf16 out)")
        self.split_epilogue = split_epilogue
        # O in its Q stage (``o_in_q_stage``): a persistent CTA's consumers put O into the item's own Q stage (each
        # warpgroup its own 64 rows, whose QKs have all retired) and go on; a storer warp (an idle producer warp) stores
        # it by TMA, waits for the store to read the stage and hands the stage back to the producer.  No sO buffer: its
        # shared memory can hold one more K/V stage (the hd128 small-window build: 5 instead of 4)
        if o_in_q_stage and not (persistent and self.tma_store_o and not split_epilogue and not cluster_pairs):
            raise ValueError("o_in_q_stage stages a persistent CTA's bf16 O in its Q stage for a storer warp "
                             "(persistent=True, bf16 TMA-store out; not with split_epilogue or cluster_pairs)")
        self.o_in_q_stage = o_in_q_stage
        # L2 eviction hints (``l2_hints``, persistent warpgroup-tiles builds): Q loads and O stores evict first (each
        # is touched once), K/V loads evict last (the neighbouring query blocks read each tile again)
        if l2_hints and not (warpgroup_tiles and o_in_q_stage):
            raise ValueError("l2_hints is built for the warpgroup-tiles producer and the o_in_q_stage storer")
        self.l2_q = L2_EVICT_FIRST if l2_hints else None
        self.l2_kv = L2_EVICT_LAST if l2_hints else None
        # Window ring (``ring``): one CTA per SM walks chunks of consecutive 128-row items of one head, K/V tiles
        # streamed once per chunk into a ring the two halves of an item share (module docstring).  Only for a
        # window whose 64-row halves need at most 3 tiles of 64 keys and whose queries sit on tile boundaries
        # (keys − queries a multiple of tile_n): the host (``dsv4lib.attention``) checks that; more tiles per half
        # than stages would stall the ring.
        if ring and not (window and overlap and self.tma_store_o and pack_gqa == 1
                         and not (p_in_smem or wg_pingpong or persistent)):
            raise ValueError("the window ring is built for a sliding window, the overlapped RS mainloop and the bf16 "
                             "TMA-store epilogue, unpacked heads (not persistent, SMEM-P or ping-pong)")
        # an item's rows see the keys [first row - 127, last row]: (tile_m + 128) / tile_n tiles, all in the ring at once
        ring_tiles = (tile_m + 128) // (tile_n or default_tile_n(head_dim))
        if ring and num_stages < ring_tiles:
            raise ValueError(f"the window ring holds up to {ring_tiles} K/V tiles of a {tile_m}-row item: "
                             f"num_stages >= {ring_tiles}, got {num_stages}")
        self.ring = ring
        # Q in registers (``q_in_registers``, the 64-row ring only): QK is an RS-wgmma, each item copies its Q out of
        # the single Q stage before the previous item's O is staged there, so the next Q loads a whole item ahead
        # instead of after the O store (module docstring)
        if q_in_registers and not (ring and tile_m == 64):
            raise ValueError("q_in_registers is built for the 64-row window ring (ring=True, tile_m=64)")
        self.q_in_registers = q_in_registers
        self.num_sms = num_sms
        # Q stages: two when persistent, or for a 128-row ring item (the next item's Q loads while this one
        # computes); a 64-row ring item (two CTAs per SM) has room for one: the other CTA computes while it loads
        self.q_stages = 2 if (persistent or (ring and tile_m == 128)) else 1
        if q_stages is not None:     # a persistent build may trade its second Q stage for K/V stages
            if not (persistent and q_stages in (1, 2)):
                raise ValueError(f"q_stages (1 or 2) is a knob of persistent builds, got {q_stages}")
            self.q_stages = q_stages
        self.dtype = cutlass.BFloat16
        if self.ctas_per_sm * (self.smem_bytes() + 1024) > self.SMEM_PER_SM:
            raise ValueError(f"{self.smem_bytes()} B of shared memory per CTA: {self.ctas_per_sm} CTAs do not fit an "
                             f"SM (tile_m {tile_m}, tile_n {self.tile_n}, {num_stages} stages, head_dim {head_dim})")
        # Debug knobs (compile-time), e.g. DSV4_D1_DEBUG="printf,noreg,notail": checkpoints printed by
        # block (0,0,0), no register reallocation, no producer tail; "nomma" and "lightfirst" are timing probes
        # (scripts/explore.py d5probe / d1causal).  Never set in normal runs.
        knobs = set(filter(None, os.environ.get("DSV4_D1_DEBUG", "").split(",")))
        self.debug_nomma = "nomma" in knobs       # timing probe: every wgmma left out (garbage O), loads and waits kept
        self.debug_lightfirst = "lightfirst" in knobs    # A/B probe: causal blocks in launch order (light first)
        # timing probe of the ring ("times"): %globaltimer stamps per CTA and item into the LSE buffer (as int64; the
        # LSE itself is not written) — see timing_stamp; call with return_lse=True
        # stamps (timing_stamp): 0 consumer item start, 1 its mainloop done, 2 next Q in registers, 3 O staged
        # (persistent: 0 and 3, O's store issued); 4 producer Q issued, 5 the item's K/V issued; 6 storer: O store
        # read (scripts/explore.py ringtimes)
        self.debug_times = "times" in knobs and (ring or persistent)
        self.debug_printf, self.debug_noreg, self.debug_notail = ("printf" in knobs, "noreg" in knobs,
                                                                 "notail" in knobs)

    SMEM_PER_SM = 228 * 1024             # H100/H200; the driver keeps 1 KB of it per CTA

    def smem_bytes(self) -> int:
        """Shared memory of one CTA: Q (two stages when persistent), the K and V stages, P (SMEM-P only), O (persistent
        only), the mbarriers, 1 KB alignment each."""
        elem = 2
        q = self.q_stages * self.tile_m * self.head_dim * elem
        kv = 2 * self.num_stages * self.tile_n * self.head_dim * elem
        p = self.tile_m * self.tile_n * elem if self.p_in_smem else 0
        o = self.tile_m * self.head_dim * elem if self.persistent and not self.o_in_q_stage else 0
        return 1024 + q + kv + p + o

    # ------------------------------------------------------------------------------ host side
    def token(self, row):
        """The query token of an M row: rows are (q head within the group, token) with the head fastest when
        the q heads of a KV head are packed (``pack_gqa`` > 1); otherwise a row is a token."""
        if const_expr(self.pack_gqa > 1):
            return row // self.pack_gqa
        return row

    def pack_heads(self, t: cute.Tensor, head_mode: int) -> cute.Tensor:
        """``(s, …, h, …)`` → ``((G, s), …, h/G, …)``: the G q heads sharing a KV head become the fast part of the
        row mode (G = ``pack_gqa``), so one CTA's 128 rows are 128/G tokens × G heads and read each K/V tile once."""
        shape, stride = list(t.layout.shape), list(t.layout.stride)
        g = self.pack_gqa
        shape[0], stride[0] = (g, shape[0]), (stride[head_mode], stride[0])
        shape[head_mode], stride[head_mode] = shape[head_mode] // g, stride[head_mode] * g
        return cute.make_tensor(t.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))

    def _smem_layout(self, rows: int, stages: int | None, cols: int | None = None):
        return row_major_smem_layout(self.dtype, rows, cols or self.head_dim, stages)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, mOutScales: cute.Tensor,
                 mSenc: cute.Tensor, stream: cuda.CUstream = None, mWork: cute.Tensor = None):
        # mWork (dynamic_schedule only): int32 (2,) = (items handed out, producers done), zero before the launch and
        # left zero after it (dsv4lib.attention.work_counters)
        # torch (b, s, h, d) -> (s, d, h, b): the TMA tiles the first two modes
        mQ, mK, mV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0])) for t in (mQ, mK, mV)]
        if const_expr(self.split_kv):
            # partials: O (splits, b, s, h, d) -> (s, d, h, b, splits); LSE (splits, b, h, s) -> (s, h, b, splits)
            mO = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[2, 4, 3, 1, 0]))
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[3, 2, 1, 0]))
        else:
            mO = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[1, 3, 2, 0]))    # bf16 O, or NVFP4 bytes
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))   # (b,h,s) -> (s,h,b)
        if const_expr(self.nvfp4_out):   # scales (b, s, h, d/16) -> (s, d/16, h, b)
            mOutScales = cute.make_tensor(mOutScales.iterator, cute.select(mOutScales.layout, mode=[1, 3, 2, 0]))
        if const_expr(self.pack_gqa > 1):    # rows = (q head in group, token); the head mode counts KV heads
            mQ, mO, mLSE = self.pack_heads(mQ, 2), self.pack_heads(mO, 2), self.pack_heads(mLSE, 1)
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.tile_m // 64, 1, 1), (64, self.tile_n),
            a_source=warpgroup.OperandSource.RMEM if self.q_in_registers else warpgroup.OperandSource.SMEM)
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            (self.tile_m // 64, 1, 1), (64, self.head_dim),
            a_source=warpgroup.OperandSource.SMEM if self.p_in_smem else warpgroup.OperandSource.RMEM)
        sQ_layout = self._smem_layout(self.tile_m, self.q_stages if const_expr(self.q_stages > 1 or self.ring
                                                                           or self.persistent) else None)
        sO_layout = self._smem_layout(self.tile_m, None)                 # O's tile (its own buffer when persistent)
        sK_layout = self._smem_layout(self.tile_n, self.num_stages)
        sV_layout = self._smem_layout(self.tile_n, self.num_stages)
        # P: (tile_m, tile_n), K-major (the PV MMA's K is the KV column) — only allocated for SMEM-P
        sP_layout = self._smem_layout(self.tile_m, None, cols=self.tile_n)
        p_elems = cute.cosize(sP_layout) if const_expr(self.p_in_smem) else 0
        tma_load = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(tma_load, mQ, sO_layout, (self.tile_m, self.head_dim))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(tma_load, mK, cute.select(sK_layout, mode=[0, 1]),
                                                        (self.tile_n, self.head_dim), 1)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(tma_load, mV, cute.select(sV_layout, mode=[0, 1]),
                                                        (self.tile_n, self.head_dim), 1)
        tma_atom_Kmc = tma_Kmc = tma_atom_Vmc = tma_Vmc = None
        if const_expr(self.cluster_pairs):  # half a tile per CTA, multicast into both CTAs of the pair
            tma_mcast = cpasync.CopyBulkTensorTileG2SMulticastOp()
            tma_atom_Kmc, tma_Kmc = cpasync.make_tiled_tma_atom(tma_mcast, mK, cute.select(sK_layout, mode=[0, 1]),
                                                                (self.tile_n, self.head_dim), 2)
            tma_atom_Vmc, tma_Vmc = cpasync.make_tiled_tma_atom(tma_mcast, mV, cute.select(sV_layout, mode=[0, 1]),
                                                                (self.tile_n, self.head_dim), 2)
        tma_atom_O = None
        if const_expr(self.split_epilogue):  # O leaves as two 64-row halves, one per warpgroup
            tma_atom_O, mO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                         self._smem_layout(64, None), (64, self.head_dim))
        elif const_expr(self.tma_store_o):   # O shares Q's tile shape and buffer layout
            tma_atom_O, mO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO, sO_layout,
                                                         (self.tile_m, self.head_dim))
        o_elems = cute.cosize(sO_layout) if const_expr(self.persistent and self.tma_store_o
                                                       and not self.o_in_q_stage) else 0

        @cute.struct
        class SharedStorage:
            mbar_Q: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            mbar_K: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            mbar_V: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            # dynamic_schedule: the work item of each Q stage (in the barriers' 1 KB, before the aligned buffers:
            # two 64-row persistent CTAs fill an SM's 228 KB to the byte)
            sWork: cute.struct.MemRange[Int32, self.q_stages if self.dynamic_schedule else 0]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, p_elems], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, o_elems], 1024]

        if const_expr(self.ctas_per_sm * (SharedStorage.size_in_bytes() + 1024) > self.SMEM_PER_SM):
            # the exact struct (alignment padding included), not smem_bytes()'s estimate: one byte over and the
            # second CTA of an SM silently waits for the first to finish
            raise ValueError(f"{SharedStorage.size_in_bytes()} B of shared memory: {self.ctas_per_sm} CTAs do not "
                             f"fit an SM")
        batch_and_splits = cute.size(mQ.shape[3])
        if const_expr(self.split_kv):
            batch_and_splits = batch_and_splits * cute.size(mO.shape[4])
        grid = (cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m), cute.size(mQ.shape[2]), batch_and_splits)
        if const_expr(self.persistent):
            grid = (persistent_grid(self.work_items(mQ), self.num_sms * self.ctas_per_sm), 1, 1)
            if const_expr(self.dynamic_schedule):            # every slot: the faster ones take more items
                grid = (cutlass.min(self.work_items(mQ), self.num_sms * self.ctas_per_sm), 1, 1)
            if const_expr(self.cluster_pairs):              # two CTAs (one cluster) per pair of query blocks
                grid = (2 * persistent_grid(self.pair_items(mQ), self.num_sms * self.ctas_per_sm // 2), 1, 1)
        if const_expr(not self.dynamic_schedule):
            mWork = mSenc                                    # unused
        if const_expr(self.ring):
            grid = (persistent_grid(self.ring_chunking(mQ)[2], self.num_sms * self.ctas_per_sm), 1, 1)
        self.kernel(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, mO, mLSE, softmax_scale_log2,
                    window_size, mSink, mOutScales, mSenc, mWork,
                    sQ_layout, sK_layout, sV_layout, sP_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage,
                    tma_atom_Kmc, tma_Kmc, tma_atom_Vmc, tma_Vmc).launch(
            grid=grid, block=[self.NUM_THREADS, 1, 1], min_blocks_per_mp=self.ctas_per_sm,
            cluster=(2, 1, 1) if const_expr(self.cluster_pairs) else None,
            # two CTAs per SM need the whole 228 KB carve-out (100 %), not the driver's pick for one CTA's size
            **({"preferred_smem_carveout": 100} if self.ctas_per_sm > 1 else {}), **launch_stream(stream))

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
               tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_O: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, mOutScales: cute.Tensor,
               mSenc: cute.Tensor, mWork: cute.Tensor, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, tiled_mma_qk: cute.TiledMma,
               tiled_mma_pv: cute.TiledMma, SharedStorage: cutlass.Constexpr, tma_atom_Kmc: cute.CopyAtom = None,
               mKmc: cute.Tensor = None, tma_atom_Vmc: cute.CopyAtom = None, mVmc: cute.Tensor = None):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if const_expr(self.causal and not self.debug_lightfirst):
            # heaviest query blocks first (blocks launch x-fastest): causal work grows with m_block, and the blocks
            # launched last should be the short ones, not the full-length rows of the last head
            m_blocks, _, _ = cute.arch.grid_dim()
            m_block = m_blocks - 1 - m_block
        split = Int32(0)
        if const_expr(self.split_kv):
            num_splits = mO.shape[4]
            split = batch % num_splits
            batch = batch // num_splits
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)
            if const_expr(self.tma_store_o):
                cpasync.prefetch_descriptor(tma_atom_O)
            if const_expr(self.cluster_pairs):
                cpasync.prefetch_descriptor(tma_atom_Kmc)
                cpasync.prefetch_descriptor(tma_atom_Vmc)

        storage = cutlass.utils.SmemAllocator().allocate(SharedStorage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, (self.NUM_THREADS - 128) // 32)
        tile_bytes_q = self.tile_m * self.head_dim * self.dtype.width // 8
        tile_bytes_kv = self.tile_n * self.head_dim * self.dtype.width // 8
        pipeline_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_Q.data_ptr(), num_stages=self.q_stages, producer_group=one_thread,
            # the ring (and o_in_q_stage) hands a Q stage back from its storer warp, once the O store has read it
            consumer_group=one_thread if const_expr(self.ring or self.o_in_q_stage) else consumer_warps,
            tx_count=tile_bytes_q,
            defer_sync=True)
        # cluster pairs: a K/V stage is refilled (by either CTA's multicast) only when the consumers of both CTAs
        # have released it — each consumer warp arrives on the stage's empty barrier in both CTAs
        kv_consumers, kv_cluster, cluster_mn = consumer_warps, None, (1, 1)
        if const_expr(self.cluster_pairs):
            kv_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * ((self.NUM_THREADS - 128) // 32))
            kv_cluster, cluster_mn = cute.make_layout((1, 2, 1, 1)), (2, 1)
        pipeline_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_K.data_ptr(), num_stages=self.num_stages, producer_group=one_thread,
            consumer_group=kv_consumers, tx_count=tile_bytes_kv, cta_layout_vmnk=kv_cluster, defer_sync=True)
        pipeline_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.num_stages, producer_group=one_thread,
            consumer_group=kv_consumers, tx_count=tile_bytes_kv, cta_layout_vmnk=kv_cluster, defer_sync=True)
        pipeline_init_arrive(cluster_shape_mn=cluster_mn, is_relaxed=True)

        # Swizzles go into the pointers: the hardware swizzles byte addresses (see dsv4lib.layouts)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)     # (tile_m, D[, 2 stages])
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)     # (tile_n, D, stages)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)     # (tile_n, D, stages)
        sVt = cute.composition(sV, transposed_view(self.head_dim, self.tile_n, self.num_stages))  # (D, tile_n, stages)
        sP = None
        if const_expr(self.p_in_smem):
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)  # (tile_m, tile_n)

        seqlen_q = mQ.shape[0]
        rows_q = seqlen_q                                                        # M rows (= tokens unless packed)
        seqlen_k = mK.shape[0]
        if const_expr(self.pack_gqa > 1):
            rows_q = cute.size(mQ, mode=[0])
            seqlen_q = rows_q // self.pack_gqa
        head_kv = self.kv_head(head, mQ, mK)
        n_block_min, n_block_max = self.block_range(m_block, seqlen_q, seqlen_k, window_size)
        if const_expr(self.split_kv):   # this split's share: ceil(n / splits) tiles (dsv4lib.splitkv.split_block_ranges)
            per_split = (cutlass.max(n_block_max - n_block_min, 0) + num_splits - 1) // num_splits
            lo = cutlass.min(n_block_min + split * per_split, n_block_max)
            n_block_max = cutlass.min(lo + per_split, n_block_max)
            n_block_min = lo
        pipeline_init_wait(cluster_shape_mn=cluster_mn)

        if const_expr(self.debug_printf):
            if tidx == 0 and m_block == 0 and head == 0 and batch == 0:
                cute.printf("D1 start: seqlen_q %d seqlen_k %d n_block_max %d\n", seqlen_q, seqlen_k, n_block_max)
        sWork = None
        if const_expr(self.dynamic_schedule):
            sWork = storage.sWork.get_tensor(cute.make_layout(self.q_stages))     # (Q stages,) work items
        if warp_idx < 4:
            if const_expr(not self.debug_noreg):
                cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if const_expr(self.ring):
                if warp_idx == 1:
                    self.store_ring(tma_atom_O, mO, mQ, sQ, pipeline_q, mLSE)
            if const_expr(self.o_in_q_stage):
                if warp_idx == 1:
                    self.store_persistent(tma_atom_O, mO, mQ, sQ, pipeline_q, sWork)
            if warp_idx == 0:
                if const_expr(self.ring):
                    self.load_ring(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
                                   pipeline_v, seqlen_q, seqlen_k, window_size, mLSE)
                elif const_expr(self.cluster_pairs):
                    self.load_pairs(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, tma_atom_Kmc, mKmc, tma_atom_Vmc,
                                    mVmc, sQ, sK, sV, pipeline_q, pipeline_k, pipeline_v, seqlen_q, seqlen_k,
                                    window_size)
                elif const_expr(self.persistent):
                    self.load_persistent(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q,
                                         pipeline_k, pipeline_v, seqlen_q, seqlen_k, window_size, mWork,
                                         sWork)
                else:
                    self.load(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
                              pipeline_v, m_block, head, head_kv, batch, n_block_min, n_block_max)
        elif const_expr(self.ring):
            if const_expr(not self.debug_noreg):
                cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consume_ring(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, mLSE, mQ, pipeline_q,
                              pipeline_k, pipeline_v, softmax_scale_log2, window_size, mSink, tidx - 128, seqlen_q,
                              seqlen_k, rows_q)
        elif const_expr(self.persistent):
            if const_expr(not self.debug_noreg):
                cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            sO = None
            if const_expr(self.split_epilogue):
                sO_layout = self._smem_layout(64, 2)
                sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)         # (64, D, 2 halves)
            elif const_expr(self.o_in_q_stage):
                sO = sQ                                      # (tile_m, D, Q stages): O goes into its item's stage
            elif const_expr(self.tma_store_o):
                sO_layout = self._smem_layout(self.tile_m, None)
                sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)               # (tile_m, D)
            self.consume_persistent(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sO, tma_atom_O, mO, mLSE, mQ, pipeline_q,
                                    pipeline_k, pipeline_v, softmax_scale_log2, window_size, mSink, tidx - 128,
                                    seqlen_q, seqlen_k, rows_q, sWork, mOutScales, mSenc)
        else:
            if const_expr(not self.debug_noreg):
                cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consume(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sP, tma_atom_O, mO, mLSE, pipeline_q, pipeline_k, pipeline_v,
                         softmax_scale_log2, window_size, mSink, mOutScales, mSenc, tidx - 128, m_block, head, batch,
                         split, seqlen_q, seqlen_k, n_block_min, n_block_max, rows_q)
        if const_expr(self.cluster_pairs):
            # no CTA exits while its peer may still multicast into it or arrive on its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def work_coords(self, work, mQ):
        """Persistent CTAs: work item → (query block, head, batch), the query block fastest (so the CTAs running at
        once take neighbouring blocks of one head and share its K/V tiles through L2)."""
        m_blocks = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        n_heads = cute.size(mQ.shape[2])
        m_block = work % m_blocks
        if const_expr(self.causal or self.has_window):
            # the last query blocks first: under a causal mask or a window the first blocks of a head see the fewest
            # keys, so the items dealt last are the short ones (longest processing time first)
            m_block = m_blocks - 1 - m_block
        return m_block, (work // m_blocks) % n_heads, work // (m_blocks * n_heads)

    @cute.jit
    def work_items(self, mQ):
        """Persistent CTAs: the number of work items (query blocks × heads × batch)."""
        return cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m) * cute.size(mQ.shape[2]) * cute.size(mQ.shape[3])

    @cute.jit
    def kv_head(self, head, mQ, mK):
        """The KV head of grid head ``head``: itself when the q heads of a KV head are packed into M (the grid's
        heads are then KV heads), else GQA / MQA."""
        head_kv = head
        if const_expr(self.pack_gqa == 1):
            head_kv = head // (mQ.shape[2] // mK.shape[2])
        return head_kv

    @cute.jit
    def load_persistent(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
                        pipeline_v, seqlen_q, seqlen_k, window_size, mWork, sWork):
        """Producer of a persistent CTA: per work item, Q into the next of two Q stages, then its K/V tiles into
        the running K/V stages — the next item's loads start as soon as stages free up, while the consumers still
        finish the current one.  Work items: blockIdx.x, + gridDim.x, …; or, with ``dynamic_schedule``, blockIdx.x
        and then gridDim.x + the counter ``mWork[0]`` (the next one fetched while this one's K/V load), each
        announced to the consumers in ``sWork`` next to its Q, and -1 after the last."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        total = self.work_items(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        work = bidx                                          # the first item needs no counter (no atomic's latency)
        step = gdim
        while work < total:
            m_block, head, batch = self.work_coords(work, mQ)
            head_kv = self.kv_head(head, mQ, mK)
            n_block_min, n_block_max = self.block_range(m_block, seqlen_q, seqlen_k, window_size)
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.item_tma_views(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV,
                                                                     sQ, sK, sV, m_block, head, head_kv, batch)
            if const_expr(self.dynamic_schedule):
                # the item goes into sWork before the full barrier's arrive (a release) announces the stage
                pipeline_q.sync_object_empty.wait(q_state.index, q_state.phase)
                if cute.arch.lane_idx() == 0:
                    sWork[q_state.index] = work
            pipeline_q.producer_acquire(q_state)
            tma_copy(tma_atom_Q, tQgQ, tQsQ[None, q_state.index], self.l2_q,
                     tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
            q_state.advance()
            if const_expr(self.dynamic_schedule):
                step = self.take_work(mWork) - work          # fetched now, used after the K/V issue below
            if const_expr(self.warpgroup_tiles):
                slots, n_slots, _, _ = self.warpgroup_plan(m_block, 0, seqlen_q, seqlen_k, window_size)
                kv_state = self.load_tile_slots(tma_atom_K, tKgK, tKsK, pipeline_k, tma_atom_V, tVgV, tVsV,
                                                pipeline_v, kv_state, n_slots, slots)
            else:
                kv_state = load_kv_tiles(tma_atom_K, tKgK, tKsK, pipeline_k, tma_atom_V, tVgV, tVsV, pipeline_v,
                                         n_block_min, n_block_max, self.num_stages, kv_state,
                                         k_ahead=True)
            work += step
        if const_expr(self.dynamic_schedule):
            # no more items: -1 in the next Q stage, its full barrier completed by a plain arrive (no bytes)
            pipeline_q.sync_object_empty.wait(q_state.index, q_state.phase)
            if cute.arch.lane_idx() == 0:
                sWork[q_state.index] = Int32(-1)
                cute.arch.mbarrier_arrive(pipeline_q.producer_get_barrier(q_state))
            q_state.advance()
            if cute.arch.lane_idx() == 0:
                # the last producer to finish taking items puts both counters back to zero for the next launch
                if cute.arch.atomic_add(mWork.iterator + 1, Int32(1), sem="relaxed", scope="gpu") == gdim - 1:
                    mWork[0] = Int32(0)
                    mWork[1] = Int32(0)
        pipeline_q.producer_tail(q_state)
        pipeline_k.producer_tail(kv_state.clone())
        pipeline_v.producer_tail(kv_state.clone())

    @cute.jit
    def item_tma_views(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, m_block, head, head_kv, batch):
        """A persistent producer's TMA views of one work item: Q's tile → its stages, every K and V tile of its KV
        head → the K/V stages, as (tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV)."""
        gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))   # (tile_m, D)
        gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))   # (tile_n, D, n)
        gV = cute.local_tile(mV[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))                    # (TMA, stages)
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    @cute.jit
    def take_work(self, mWork) -> Int32:
        """dynamic_schedule: the next work item — gridDim.x + the global counter (every CTA's first item is its
        blockIdx.x) — lane 0's atomic, broadcast to the warp."""
        gdim, _, _ = cute.arch.grid_dim()
        work = Int32(0)
        if cute.arch.lane_idx() == 0:
            work = cute.arch.atomic_add(mWork.iterator, Int32(1), sem="relaxed", scope="gpu")
        return gdim + cute.arch.shuffle_sync(work, 0)

    @cute.jit
    def announced_work(self, pipeline_q, q_state, sWork, total) -> Int32:
        """dynamic_schedule, consumers: wait for the next Q stage and read its work item (the producer's -1 after
        the last item becomes ``total``, which ends the loop)."""
        pipeline_q.consumer_wait(q_state)
        work = sWork[q_state.index]
        if work < 0:
            work = total
        return work

    @cute.jit
    def consume_persistent(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sO, tma_atom_O, mO, mLSE, mQ, pipeline_q,
                           pipeline_k, pipeline_v, softmax_scale_log2, window_size, mSink, ctidx, seqlen_q, seqlen_k,
                           rows_q, sWork, mOutScales=None, mSenc=None):
        """Consumers of a persistent CTA: per work item, the overlapped mainloop on its Q stage and K/V tiles (the
        pipeline states run on from item to item), Q's stage freed as soon as its last QK retired, the rows
        finished, O stored by TMA from ``sO`` (the previous item's store must have read it first) — or, NVFP4 out,
        quantized and stored from the registers."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        (thr_qk, thr_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum,
         tOcO_rc) = self.consumer_fragments(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, ctidx)
        causal_shift = seqlen_k - seqlen_q
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        item_count = Int32(0)                                # debug_times stamps
        total = self.work_items(mQ)
        work = bidx
        step = gdim
        if const_expr(self.cluster_pairs):                   # work = the cluster's pair of query blocks
            total, work, step = self.pair_items(mQ), bidx // 2, gdim // 2
        if const_expr(self.dynamic_schedule):
            work = self.announced_work(pipeline_q, q_state, sWork, total)
        while work < total:
            slots = None
            if const_expr(self.cluster_pairs):
                m_block, head, batch, has_block, n_real, n_slots, slots = self.pair_plan(work, mQ, seqlen_q, seqlen_k,
                                                                                         window_size)
                n_block_min, n_block_max = Int32(0), n_real          # this CTA's slots 0 .. n_real - 1 (slot_block)
            elif const_expr(self.warpgroup_tiles):
                m_block, head, batch = self.work_coords(work, mQ)
                # this warpgroup's tiles: skip the other's that come first, visit its own, skip the rest
                _, _, lead_and_own, slots = self.warpgroup_plan(m_block, cute.arch.make_warp_uniform(ctidx // 128),
                                                                seqlen_q, seqlen_k, window_size)
                n_lead, n_block_max, n_trail = lead_and_own
                n_block_min = Int32(0)
            else:
                m_block, head, batch = self.work_coords(work, mQ)
                n_block_min, n_block_max = self.block_range(m_block, seqlen_q, seqlen_k, window_size)
            self.timing_stamp(mLSE, item_count, 0, ctidx == 0)
            acc_O.fill(0.0)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            if const_expr(not self.dynamic_schedule):
                pipeline_q.consumer_wait(q_state)
            if const_expr(self.warpgroup_tiles):
                kv_state = self.release_empty_slots(pipeline_k, pipeline_v, kv_state, n_lead)
            kv_state = self.mainloop_overlapped(tiled_mma_qk, tiled_mma_pv, tSrQ[None, None, None, q_state.index],
                                                tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, pipeline_k,
                                                pipeline_v, kv_state, softmax_scale_log2, window_size, m_block,
                                                seqlen_k, causal_shift, n_block_min, n_block_max, ctidx // 128,
                                                slots)
            o_stage = q_state.index                          # o_in_q_stage: O goes here, the storer frees it
            if const_expr(not self.o_in_q_stage):
                pipeline_q.consumer_release(q_state)                       # every QK of this block has retired
            q_state.advance()
            if const_expr(self.cluster_pairs):
                kv_state = self.release_empty_slots(pipeline_k, pipeline_v, kv_state, n_slots - n_real)
                if has_block:
                    self.finish_persistent_item(acc_O, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE,
                                                softmax_scale_log2, m_block, head, batch, rows_q, seqlen_q, tiled_mma_pv,
                                                sO, tma_atom_O, mO, mOutScales, mSenc, ctidx)
            else:
                self.finish_persistent_item(acc_O, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2,
                                            m_block, head, batch, rows_q, seqlen_q, tiled_mma_pv, sO, tma_atom_O, mO,
                                            mOutScales, mSenc, ctidx, o_stage)
            if const_expr(self.warpgroup_tiles):
                # the other warpgroup's trailing tiles, handed back after this one's epilogue: waiting for them to
                # land first would hold the epilogue back until the other's last tile arrives
                kv_state = self.release_empty_slots(pipeline_k, pipeline_v, kv_state, n_trail)
            self.timing_stamp(mLSE, item_count, 3, ctidx == 0)
            item_count += 1
            if const_expr(self.dynamic_schedule):
                work = self.announced_work(pipeline_q, q_state, sWork, total)
            else:
                work += step
        if const_expr(self.dynamic_schedule and not self.o_in_q_stage):
            pipeline_q.consumer_release(q_state)             # the -1 stage: the producer's tail waits for it
        if const_expr(self.tma_store_o and not self.o_in_q_stage):
            storer = ctidx < 32
            if const_expr(self.split_epilogue):
                storer = ctidx % 128 < 32                                   # each warpgroup stores its own half
            if storer:
                cute.arch.cp_async_bulk_wait_group(0, read=True)            # sO must outlive the last store's reads

    @cute.jit
    def finish_persistent_item(self, acc_O, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2,
                               m_block, head, batch, rows_q, seqlen_q, tiled_mma_pv, sO, tma_atom_O, mO, mOutScales,
                               mSenc, ctidx, o_stage=None):
        """A persistent CTA's epilogue of one query block: the rows finished, O stored (TMA from ``sO``, left in
        flight) or, NVFP4 out, quantized and stored from the registers."""
        self.finish_rows(acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, m_block, head,
                         batch, Int32(0), rows_q)
        if const_expr(self.nvfp4_out):
            self.store_nvfp4(acc_O_rc, tOcO_rc, mO, mOutScales, mSenc[0], m_block, head, batch, seqlen_q)
        elif const_expr(self.o_in_q_stage):
            self.hand_o_to_storer(acc_O, tiled_mma_pv, sO, o_stage, ctidx)        # sO is sQ
        elif const_expr(self.split_epilogue):
            # this warpgroup's 64 rows: its half of sO, its own TMA store, only its own 128 threads meet
            wg = cute.arch.make_warp_uniform(ctidx // 128)
            gO = cute.local_tile(mO[None, None, head, batch], (64, self.head_dim), (2 * m_block + wg, 0))
            mma_one_wg = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K,
                                                           OperandMajorMode.MN, Float32, (1, 1, 1),
                                                           (64, self.head_dim), a_source=warpgroup.OperandSource.RMEM)
            self.store_o_tma(acc_O, mma_one_wg, sO[None, None, wg], tma_atom_O, gO, ctidx % 128, reuse=True,
                             barrier_id=self.HALF_EPILOGUE_BARRIER_BASE + wg, threads=128)
        else:
            gO = cute.local_tile(mO[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))
            self.store_o_tma(acc_O, tiled_mma_pv, sO, tma_atom_O, gO, ctidx, reuse=True)

    # ------------------------------------------------------------------ warpgroup tiles (warpgroup_tiles=True)
    @cute.jit
    def warpgroup_plan(self, m_block, wg_idx, seqlen_q, seqlen_k, window_size):
        """Warpgroup tiles: the K/V slots of query block ``m_block`` — every tile one of its 64-row warpgroups
        visits, in one run descending from the top (the rows of adjacent warpgroups are adjacent, so their key-tile
        ranges overlap or touch: the run has no gap) — and warpgroup ``wg_idx``'s part of it: the leading slots above
        its own tiles (skipped), its own tiles (visited), the trailing ones below (skipped).  An empty range (rows
        that see no key) skips every slot.  Returns (producer segments, slots, (leading skips, own visits, trailing
        skips), this warpgroup's segments for ``slot_block``).  ``dsv4lib.tiles.warpgroup_slots`` is the same plan in
        Python (tested against the 64-row tile plan, and plotted in the D5 notebook)."""
        first_row = m_block * self.tile_m
        top, bottom = Int32(0), Int32(0)
        lo, hi = Int32(0), Int32(0)
        for w in cutlass.range_constexpr(self.consumer_warpgroups):
            lo_w, hi_w = self.rows_key_tiles(first_row + 64 * w, first_row + 64 * w + 63, seqlen_q, seqlen_k,
                                             window_size)
            if hi_w > lo_w:
                if top == bottom:                            # the first non-empty range
                    top, bottom = hi_w, lo_w
                top = cutlass.max(top, hi_w)
                bottom = cutlass.min(bottom, lo_w)
            if w == wg_idx:
                lo, hi = lo_w, hi_w
        n_slots = top - bottom
        visits = cutlass.max(hi - lo, 0)
        lead = n_slots
        if visits > 0:
            lead = top - hi
        return ((n_slots, top),), n_slots, (lead, visits, n_slots - lead - visits), ((visits, hi),)

    @cute.jit
    def load_tile_slots(self, tma_atom_K, tKgK, tKsK, pipe_k, tma_atom_V, tVgV, tVsV, pipe_v, kv_state, n_slots,
                        slots):
        """Warpgroup tiles, producer: the block's K/V slots in slot order, K one slot ahead of V."""
        k_state = kv_state.clone()
        for i in cutlass.range(n_slots + 1, unroll=1):
            if i < n_slots:
                tma_load_tile(tma_atom_K, tKgK, tKsK, pipe_k, k_state, self.slot_block(i, n_slots, slots), self.l2_kv)
                k_state.advance()
            if i > 0:
                tma_load_tile(tma_atom_V, tVgV, tVsV, pipe_v, kv_state, self.slot_block(i - 1, n_slots, slots),
                              self.l2_kv)
                kv_state.advance()
        return kv_state

    # ------------------------------------------------------------------ cluster pairs (cluster_pairs=True)
    @cute.jit
    def pair_items(self, mQ):
        """Cluster pairs: the number of work items, pairs of adjacent query blocks of one head (the last pair of a
        head has one block when the head has an odd number)."""
        m_blocks = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        return (m_blocks + 1) // 2 * cute.size(mQ.shape[2]) * cute.size(mQ.shape[3])

    @cute.jit
    def shared_and_own(self, lo0, hi0, lo1, hi1):
        """Cluster pairs (``pair_plan``): two adjacent row ranges' KV tiles ``[lo0, hi0)`` (the earlier rows) and
        ``[lo1, hi1)``, as runs that descend from a top: (count, top) of the tiles both see, of the first's own (below the shared ones) and of
        the second's own (above them).  An empty range shares nothing; its own count is 0."""
        s_lo = cutlass.max(lo0, lo1)
        s_hi = cutlass.min(hi0, hi1)
        n_shared = cutlass.max(s_hi - s_lo, 0)
        own0 = cutlass.max(hi0 - lo0, 0) - n_shared          # the shared tiles lie inside both (non-empty) ranges
        own1 = cutlass.max(hi1 - lo1, 0) - n_shared
        return (n_shared, s_hi), (own0, cutlass.min(hi0, lo1)), (own1, hi1)

    @cute.jit
    def pair_plan(self, pair, mQ, seqlen_q, seqlen_k, window_size):
        """Cluster pairs: what pair ``pair`` means for this CTA (rank r of the cluster takes block ``first + r``).
        Both CTAs walk the same sequence of K/V *slots* so that their stages stay in step: first the tiles both
        blocks visit (``n_shared``, descending from ``s_hi``; multicast), then each CTA's own tiles (loaded by it
        alone, descending), and where one CTA has fewer own tiles than its peer, empty slots (no bytes; waited for and
        released).  Returns (m_block, head, batch, has_block, n_real: this CTA's tiles, n_slots, slots: this CTA's
        segments for ``slot_block``)."""
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        m_blocks = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        pairs_per_head = (m_blocks + 1) // 2
        n_heads = cute.size(mQ.shape[2])
        head = (pair // pairs_per_head) % n_heads
        batch = pair // (pairs_per_head * n_heads)
        first = 2 * (pair % pairs_per_head)
        if const_expr(self.causal or self.has_window):
            first = m_blocks - 2 - first                     # the last blocks first (longest first, as work_coords)
        lo0, hi0 = self.block_range(first, seqlen_q, seqlen_k, window_size)
        lo1, hi1 = self.block_range(first + 1, seqlen_q, seqlen_k, window_size)
        if first < 0:
            hi0 = lo0                                        # no block for rank 0: an empty range
        if first + 1 >= m_blocks:
            hi1 = lo1
        (n_shared, s_hi), (own0, top0), (own1, top1) = self.shared_and_own(lo0, hi0, lo1, hi1)
        n_slots = n_shared + cutlass.max(own0, own1)
        m_block = first + rank
        own, own_top = own0, top0
        if rank == 1:
            own, own_top = own1, top1
        has_block = m_block >= 0 and m_block < m_blocks
        return m_block, head, batch, has_block, n_shared + own, n_slots, ((n_shared, s_hi), (own, own_top))

    @cute.jit
    def slot_block(self, i, n_block_max, slots):
        """The KV tile of the i-th visit: ``n_block_max - 1 - i`` (descending), or, given ``slots`` — segments
        ``((count, top), …)``, each a run of tiles descending from ``top`` (the last segment's count unused) — the
        tile of slot i (cluster pairs, warpgroup tiles)."""
        n_block = n_block_max - 1 - i
        if const_expr(slots is not None):
            n_block = slots[0][1] - 1 - i
            start = slots[0][0]
            for seg in slots[1:]:
                if i >= start:
                    n_block = seg[1] - 1 - (i - start)
                start = start + seg[0]
        return n_block

    @cute.jit
    def load_slot(self, tma_atom, tXgX, tXsX, tma_atom_mc, tXgXmc, tXsXmc, pipe, state, i, n_real, slots):
        """Cluster pairs, producer: K or V slot i — a shared tile (this CTA's half, multicast into both CTAs; each
        CTA's full barrier expects the whole tile), an own tile (TMA into this CTA only) or an empty slot (the full
        barrier completed by a plain arrive once the stage is free in both CTAs)."""
        n_block = self.slot_block(i, n_real, slots)
        if i < slots[0][0]:
            pipe.producer_acquire(state)
            cute.copy(tma_atom_mc, tXgXmc[None, n_block], tXsXmc[None, state.index],
                      tma_bar_ptr=pipe.producer_get_barrier(state), mcast_mask=cutlass.Int16(3))
        else:
            if i < n_real:
                tma_load_tile(tma_atom, tXgX, tXsX, pipe, state, n_block)
            else:
                pipe.sync_object_empty.wait(state.index, state.phase)
                if cute.arch.lane_idx() == 0:
                    cute.arch.mbarrier_arrive(pipe.producer_get_barrier(state))

    @cute.jit
    def release_empty_slots(self, pipeline_k, pipeline_v, kv_state, n_empty):
        """Cluster pairs, consumers: the empty slots after this CTA's own tiles — waited for and handed back, so
        the stage can be refilled for both CTAs."""
        for _ in cutlass.range(n_empty, unroll=1):
            pipeline_k.consumer_wait(kv_state)
            pipeline_k.consumer_release(kv_state)
            pipeline_v.consumer_wait(kv_state)
            pipeline_v.consumer_release(kv_state)
            kv_state.advance()
        return kv_state

    @cute.jit
    def load_pairs(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, tma_atom_Kmc, mKmc, tma_atom_Vmc, mVmc, sQ,
                   sK, sV, pipeline_q, pipeline_k, pipeline_v, seqlen_q, seqlen_k, window_size):
        """Producer of a cluster-pair CTA: per pair, this CTA's Q (or, with no block, its Q stage completed empty —
        both loops take one Q stage per pair), then the pair's K/V slots (``pair_plan``), K one slot ahead of V."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        total = self.pair_items(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        pair = bidx // 2
        while pair < total:
            m_block, head, batch, has_block, n_real, n_slots, slots = self.pair_plan(pair, mQ, seqlen_q, seqlen_k,
                                                                                     window_size)
            head_kv = self.kv_head(head, mQ, mK)
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.item_tma_views(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV,
                                                                     sQ, sK, sV, cutlass.max(m_block, 0), head,
                                                                     head_kv, batch)
            gKmc = cute.local_tile(mKmc[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
            gVmc = cute.local_tile(mVmc[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
            # this CTA's half of a shared tile (rows rank·tile_n/2 …), for both CTAs' shared memory
            tKsKmc, tKgKmc = cpasync.tma_partition(tma_atom_Kmc, rank, cute.make_layout(2),
                                                   cute.group_modes(sK, 0, 2), cute.group_modes(gKmc, 0, 2))
            tVsVmc, tVgVmc = cpasync.tma_partition(tma_atom_Vmc, rank, cute.make_layout(2),
                                                   cute.group_modes(sV, 0, 2), cute.group_modes(gVmc, 0, 2))
            if has_block:
                pipeline_q.producer_acquire(q_state)
                cute.copy(tma_atom_Q, tQgQ, tQsQ[None, q_state.index],
                          tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
            else:
                pipeline_q.sync_object_empty.wait(q_state.index, q_state.phase)
                if cute.arch.lane_idx() == 0:
                    cute.arch.mbarrier_arrive(pipeline_q.producer_get_barrier(q_state))
            q_state.advance()
            k_state = kv_state.clone()
            for i in cutlass.range(n_slots + 1, unroll=1):
                if i < n_slots:
                    self.load_slot(tma_atom_K, tKgK, tKsK, tma_atom_Kmc, tKgKmc, tKsKmc, pipeline_k, k_state, i,
                                   n_real, slots)
                    k_state.advance()
                if i > 0:
                    self.load_slot(tma_atom_V, tVgV, tVsV, tma_atom_Vmc, tVgVmc, tVsVmc, pipeline_v, kv_state, i - 1,
                                   n_real, slots)
                    kv_state.advance()
            pair += gdim // 2
        pipeline_q.producer_tail(q_state)
        pipeline_k.producer_tail(kv_state.clone())
        pipeline_v.producer_tail(kv_state.clone())

    @cute.jit
    def block_range(self, m_block, seqlen_q, seqlen_k, window_size):
        """The KV tiles ``[n_block_min, n_block_max)`` query block ``m_block`` visits: all of them, or those the
        causal diagonal / the window leaves visible (tiles wholly outside are skipped, not masked)."""
        return self.rows_key_tiles(m_block * self.tile_m, (m_block + 1) * self.tile_m - 1, seqlen_q, seqlen_k,
                                   window_size)

    @cute.jit
    def rows_key_tiles(self, first_row, last_row, seqlen_q, seqlen_k, window_size):
        """The KV tiles the M rows ``first_row..last_row`` visit (``block_range`` of a block, or of a ring half)."""
        n_block_max = cute.ceil_div(seqlen_k, self.tile_n)
        n_block_min = Int32(0)
        if const_expr(self.has_window):
            # the first key the first row may see: t - W + 1 (tiles left of it are skipped)
            first_key = self.token(first_row) + seqlen_k - seqlen_q - window_size + 1
            n_block_min = cutlass.max(first_key, 0) // self.tile_n
        if const_expr(self.causal or self.has_window):
            # the last key the last row may see (queries aligned to the end of the keys)
            last_key = self.token(last_row) + seqlen_k - seqlen_q
            n_block_max = cutlass.min(n_block_max, cutlass.max(last_key // self.tile_n + 1, 0))
        return n_block_min, n_block_max

    # ------------------------------------------------------------------ the window ring (ring=True)
    @cute.jit
    def ring_chunking(self, mQ):
        """How the ring splits the work: (chunks per (head, batch), items per chunk, chunks).  Every head gets the
        same number of chunks, as many as leave one CTA per SM for each (B2 H16 on 132 SMs: 4 chunks of 32
        items); a chunk pays its first tiles once (2 of 64 extra at W = 128, S = 16k)."""
        m_items = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        heads = cute.size(mQ.shape[2]) * cute.size(mQ.shape[3])
        per_head = cutlass.max(cutlass.min(Int32(self.num_sms * self.ctas_per_sm) // heads, m_items), 1)
        chunk_items = (m_items + per_head - 1) // per_head
        per_head = (m_items + chunk_items - 1) // chunk_items
        return per_head, chunk_items, heads * per_head

    @cute.jit
    def ring_chunk(self, chunk, per_head, chunk_items, mQ):
        """Chunk → (head, batch, first item, end item)."""
        m_items = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        head_lin = chunk // per_head
        item_lo = (chunk % per_head) * chunk_items
        n_heads = cute.size(mQ.shape[2])
        return head_lin % n_heads, head_lin // n_heads, item_lo, cutlass.min(item_lo + chunk_items, m_items)

    @cute.jit
    def half_tiles(self, half, seqlen_q, seqlen_k, window_size):
        """The KV tiles of 64-row half ``half`` (item ``half // halves``, consumer warpgroup ``half % halves``, with
        ``halves`` = consumer warpgroups: 2 for 128-row items, 1 for 64-row ones)."""
        return self.rows_key_tiles(half * 64, half * 64 + 63, seqlen_q, seqlen_k, window_size)

    def ring_state(self, position):
        """The consumer's pipeline state of the ring's ``position``-th tile (counted over this CTA's whole life):
        stage ``position mod stages``, phase = parity of the laps."""
        return pipeline.PipelineState(self.num_stages, position, position % self.num_stages,
                                      (position // self.num_stages) % 2)

    @cute.jit
    def release_ring_tiles(self, pipeline_k, pipeline_v, ring_base, n_from, n_to):
        """Hand back tiles ``[n_from, n_to)`` this warpgroup never computes on (the other half's, with windows of
        at most 64 keys): wait for each first, so a release never runs ahead of the load it belongs to."""
        for n in cutlass.range(n_from, n_to, unroll=1):
            st = self.ring_state(ring_base + n)
            pipeline_k.consumer_wait(st)
            pipeline_k.consumer_release(st)
            pipeline_v.consumer_wait(st)
            pipeline_v.consumer_release(st)

    @cute.jit
    def load_ring(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
                  pipeline_v, seqlen_q, seqlen_k, window_size, mLSE):
        """Producer of the ring: per chunk, per item, its Q into the next Q stage, then the K/V tiles the item's
        second half reaches that are not loaded yet — each tile of the chunk once, in key order."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        per_head, chunk_items, num_chunks = self.ring_chunking(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        item_count = Int32(0)                                # debug_times stamps
        for chunk in cutlass.range(bidx, num_chunks, gdim, unroll=1):
            head, batch, item_lo, item_hi = self.ring_chunk(chunk, per_head, chunk_items, mQ)
            head_kv = self.kv_head(head, mQ, mK)
            gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.head_dim), (None, 0))  # (M, D, items)
            gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))  # (N, D, n)
            gV = cute.local_tile(mV[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
            tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                               cute.group_modes(gQ, 0, 2))       # (TMA, Q stages), (TMA, items)
            tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                               cute.group_modes(gK, 0, 2))       # (TMA, stages), (TMA, n)
            tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                               cute.group_modes(gV, 0, 2))
            halves = self.consumer_warpgroups                    # 64-row halves per item, one per warpgroup
            next_tile = self.half_tiles(halves * item_lo, seqlen_q, seqlen_k, window_size)[0]
            for item in cutlass.range(item_lo, item_hi, unroll=1):
                pipeline_q.producer_acquire(q_state)
                cute.copy(tma_atom_Q, tQgQ[None, item], tQsQ[None, q_state.index],
                          tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
                q_state.advance()
                self.timing_stamp(mLSE, item_count, 4)
                item_end = self.half_tiles(halves * item + halves - 1, seqlen_q, seqlen_k, window_size)[1]
                kv_state = load_kv_tiles(tma_atom_K, tKgK, tKsK, pipeline_k, tma_atom_V, tVgV, tVsV, pipeline_v,
                                         next_tile, item_end, self.num_stages, kv_state, ascending=True)
                next_tile = cutlass.max(next_tile, item_end)
                self.timing_stamp(mLSE, item_count, 5)
                item_count += 1
        pipeline_q.producer_tail(q_state)
        pipeline_k.producer_tail(kv_state.clone())
        pipeline_v.producer_tail(kv_state.clone())

    @cute.jit
    def consume_ring(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, mLSE, mQ, pipeline_q, pipeline_k,
                     pipeline_v, softmax_scale_log2, window_size, mSink, ctidx, seqlen_q, seqlen_k, rows_q):
        """Consumers of the ring: warpgroup w computes half ``halves·item + w`` of every item of the chunk over its
        tiles in ascending order, handing back each tile its next half does not need; both halves' O go into
        the item's Q stage, for the storer warp (``store_ring``) to take out."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        (thr_qk, thr_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum,
         tOcO_rc) = self.consumer_fragments(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, ctidx)
        causal_shift = seqlen_k - seqlen_q
        wg = ctidx // 128
        halves = self.consumer_warpgroups                            # 64-row halves per item, one per warpgroup
        per_head, chunk_items, num_chunks = self.ring_chunking(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        tSsQ = thr_qk.partition_A(sQ)                                # (MMA, MMA_M, MMA_K, Q stages) in smem
        if const_expr(self.q_in_registers):
            if bidx < num_chunks:            # the CTA's first Q: to registers, and its stage straight back
                self.ring_q_to_registers(pipeline_q, q_state, tSsQ, tSrQ)
                if ctidx < 32:               # one warp: the Q pipeline's consumer count is one arrival
                    pipeline_q.consumer_release(q_state)
                q_state.advance()
        tiles_before = Int32(0)              # tiles this CTA streamed for its earlier chunks
        item_count = Int32(0)                # items this CTA has done (debug_times stamps)
        for chunk in cutlass.range(bidx, num_chunks, gdim, unroll=1):
            head, batch, item_lo, item_hi = self.ring_chunk(chunk, per_head, chunk_items, mQ)
            chunk_lo = self.half_tiles(halves * item_lo, seqlen_q, seqlen_k, window_size)[0]
            chunk_hi = self.half_tiles(halves * item_hi - 1, seqlen_q, seqlen_k, window_size)[1]
            ring_base = tiles_before - chunk_lo             # tile n of this chunk is the ring's (ring_base + n)-th
            released = chunk_lo                             # tiles below were handed back by this warpgroup
            for item in cutlass.range(item_lo, item_hi, unroll=1):
                half = halves * item + wg
                n_lo, n_hi = self.half_tiles(half, seqlen_q, seqlen_k, window_size)
                n_keep = chunk_hi                           # tiles from n_keep on: this warpgroup's next half uses them
                if item + 1 < item_hi:
                    n_keep = self.half_tiles(half + halves, seqlen_q, seqlen_k, window_size)[0]
                self.release_ring_tiles(pipeline_k, pipeline_v, ring_base, released, n_lo)
                acc_O.fill(0.0)
                row_max.fill(-Float32.inf)
                row_sum.fill(0.0)
                self.timing_stamp(mLSE, item_count, 0, ctidx == 0)
                q_index = 0                  # Q in registers: one Q stage, its fragment the registers' only copy
                if const_expr(not self.q_in_registers):
                    pipeline_q.consumer_wait(q_state)
                    q_index = q_state.index
                self.mainloop_ring(tiled_mma_qk, tiled_mma_pv, tSrQ[None, None, None, q_index], tSrK, tOrVt,
                                   acc_O, acc_O_rc, tScS_rc, row_max, row_sum, pipeline_k, pipeline_v,
                                   softmax_scale_log2, window_size, item, seqlen_k, causal_shift, n_lo, n_hi, n_keep,
                                   ring_base)
                self.timing_stamp(mLSE, item_count, 1, ctidx == 0)
                self.release_ring_tiles(pipeline_k, pipeline_v, ring_base, cutlass.max(n_hi, released), n_keep)
                released = n_keep
                self.finish_rows(acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, item, head,
                                 batch, Int32(0), rows_q)
                if const_expr(self.q_in_registers):
                    # the next item's Q (loaded while this one computed) into the registers this item's QKs are done
                    # with, before this O takes its stage; q_state then names the stage O goes to (the only one)
                    if item + 1 < item_hi or chunk + gdim < num_chunks:
                        self.ring_q_to_registers(pipeline_q, q_state, tSsQ, tSrQ)
                    else:
                        # the CTA's last item: no next Q proves the previous O store has read the stage, so wait for
                        # that hand-back itself (the q_state.count-th completion of the stage's empty barrier)
                        pipeline_q.sync_object_empty.wait(0, q_state.phase ^ 1)
                    cute.arch.barrier(barrier_id=self.EPILOGUE_BARRIER, number_of_threads=128)  # all of Q is read
                    self.timing_stamp(mLSE, item_count, 2, ctidx == 0)
                # O → this item's Q stage (each warpgroup's own 64 rows, its QKs all retired), then tell the storer
                self.hand_o_to_storer(acc_O, tiled_mma_pv, sQ, q_state.index, ctidx)
                q_state.advance()    # Q in registers: the stage index stays 0, the phase is the next Q's
                self.timing_stamp(mLSE, item_count, 3, ctidx == 0)
                item_count += 1
            tiles_before = tiles_before + chunk_hi - chunk_lo

    @cute.jit
    def ring_q_to_registers(self, pipeline_q, q_state, tSsQ, tSrQ):
        """Q in registers: wait for the Q in the (single) stage and copy this thread's A fragment out of it."""
        pipeline_q.consumer_wait(q_state)
        cute.autovec_copy(tSsQ[None, None, None, 0], tSrQ[None, None, None, 0])

    @cute.jit
    def store_ring(self, tma_atom_O, mO, mQ, sQ, pipeline_q, mLSE):
        """The ring's storer warp: per item, wait until both consumer warpgroups have put O in the item's Q stage
        (named barrier of that stage: the consumers only arrive, they never wait here), TMA-store it, wait for the
        store to read the stage and hand it back to the producer.  The barrier of a stage is not reused before the
        storer has passed it: the consumers' next arrival there needs the Q that this hand-back lets in."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        per_head, chunk_items, num_chunks = self.ring_chunking(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        item_count = Int32(0)                                # debug_times stamps
        for chunk in cutlass.range(bidx, num_chunks, gdim, unroll=1):
            head, batch, item_lo, item_hi = self.ring_chunk(chunk, per_head, chunk_items, mQ)
            for item in cutlass.range(item_lo, item_hi, unroll=1):
                self.store_staged_o(tma_atom_O, mO, sQ, pipeline_q, q_state, item, head, batch)
                q_state.advance()
                self.timing_stamp(mLSE, item_count, 6)
                item_count += 1

    @cute.jit
    def hand_o_to_storer(self, acc_O, tiled_mma_pv, sQ, stage, ctidx):
        """Consumers: O into Q stage ``stage`` (each warpgroup its own 64 rows, whose QKs have all retired), then an
        arrive on the stage's store barrier — nobody waits here; the storer warp (``store_staged_o``) does."""
        self.stage_o(acc_O, tiled_mma_pv, sQ[None, None, stage], ctidx)
        cute.arch.barrier_arrive(barrier_id=self.RING_STORE_BARRIERS + stage,
                                 number_of_threads=128 * self.consumer_warpgroups + 32)

    @cute.jit
    def store_staged_o(self, tma_atom_O, mO, sQ, pipeline_q, q_state, m_block, head, batch):
        """The storer warp, one item: wait on its Q stage's store barrier until every consumer has put O there
        (``hand_o_to_storer``), TMA-store the tile (Q's L2 hint: written once), wait for the store to read the stage
        and hand the stage back to the producer.  The caller advances ``q_state``."""
        cute.arch.barrier(barrier_id=self.RING_STORE_BARRIERS + q_state.index,
                          number_of_threads=128 * self.consumer_warpgroups + 32)
        gO = cute.local_tile(mO[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))
        tma_store_tile(tma_atom_O, sQ[None, None, q_state.index], gO, wait=True, cache_policy=self.l2_q)
        pipeline_q.consumer_release(q_state)

    @cute.jit
    def store_persistent(self, tma_atom_O, mO, mQ, sQ, pipeline_q, sWork):
        """The storer warp of a persistent CTA with ``o_in_q_stage``: per work item (the consumers' sequence: every
        gridDim.x-th, or as announced in ``sWork``), wait until both consumer warpgroups have put O in the item's Q
        stage (its named barrier: the consumers only arrive), TMA-store it, wait for the store to read the stage and
        hand it back to the producer; with the dynamic schedule also the -1 stage after the last item.  A stage's
        barrier is not reused before the storer has passed it (the consumers' next arrival needs the Q this
        hand-back lets in)."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        total = self.work_items(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        work = bidx
        if const_expr(self.dynamic_schedule):
            work = self.announced_work(pipeline_q, q_state, sWork, total)
        while work < total:
            m_block, head, batch = self.work_coords(work, mQ)
            self.store_staged_o(tma_atom_O, mO, sQ, pipeline_q, q_state, m_block, head, batch)
            q_state.advance()
            if const_expr(self.dynamic_schedule):
                work = self.announced_work(pipeline_q, q_state, sWork, total)
            else:
                work += gdim
        if const_expr(self.dynamic_schedule):
            pipeline_q.consumer_release(q_state)             # the -1 stage: the producer's tail waits for it

    @cute.jit
    def mainloop_ring(self, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum,
                      pipeline_k, pipeline_v, softmax_scale_log2, window_size, m_block, seqlen_k, causal_shift, n_lo,
                      n_hi, n_keep, ring_base):
        """The overlapped mainloop (QK(j+1) ∥ PV(j)) over ring tiles ``[n_lo, n_hi)`` in ascending order: the oldest
        tile first, so its stage goes back to the producer (when ``n < n_keep``) right after its QK / PV.  The
        window's edge tile comes first and may leave a row without a visible key (its max stays -inf;
        ``online_softmax`` keeps such a row at zero)."""
        acc_S, acc_S_rc, tOrP_view, tOrP, corrections = self.overlap_registers(tiled_mma_qk, row_max)
        if n_hi > n_lo:
            k_st = self.ring_state(ring_base + n_lo)
            pipeline_k.consumer_wait(k_st)
            self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, k_st.index], True)
            if n_lo < n_keep:
                pipeline_k.consumer_release(k_st)
            self.mask_scores(acc_S_rc, tScS_rc, n_lo, m_block, seqlen_k, causal_shift, window_size)
            self.online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, True)
            convert_to_bf16_pairs(tOrP_view, tOrP)
            for n in cutlass.range(n_lo + 1, n_hi, unroll=1):
                k_st = self.ring_state(ring_base + n)
                v_st = self.ring_state(ring_base + n - 1)
                pipeline_k.consumer_wait(k_st)
                self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, k_st.index], True, False)
                pipeline_v.consumer_wait(v_st)
                self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_st.index], False, False)
                warpgroup.wait_group(1)                                      # S of tile n is ready
                if n < n_keep:
                    pipeline_k.consumer_release(k_st)
                self.mask_scores(acc_S_rc, tScS_rc, n, m_block, seqlen_k, causal_shift, window_size)
                self.online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, False)
                warpgroup.wait_group(0)                                      # PV done: O and P are ours again
                if n - 1 < n_keep:
                    pipeline_v.consumer_release(v_st)
                self.rescale_rows(acc_O_rc, corrections)
                convert_to_bf16_pairs(tOrP_view, tOrP)
            v_st = self.ring_state(ring_base + n_hi - 1)
            pipeline_v.consumer_wait(v_st)                                   # the last tile's PV
            self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_st.index], False)
            if n_hi - 1 < n_keep:
                pipeline_v.consumer_release(v_st)

    @cute.jit
    def load(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
             pipeline_v, m_block, head, head_kv, batch, n_block_min, n_block_max):
        gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))   # (tile_m, D)
        gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))   # (tile_n, D, n)
        gV = cute.local_tile(mV[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipeline_q.producer_acquire(q_state)
        cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
        kv_state = load_kv_tiles(tma_atom_K, tKgK, tKsK, pipeline_k, tma_atom_V, tVgV, tVsV, pipeline_v, n_block_min,
                                 n_block_max, self.num_stages, k_ahead=self.overlap)
        if const_expr(not self.debug_notail):
            # producer_tail advances the state it is given: each pipeline gets its own copy, or the V tail
            # would wait on a stage the K tail moved past (a hang found on the H200)
            pipeline_k.producer_tail(kv_state.clone())
            pipeline_v.producer_tail(kv_state.clone())
        if const_expr(self.debug_printf):
            if m_block == 0 and head == 0 and batch == 0:
                cute.printf("D1 producer: done\n")

    @cute.jit
    def mask_scores(self, acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift, window_size, wg_idx=None):
        """-inf on the scores a query may not see, only in the tiles that need it, and only the edge that crosses
        the tile: the right edge (the ragged end of the keys, the causal diagonal) and the window's left edge are
        separate passes (a window's tile crosses one of them, seldom both).  Each pass turns its edge into one
        limit per row, relative to the thread's first column, so an element costs one compare with a constant (its
        column offset) and one select, not a column computed and compared twice.  Whether an edge crosses the tile
        is asked of the block's rows, or, with warpgroup tiles, of this warpgroup's own 64 (``wg_idx``): in a 192-row
        block the upper warpgroups would otherwise mask every tile of theirs."""
        first_col = n_block * self.tile_n
        crosses_right = first_col + self.tile_n > seqlen_k
        if const_expr(self.causal or self.has_window):
            crosses_right = crosses_right or (first_col + self.tile_n - 1 > self.token(self.mask_row(m_block, wg_idx, 0))
                                              + causal_shift)
        if crosses_right:
            for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
                m, n0 = tScS_rc[r, 0]
                visible = seqlen_k - first_col - n0             # columns n with n - n0 < visible are kept
                if const_expr(self.causal or self.has_window):
                    diagonal = self.token(m_block * self.tile_m + m) + causal_shift + 1 - first_col - n0
                    if diagonal < visible:
                        visible = diagonal
                for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                    if tScS_rc[r, c][1] - n0 >= visible:
                        acc_S_rc[r, c] = -Float32.inf
        if const_expr(self.has_window):     # the window's left edge crosses this tile for some row
            if first_col <= self.token(self.mask_row(m_block, wg_idx, 1)) + causal_shift - window_size:
                for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
                    m, n0 = tScS_rc[r, 0]
                    # columns n with n - n0 <= hidden fall out of the window (col <= token + shift - W)
                    hidden = self.token(m_block * self.tile_m + m) + causal_shift - window_size - first_col - n0
                    for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                        if tScS_rc[r, c][1] - n0 <= hidden:
                            acc_S_rc[r, c] = -Float32.inf

    @cute.jit
    def mask_row(self, m_block, wg_idx, last: cutlass.Constexpr):
        """The first (``last`` = 0) or last (1) M row whose keys decide whether an edge crosses a tile: the block's,
        or with warpgroup tiles warpgroup ``wg_idx``'s own 64 rows."""
        if const_expr(self.warpgroup_tiles):
            row = m_block * self.tile_m + 64 * wg_idx + 63 * last
        elif const_expr(last):
            row = (m_block + 1) * self.tile_m - 1
        else:
            row = m_block * self.tile_m
        return row

    @cute.jit
    def scheduler_wait(self, wg_idx):
        """Ping-pong: block until it is this consumer warpgroup's turn to issue MMAs."""
        if const_expr(self.wg_pingpong):
            cute.arch.barrier(barrier_id=self.SCHEDULER_BARRIER_BASE + wg_idx, number_of_threads=256)

    @cute.jit
    def scheduler_pass(self, wg_idx):
        """Ping-pong: hand the turn to the next consumer warpgroup (arrive on its barrier, do not wait)."""
        if const_expr(self.wg_pingpong):
            nxt = wg_idx + 1
            if nxt == self.consumer_warpgroups:
                nxt = 0
            cute.arch.barrier_arrive(barrier_id=self.SCHEDULER_BARRIER_BASE + nxt, number_of_threads=256)

    def overlap_registers(self, tiled_mma_qk, row_max):
        """The overlapped mainloops' registers: S (flat and as (rows, cols)), its bf16 P view and P of the tile in
        flight, and the rows' deferred O corrections."""
        thr_qk = tiled_mma_qk.get_slice(0)
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        acc_S_rc = cute.make_tensor(acc_S.iterator, acc_layout_rows_cols(acc_S.layout))
        tOrP_view = cute.make_tensor(acc_S.iterator, acc_layout_as_operand_a(acc_S.layout))
        tOrP = cute.make_rmem_tensor_like(tOrP_view, self.dtype)              # P of the tile in flight
        return acc_S, acc_S_rc, tOrP_view, tOrP, cute.make_rmem_tensor((cute.size(row_max),), Float32)

    @cute.jit
    def mainloop_overlapped(self, tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max,
                            row_sum, pipeline_k, pipeline_v, kv_state, softmax_scale_log2, window_size, m_block,
                            seqlen_k, causal_shift, n_block_min, n_block_max, wg_idx, slots=None):
        """QK(j+1) ∥ PV(j): one S buffer, one P buffer, the O rescale deferred past the in-flight PV (or, with
        ``rescale_o_early``, done while QK(j+1) is in flight, before PV(j) is issued).  Whether the softmax of tile
        j+1 really runs beside PV(j) is ptxas's call: by default it hoists the PV wait above the softmax (SASS, session
        13); ``pv_wait_block`` keeps the wait below it."""
        acc_S, acc_S_rc, tOrP_view, tOrP, corrections = self.overlap_registers(tiled_mma_qk, row_max)
        v_state = kv_state.clone()                                           # one tile behind kv_state
        v_prev = None
        if const_expr(self.pv_wait_block):
            v_prev = kv_state.clone()              # the V stage whose PV the last tile waited for (released late)
        n_iter = n_block_max - n_block_min
        if const_expr(self.wg_pingpong):
            # the first consumer warpgroup holds the first turn; the last warpgroup's final pass is never waited on
            # (its barrier is left half-arrived at exit, as in FA3/FA4's non-persistent kernels)
            if wg_idx == 0:
                cute.arch.barrier_arrive(barrier_id=self.SCHEDULER_BARRIER_BASE, number_of_threads=256)
        if n_iter > 0:
            # prologue: the first tile alone (O is still zero, so rescaling it now is free)
            pipeline_k.consumer_wait(kv_state)
            self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True)
            pipeline_k.consumer_release(kv_state)
            self.mask_scores(acc_S_rc, tScS_rc, self.slot_block(0, n_block_max, slots), m_block, seqlen_k,
                             causal_shift, window_size, wg_idx)
            self.online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections,
                                not self.rescale_o_early)
            convert_to_bf16_pairs(tOrP_view, tOrP)
            kv_state.advance()
            for i in cutlass.range(1, n_iter, unroll=1):
                n_block = self.slot_block(i, n_block_max, slots)
                pipeline_k.consumer_wait(kv_state)
                self.scheduler_wait(wg_idx)
                self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, False)
                if const_expr(self.rescale_o_early):
                    self.rescale_rows(acc_O_rc, corrections)                 # O·corr(j) before O += P(j)·V(j)
                pipeline_v.consumer_wait(v_state)
                self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False, False)
                self.scheduler_pass(wg_idx)
                if const_expr(self.pv_wait_block):
                    if i > 1:
                        pipeline_v.consumer_release(v_prev)                  # PV(j-1): waited for last tile
                warpgroup.wait_group(1)                                      # S of tile n_block is ready
                pipeline_k.consumer_release(kv_state)
                self.mask_scores(acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift, window_size, wg_idx)
                self.online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, False)
                if const_expr(self.pv_wait_block):
                    # PV(j) done.  The wait sits behind a branch (never the else: seqlen_k > 0 here) so that it
                    # starts a basic block of its own: in the softmax's block ptxas hoists it above the whole softmax
                    # (to pack P early into the registers PV(j) still reads), which serializes the softmax behind
                    # PV(j) and undoes the overlap.  Its V stage is released next tile, after PV(j+1) is issued.
                    if seqlen_k > 0:
                        warpgroup.wait_group(0)
                    else:
                        cute.arch.sync_warp()              # differs from the other side, so the branch is kept
                        warpgroup.wait_group(0)
                else:
                    warpgroup.wait_group(0)                                  # PV done: O and P are ours again
                    pipeline_v.consumer_release(v_state)
                if const_expr(not self.rescale_o_early):
                    self.rescale_rows(acc_O_rc, corrections)
                convert_to_bf16_pairs(tOrP_view, tOrP)
                if const_expr(self.pv_wait_block):
                    v_prev = v_state.clone()
                v_state.advance()
                kv_state.advance()
            if const_expr(self.pv_wait_block):
                if n_iter > 1:
                    pipeline_v.consumer_release(v_prev)
            if const_expr(self.rescale_o_early):
                self.rescale_rows(acc_O_rc, corrections)
            pipeline_v.consumer_wait(v_state)                                # the last tile's PV
            self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False)
            pipeline_v.consumer_release(v_state)
        return kv_state                          # advanced past this block's tiles (the persistent loop goes on)

    @cute.jit
    def store_nvfp4(self, acc_O_rc, tOcO_rc, mData, mScales, s_enc, m_block, head, batch, seqlen_q):
        """O (fp32, normalized) → NVFP4 from the registers that hold it.  Columns c..c+3 of a row are d0, d0+1,
        d0+8, d0+9 of one 16-column block (d0 = 16·block + 2t, t = lane % 4): thread t packs bytes t and 4 + t of
        the block's 8.  The quad ORs its bytes into the block's two 32-bit words (butterfly shuffles), so every
        thread of the quad ends the row holding the whole packed row (D/2 bytes); thread t stores the t-th quarter
        of it with one vector store, so each store instruction writes D/8 contiguous bytes of 8 rows (byte stores
        wrote 4).  The row's scale bytes, known to the whole quad, leave as 32-bit words.  ``mData`` /
        ``mScales`` are 32-bit views of the byte tensors: (s, D/8, h, b) and (s, D/64, h, b), rows contiguous."""
        s_dec = 1.0 / s_enc                                 # once per thread, not once per block
        t = cute.arch.lane_idx() % 4
        n_blocks = cute.size(acc_O_rc, mode=[1]) // 4
        per_lane = n_blocks // 2                            # data words a quad lane stores per row (2 per block)
        for r in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[0])):
            row = m_block * self.tile_m + tOcO_rc[r, 0][0]
            words = []                                      # the packed row, word 2·block (+1), in every quad lane
            scale_words = [Uint32(0) for _ in range((n_blocks + 3) // 4)]
            for blk in cutlass.range_constexpr(n_blocks):
                c0 = 4 * blk
                vmax = Float32(0.0)
                for k in cutlass.range_constexpr(4):
                    vmax = cute.arch.fmax(vmax, cute.arch.fmax(acc_O_rc[r, c0 + k], -acc_O_rc[r, c0 + k]))
                vmax = cute.arch.fmax(vmax, cute.arch.shuffle_sync_bfly(vmax, offset=2))   # the quad shares the block
                vmax = cute.arch.fmax(vmax, cute.arch.shuffle_sync_bfly(vmax, offset=1))
                sf_bits, enc = nvfp4_block_scale(vmax, s_enc, s_dec)
                byte_lo = e2m1_code_magic(acc_O_rc[r, c0] * enc) | (e2m1_code_magic(acc_O_rc[r, c0 + 1] * enc) << Uint32(4))
                byte_hi = e2m1_code_magic(acc_O_rc[r, c0 + 2] * enc) | (e2m1_code_magic(acc_O_rc[r, c0 + 3] * enc) << Uint32(4))
                for word in (byte_lo << (Uint32(8) * Uint32(t)), byte_hi << (Uint32(8) * Uint32(t))):
                    for offset in (1, 2):                   # bytes 0..3 (lo) / 4..7 (hi) of the block, one per lane
                        word = word | Uint32(cute.arch.shuffle_sync_bfly(Int32(word), offset=offset))
                    words.append(word)
                scale_words[blk // 4] = scale_words[blk // 4] | (sf_bits << Uint32(8 * (blk % 4)))
            rW = cute.make_rmem_tensor((per_lane,), Int32)
            for k in cutlass.range_constexpr(per_lane):     # my quarter of the row: words per_lane·t + k
                mine_k = Int32(words[k])
                for g in cutlass.range_constexpr(1, 4):
                    if t == g:
                        mine_k = Int32(words[g * per_lane + k])
                rW[k] = mine_k
            if row < seqlen_q:
                row_words = mData[row, None, head, batch]                                   # (D/8,) contiguous
                mine = cute.make_tensor(
                    cute.make_ptr(Int32, row_words.iterator.toint() + Int64(4 * per_lane) * Int64(t),
                                  cute.AddressSpace.gmem, assumed_align=4 * per_lane),
                    cute.make_layout(per_lane))
                cute.autovec_copy(rW, mine)
                for sw in cutlass.range_constexpr(len(scale_words)):
                    if t == sw % 4:
                        mScales[row, sw, head, batch] = Int32(scale_words[sw])

    @cute.jit
    def store_o_tma(self, acc_O, tiled_mma_pv, sO, tma_atom_O, gO, ctidx, reuse: cutlass.Constexpr = False,
                    barrier_id=None, threads: cutlass.Constexpr = None):
        """bf16 O → shared memory by stmatrix, then one TMA store of the whole tile.  The buffer is Q's: each
        warpgroup writes only the 64 rows its own QK wgmmas read, all of them retired, so no barrier is needed
        before the writes; rows past the end of the sequence are clipped by the TMA unit.  ``reuse`` (persistent
        CTAs, O's own buffer): first wait until the previous block's store has read the buffer, and leave this
        store in flight (the next block, or the end of the CTA, waits for it).  ``barrier_id`` / ``threads``: the
        threads that meet (by default every consumer thread at EPILOGUE_BARRIER; ``split_epilogue``: one warpgroup,
        ``ctidx`` its own thread index, ``sO`` and ``gO`` its 64 rows, ``tiled_mma_pv`` a one-warpgroup MMA)."""
        if const_expr(barrier_id is None):
            barrier_id = self.EPILOGUE_BARRIER
        if const_expr(threads is None):
            threads = 128 * self.consumer_warpgroups
        if const_expr(reuse):
            if ctidx < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
        self.stage_o(acc_O, tiled_mma_pv, sO, ctidx)
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
        if ctidx < 32:
            tma_store_tile(tma_atom_O, sO, gO, wait=not reuse)

    @cute.jit
    def stage_o(self, acc_O, tiled_mma_pv, sO, ctidx):
        """bf16 O → the shared-memory tile ``sO`` by stmatrix (this thread's part under ``tiled_mma_pv``), fenced
        for the TMA store that reads it (generic-proxy writes → async-proxy reads)."""
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_copy_O = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv).get_slice(ctidx)
        cute.copy(stmatrix, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def finish_rows(self, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, m_block, head, batch,
                    split, rows_q):
        """Epilogue, rows: the row sums finished across the quad, the sink added to the denominator, O normalized
        in place, the LSE (sink excluded) written by the thread holding column 0."""
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            s = row_sum[r]
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            inv = Float32(0.0)
            lse = -Float32.inf
            if s > 0.0:
                denom = s
                if const_expr(self.has_sink):
                    # the value-less sink joins the denominator once: exp(σ - m) in this row's max units
                    q_head = head
                    if const_expr(self.pack_gqa > 1):     # this row's own q head within the KV head's group
                        q_head = head * self.pack_gqa + (m_block * self.tile_m + tOcO_rc[r, 0][0]) % self.pack_gqa
                    denom = s + cute.arch.exp2(mSink[q_head] * LOG2_E - row_max[r] * softmax_scale_log2)
                inv = 1.0 / denom
                lse = (row_max[r] * softmax_scale_log2 + cute.math.log2(s)) * LN_2      # sink excluded
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * inv
            if const_expr((self.has_lse or self.split_kv) and not self.debug_times):
                m, d = tOcO_rc[r, 0]
                row = m_block * self.tile_m + m
                if d == 0 and row < rows_q:
                    if const_expr(self.split_kv):
                        mLSE[row, head, batch, split] = lse
                    else:
                        mLSE[row, head, batch] = lse

    def o_coords(self, thr_pv):
        """The (row, column) of every O accumulator element this thread holds, flat and as (rows, cols)."""
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim)))
        return tOcO, cute.make_tensor(tOcO.iterator, acc_layout_rows_cols(tOcO.layout))

    @cute.jit
    def consumer_fragments(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, ctidx):
        """A consumer thread's MMA views and registers: its slices of the two MMAs, the Q / K / Vᵀ operand fragments
        (Q with a stage mode when persistent), the O accumulator and its (rows, cols) view, the (m, n) coordinate
        of every score it holds, its rows' running max and sum (not initialized), and the (rows, cols) coordinates
        of its O elements."""
        thr_qk = tiled_mma_qk.get_slice(ctidx)
        thr_pv = tiled_mma_pv.get_slice(ctidx)
        # Q's shared-memory descriptors depend only on the warpgroup (its 64-row slice): slicing by a warpgroup index
        # the compiler can prove warp-uniform keeps them in uniform registers, instead of building them per thread
        # from tid.x and moving them to uniform registers (one R2UR) before every QK wgmma
        thr_qk_wg = tiled_mma_qk.get_slice(cute.arch.make_warp_uniform(ctidx // 128) * 128)
        tSrQ = thr_qk_wg.make_fragment_A(thr_qk_wg.partition_A(sQ))        # (MMA, MMA_M, MMA_K[, Q stages])
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))              # (MMA, MMA_N, MMA_K, stages)
        tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))            # (MMA, MMA_D, MMA_K, stages)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        acc_O_rc = cute.make_tensor(acc_O.iterator, acc_layout_rows_cols(acc_O.layout))    # (rows, cols)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))   # (m, n) per element
        tScS_rc = cute.make_tensor(tScS.iterator, acc_layout_rows_cols(tScS.layout))
        row_max = cute.make_rmem_tensor((cute.size(acc_O_rc, mode=[0]),), Float32)
        row_sum = cute.make_rmem_tensor((cute.size(acc_O_rc, mode=[0]),), Float32)
        return thr_qk, thr_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, self.o_coords(thr_pv)[1]

    @cute.jit
    def consume(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sP, tma_atom_O, mO, mLSE, pipeline_q, pipeline_k, pipeline_v,
                softmax_scale_log2, window_size, mSink, mOutScales, mSenc, ctidx, m_block, head, batch, split,
                seqlen_q, seqlen_k, n_block_min, n_block_max, rows_q):
        (thr_qk, thr_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc, row_max, row_sum,
         _) = self.consumer_fragments(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, ctidx)
        if const_expr(self.p_in_smem):
            tSsP = thr_qk.partition_C(sP)            # where each accumulator element goes = composition(sP, tv_C)
            tOrP_smem = thr_pv.make_fragment_A(thr_pv.partition_A(sP))       # the PV MMA's view of the same buffer
            warpgroup_idx = ctidx // 128
        n_rows = cute.size(acc_O_rc, mode=[0])                              # rows this thread owns (2)
        acc_O.fill(0.0)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipeline_q.consumer_wait(q_state)
        dbg = self.debug_printf
        if const_expr(dbg):
            if ctidx == 0 and m_block == 0 and head == 0 and batch == 0:
                cute.printf("D1 consumer: Q arrived\n")
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        # the diagonal offset: query row r sits at key position r + seqlen_k - seqlen_q
        causal_shift = seqlen_k - seqlen_q
        if const_expr(self.overlap):
            self.mainloop_overlapped(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc,
                                     row_max, row_sum, pipeline_k, pipeline_v, kv_state, softmax_scale_log2,
                                     window_size, m_block, seqlen_k, causal_shift, n_block_min, n_block_max,
                                     ctidx // 128)
        else:
            for i in cutlass.range(n_block_max - n_block_min, unroll=1):
                n_block = n_block_max - 1 - i
                acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
                pipeline_k.consumer_wait(kv_state)
                self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True)
                pipeline_k.consumer_release(kv_state)
                if const_expr(dbg):
                    if ctidx == 0 and m_block == 0 and head == 0 and batch == 0:
                        cute.printf("D1 consumer: QK done for block %d, S[0] = %f\n", n_block, acc_S[0])

                acc_S_rc = cute.make_tensor(acc_S.iterator, acc_layout_rows_cols(acc_S.layout))
                self.mask_scores(acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift, window_size)
                self.online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, None, True)

                if const_expr(self.p_in_smem):
                    # SMEM-P: bf16 P to the swizzled buffer, then make the stores visible to the async proxy
                    rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
                    rP.store(acc_S.load().to(self.dtype))
                    cute.autovec_copy(rP, tSsP)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=1 + warpgroup_idx, number_of_threads=128)   # this warpgroup's rows
                    tOrP = tOrP_smem
                else:
                    # P stays in the registers that held S: re-view as the RS operand, convert to bf16
                    tOrP_acc = cute.make_tensor(acc_S.iterator, acc_layout_as_operand_a(acc_S.layout))
                    tOrP = cute.make_rmem_tensor_like(tOrP_acc, self.dtype)
                    tOrP.store(tOrP_acc.load().to(self.dtype))
                pipeline_v.consumer_wait(kv_state)
                self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, kv_state.index], False)
                pipeline_v.consumer_release(kv_state)
                kv_state.advance()
                if const_expr(dbg):
                    if ctidx == 0 and m_block == 0 and head == 0 and batch == 0:
                        cute.printf("D1 consumer: PV done for block %d, O[0] = %f\n", n_block, acc_O[0])

        # epilogue: finish the row sums across the quad, normalize, write O (and LSE)
        mO_cur = mO[None, None, head, batch, split] if const_expr(self.split_kv) else mO[None, None, head, batch]
        gO = cute.local_tile(mO_cur, (self.tile_m, self.head_dim), (m_block, 0))
        tOgO = thr_pv.partition_C(gO)
        tOcO, tOcO_rc = self.o_coords(thr_pv)
        self.finish_rows(acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, m_block, head, batch,
                         split, rows_q)
        if const_expr(self.nvfp4_out):
            self.store_nvfp4(acc_O_rc, tOcO_rc, mO, mOutScales, mSenc[0], m_block, head, batch, seqlen_q)
        elif const_expr(self.tma_store_o):
            self.store_o_tma(acc_O, tiled_mma_pv, sQ, tma_atom_O, gO, ctidx)
        else:
            rO = cute.make_rmem_tensor_like(acc_O, mO.element_type)        # bf16 out, or the fp32 partial
            rO.store(acc_O.load().to(mO.element_type))
            for i in cutlass.range_constexpr(cute.size(rO)):
                if m_block * self.tile_m + tOcO[i][0] < rows_q:
                    tOgO[i] = rO[i]
        pipeline_q.consumer_release(q_state)
        if const_expr(dbg):
            if ctidx == 0 and m_block == 0 and head == 0 and batch == 0:
                cute.printf("D1 consumer: done\n")


def fake_split_args(head_dim: int):
    """Like :func:`fake_attention_args` but with the fp32 partial outputs of a split-KV build."""
    from cutlass.cute.runtime import make_fake_tensor
    q, k, v, _, _, scale, window, sink, out_scales, s_enc = fake_attention_args(head_dim)
    sp, b, s, h = (cute.sym_int() for _ in range(4))
    o_part = make_fake_tensor(Float32, (sp, b, s, h, cute.sym_int()),
                              stride=tuple(cute.sym_int(divisibility=4) for _ in range(4)) + (1,), assumed_align=16)
    lse_part = make_fake_tensor(Float32, (sp, b, h, s), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                                assumed_align=4)
    return q, k, v, o_part, lse_part, scale, window, sink, out_scales, s_enc


def fake_nvfp4_args(head_dim: int):
    """Fake args of an ``nvfp4_out`` build: O's bytes (b, s, h, d/2) and the scale bytes (b, s, h, d/16), both as
    32-bit words — (b, s, h, d/8) and (b, s, h, d/64) — the views ``dsv4lib.attention_nvfp4`` passes."""
    from cutlass.cute.runtime import make_fake_tensor
    q, k, v, _, lse, scale, window, sink, _, s_enc = fake_attention_args(head_dim)
    b, s, h = (cute.sym_int() for _ in range(3))
    data = make_fake_tensor(Int32, (b, s, h, head_dim // 8), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                            assumed_align=16)
    scales = make_fake_tensor(Int32, (b, s, h, head_dim // 64), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                              assumed_align=4)
    return q, k, v, data, lse, scale, window, sink, scales, s_enc


def fake_work_counters():
    """Symbolic stand-in for the dynamic schedule's int32 (2,) counters (the argument after the stream)."""
    from cutlass.cute.runtime import make_fake_tensor
    return make_fake_tensor(cutlass.Int32, (2,), stride=(1,), assumed_align=4)


def fake_attention_args(head_dim: int, dynamic_schedule: bool = False):
    """Symbolic stand-ins for (q, k, v, o, lse) shaped like the runtime tensors ``dsv4lib.attention`` passes
    (every extent and stride dynamic, unit stride last): builds the kernel on a machine without a GPU.  With
    ``dynamic_schedule`` also the (default) stream and the work counters that such a build takes after it."""
    from cutlass.cute.runtime import make_fake_tensor

    def bshd():
        b, s, h, d = (cute.sym_int() for _ in range(4))
        sb, ss, sh = (cute.sym_int(divisibility=8) for _ in range(3))
        return make_fake_tensor(cutlass.BFloat16, (b, s, h, d), stride=(sb, ss, sh, 1), assumed_align=16)
    b, h, s = cute.sym_int(), cute.sym_int(), cute.sym_int()
    lse = make_fake_tensor(Float32, (b, h, s), stride=(cute.sym_int(), cute.sym_int(), 1), assumed_align=4)
    sink = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    out_scales = make_fake_tensor(Uint8, (cute.sym_int(),), stride=(1,), assumed_align=1)     # unused unless nvfp4
    s_enc = make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4)
    args = bshd(), bshd(), bshd(), bshd(), lse, Float32(1.0), Int32(0), sink, out_scales, s_enc
    return args + (None, fake_work_counters()) if dynamic_schedule else args
