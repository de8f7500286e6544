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
split i takes its share of the visible KV tiles (``dsv4lib.kernels.splitkv.split_block_ranges``) and writes an fp32
partial O normalized over its own keys plus its LSE — no sink: the combine kernel applies it once.

**Epilogue.**  bf16 O leaves by ``stmatrix`` into the Q buffer (each warpgroup's 64 rows are the rows its own QK
read, all retired) and one TMA store of the tile, not by 4-byte register stores (D5 W128 hd128 on the H100: 83 →
123 TFLOP/s; D1 hd128 665 → 690).

**64-row tile** (``tile_m=64``): one consumer warpgroup, built for two CTAs per SM (``minnctapersm 2``: 128
registers a thread at launch, 24 / 232 after setmaxnreg; the shared memory is checked to fit half an SM).  The
small-window default (``dsv4lib.ops.attention.SM90_SMALL_WINDOW_TUNING``): there one CTA's loads and stores overlap
the other's MMAs.

**Persistent CTAs** (``persistent=True``; the small-window and hd128 default, ``dsv4lib.ops.attention``):
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
``dsv4lib.ops.attention.SM90_RING_TUNING``): each CTA (one per SM, two consumer warpgroups, 128-row items of 64-row
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

**Warpgroup tiles** (``warpgroup_tiles=True``; hd128's small-window default, ``dsv4lib.ops.attention``): a persistent
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
``dsv4lib.ops.attention.SM90_SMALL_WINDOW_TUNING``): the two CTAs of a (2, 1, 1) cluster take two adjacent query blocks
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

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, Uint8, Uint32, const_expr, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum

from ..common import (L2_EVICT_FIRST, L2_EVICT_LAST, convert_to_bf16_pairs, launch_stream,
                      load_kv_tiles, tma_copy, tma_load_tile, tma_store_tile)
from ..nvfp4 import e2m1_code_magic, nvfp4_block_scale
from .config import SMEM_PER_SM, Sm90FwdConfig

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


class Sm90AttentionOps:
    """The wgmma issue and the online softmax, shared by the Hopper attention kernels of this package."""


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
    # 64K-register file is shared out (128·24 + 256·240 = 128·32 + 384·160 = 64K)
    REGS_BY_CONSUMER_WARPGROUPS = {2: (24, 240), 3: (32, 160)}
    EPILOGUE_BARRIER = 7                 # every consumer thread has put its O rows in shared memory
    STORE_BARRIERS = 1                   # o_in_q_stage: named barriers 1, 2 (by Q stage; SMEM-P's ids, unused there)

    def __init__(self, config: Sm90FwdConfig):
        config.check()
        self.config = config
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.has_lse = config.has_lse
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.num_stages = config.num_stages
        self.p_in_smem = config.p_in_smem
        self.has_window = config.window
        self.has_sink = config.sink
        self.split_kv = config.split_kv
        self.overlap = config.overlap
        self.nvfp4_out = config.nvfp4_out
        self.pack_gqa = config.pack_gqa
        self.rescale_o_early = config.rescale_o_early
        self.pv_wait_block = config.pv_wait_block
        self.persistent = config.persistent
        self.dynamic_schedule = config.dynamic_schedule
        self.warpgroup_tiles = config.warpgroup_tiles
        self.o_in_q_stage = config.o_in_q_stage
        self.num_sms = config.num_sms
        self.consumer_warpgroups = self.tile_m // 64
        self.NUM_THREADS = 128 * (1 + self.consumer_warpgroups)    # producer warpgroup + consumer warpgroups
        self.PRODUCER_REGS, self.CONSUMER_REGS = self.REGS_BY_CONSUMER_WARPGROUPS[self.consumer_warpgroups]
        # bf16 O leaves through shared memory (stmatrix, one TMA store per tile) instead of 4 B register stores;
        # the fp32 split partials and the NVFP4 bytes keep their register stores
        self.tma_store_o = not self.split_kv and not self.nvfp4_out
        self.l2_q = L2_EVICT_FIRST if config.l2_hints else None
        self.l2_kv = L2_EVICT_LAST if config.l2_hints else None
        # two Q stages when persistent: the next block's Q loads while this one computes
        self.q_stages = 2 if self.persistent else 1
        self.dtype = cutlass.BFloat16

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
        # left zero after it (dsv4lib.ops.attention.work_counters)
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
            (self.tile_m // 64, 1, 1), (64, self.tile_n), a_source=warpgroup.OperandSource.SMEM)
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            (self.tile_m // 64, 1, 1), (64, self.head_dim),
            a_source=warpgroup.OperandSource.SMEM if self.p_in_smem else warpgroup.OperandSource.RMEM)
        sQ_layout = self._smem_layout(self.tile_m, self.q_stages if const_expr(self.persistent) else None)
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
        tma_atom_O = None
        if const_expr(self.tma_store_o):   # O shares Q's tile shape and buffer layout
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

        if const_expr(SharedStorage.size_in_bytes() + 1024 > SMEM_PER_SM):
            # the exact struct (alignment padding included): the config's check is an estimate
            raise ValueError(f"{SharedStorage.size_in_bytes()} B of shared memory do not fit an SM")
        batch_and_splits = cute.size(mQ.shape[3])
        if const_expr(self.split_kv):
            batch_and_splits = batch_and_splits * cute.size(mO.shape[4])
        grid = (cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m), cute.size(mQ.shape[2]), batch_and_splits)
        if const_expr(self.persistent):
            grid = (persistent_grid(self.work_items(mQ), self.num_sms), 1, 1)
            if const_expr(self.dynamic_schedule):            # every slot: the faster ones take more items
                grid = (cutlass.min(self.work_items(mQ), self.num_sms), 1, 1)
        if const_expr(not self.dynamic_schedule):
            mWork = mSenc                                    # unused
        self.kernel(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, mO, mLSE, softmax_scale_log2,
                    window_size, mSink, mOutScales, mSenc, mWork,
                    sQ_layout, sK_layout, sV_layout, sP_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage).launch(
            grid=grid, block=[self.NUM_THREADS, 1, 1], min_blocks_per_mp=1, **launch_stream(stream))

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
               tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_O: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, mOutScales: cute.Tensor,
               mSenc: cute.Tensor, mWork: cute.Tensor, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, tiled_mma_qk: cute.TiledMma,
               tiled_mma_pv: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if const_expr(self.causal):
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

        storage = cutlass.utils.SmemAllocator().allocate(SharedStorage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, (self.NUM_THREADS - 128) // 32)
        tile_bytes_q = self.tile_m * self.head_dim * self.dtype.width // 8
        tile_bytes_kv = self.tile_n * self.head_dim * self.dtype.width // 8
        pipeline_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_Q.data_ptr(), num_stages=self.q_stages, producer_group=one_thread,
            # o_in_q_stage hands a Q stage back from its storer warp, once the O store has read it
            consumer_group=one_thread if const_expr(self.o_in_q_stage) else consumer_warps,
            tx_count=tile_bytes_q,
            defer_sync=True)
        pipeline_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_K.data_ptr(), num_stages=self.num_stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=tile_bytes_kv, defer_sync=True)
        pipeline_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.num_stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=tile_bytes_kv, defer_sync=True)
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

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
        if const_expr(self.split_kv):   # this split's share: ceil(n / splits) tiles (dsv4lib.kernels.splitkv.split_block_ranges)
            per_split = (cutlass.max(n_block_max - n_block_min, 0) + num_splits - 1) // num_splits
            lo = cutlass.min(n_block_min + split * per_split, n_block_max)
            n_block_max = cutlass.min(lo + per_split, n_block_max)
            n_block_min = lo
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        sWork = None
        if const_expr(self.dynamic_schedule):
            sWork = storage.sWork.get_tensor(cute.make_layout(self.q_stages))     # (Q stages,) work items
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
            if const_expr(self.o_in_q_stage):
                if warp_idx == 1:
                    self.store_persistent(tma_atom_O, mO, mQ, sQ, pipeline_q, sWork)
            if warp_idx == 0:
                if const_expr(self.persistent):
                    self.load_persistent(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q,
                                         pipeline_k, pipeline_v, seqlen_q, seqlen_k, window_size, mWork,
                                         sWork)
                else:
                    self.load(tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV, pipeline_q, pipeline_k,
                              pipeline_v, m_block, head, head_kv, batch, n_block_min, n_block_max)
        elif const_expr(self.persistent):
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            sO = None
            if const_expr(self.o_in_q_stage):
                sO = sQ                                      # (tile_m, D, Q stages): O goes into its item's stage
            elif const_expr(self.tma_store_o):
                sO_layout = self._smem_layout(self.tile_m, None)
                sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)               # (tile_m, D)
            self.consume_persistent(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sO, tma_atom_O, mO, mLSE, mQ, pipeline_q,
                                    pipeline_k, pipeline_v, softmax_scale_log2, window_size, mSink, tidx - 128,
                                    seqlen_q, seqlen_k, rows_q, sWork, mOutScales, mSenc)
        else:
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consume(tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, sP, tma_atom_O, mO, mLSE, pipeline_q, pipeline_k, pipeline_v,
                         softmax_scale_log2, window_size, mSink, mOutScales, mSenc, tidx - 128, m_block, head, batch,
                         split, seqlen_q, seqlen_k, n_block_min, n_block_max, rows_q)

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
        total = self.work_items(mQ)
        work = bidx
        step = gdim
        if const_expr(self.dynamic_schedule):
            work = self.announced_work(pipeline_q, q_state, sWork, total)
        while work < total:
            slots = None
            if const_expr(self.warpgroup_tiles):
                m_block, head, batch = self.work_coords(work, mQ)
                # this warpgroup's tiles: skip the other's that come first, visit its own, skip the rest
                _, _, lead_and_own, slots = self.warpgroup_plan(m_block, cute.arch.make_warp_uniform(ctidx // 128),
                                                                seqlen_q, seqlen_k, window_size)
                n_lead, n_block_max, n_trail = lead_and_own
                n_block_min = Int32(0)
            else:
                m_block, head, batch = self.work_coords(work, mQ)
                n_block_min, n_block_max = self.block_range(m_block, seqlen_q, seqlen_k, window_size)
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
            self.finish_persistent_item(acc_O, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2,
                                        m_block, head, batch, rows_q, seqlen_q, tiled_mma_pv, sO, tma_atom_O, mO,
                                        mOutScales, mSenc, ctidx, o_stage)
            if const_expr(self.warpgroup_tiles):
                # the other warpgroup's trailing tiles, handed back after this one's epilogue: waiting for them to
                # land first would hold the epilogue back until the other's last tile arrives
                kv_state = self.release_empty_slots(pipeline_k, pipeline_v, kv_state, n_trail)
            if const_expr(self.dynamic_schedule):
                work = self.announced_work(pipeline_q, q_state, sWork, total)
            else:
                work += step
        if const_expr(self.dynamic_schedule and not self.o_in_q_stage):
            pipeline_q.consumer_release(q_state)             # the -1 stage: the producer's tail waits for it
        if const_expr(self.tma_store_o and not self.o_in_q_stage):
            if ctidx < 32:
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
        skips), this warpgroup's segments for ``slot_block``).  ``dsv4lib.kernels.tiles.warpgroup_slots`` is the same plan in
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

    # ------------------------------------------------------------------ empty slots
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

    # ------------------------------------------------------------------ O staged in its Q stage (o_in_q_stage)
    @cute.jit
    def hand_o_to_storer(self, acc_O, tiled_mma_pv, sQ, stage, ctidx):
        """Consumers: O into Q stage ``stage`` (each warpgroup its own 64 rows, whose QKs have all retired), then an
        arrive on the stage's store barrier — nobody waits here; the storer warp (``store_staged_o``) does."""
        self.stage_o(acc_O, tiled_mma_pv, sQ[None, None, stage], ctidx)
        cute.arch.barrier_arrive(barrier_id=self.STORE_BARRIERS + stage,
                                 number_of_threads=128 * self.consumer_warpgroups + 32)

    @cute.jit
    def store_staged_o(self, tma_atom_O, mO, sQ, pipeline_q, q_state, m_block, head, batch):
        """The storer warp, one item: wait on its Q stage's store barrier until every consumer has put O there
        (``hand_o_to_storer``), TMA-store the tile (Q's L2 hint: written once), wait for the store to read the stage
        and hand the stage back to the producer.  The caller advances ``q_state``."""
        cute.arch.barrier(barrier_id=self.STORE_BARRIERS + q_state.index,
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
        # producer_tail advances the state it is given: each pipeline gets its own copy, or the V tail
        # would wait on a stage the K tail moved past (a hang found on the H200)
        pipeline_k.producer_tail(kv_state.clone())
        pipeline_v.producer_tail(kv_state.clone())

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
                self.gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, False)
                if const_expr(self.rescale_o_early):
                    self.rescale_rows(acc_O_rc, corrections)                 # O·corr(j) before O += P(j)·V(j)
                pipeline_v.consumer_wait(v_state)
                self.gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False, False)
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
            if const_expr(self.has_lse or self.split_kv):
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
        acc_O.fill(0.0)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipeline_q.consumer_wait(q_state)
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
    """Symbolic stand-ins for (q, k, v, o, lse) shaped like the runtime tensors ``dsv4lib.ops.attention`` passes
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
