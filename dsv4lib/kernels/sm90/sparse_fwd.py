"""D6 on Hopper: DSV4 attention core — one shared KV head of dim 512 (K = V), 64 query heads packed as the MMA
M dimension, keys gathered by index (FlashMLA's sparse form) or taken as a dense causal / windowed range.

One CTA computes one query token × 64 heads (``blockIdx = (token, head group, batch·splits + split)``; gathered
keys: ``(token · head groups + head group, 1, batch·splits + split)``, so the head groups of a token — at H = 128 two
CTAs gathering the same rows — run side by side and share them through L2): every KV row it loads serves all 64
heads, which is the whole point of MQA packing.  The gathered unsplit build (D6's prefill) is persistent instead: one
CTA an SM walks the items ``blockIdx.x, + gridDim.x, …`` in that same order, the next item's Q and first half-tiles
loading while the last item's O drains (:attr:`SparseAttentionForwardSm90.PERSISTENT_ITEMS`).

* **warpgroup 0 — producer.**  Gathers 64 KV rows per tile with ``cp.async`` (16 B per copy, each warp
  owns 16 rows, a row's 1 KiB read by one warp in two coalesced sweeps) into a 128 B-swizzled
  ``(64, 512)`` stage of a 2-stage ``PipelineCpAsync``.  A row index outside ``[0, Skv)`` (``-1``) loads row 0
  instead — the consumers mask it — so no uninitialized shared memory (possibly NaN) ever meets a zero
  probability.  Q (64 heads × 512) rides on the first stage's barrier.
* **warpgroup 1 — scores and left half.**  ``S = Q·Kᵀ`` (64×64, SS-wgmma over k = 512), masking, online
  softmax (max in raw-score units, scale inside exp2), then ``P`` goes two ways: to shared memory ``sP`` (the
  D1.3 map, ``partition_C(sP)``) with the row rescale factors for warpgroup 2, and — re-viewed in the
  registers that hold it — into ``O[:, :256] += P·V[:, :256]`` as an RS-wgmma.
* **warpgroup 2 — right half.**  Waits for ``sP`` (named barrier), rescales ``O[:, 256:]`` by the factors
  and runs ``O[:, 256:] += P·V[:, 256:]`` as an SS-wgmma.

Why split O by columns: a 64×512 fp32 accumulator is 256 registers per thread — more than a thread has.
Two warpgroups with 128 each fit, and the QK product is computed once.  ``V = K``: the PV B-operand is the
very same shared buffer read MN-major (``composition`` with a transposing layout), nothing is loaded twice.

``sP`` is double-buffered: warpgroup 1 writes tile i+1 while warpgroup 2 still reads tile i.  Named barriers:
``P_FULL[b]`` (WG1 arrives after writing buffer b, WG2 syncs) and ``P_EMPTY[b]`` (WG2 arrives once its wgmma
on buffer b is done, WG1 syncs before overwriting it), ``FINAL`` (the row normalizers).

**Paired variant** (``schedule="paired"``): the two consumer warpgroups take *whole tiles* in turn — warpgroup
0 the even tiles, warpgroup 1 the odd ones — so the score work is split evenly without narrowing the QK wgmma.
Per pair of tiles: each warpgroup computes its tile's scores (m64n64, k = 512); warpgroup 0 does its softmax
first and publishes its running max (barrier ``M0``); warpgroup 1 folds it into its own (so its max is the
max over both tiles) and publishes that (``M1``); warpgroup 0 rescales its P and O by the difference.  Each
warpgroup then owns one column half of O for *both* tiles: its own tile's P straight from registers (RS) and
the other's P from shared memory (SS, barriers ``S0`` / ``S1``).  While one warpgroup runs its softmax the
other's wgmmas keep the tensor cores busy.  The KV stages are split into column halves with their own
barriers (four one-stage pipelines), filled in the order they are freed, so the gather of the next pair
starts while the current one is still being multiplied: the left half of the even tile is free as soon as
warpgroup 0's RS product is done.  Q comes by TMA.  A tile count that is not even ends on a *lone* pair:
its odd tile is a pad that no MMA reads (warpgroup 1 only folds warpgroup 0's max into its O half: no QK, no PV on
it), so a producer may leave it unfilled (the MODEL1 one does; the bf16 one zero-fills it, no traffic).  The gathered
producer also writes a validity flag per key of the pair into shared memory, published by its arrives on the
half-tile barriers: the consumers mask from those flags, not from the index list in global memory (6-9 % of D6).

**Epilogue** (paired, bf16 out): once both warpgroups passed the row-sum barrier every QK has retired,
so each writes its normalized column half of O into the Q buffer (value pairs through the accumulator's own
``partition_C``) and one thread stores the 64 × 512 tile by TMA (H200, D6 shapes: h64 436 → 490 TFLOP/s).

Split-KV (``split_kv=True``, D2 decode): split s takes its share of the key tiles and writes an fp32 partial O
normalized over its own keys plus its LSE; :class:`dsv4lib.kernels.combine.LSECombineKernel` merges them and
applies the sink once.  The paired schedule's splits (D6 gathered, D7) write it in bf16 instead (``bf16_partials``)
through the bf16 output's own TMA epilogue, into their split's slice: half the bytes a split CTA drains from its SM
(B1 D7 decode 13.0 → 12.1 µs, H100; the fp32 store from the accumulators was 3.6 µs of it, docs/tuning/d7.md).

**Cluster-reduced partials** (``cluster_splits=C > 1``, split-KV, columns schedule): the C consecutive splits of a
query form a thread-block cluster and merge their partials on chip before anything leaves the SMs.  Each CTA puts
its rows' LSEs in shared memory and its normalized O, bf16, into its own dead Q + KV buffers (``sRed``, rows padded
to 520 elements so the accumulator's pairs hit distinct banks); after a cluster barrier CTA r sums column slice r
(``512 / C`` columns × 64 heads) in fp32 over the C peers' ``sRed``, each peer's row weighed by
``e^{lse_peer - lse_cluster}`` from the C LSEs of that row (``ld.shared::cluster``), and stores it as the cluster's
fp32 partial (bf16 between the CTAs because the SM-to-SM network, not the math, is the cost: 7/8 of a 128 KB fp32
tile pulled by every CTA took ~7 µs); a second barrier keeps every CTA alive until its peers have
read its buffer.  So one partial in C reaches global memory:
the fp32 round trip (128 KB a split, written and read back by the combine) was most of what the decode lost to
the producer-only roof (H200, H64 KV64k, 128 splits: split kernel 27.4 µs vs 19.9 producer only, combine 9.5 µs).  The combine then merges ``splits / C`` partials.

**The paired schedule's cluster** (``cluster_splits=C > 1`` with gathered keys; ``sparse_attention`` at 2 splits): the
cluster is *all* C splits of the query, so its merge is the final one — the same on-chip merge, then CTA r writes
column slice r of the bf16 output itself with the sink applied once (``1 / (1 + e^{σ - lse})`` on the merged row) and
the final LSE: no partial leaves the SMs and no combine is launched. At 64 tokens x 1152 keys on the H200 the combine
of two bf16 partials took 6.1 µs of a 35.2 µs split call, the cluster 30.3 (docs/tuning/d2_d6.md, session 50).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, const_expr, pipeline
from cutlass._mlir.dialects import nvvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from ..common import (L2_EVICT_FIRST, L2_EVICT_LAST, convert_to_bf16_pairs, exp2, launch_stream, tma_copy,
                      tma_store_tile)
from ..layouts import acc_layout_as_operand_a, acc_layout_rows_cols, row_major_smem_layout, transposed_view
from ..softmax import LN_2, LOG2_E, finish_row, online_softmax, rescale_rows
from ..sparse_base import (HALF, HEAD_DIM, TILE_H, TILE_N, SparseAttentionBase, as_global, cp_async_16,
                           kv_chunk_offset, prefetch_l2_bulk, prefetch_l2_line, shared_address)
from .sparse_config import SparseFwdConfig
from .wgmma import gemm

# named barrier ids (0 is __syncthreads)
P_FULL, P_EMPTY, FINAL = 1, 3, 5
PAIR_MAX, PAIR_P, PAIR_SUM = 1, 3, 5   # the paired variant's: + warpgroup (M0 / M1, S0 / S1), then the row sums
O_CHUNK_READY = 8                      # paired, bf16 out: a warpgroup's O chunk written, + warpgroup (7 is MODEL1's
                                       # producer's)
O_CHUNK = 64                           # columns of O a TMA store carries (one 128 B-swizzle atom wide, 8 KB)
STAGED = 6                             # columns, split partials through sRed: both consumer warpgroups
RED_PAD = 8                            # sRed row pad in elements.  fp32 rows of 2080 B: the accumulator's 8 B pairs of
                                       # 8 rows fall in two wavefronts, the minimum for a warp's 256 B; bf16 rows of
                                       # 1040 B: its 4 B pairs of 8 rows hit 32 different banks
ROW_GROUPS = 16                        # paired producer: 16 groups of 8 threads, a group copies a 128 B segment
HALF_TILE_ORDER = ((0, 0), (1, 1), (0, 1), (1, 0))   # paired producer: (tile buffer, column half), order freed


@dsl_user_op
def cp_async_arrive_counted(mbar_ptr, *, loc=None, ip=None) -> None:
    """``cp.async.mbarrier.arrive`` without ``.noinc``: the barrier's pending count goes up by one now and back down
    when this thread's earlier ``cp.async`` copies land, so the phase still waits for them — and the thread owes its
    own (release) arrive, which is what publishes its generic shared stores (the key flags) to the consumers."""
    nvvm.cp_async_mbarrier_arrive(mbar_ptr.to_llvm_ptr(loc=loc, ip=ip), noinc=False, loc=loc, ip=ip)


class KeyFlags:
    """The consumers' view of the paired producer's key flags (:meth:`SparseAttentionForwardSm90.gather_pairs`):
    ``flags[key of the pair, pair % 2]`` is 1 for a real key, and keys count from the CTA's first tile."""

    def __init__(self, flags: cute.Tensor, tile_lo):
        self.flags = flags
        self.tile_lo = tile_lo


def half_tile_pipelines(barriers, producer=pipeline.PipelineCpAsync) -> tuple:
    """The paired schedule's four single-stage cp.async pipelines, index ``2 b + h`` = (tile buffer b, column half
    h), each with its (full, empty) mbarrier pair at ``barriers + 2 i``: 128 producer threads, 128 consumer threads
    (the one warpgroup that frees it).  Plain Python, so the four are built at trace time."""
    return tuple(producer.create(
        barrier_storage=barriers + 2 * i, num_stages=1,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128), defer_sync=True) for i in range(4))


class SparseAttentionForwardSm90(SparseAttentionBase):
    """MQA attention with head dim 512 and K = V.  ``gather=True``: keys listed per query in ``indices``
    (``-1`` = none); ``gather=False``: the dense key range of the query (all keys, ``causal``, ``window``)."""

    NUM_THREADS = 384
    PRODUCER_REGS, CONSUMER_REGS = 56, 224          # 128·(56 + 2·224) = 64 512 ≤ 65 536
    PAIRED_PRODUCER_REGS, PAIRED_CONSUMER_REGS = 88, 208   # 128·(88 + 2·208) = 64 512
    # int64 words of shared room for a producer's key records: here the gathered paired producer's key flags (one
    # int32 per key of a pair, two pairs)
    KEY_ADDR_SLOTS = 2 * TILE_N
    # mbarriers a producer keeps past the paired schedule's eight (the FP8 decode's crossover: one a half-tile)
    extra_kv_barriers = 0
    # paired schedule: the consumers' key mask computed after the tile's first wait (from what the producer published
    # with the tile, see key_source) instead of from global memory before it
    KEY_MASK_AFTER_WAIT = False
    # the gathered paired producer publishes each key's validity (it has the row index anyway) so the consumers read
    # one shared word per key after their wait instead of loading and testing its index from global memory before it
    # (a branch per key column: H200 Sq 4096 H64 K640 441 → 471 TFLOP/s with the mask switched off, probe_d6.py)
    PRODUCER_KEY_FLAGS = True
    HEAD_GROUP_FASTEST = True                       # gathered keys: a token's head groups side by side (the base)
    # L2 eviction hints (FlashMLA's): Q and O pass through L2 once (evict first), the gathered key rows are read by
    # every CTA whose list names them (evict last), and each gather copy prefetches its 256 B.  ncu (session 35, Sq
    # 4096 H64, 32 MiB pool): L2 hit rate 54 % ours / 62.5 % FlashMLA; H128 on that pool ran bimodal for us only
    # (2365-2895 µs against FlashMLA's 2297-2404) — Q and O (512 MiB each at H128) streaming through L2 can evict the
    # 32 MiB of keys.  None: no hint.
    Q_L2_POLICY, O_L2_POLICY, GATHER_L2_POLICY = L2_EVICT_FIRST, L2_EVICT_FIRST, L2_EVICT_LAST
    GATHER_PREFETCH_256 = True
    # the O chunks (store_o_chunks) written by stmatrix, 4 a chunk and thread (FlashMLA's), not 16 st.shared.b32
    O_CHUNK_STMATRIX = True
    # programmatic dependent launch between calls: the build is launched with PDL and waits for the grid before it
    # (griddepcontrol.wait) ahead of its first global access, and lets the grid after it launch once every CTA is
    # past its main loop — so the next call's CTAs are resident when this one ends.  No effect beside kernels
    # launched without PDL.  (The MODEL1 decode first, session 36: B1 13.4 → 13.0 µs.)
    PDL_CHAIN = True
    # the gathered unsplit producer, done with its fills (the last pair in flight), brings into L2 the Q tile and the
    # index list of the CTA that will start next on the GPU (this one's linear id + the SM count: one CTA an SM, CTAs
    # dispatched in order), so that CTA's Q load and first gather start from L2, not DRAM.  A CTA's life (probe_d6.py
    # --items, H200, Sq 4096 H64 K640, session 54): Q landed 2.05 µs after its start, the first QK done at 4.35, of
    # 21.5 — the fixed part of a CTA (5.7 µs by a key-count sweep; FlashMLA's 4.3).
    PREFETCH_NEXT_CTA = True
    # (landed session 55: H200, probe_d6 32 MiB pool, 466 → 486 TFLOP/s at Sq 4096 H64, 471 → 488 at Sq 16k, 518 → 529
    # at H128 K1152; bit-equal to the one-CTA-an-item build.  Its first GPU run hung: 64 / 224 registers passed the
    # launch's 64 512 — check_register_split.)  The gathered unsplit build as persistent
    # CTAs, one an SM (the config's num_sms), each walking the (token, head group) items blockIdx.x, + gridDim.x, …
    # (a static deal).  Each item's O is staged in its last pair's (1, L) / (0, R) buffers — one warpgroup's 32 KB
    # each — instead of Q's, so the next item's Q loads as soon as both warpgroups' last QK is done, and its first
    # half-tiles fill (0, L) / (1, R) while O drains: the epilogue overlaps the next item's start.  Those two buffers'
    # last releases wait for O's TMA store to have read them.  (A CTA's fixed part was 4.4 µs of 24.6 at 640 keys.)
    PERSISTENT_ITEMS = True
    PERSISTENT_CTAS = None                          # None: the config's num_sms (a probe sets 2 or 4 an SM)
    PERSISTENT_REGS = (56, 224)                     # 128·(56 + 2·224) = 64 512: the 384 threads × 168 launched
    # off, not yet measured (scripts/probe_d6.py prefetch_rows): the next item's first pair's key rows prefetched into
    # L2 too — on a DRAM-resident pool its first gather would then start from L2
    PREFETCH_FIRST_ROWS = False

    def __init__(self, config: SparseFwdConfig):
        super().__init__(config)
        self.schedule = config.schedule
        self.num_sms = config.num_sms
        self.paired = config.schedule == "paired"
        # columns, split-KV, no cluster: the fp32 partial leaves through sRed as row-contiguous 16 B stores (a tie
        # with the accumulator's 8 B stores, kept as the C = 1 case of the cluster code)
        self.staged_partials = self.split_kv and self.schedule == "columns" and self.cluster_splits == 1
        # benchmark knobs (wrong output by construction; never used for results): the consumers only wait for and
        # release each tile (gather_only: the producer's roof), or one MMA left out (skip_mma "qk" / "pv")
        self.gather_only = config.gather_only
        self.skip_mma = config.skip_mma
        # dense keys come by TMA (one instruction per 64 x 64 box instead of 4096 cp.async per tile); gathered rows
        # by cp.async (no TMA gather on sm_90).  The paired schedule takes every key row by cp.async (its half-tile
        # buffers are filled out of order) and Q by TMA (both warpgroups wait for it; no KV stage carries it).
        self.use_tma = not self.gather and not self.paired
        self.q_by_tma = self.use_tma or self.paired
        # the paired producer keeps 8 row indices, their addresses and zero-fill predicates live across four
        # half-tile fills: at 56 / 72 registers ptxas spills 30-60 B (ptxas -v); its consumers fit in 208
        self.producer_regs = self.PAIRED_PRODUCER_REGS if self.paired else self.PRODUCER_REGS
        self.consumer_regs = self.PAIRED_CONSUMER_REGS if self.paired else self.CONSUMER_REGS
        # bf16 O of the paired schedule leaves as value pairs into the Q buffer (dead once both warpgroups passed the
        # row-sum barrier) and one TMA store of the 64 x 512 tile — a bf16 split partial (bf16_partials) the same way,
        # into its split's slice (from the accumulators as 4-byte bf16 pairs instead — half-filled 32-byte sectors —
        # B1 H64 took 15.7 µs against 12.0, session 41); fp32 split partials and the columns schedule keep their
        # register stores
        # paired, split-KV in a cluster of every split: the cluster's merge writes the output (module docstring)
        self.cluster_final = self.paired and self.cluster_splits > 1
        self.tma_store_o = self.paired and not self.cluster_final and (not self.split_kv or config.bf16_partials)
        self.key_flags = self.paired and self.gather and self.PRODUCER_KEY_FLAGS
        self.key_mask_after_wait = self.KEY_MASK_AFTER_WAIT or self.key_flags
        # the cluster whose CTAs use each other's pipeline barriers (none here: the split clusters merge through their
        # own cluster barriers at the end); a subclass that does sets it, and every barrier is initialized cluster-wide
        # before any CTA of it goes on
        self.pipeline_cluster = (1, 1)
        if self.persistent_items():
            # the item loop's coordinates and states: at 88 / 208 ptxas spills 116 B (72 / 216: 48 B); spill-free here
            # (56 / 224: the launch's 64 512 registers whole)
            self.producer_regs, self.consumer_regs = self.PERSISTENT_REGS
        self.check_register_split()

    def check_register_split(self) -> None:
        """``setmaxnreg`` moves registers only inside the CTA's launch allocation — NUM_THREADS × 168 (65 536 / 384,
        rounded down to 8) — so a split that sums past it makes the consumers' increase wait forever: session 54's
        persistent candidate at 64 / 224 (128 · 512 = 65 536 > 64 512) hung the H200 (session 55)."""
        launched = self.NUM_THREADS * (65536 // self.NUM_THREADS // 8 * 8)
        wanted = 128 * (self.producer_regs + 2 * self.consumer_regs)
        if wanted > launched:
            raise ValueError(f"{type(self).__name__}: registers {self.producer_regs} / {self.consumer_regs} a thread "
                             f"(producer / consumers) need {wanted} of the {launched} a CTA is launched with")

    # ------------------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, stream: cuda.CUstream = None):
        # mQ (B, Sq, H, 512)  mKV (B, Skv, 512)  mIdx (B, Sq, K) int32  mO (splits, B, Sq, H, 512)
        # mLSE (splits, B, H, Sq)  mSink (H,).  All global (a CPU build gets generic pointers from DLPack).
        mQ, mKV, mO = as_global(mQ, 16), as_global(mKV, 16), as_global(mO, 16)     # 1 KiB / 2 KiB rows
        mIdx, mLSE, mSink = as_global(mIdx, 4), as_global(mLSE, 4), as_global(mSink, 4)
        common = self.build_common(mQ, mO)
        tma_atom_KV = tma_KV = None
        if const_expr(self.use_tma):
            # (B, Skv, 512) -> (Skv, 512, B): the TMA tiles the first two
            sKV_layout = common[4]
            tma_atom_KV, tma_KV = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), cute.make_tensor(mKV.iterator, cute.select(mKV.layout, mode=[1, 2, 0])),
                cute.select(sKV_layout, mode=[0, 1]), (TILE_N, HEAD_DIM))
        self.kernel(mQ, mKV, mIdx, mO, mLSE, softmax_scale_log2, window_size, mSink, *common, tma_atom_KV,
                    tma_KV).launch(grid=self.grid(mQ, mO), block=[self.NUM_THREADS, 1, 1], min_blocks_per_mp=1,
                                   cluster=(1, 1, self.cluster_splits) if const_expr(self.cluster_splits > 1) else None,
                                   use_pdl=self.PDL_CHAIN, **launch_stream(stream))

    def grid(self, mQ, mO):
        """(token, head group, batch · splits), or (token · head groups + head group, 1, batch · splits) with
        :meth:`head_group_fastest` (x has room for any Sq; y would stop at 65 535); mO holds one partial per cluster:
        splits = its count × cluster_splits."""
        batch_splits = cute.size(mQ.shape[0]) * cute.size(mO.shape[0]) * self.cluster_splits
        if const_expr(self.persistent_items()):
            items = cute.size(mQ.shape[1]) * (cute.size(mQ.shape[2]) // TILE_H) * batch_splits
            return (cutlass.min(items, self.PERSISTENT_CTAS or self.num_sms), 1, 1)
        if const_expr(self.head_group_fastest()):
            return (cute.size(mQ.shape[1]) * (cute.size(mQ.shape[2]) // TILE_H), 1, batch_splits)
        return (cute.size(mQ.shape[1]), cute.size(mQ.shape[2]) // TILE_H, batch_splits)

    @cute.jit
    def build_common(self, mQ, mO):
        """What every variant's launch builds at trace time: the three wgmmas, the Q / KV stage / P shared layouts, the
        shared storage, Q's TMA (when Q comes by TMA) and O's TMA store (paired, bf16 out); in the order
        :meth:`kernel` takes them after its data arguments."""
        mma = lambda a_source, n: sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K if n <= TILE_N else OperandMajorMode.MN,
            Float32, (1, 1, 1), (TILE_H, n), a_source=a_source)
        tiled_mma_qk = mma(warpgroup.OperandSource.SMEM, TILE_N)
        tiled_mma_pv_rs = mma(warpgroup.OperandSource.RMEM, HALF)
        tiled_mma_pv_ss = mma(warpgroup.OperandSource.SMEM, HALF)
        sQ_layout = row_major_smem_layout(self.dtype, TILE_H, HEAD_DIM)
        sKV_layout = row_major_smem_layout(self.dtype, TILE_N, HEAD_DIM, self.num_stages)
        sP_layout = row_major_smem_layout(self.dtype, TILE_H, TILE_N, 2)

        @cute.struct
        class SharedStorage:
            mbar_KV: cute.struct.MemRange[cutlass.Int64,
                                          8 + self.extra_kv_barriers if self.paired else self.num_stages * 2]
            sRowScale: cute.struct.MemRange[Float32, 2 * TILE_H]     # per sP buffer: O rescale of each row
            sRowInv: cute.struct.MemRange[Float32, TILE_H]           # final 1 / denominator of each row
            sMax: cute.struct.MemRange[Float32, 2 * 2 * TILE_H]      # paired: each warpgroup's row maxima
            sSum: cute.struct.MemRange[Float32, 2 * TILE_H]          # paired: each warpgroup's row sums
            sLSE: cute.struct.MemRange[Float32, TILE_H]              # cluster_splits: this split's row LSEs
            # a producer's resolved key records (its own layout of KEY_ADDR_SLOTS words; unused by the bf16 gather)
            sKeyAddr: cute.struct.Align[cute.struct.MemRange[cutlass.Int64, self.KEY_ADDR_SLOTS], 16]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]
            mbar_Q: cute.struct.MemRange[cutlass.Int64, 2]

        tma_atom_Q = tma_Q = None
        if const_expr(self.q_by_tma):
            # (B, Sq, H, 512) -> (H, 512, Sq, B): the TMA tiles the first two
            tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[2, 3, 1, 0])),
                sQ_layout, (TILE_H, HEAD_DIM))
        tma_atom_O = tma_O = None
        if const_expr(self.tma_store_o):
            # (splits, B, Sq, H, 512) -> (H, 512, Sq, B, splits), like Q with the split last (1 without split-KV); a
            # 64 x 64 box, whose shared image is one 8 KB column block of the Q buffer (its atoms stack rows first):
            # store_o_chunks
            tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(),
                cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[3, 4, 2, 1, 0])),
                row_major_smem_layout(self.dtype, TILE_H, O_CHUNK), (TILE_H, O_CHUNK))
        return (tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ_layout, sKV_layout, sP_layout, SharedStorage,
                tma_atom_Q, tma_Q, tma_atom_O, tma_O)

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, tiled_mma_qk: cute.TiledMma,
               tiled_mma_pv_rs: cute.TiledMma, tiled_mma_pv_ss: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sKV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr,
               tma_atom_Q, tma_Q, tma_atom_O, tma_O, tma_atom_KV, tma_KV):
        if const_expr(self.PDL_CHAIN):
            # launched with PDL: the grid before may still run — nothing global is read or written before it ended
            cute.arch.griddepcontrol_wait()
        if const_expr(self.persistent_items()):
            self.cta_persistent(mQ, mKV, mIdx, mKV.shape[1], mO, mLSE, softmax_scale_log2, window_size, mSink,
                                tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ_layout, sKV_layout, sP_layout,
                                SharedStorage, tma_atom_Q, tma_Q, tma_atom_O, tma_O)
            return
        self.cta(mQ, mKV, mIdx, mKV.shape[1], mO, mLSE, softmax_scale_log2, window_size, mSink, tiled_mma_qk,
                 tiled_mma_pv_rs, tiled_mma_pv_ss, sQ_layout, sKV_layout, sP_layout, SharedStorage, tma_atom_Q, tma_Q,
                 tma_atom_O, tma_O, tma_atom_KV, tma_KV)

    @cute.jit
    def cta(self, mQ: cute.Tensor, mKV, mIdx, seqlen_k: Int32, mO: cute.Tensor, mLSE: cute.Tensor,
            softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, tiled_mma_qk: cute.TiledMma,
            tiled_mma_pv_rs: cute.TiledMma, tiled_mma_pv_ss: cute.TiledMma, sQ_layout: cute.ComposedLayout,
            sKV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr,
            tma_atom_Q, tma_Q, tma_atom_O, tma_O, tma_atom_KV, tma_KV):
        """One CTA of any variant.  ``mKV`` / ``mIdx`` / ``seqlen_k``: the keys as this variant's key rules
        (:meth:`key_range`, :meth:`is_real_key`, the producer) read them — a bf16 (B, Skv, 512) tensor, its index
        list and Skv here; a subclass may pass its own key sources (the FP8 decode's page lists)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        token, head_group, batch, split, num_splits = self.cta_coords(mO)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        pipeline_q = None
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)     # both consumer warpgroups
        if const_expr(self.use_tma):
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_atom_Q)
                cpasync.prefetch_descriptor(tma_atom_KV)
            pipeline_kv = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_KV.data_ptr(), num_stages=self.num_stages, producer_group=one_thread,
                consumer_group=consumer_warps, tx_count=TILE_N * HEAD_DIM * self.dtype.width // 8, defer_sync=True)
        if const_expr(self.q_by_tma):
            pipeline_q = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_Q.data_ptr(), num_stages=1, producer_group=one_thread,
                consumer_group=consumer_warps, tx_count=TILE_H * HEAD_DIM * self.dtype.width // 8, defer_sync=True)
        if const_expr(self.tma_store_o):
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_atom_O)
        if const_expr(self.paired):
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_atom_Q)
            # one single-stage pipeline per (tile buffer b, column half h), index 2 b + h; each released by the one
            # warpgroup that reads it last (see paired_half)
            pipeline_kv = self.half_tile_pipelines(storage.mbar_KV.data_ptr())
        elif const_expr(not self.use_tma):
            pipeline_kv = pipeline.PipelineCpAsync.create(
                barrier_storage=storage.mbar_KV.data_ptr(), num_stages=self.num_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 256), defer_sync=True)
        pipeline_init_arrive(cluster_shape_mn=self.pipeline_cluster, is_relaxed=True)

        sQ, sKV, sP, sVt = self.shared_tiles(storage, sQ_layout, sKV_layout, sP_layout)
        sRowScale = storage.sRowScale.get_tensor(cute.make_layout(2 * TILE_H))
        sRowInv = storage.sRowInv.get_tensor(cute.make_layout(TILE_H))
        sMax = storage.sMax.get_tensor(cute.make_layout(4 * TILE_H))
        sSum = storage.sSum.get_tensor(cute.make_layout(2 * TILE_H))
        sLSE = storage.sLSE.get_tensor(cute.make_layout(TILE_H))
        sKeyAddr = storage.sKeyAddr.get_tensor(cute.make_layout(self.KEY_ADDR_SLOTS))
        # cluster_splits: the weighted fp32 O (64 heads × 512, padded rows) over the dead Q and KV buffers (192 KB,
        # contiguous: sKV follows sQ); written only after the last wgmma / TMA of the CTA retired
        # (bf16 between the CTAs of a cluster: DSMEM carries half the bytes; see cluster_reduce_half)
        red_dtype = self.dtype if const_expr(self.cluster_splits > 1) else Float32
        sRed = cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), dtype=red_dtype),
                                cute.make_layout((TILE_H, HEAD_DIM), stride=(HEAD_DIM + RED_PAD, 1)))

        key_lo, n_keys, tile_lo, tile_hi = self.key_range(mQ, mKV, mIdx, token, window_size, num_splits, split)
        keys_seen = self.key_source(mIdx, sKeyAddr, tile_lo)       # what the consumers test key validity on
        pipeline_init_wait(cluster_shape_mn=self.pipeline_cluster)

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if const_expr(self.paired):
                self.load_paired(tma_atom_Q, tma_Q, mKV, mIdx, sQ, sKV, pipeline_q, pipeline_kv, warp_idx, tidx,
                                 token, head_group, batch, key_lo, n_keys, seqlen_k, tile_lo, tile_hi, mQ, mO,
                                 window_size, mLSE, sKeyAddr)
            elif const_expr(self.use_tma):
                if warp_idx == 0:
                    self.load_tma(tma_atom_Q, tma_Q, tma_atom_KV, tma_KV, sQ, sKV, pipeline_q, pipeline_kv, token,
                                  head_group, batch, key_lo, tile_lo, tile_hi)
            else:
                self.load(mQ, mKV, mIdx, sQ, sKV, pipeline_kv, tidx, token, head_group, batch, key_lo, n_keys,
                          seqlen_k, tile_lo, tile_hi)
            if const_expr(self.cluster_splits > 1):
                for _ in cutlass.range_constexpr(2):        # the consumers' two cluster barriers, every thread
                    cute.arch.cluster_arrive()
                    cute.arch.cluster_wait()
        elif const_expr(self.gather_only):
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.wait_q(pipeline_q, tile_lo, tile_hi)            # no TMA left in flight when the CTA exits
            if const_expr(self.paired):          # each warpgroup frees the two half-buffers it frees in paired_half
                w = tidx // 128 - 1
                pair_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
                for _ in cutlass.range((tile_hi - tile_lo + 1) // 2, unroll=1):
                    for b in cutlass.range_constexpr(2):
                        if w == 0:
                            pipeline_kv[2 * b].consumer_wait(pair_state)
                            pipeline_kv[2 * b].consumer_release(pair_state)
                        else:
                            pipeline_kv[2 * b + 1].consumer_wait(pair_state)
                            pipeline_kv[2 * b + 1].consumer_release(pair_state)
                    pair_state.advance()
            else:
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
                for _ in cutlass.range(tile_hi - tile_lo, unroll=1):
                    pipeline_kv.consumer_wait(kv_state)
                    pipeline_kv.consumer_release(kv_state)
                    kv_state.advance()
        elif const_expr(self.paired):
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.wait_q(pipeline_q, tile_lo, tile_hi)
            if warp_idx < 8:
                self.paired_half(0, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, sMax, sSum,
                                 keys_seen, mO, mLSE, mSink, pipeline_kv, softmax_scale_log2, tidx - 128, token,
                                 head_group, batch, split, n_keys, seqlen_k, tile_lo, tile_hi, tma_atom_O, tma_O,
                                 mQ, mKV, window_size, tma_atom_Q, tma_Q, pipeline_q, sLSE, sRed)
            else:
                self.paired_half(1, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, sMax, sSum,
                                 keys_seen, mO, mLSE, mSink, pipeline_kv, softmax_scale_log2, tidx - 256, token,
                                 head_group, batch, split, n_keys, seqlen_k, tile_lo, tile_hi, tma_atom_O, tma_O,
                                 mQ, mKV, window_size, tma_atom_Q, tma_Q, pipeline_q, sLSE, sRed)
        elif warp_idx < 8:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.wait_q(pipeline_q, tile_lo, tile_hi)
            self.scores_and_left_half(tiled_mma_qk, tiled_mma_pv_rs, sQ, sKV, sVt, sP, sRowScale, sRowInv, keys_seen,
                                      mO, mLSE, mSink, pipeline_kv, softmax_scale_log2, tidx - 128, token,
                                      head_group, batch, split, key_lo, n_keys, seqlen_k, tile_lo, tile_hi, sLSE,
                                      sRed)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.right_half(tiled_mma_pv_ss, sVt, sP, sRowScale, sRowInv, mO, pipeline_kv, tidx - 256, token,
                            head_group, batch, split, tile_lo, tile_hi, mLSE, sLSE, sRed)

    @cute.jit
    def shared_tiles(self, storage, sQ_layout, sKV_layout, sP_layout):
        """The CTA's Q tile, key tiles, P buffers and the key tiles read as V (MN-major: (512, 64 keys, stages) over
        the same bytes, one half per consumer warpgroup)."""
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)       # (64 heads, 512)
        sKV = storage.sKV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)   # (64 keys, 512, stages)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)       # (64 heads, 64 keys, 2)
        sVt = cute.composition(sKV, transposed_view(HEAD_DIM, TILE_N, self.num_stages))
        return sQ, sKV, sP, sVt

    @cute.jit
    def cta_persistent(self, mQ: cute.Tensor, mKV, mIdx, seqlen_k: Int32, mO: cute.Tensor, mLSE: cute.Tensor,
                       softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor,
                       tiled_mma_qk: cute.TiledMma, tiled_mma_pv_rs: cute.TiledMma, tiled_mma_pv_ss: cute.TiledMma,
                       sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
                       sP_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr, tma_atom_Q, tma_Q,
                       tma_atom_O, tma_O):
        """A persistent CTA of the gathered unsplit build (:attr:`PERSISTENT_ITEMS`): items blockIdx.x, +
        gridDim.x, … — the producer loads each item's Q once both warpgroups freed the last one's and gathers its
        pairs right behind the last item's; the consumers run :meth:`paired_item` per item with ``persist``."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        first, _, _ = cute.arch.block_idx()
        step, _, _ = cute.arch.grid_dim()
        n_items = mQ.shape[0] * mQ.shape[1] * (mQ.shape[2] // TILE_H)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)     # both consumer warpgroups
        pipeline_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_Q.data_ptr(), num_stages=1, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=TILE_H * HEAD_DIM * self.dtype.width // 8, defer_sync=True)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_Q)
            cpasync.prefetch_descriptor(tma_atom_O)
        kv_pipes = self.half_tile_pipelines(storage.mbar_KV.data_ptr())
        pipeline_init_arrive(cluster_shape_mn=self.pipeline_cluster, is_relaxed=True)
        sQ, sKV, sP, sVt = self.shared_tiles(storage, sQ_layout, sKV_layout, sP_layout)
        sMax = storage.sMax.get_tensor(cute.make_layout(4 * TILE_H))
        sSum = storage.sSum.get_tensor(cute.make_layout(2 * TILE_H))
        sKeyAddr = storage.sKeyAddr.get_tensor(cute.make_layout(self.KEY_ADDR_SLOTS))
        pipeline_init_wait(cluster_shape_mn=self.pipeline_cluster)

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pair_base = Int32(0)
            for item in cutlass.range(first, n_items, step, unroll=1):
                token, head_group, batch, key_lo, n_keys, tile_lo, tile_hi = self.item_keys(item, mQ, mKV, mIdx,
                                                                                            window_size)
                if warp_idx == 0:
                    # every item's Q is loaded (and waited for), keys or none: the pipeline's phases stay in step
                    tQsQ, tQgQ = self.q_tile(tma_atom_Q, tma_Q, sQ, token, head_group, batch)
                    pipeline_q.producer_acquire(q_state)
                    tma_copy(tma_atom_Q, tQgQ, tQsQ, self.Q_L2_POLICY,
                             tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
                q_state.advance()
                state = self.gather_pairs(mKV, mIdx, sKV, kv_pipes, tidx, token, batch, key_lo, n_keys, seqlen_k,
                                          tile_lo, tile_hi, state, sKeyAddr, pair_base)
                pair_base += (tile_hi - tile_lo + 1) // 2
                if const_expr(self.PREFETCH_NEXT_CTA):
                    if warp_idx == 1:                 # this CTA's next item: its Q and list into L2
                        nxt = item + step
                        if nxt >= n_items:            # my last: the first item of the CTA dispatched after me
                            nxt = first + cute.arch.nsmid()
                            if nxt >= step:           # (none: a grid of at most one CTA an SM)
                                nxt = n_items
                        self.prefetch_item(mQ, mKV, mIdx, nxt, n_items, tidx % 32)
            for pipe in kv_pipes:
                pipe.producer_acquire(state)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            flags = self.key_flag_view(sKeyAddr)
            if warp_idx < 8:
                self.paired_items(0, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, sMax, sSum,
                                  flags, mQ, mKV, mIdx, mO, mLSE, mSink, kv_pipes, pipeline_q, softmax_scale_log2,
                                  window_size, tidx - 128, first, step, n_items, seqlen_k, tma_atom_O, tma_O)
            else:
                self.paired_items(1, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, sMax, sSum,
                                  flags, mQ, mKV, mIdx, mO, mLSE, mSink, kv_pipes, pipeline_q, softmax_scale_log2,
                                  window_size, tidx - 256, first, step, n_items, seqlen_k, tma_atom_O, tma_O)

    @cute.jit
    def paired_items(self, w: cutlass.Constexpr, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP,
                     sMax, sSum, flags, mQ, mKV, mIdx, mO, mLSE, mSink, kv_pipes, pipeline_q, softmax_scale_log2,
                     window_size, wtid, first, step, n_items, seqlen_k, tma_atom_O, tma_O):
        """Warpgroup ``w`` of a persistent CTA: :meth:`paired_half`'s operands once, then per item Q's wait and
        :meth:`paired_item` (``persist``: it leaves O / row max / row sum reset for the next)."""
        operands = self.paired_operands(w, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, wtid)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pair_base = Int32(0)
        for item in cutlass.range(first, n_items, step, unroll=1):
            token, head_group, batch, key_lo, n_keys, tile_lo, tile_hi = self.item_keys(item, mQ, mKV, mIdx,
                                                                                        window_size)
            # the flags count pairs over the CTA's items (gather_pairs' pair_base): shift this item's first tile
            keys_seen = KeyFlags(flags, tile_lo - 2 * pair_base)
            pipeline_q.consumer_wait(q_state)
            state = self.paired_item(w, operands, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sP, sMax, sSum,
                                     keys_seen, mO, mLSE, mSink, kv_pipes, softmax_scale_log2, wtid, token,
                                     head_group, batch, Int32(0), n_keys, seqlen_k, tile_lo, tile_hi, tma_atom_O,
                                     tma_O, state, persist=(pipeline_q, q_state, sKV))
            q_state.advance()
            pair_base += (tile_hi - tile_lo + 1) // 2

    def half_tile_pipelines(self, barriers) -> tuple:
        """The paired schedule's four half-tile pipelines (filled by ``cp.async`` here)."""
        return half_tile_pipelines(barriers)

    def key_source(self, mIdx, sKeyAddr, tile_lo):
        """What :meth:`is_real_key` reads, given the producer's shared key room and the CTA's first tile: the gathered
        paired producer's key flags (:class:`KeyFlags`), else the index list itself (a subclass may point its consumers
        at records its producer publishes)."""
        if self.key_flags:
            return KeyFlags(self.key_flag_view(sKeyAddr), tile_lo)
        return mIdx

    @cute.jit
    def key_flag_view(self, sKeyAddr) -> cute.Tensor:
        """The key flags in the producer's shared key room: ``[key of the pair, pair % 2]`` int32."""
        return cute.make_tensor(cute.recast_ptr(sKeyAddr.iterator, dtype=Int32),
                                cute.make_layout((2 * TILE_N, 2), stride=(1, 2 * TILE_N)))

    @cute.jit
    def is_real_key(self, key, mIdx, batch, token, n_keys, seqlen_k):
        """From the producer's key flags (``mIdx`` a :class:`KeyFlags`: the tile's wait has published them), else
        :meth:`SparseAttentionBase.is_real_key` from the index list."""
        if const_expr(isinstance(mIdx, KeyFlags)):
            rel = key - mIdx.tile_lo * TILE_N
            ok = mIdx.flags[rel % (2 * TILE_N), (rel // (2 * TILE_N)) % 2] != Int32(0)
        else:
            ok = SparseAttentionBase.is_real_key(self, key, mIdx, batch, token, n_keys, seqlen_k)
        return ok

    @cute.jit
    def wait_q(self, pipeline_q, tile_lo, tile_hi):
        """TMA path: Q has its own barrier (the cp.async path lands Q with the first KV stage instead)."""
        if const_expr(self.q_by_tma):
            if tile_hi > tile_lo:
                pipeline_q.consumer_wait(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1))

    @cute.jit
    def load_tma(self, tma_atom_Q, mQ, tma_atom_KV, mKV, sQ, sKV, pipeline_q, pipeline_kv, token, head_group, batch,
                 key_lo, tile_lo, tile_hi):
        """Warp 0 of the producer, dense keys: Q (64 heads × 512) once, then each 64-key tile as TMA boxes.  Key
        k of this query is row ``key_lo + k`` (``domain_offset``), so tile t starts at row ``key_lo + 64 t`` — a
        window's first row need not be 64-aligned.  Rows past the tensor come back as zeros; rows past this
        query's range but inside the tensor (other queries' keys, finite data) are loaded and masked."""
        gKV = cute.local_tile(cute.domain_offset((key_lo, 0), mKV[None, None, batch]), (TILE_N, HEAD_DIM),
                              (None, 0))                                                          # (64, 512, n)
        tKsK, tKgK = cpasync.tma_partition(tma_atom_KV, 0, cute.make_layout(1), cute.group_modes(sKV, 0, 2),
                                           cute.group_modes(gKV, 0, 2))
        self.load_q_tma(tma_atom_Q, mQ, sQ, pipeline_q, token, head_group, batch, tile_lo, tile_hi)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        for tile in cutlass.range(tile_lo, tile_hi, unroll=1):
            pipeline_kv.producer_acquire(state)
            cute.copy(tma_atom_KV, tKgK[None, tile], tKsK[None, state.index],
                      tma_bar_ptr=pipeline_kv.producer_get_barrier(state))
            state.advance()
        pipeline_kv.producer_tail(state)

    @cute.jit
    def load_q_tma(self, tma_atom_Q, mQ, sQ, pipeline_q, token, head_group, batch, tile_lo, tile_hi):
        """One warp: this CTA's 64 heads × 512 of Q by TMA, on Q's own barrier (none when there is no key)."""
        tQsQ, tQgQ = self.q_tile(tma_atom_Q, mQ, sQ, token, head_group, batch)
        if tile_hi > tile_lo:
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipeline_q.producer_acquire(q_state)
            tma_copy(tma_atom_Q, tQgQ, tQsQ, self.Q_L2_POLICY, tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))

    @cute.jit
    def q_tile(self, tma_atom_Q, mQ, sQ, token, head_group, batch):
        """The TMA view of one CTA's Q (64 heads × 512 of one token): (shared, global) partitions."""
        gQ = cute.local_tile(mQ[None, None, token, batch], (TILE_H, HEAD_DIM), (head_group, 0))     # (64, 512)
        return cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                     cute.group_modes(gQ, 0, 2))

    @cute.jit
    def load_paired(self, tma_atom_Q, tma_Q, mKV, mIdx, sQ, sKV, pipeline_q, kv_pipes, warp_idx, tidx, token,
                    head_group, batch, key_lo, n_keys, seqlen_k, tile_lo, tile_hi, mQ, mO, window_size, mLSE,
                    sKeyAddr):
        """Producer of the paired schedule: Q by TMA (warp 0; persistent: the consumers load it), then per pair of
        tiles the four half-tiles in the order the consumers free them — (even, left), (odd, right), (even, right),
        (odd, left).  Persistent: the same for each of this CTA's items, back to back (the next item's first
        half-tile as soon as the last pair of this one frees it)."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        if warp_idx == 0:
            self.load_q_tma(tma_atom_Q, tma_Q, sQ, pipeline_q, token, head_group, batch, tile_lo, tile_hi)
        state = self.gather_pairs(mKV, mIdx, sKV, kv_pipes, tidx, token, batch, key_lo, n_keys, seqlen_k,
                                  tile_lo, tile_hi, state, sKeyAddr)
        if const_expr(self.prefetches_next_cta()):
            if warp_idx == 1:
                self.prefetch_next_cta(mQ, mKV, mIdx, tidx % 32)
        # the tail of a one-stage pipeline: wait until the last fill is freed (no mbarrier arrive after exit);
        # producer_tail itself loops over a stage count that is a runtime value once the tuple crossed an if
        for pipe in kv_pipes:
            pipe.producer_acquire(state)

    def gathered_unsplit(self) -> bool:
        """Gathered keys (head groups fastest, grid y = 1), one split, bf16 Q and an index tensor (a subclass with
        other key sources turns head_group_fastest off): the builds the next-CTA prefetch and the persistent items
        are made for."""
        return self.paired and self.head_group_fastest() and not self.split_kv

    def prefetches_next_cta(self) -> bool:
        return self.PREFETCH_NEXT_CTA and self.gathered_unsplit()

    def persistent_items(self) -> bool:
        """:attr:`PERSISTENT_ITEMS` for the builds it is made for — not the benchmark's producer alone
        (``gather_only``: its stand-in consumers only release; the persistent item loop would do the math)."""
        return (self.PERSISTENT_ITEMS and self.gathered_unsplit() and self.key_flags and self.tma_store_o
                and not self.gather_only)

    @cute.jit
    def item_coords(self, item, mQ):
        """A persistent CTA's item → (token, head group, batch), in the one-CTA-an-item grid's order (x = token ·
        head groups + head group, z = batch)."""
        head_groups = mQ.shape[2] // TILE_H
        per_batch = mQ.shape[1] * head_groups
        batch = item // per_batch
        flat = item - batch * per_batch
        token = flat // head_groups
        return token, flat - token * head_groups, batch

    @cute.jit
    def item_keys(self, item, mQ, mKV, mIdx, window_size):
        """A persistent CTA's item: its coordinates (:meth:`item_coords`) and key range (one split):
        ``(token, head_group, batch, key_lo, n_keys, tile_lo, tile_hi)`` — the producer and both warpgroups alike."""
        token, head_group, batch = self.item_coords(item, mQ)
        key_lo, n_keys, tile_lo, tile_hi = self.key_range(mQ, mKV, mIdx, token, window_size, 1, 0)
        return token, head_group, batch, key_lo, n_keys, tile_lo, tile_hi

    @cute.jit
    def prefetch_next_cta(self, mQ, mKV, mIdx, lane):
        """One warp: the next CTA's Q rows (64 heads × 1 KB, two a lane, bulk prefetches) and its index list (a
        128 B line a lane and step) into L2 — the CTA ``nsmid`` past this one in launch order, if there is one."""
        bx, _, bz = cute.arch.block_idx()
        gx, _, gz = cute.arch.grid_dim()
        self.prefetch_item(mQ, mKV, mIdx, bz * gx + bx + cute.arch.nsmid(), gx * gz, lane)

    @cute.jit
    def prefetch_item(self, mQ, mKV, mIdx, nxt, n_items, lane):
        """:meth:`prefetch_next_cta` of item ``nxt`` (in the one-CTA-an-item grid's order), if ``nxt < n_items``;
        with :attr:`PREFETCH_FIRST_ROWS` also the key rows of its first pair (its first 128 list entries loaded, then
        a 1 KB bulk prefetch a valid row)."""
        if nxt < n_items:
            token, head_group, batch = self.item_coords(nxt, mQ)
            q_at = mQ.iterator.toint() + Int64(2) * (Int64(batch) * Int64(mQ.stride[0])
                                                     + Int64(token) * Int64(mQ.stride[1])
                                                     + Int64(head_group * TILE_H) * Int64(mQ.stride[2]))
            for r in cutlass.range_constexpr(TILE_H // 32):
                prefetch_l2_bulk(q_at + Int64(2) * Int64(lane + 32 * r) * Int64(mQ.stride[2]), HEAD_DIM * 2)
            idx_at = mIdx.iterator.toint() + Int64(4) * (Int64(batch) * Int64(mIdx.stride[0])
                                                         + Int64(token) * Int64(mIdx.stride[1]))
            n_lines = (mIdx.shape[2] * 4 + 127) // 128
            for line in cutlass.range(lane, n_lines, 32, unroll=1):
                prefetch_l2_line(idx_at + Int64(128) * Int64(line))
            if const_expr(self.PREFETCH_FIRST_ROWS):
                kv_at = mKV.iterator.toint() + Int64(2) * Int64(batch) * Int64(mKV.stride[0])
                for r in cutlass.range_constexpr(2 * TILE_N // 32):     # the first pair's 128 keys, 4 a lane
                    key = lane + 32 * r
                    if key < mIdx.shape[2]:
                        row = mIdx[batch, token, key]
                        if row >= 0 and row < mKV.shape[1]:
                            prefetch_l2_bulk(kv_at + Int64(2) * Int64(row) * Int64(mKV.stride[1]), HEAD_DIM * 2)

    @cute.jit
    def gather_pairs(self, mKV, mIdx, sKV, kv_pipes, tidx, token, batch, key_lo, n_keys, seqlen_k, tile_lo, tile_hi,
                     state, sKeyAddr, pair_base=None):
        """The paired producer's gather of one item's tiles ``[tile_lo, tile_hi)``, a pair at a time.  Thread t copies
        16 B chunk ``t % 8`` of each 128 B segment of rows ``t // 8 + 16 k`` (k < 4): a group of 8 threads reads
        128 contiguous bytes of one row, and each thread needs only 4 row indices per tile.  Returns the pipelines'
        state past the item.  (``sKeyAddr``: shared room for a pair's key addresses, for producers that share them.)
        Every copy of a thread sits at a constant offset from one shared address and from its row's global address
        (:func:`kv_chunk_offset`: the thread's rows are ``group + 16 k``, so ``row % 8`` — the swizzle's XOR — is its
        own constant): no address math per copy (through the swizzled layout it was half the producer's instructions,
        ncu, session 35)."""
        group = tidx // 8
        chunk = tidx % 8
        rows_per_group = TILE_N // ROW_GROUPS
        segments = HALF // 64                                     # 128 B segments per half row
        rows = cute.make_rmem_tensor((2 * rows_per_group,), Int32)
        # my 16 B chunk of row `group`, column block 0, stage 0: every other copy of mine is a constant away
        s_at = shared_address(sKV.iterator) + kv_chunk_offset(group, chunk, 0)
        # ... and of my 16 B chunk of key row 0 in global memory (2 bytes an element)
        kv_at = mKV.iterator.toint() + Int64(2) * (Int64(batch) * Int64(mKV.stride[0]) + Int64(8) * Int64(chunk))
        # past it (an odd count's padding tile, or the next split's keys): no key — neither loaded nor flagged real
        key_end = cutlass.min(n_keys, tile_hi * TILE_N)
        if const_expr(self.key_flags):
            flags = self.key_flag_view(sKeyAddr)
        for p in cutlass.range((tile_hi - tile_lo + 1) // 2, unroll=1):
            for b in cutlass.range_constexpr(2):                  # all 8 index loads first: one latency
                for k in cutlass.range_constexpr(rows_per_group):
                    rows[b * rows_per_group + k] = self.key_row_or_none(
                        mIdx, batch, token, (tile_lo + 2 * p + b) * TILE_N + group + ROW_GROUPS * k, key_lo,
                        key_end, seqlen_k)
            if const_expr(self.key_flags):
                # the pair's key flags, by the first thread of each row's group (buffer p % 2: last read in pair
                # p - 2, whose half-tiles the consumers had all freed before this producer finished pair p - 1);
                # published by that thread's release arrive on each of the pair's four half-tiles below
                if chunk == 0:
                    for b in cutlass.range_constexpr(2):
                        for k in cutlass.range_constexpr(rows_per_group):
                            flags[b * TILE_N + group + ROW_GROUPS * k, self.flag_buffer(p, pair_base)] = Int32(
                                rows[b * rows_per_group + k] >= 0)
            for j in cutlass.range_constexpr(4):
                b, h = HALF_TILE_ORDER[j]
                kv_pipes[2 * b + h].producer_acquire(state)
                for k in cutlass.range_constexpr(rows_per_group):
                    row = rows[b * rows_per_group + k]
                    # no key: the copy reads nothing and zero-fills (src-size 0) — no traffic, and no hot spot
                    # where every CTA would fetch the same stand-in row; the consumers mask the column anyway.  (A
                    # select, not a runtime `if`: one inside this loop broke the public build's pass pipeline)
                    src_bytes = Int32(16) & ~(row >> 31)
                    g_at = kv_at + Int64(2) * (Int64(cutlass.max(row, 0)) * Int64(mKV.stride[1]))
                    for seg in cutlass.range_constexpr(segments):
                        block = h * segments + seg                                   # 64-column block of the row
                        cp_async_16(s_at, kv_chunk_offset(ROW_GROUPS * k, 8 * block, b) - kv_chunk_offset(0, 0, 0),
                                    g_at, 128 * block, src_bytes, self.GATHER_L2_POLICY, self.GATHER_PREFETCH_256)
                if const_expr(self.key_flags):
                    # the copies counted, then a release arrive of the thread's own: it publishes the flag writers'
                    # stores (every thread alike, so no branch on who wrote flags)
                    cp_async_arrive_counted(kv_pipes[2 * b + h].producer_get_barrier(state))
                    cute.arch.mbarrier_arrive(kv_pipes[2 * b + h].producer_get_barrier(state))
                else:
                    kv_pipes[2 * b + h].producer_commit(state)       # arrives when this thread's copies land
            state.advance()
        return state

    @cute.jit
    def flag_buffer(self, p, pair_base):
        """The key-flag buffer of pair ``p`` of an item: ``p % 2``, or counted over a persistent CTA's items
        (``pair_base``: the pairs of its items before this one), so that a buffer is still last read two pairs back."""
        if const_expr(pair_base is None):
            return p % 2
        return (pair_base + p) % 2

    @cute.jit
    def load(self, mQ, mKV, mIdx, sQ, sKV, pipeline_kv, tidx, token, head_group, batch, key_lo, n_keys,
             seqlen_k, tile_lo, tile_hi):
        """cp.async gather: warp w copies rows 16w … 16w+15 of each tile, lane l its 16 B chunks l and l+32."""
        # .cg: straight to L2 (each KV row is used once per CTA; other CTAs find it in L2, not in this SM's L1)
        copy_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                        num_bits_per_copy=128)
        warp = tidx // 32
        lane = tidx % 32
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        for tile in cutlass.range(tile_lo, tile_hi, unroll=1):
            pipeline_kv.producer_acquire(state)
            self.copy_tile_rows(copy_atom, mQ, mKV, mIdx, sQ, sKV, state.index, warp, lane, token, head_group, batch,
                                tile, tile == tile_lo, key_lo, n_keys, seqlen_k)
            pipeline_kv.producer_commit(state)                    # arrives when this thread's copies land
            state.advance()
        pipeline_kv.producer_tail(state)

    @cute.jit
    def scores_and_left_half(self, tiled_mma_qk, tiled_mma_pv, sQ, sKV, sVt, sP, sRowScale, sRowInv, mIdx, mO,
                             mLSE, mSink, pipeline_kv, softmax_scale_log2, wtid, token, head_group, batch, split,
                             key_lo, n_keys, seqlen_k, tile_lo, tile_hi, sLSE, sRed):
        thr_qk, thr_pv, tSrQ, tSrK, tOrV = self.consumer_operands(tiled_mma_qk, tiled_mma_pv, sQ, sKV, sVt, 0, wtid)
        acc_O, acc_O_rc, tScS_rc, row_max, row_sum, key_ok = self.consumer_registers(thr_qk, thr_pv, TILE_N)
        n_rows = cute.size(tScS_rc, mode=[0])                                 # 2 rows, 16 key columns
        n_cols = cute.size(tScS_rc, mode=[1])
        corrections = cute.make_rmem_tensor((n_rows,), Float32)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        for i in cutlass.range(tile_hi - tile_lo, unroll=1):
            tile = tile_lo + i
            buf = i % 2
            self.key_mask(key_ok, tScS_rc, tile * TILE_N, mIdx, batch, token, n_keys, seqlen_k)
            pipeline_kv.consumer_wait(kv_state)
            acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((TILE_H, TILE_N)), Float32)
            if const_expr(self.skip_mma == "qk"):
                acc_S.fill(0.0)
            else:
                gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True)
            acc_S_rc = cute.make_tensor(acc_S.iterator, acc_layout_rows_cols(acc_S.layout))
            for c in cutlass.range_constexpr(n_cols):
                if key_ok[c] == 0:
                    for r in cutlass.range_constexpr(n_rows):
                        acc_S_rc[r, c] = -Float32.inf
            online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, False)
            rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            if i >= 2:                                            # WG2 is done with this buffer's last use
                cute.arch.barrier(barrier_id=P_EMPTY + buf, number_of_threads=256)
            cute.autovec_copy(rP, thr_qk.partition_C(sP[None, None, buf]))
            if wtid % 4 == 0:                                     # one thread of the quad that owns the row
                for r in cutlass.range_constexpr(n_rows):
                    sRowScale[buf * TILE_H + tScS_rc[r, 0][0]] = corrections[r]
            cute.arch.fence_proxy("async.shared", space="cta")  # P is read by WG2's wgmma (async proxy)
            cute.arch.barrier_arrive(barrier_id=P_FULL + buf, number_of_threads=256)
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                    acc_O_rc[r, c] = acc_O_rc[r, c] * corrections[r]
            # the same bf16 registers, re-viewed as the RS operand (D1.3: a same-thread re-view for bf16)
            tOrP = cute.make_tensor(rP.iterator, acc_layout_as_operand_a(rP.layout))
            if const_expr(self.skip_mma != "pv"):
                gemm(tiled_mma_pv, acc_O, tOrP, tOrV[None, None, None, kv_state.index], False)
            pipeline_kv.consumer_release(kv_state)
            kv_state.advance()

        if const_expr(self.split_kv or self.PDL_CHAIN):
            # a combine kernel (or, PDL_CHAIN, the next call) launched with PDL may be scheduled once every CTA is
            # past its main loop (no effect on a dependent launched without it)
            if wtid == 0:
                cute.arch.griddepcontrol_launch_dependents()
        # epilogue: row sums across the quad, sink, normalizers for WG2, LSE, the left half of O
        for r in cutlass.range_constexpr(n_rows):
            s = row_sum[r]
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            m = tScS_rc[r, 0][0]
            inv, lse = finish_row(s, row_max[r], softmax_scale_log2, self.sink_logit(mSink, head_group, m))
            if wtid % 4 == 0:
                sRowInv[m] = inv
                if const_expr(self.cluster_splits > 1):
                    sLSE[m] = lse                     # merged with the cluster's peers in cluster_reduce_half
                elif const_expr(self.has_lse or self.split_kv):
                    mLSE[split, batch, head_group * TILE_H + m, token] = lse
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * inv
        cute.arch.barrier_arrive(barrier_id=FINAL, number_of_threads=256)
        if const_expr(self.cluster_splits > 1 or self.staged_partials):
            self.cluster_reduce_half(0, thr_pv, acc_O, mO, mLSE, sLSE, sRed, wtid, token, head_group, batch, split)
        else:
            self.store_half(thr_pv, acc_O, mO, split, batch, token, head_group, 0)

    @cute.jit
    def right_half(self, tiled_mma_pv, sVt, sP, sRowScale, sRowInv, mO, pipeline_kv, wtid, token, head_group,
                   batch, split, tile_lo, tile_hi, mLSE, sLSE, sRed):
        thr_pv = tiled_mma_pv.get_slice(wtid)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))               # (MMA, 1, 4, 2 buffers)
        sVt_right = cute.local_tile(sVt, (HALF, TILE_N, self.num_stages), (1, 0, 0))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sVt_right))       # (MMA, 1, 4, stages)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((TILE_H, HALF)), Float32)
        acc_O.fill(0.0)
        acc_O_rc = cute.make_tensor(acc_O.iterator, acc_layout_rows_cols(acc_O.layout))
        tOcO = thr_pv.partition_C(cute.make_identity_tensor((TILE_H, HALF)))
        tOcO_rc = cute.make_tensor(tOcO.iterator, acc_layout_rows_cols(tOcO.layout))
        n_rows = cute.size(acc_O_rc, mode=[0])
        n_tiles = tile_hi - tile_lo
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        for i in cutlass.range(n_tiles, unroll=1):
            buf = i % 2
            pipeline_kv.consumer_wait(kv_state)
            cute.arch.barrier(barrier_id=P_FULL + buf, number_of_threads=256)
            for r in cutlass.range_constexpr(n_rows):
                correction = sRowScale[buf * TILE_H + tOcO_rc[r, 0][0]]
                for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                    acc_O_rc[r, c] = acc_O_rc[r, c] * correction
            if const_expr(self.skip_mma != "pv"):
                gemm(tiled_mma_pv, acc_O, tOrP[None, None, None, buf], tOrV[None, None, None, kv_state.index],
                          False)
            if i + 2 < n_tiles:                                    # WG1 will write this buffer again
                cute.arch.barrier_arrive(barrier_id=P_EMPTY + buf, number_of_threads=256)
            pipeline_kv.consumer_release(kv_state)
            kv_state.advance()
        cute.arch.barrier(barrier_id=FINAL, number_of_threads=256)
        for r in cutlass.range_constexpr(n_rows):
            inv = sRowInv[tOcO_rc[r, 0][0]]
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * inv
        if const_expr(self.cluster_splits > 1 or self.staged_partials):
            self.cluster_reduce_half(1, thr_pv, acc_O, mO, mLSE, sLSE, sRed, wtid, token, head_group, batch, split)
        else:
            self.store_half(thr_pv, acc_O, mO, split, batch, token, head_group, 1)

    @cute.jit
    def consumer_operands(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sVt, half, wtid):
        """A consumer warpgroup's wgmma operands: Q (A of QK), its keys ``sK`` (B of QK: the whole stage, or the
        balanced variant's 32 keys) and V's output-column half ``half`` (B of PV, read MN-major)."""
        thr_qk = tiled_mma_qk.get_slice(wtid)
        thr_pv = tiled_mma_pv.get_slice(wtid)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))                               # (MMA, 1, 32)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))                               # (MMA, 1, 32, stages)
        sVt_half = cute.local_tile(sVt, (HALF, TILE_N, self.num_stages), (half, 0, 0))     # (256, 64, stages)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sVt_half))                         # (MMA, 1, 4, stages)
        return thr_qk, thr_pv, tSrQ, tSrK, tOrV

    @cute.jit
    def consumer_registers(self, thr_qk, thr_pv, keys: cutlass.Constexpr):
        """A consumer warpgroup's registers: its O half (64 × 256 fp32, zeroed) also viewed as (rows, cols), the
        (head, key) coordinates of its ``64 × keys`` scores as (rows, cols), running row max / sum, key validity."""
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((TILE_H, HALF)), Float32)
        acc_O.fill(0.0)
        acc_O_rc = cute.make_tensor(acc_O.iterator, acc_layout_rows_cols(acc_O.layout))      # (2 rows, 64)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((TILE_H, keys)))
        tScS_rc = cute.make_tensor(tScS.iterator, acc_layout_rows_cols(tScS.layout))        # (2 rows, keys / 4)
        row_max = cute.make_rmem_tensor((cute.size(tScS_rc, mode=[0]),), Float32)
        row_sum = cute.make_rmem_tensor((cute.size(tScS_rc, mode=[0]),), Float32)
        key_ok = cute.make_rmem_tensor((cute.size(tScS_rc, mode=[1]),), Int32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        return acc_O, acc_O_rc, tScS_rc, row_max, row_sum, key_ok

    @cute.jit
    def key_mask_bits(self, n_cols: cutlass.Constexpr, tScS_rc, key0, mIdx, batch, token, n_keys,
                      seqlen_k) -> Int32:
        """:meth:`key_mask` as one register: bit c set for each real key column c (the paired schedule keeps it
        live across a whole pair, next to an accumulator in flight)."""
        bits = Int32(0)
        for c in cutlass.range_constexpr(n_cols):
            if self.is_real_key(key0 + tScS_rc[0, c][1], mIdx, batch, token, n_keys, seqlen_k):
                bits = bits | Int32(1 << c)
        return bits

    @cute.jit
    def key_mask(self, key_ok, tScS_rc, key0, mIdx, batch, token, n_keys, seqlen_k):
        """1 for each of this thread's key columns that is a real key, 0 for padding / invalid indices (loaded
        from global before the MMA so the latency hides under it)."""
        for c in cutlass.range_constexpr(cute.size(key_ok)):
            ok = self.is_real_key(key0 + tScS_rc[0, c][1], mIdx, batch, token, n_keys, seqlen_k)
            key_ok[c] = Int32(1) if ok else Int32(0)

    @cute.jit
    def finish_shared_max(self, w, thr_pv, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, sSum, mO,
                          mLSE, mSink, softmax_scale_log2, wtid, token, head_group, batch, split,
                          sum_barrier: cutlass.Constexpr, tiled_mma_pv, sQ, tma_atom_O, tma_O, tiled_mma_qk,
                          sLSE=None, sRed=None):
        """Epilogue of the schedules whose two warpgroups end with the same row max (balanced, paired): my row
        sums + the other warpgroup's, sink, LSE, my half of O — or, :attr:`cluster_final`, my half normalized over
        this split's keys and its LSE into the cluster's merge (which applies the sink)."""
        n_rows = cute.size(tScS_rc, mode=[0])
        for r in cutlass.range_constexpr(n_rows):
            s = row_sum[r]
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            row_sum[r] = s
            if wtid % 4 == 0:
                sSum[w * TILE_H + tScS_rc[r, 0][0]] = s
        cute.arch.barrier(barrier_id=sum_barrier, number_of_threads=256)
        for r in cutlass.range_constexpr(n_rows):
            m = tScS_rc[r, 0][0]
            s = row_sum[r] + sSum[(1 - w) * TILE_H + m]
            sink = None if const_expr(self.cluster_final) else self.sink_logit(mSink, head_group, m)
            inv, lse = finish_row(s, row_max[r], softmax_scale_log2, sink)
            if const_expr(self.cluster_final):
                if w == 0 and wtid % 4 == 0:
                    sLSE[m] = lse                     # merged with the cluster's peers in cluster_reduce_half
            elif const_expr(self.has_lse or self.split_kv):
                if w == 0 and wtid % 4 == 0:
                    mLSE[split, batch, head_group * TILE_H + m, token] = lse
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * inv
        if const_expr(self.cluster_final):
            self.cluster_reduce_half(w, thr_pv, acc_O, mO, mLSE, sLSE, sRed, wtid, token, head_group, batch, split,
                                     mSink)
        elif const_expr(self.tma_store_o):
            self.store_o_chunks(w, tiled_mma_qk, acc_O, sQ, tma_atom_O, tma_O, wtid, token, head_group, batch, split)
        else:
            self.store_half(thr_pv, acc_O, mO, split, batch, token, head_group, w)

    @cute.jit
    def store_o_chunks(self, w, tiled_mma_qk, acc_O, sQ, tma_atom_O, tma_O, wtid, token, head_group, batch, split):
        """My column half of O (bf16: the output, or split ``split``'s partial) → the dead Q buffer in four 64-column
        chunks; after each chunk my warpgroup meets on its own barrier and my first warp issues that chunk's TMA store, so the stores overlap the next
        chunk's writes and the other warpgroup's, and little is left in flight when the CTA ends.  A chunk is
        partitioned as a m64n64 accumulator (the QK wgmma's C layout: same threads, same rows, 8-column groups), so
        its values are 32 consecutive ones of my m64n256 accumulator: chunk c = groups 8c … 8c+7."""
        acc_flat = cute.make_tensor(acc_O.iterator, cute.make_layout(cute.size(acc_O)))
        chunks = HALF // O_CHUNK
        per_chunk = cute.size(acc_O) // chunks
        thr_c = tiled_mma_qk.get_slice(wtid)
        gO = cute.local_tile(tma_O[None, None, token, batch, split], (TILE_H, O_CHUNK), (head_group, None))  # (64, 64, 8)
        for c in cutlass.range_constexpr(chunks):
            col_block = w * chunks + c
            sO_c = cute.local_tile(sQ, (TILE_H, O_CHUNK), (0, col_block))                  # (64, 64), 8 KB block
            rO = cute.make_rmem_tensor(thr_c.partition_shape_C((TILE_H, O_CHUNK)), self.dtype)
            convert_to_bf16_pairs(cute.local_tile(acc_flat, (per_chunk,), (c,)), rO)
            if const_expr(self.O_CHUNK_STMATRIX):
                stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                               self.dtype)
                thr_copy = cute.make_tiled_copy_C(stmatrix, tiled_mma_qk).get_slice(wtid)
                cute.copy(stmatrix, thr_copy.retile(rO), thr_copy.partition_D(sO_c))
            else:
                cute.autovec_copy(rO, thr_c.partition_C(sO_c))
            cute.arch.fence_proxy("async.shared", space="cta")                      # generic writes → TMA reads
            cute.arch.barrier(barrier_id=O_CHUNK_READY + w, number_of_threads=128)
            if wtid < 32:
                tma_store_tile(tma_atom_O, sO_c, gO[None, None, col_block], wait=False, cache_policy=self.O_L2_POLICY)
        if wtid < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)       # the CTA may not exit before its buffer is read

    @cute.jit
    def paired_operands(self, w: cutlass.Constexpr, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP,
                        wtid):
        """Warpgroup ``w``'s operands and registers of the paired schedule, as :meth:`paired_item` takes them:
        ``(thr_qk, thr_pv, tSrQ, tSrK, tOrV, tOsP, tOsV, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, acc_S, rP)``."""
        thr_qk, thr_pv, tSrQ, tSrK, tOrV = self.consumer_operands(tiled_mma_qk, tiled_mma_pv_rs, sQ, sKV, sVt, w,
                                                                  wtid)
        thr_pv_ss = tiled_mma_pv_ss.get_slice(wtid)
        tOsP = thr_pv_ss.make_fragment_A(thr_pv_ss.partition_A(sP))                        # (MMA, 1, 4, 2 bufs)
        sVt_mine = cute.local_tile(sVt, (HALF, TILE_N, self.num_stages), (w, 0, 0))          # (256, 64, 2 bufs)
        tOsV = thr_pv_ss.make_fragment_B(thr_pv_ss.partition_B(sVt_mine))                   # (MMA, 1, 4, 2 bufs)
        acc_O, acc_O_rc, tScS_rc, row_max, row_sum, _ = self.consumer_registers(thr_qk, thr_pv, TILE_N)
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((TILE_H, TILE_N)), Float32)   # (MMA, 1, 1) scores
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        return (thr_qk, thr_pv, tSrQ, tSrK, tOrV, tOsP, tOsV, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, acc_S, rP)

    @cute.jit
    def paired_half(self, w: cutlass.Constexpr, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP,
                    sMax, sSum, mIdx, mO, mLSE, mSink, kv_pipes, softmax_scale_log2, wtid, token, head_group, batch,
                    split, n_keys, seqlen_k, tile_lo, tile_hi, tma_atom_O, tma_O, mQ, mKV, window_size, tma_atom_Q,
                    tma_Q, pipeline_q, sLSE=None, sRed=None):
        """Warpgroup ``w`` of the paired schedule: the scores of tiles ``tile_lo + 2p + w`` and O columns
        ``256w … 256w+255`` of every tile (module docstring).  Half-buffer ``2b + h`` = tile buffer b, columns h.
        (A persistent CTA's warpgroups run :meth:`paired_items` instead.)"""
        operands = self.paired_operands(w, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sKV, sVt, sP, wtid)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        self.paired_item(w, operands, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sP, sMax, sSum, mIdx, mO,
                         mLSE, mSink, kv_pipes, softmax_scale_log2, wtid, token, head_group, batch, split, n_keys,
                         seqlen_k, tile_lo, tile_hi, tma_atom_O, tma_O, state, sLSE, sRed)

    @cute.jit
    def paired_item(self, w: cutlass.Constexpr, operands, tiled_mma_qk, tiled_mma_pv_rs, tiled_mma_pv_ss, sQ, sP, sMax,
                    sSum, mIdx, mO, mLSE, mSink, kv_pipes, softmax_scale_log2, wtid, token, head_group, batch, split,
                    n_keys, seqlen_k, tile_lo, tile_hi, tma_atom_O, tma_O, state, sLSE=None, sRed=None,
                    persist=None):
        """One query item of :meth:`paired_half` (O, row max and sum come in reset): its pairs, the epilogue and the
        O store.  Returns the half-buffer pipelines' state past this item's pairs.  ``persist``: a persistent CTA's
        ``(pipeline_q, q_state, sKV)`` — Q freed after the last QK, O staged in the last pair's (1, L) / (0, R)
        buffers (this warpgroup's: ``sKV`` stage ``1 - w``), whose releases wait for O's store to have read them."""
        thr_qk, thr_pv, tSrQ, tSrK, tOrV, tOsP, tOsV, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, acc_S, rP = operands
        n_rows = cute.size(tScS_rc, mode=[0])                                 # 2 rows, 16 key columns
        n_cols = cute.size(tScS_rc, mode=[1])
        acc_S_rc = cute.make_tensor(acc_S.iterator, acc_layout_rows_cols(acc_S.layout))
        tOrP = cute.make_tensor(rP.iterator, acc_layout_as_operand_a(rP.layout))   # D1.3 same-thread re-view
        other_max = cute.make_rmem_tensor((n_rows,), Float32)
        corrections = cute.make_rmem_tensor((n_rows,), Float32)
        k_half = cute.size(tSrQ.shape[2]) // 2                              # k-blocks per column half of Q·Kᵀ
        key_end = cutlass.min(n_keys, tile_hi * TILE_N)     # a padding tile (odd count) / the next split: masked
        n_pairs = (tile_hi - tile_lo + 1) // 2
        for p in cutlass.range(n_pairs, unroll=1):
            # an odd tile count's last pair has one tile: the odd one is a pad that no MMA reads (WG1 takes only its
            # max and O rescale; the producer need not fill it), so a one-tile split costs one tile, not two
            lone = tile_lo + 2 * p + 1 >= tile_hi
            key_bits = self.issue_scores(w, p, state, tiled_mma_qk, acc_S, tSrQ, tSrK, k_half, tScS_rc, kv_pipes,
                                         mIdx, batch, token, key_end, seqlen_k, tile_lo, lone)
            if const_expr(persist is not None):
                if p == n_pairs - 1:             # the item's last QK has read Q: the next item's may load
                    persist[0].consumer_release(persist[1])
            for c in cutlass.range_constexpr(n_cols):
                if (key_bits & (1 << c)) == 0:
                    for r in cutlass.range_constexpr(n_rows):
                        acc_S_rc[r, c] = -Float32.inf
            self.pair_with_chained_max(w, lone, state, tiled_mma_pv_rs, tiled_mma_pv_ss, thr_qk, acc_S, acc_S_rc, rP,
                                       tOrP, tOrV, tOsP, tOsV, acc_O, acc_O_rc, row_max, row_sum, other_max,
                                       corrections, tScS_rc, sMax, sP, kv_pipes, softmax_scale_log2, wtid,
                                       p == n_pairs - 1 if const_expr(persist is not None) else None)
            state.advance()
        if const_expr(persist is not None):
            if n_pairs == 0:                     # no QK read Q
                persist[0].consumer_release(persist[1])
        if const_expr((self.split_kv or self.PDL_CHAIN) and w == 0):
            # past the main loop: a combine (or, PDL_CHAIN, the next call) launched with PDL may be scheduled now, its
            # launch hidden behind this kernel's epilogue (its griddepcontrol.wait still waits for every partial)
            if wtid == 0:
                cute.arch.griddepcontrol_launch_dependents()
        sO = sQ if const_expr(persist is None) else persist[2][None, None, 1 - w]     # (64, 512): O's staging
        self.finish_shared_max(w, thr_pv, acc_O, acc_O_rc, tScS_rc, row_max, row_sum, sSum, mO, mLSE, mSink,
                               softmax_scale_log2, wtid, token, head_group, batch, split, PAIR_SUM,
                               tiled_mma_pv_rs, sO, tma_atom_O, tma_O, tiled_mma_qk, sLSE, sRed)
        if const_expr(persist is not None):
            # O's store has read my buffer (my storer waited): my warpgroup frees it — (1, L) WG0, (0, R) WG1
            cute.arch.barrier(barrier_id=O_CHUNK_READY + w, number_of_threads=128)
            if n_pairs > 0:
                kv_pipes[2 - w].consumer_release(state)
            acc_O.fill(0.0)                          # the next item's O, row max and sum start anew
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
        return state

    @cute.jit
    def pair_with_chained_max(self, w: cutlass.Constexpr, lone, state, tiled_mma_pv_rs, tiled_mma_pv_ss, thr_qk,
                              acc_S, acc_S_rc, rP, tOrP, tOrV, tOsP, tOsV, acc_O, acc_O_rc, row_max, row_sum,
                              other_max, corrections, tScS_rc, sMax, sP, kv_pipes, softmax_scale_log2, wtid,
                              last=None):
        """The paired schedule's softmax and PV of one pair, warpgroup ``w`` with its tile's masked scores in
        ``acc_S``: warpgroup 0's softmax, then warpgroup 1's over both tiles' max, then warpgroup 0's P and O rescaled
        to that max; each P times its warpgroup's column half, and through ``sP`` the other warpgroup's.

        Why a chain and not a swap (both publish their own tile's max, meet once, both softmaxes at once, P never
        rescaled): the swap was built and measured in session 33 (H100, probe_d7 / probe_d6) — D7 B64 / B128 H128
        81.1 / 154.6 µs against the chain's 70.5 / 136.9, D6 H128 449 against 469 TFLOP/s.  The chain lets warpgroup
        0's PV wgmma start before warpgroup 1's softmax; the swap holds both at the meeting (docs/tuning/d7.md).
        ``last`` (a persistent CTA's item's last pair): (1, L) and (0, R) stay held — O is staged in them."""
        n_rows = cute.size(tScS_rc, mode=[0])
        n_cols = cute.size(tScS_rc, mode=[1])
        if const_expr(w == 0):
            online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, True)
        else:          # WG0's max of this pair is a floor for mine: mine becomes the max over both tiles
            cute.arch.barrier(barrier_id=PAIR_MAX, number_of_threads=256)
            for r in cutlass.range_constexpr(n_rows):
                other_max[r] = sMax[tScS_rc[r, 0][0]]
            online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, True,
                           floor_max=other_max)
        if wtid % 4 == 0:
            for r in cutlass.range_constexpr(n_rows):
                sMax[w * TILE_H + tScS_rc[r, 0][0]] = row_max[r]
        convert_to_bf16_pairs(acc_S, rP)
        if const_expr(w == 0):
            cute.arch.barrier_arrive(barrier_id=PAIR_MAX, number_of_threads=256)
            gemm(tiled_mma_pv_rs, acc_O, tOrP, tOrV[None, None, None, 0], False)
            kv_pipes[0].consumer_release(state)                       # (even, left): nobody reads it again
            # WG1's max (over both tiles) → my P and O move to it; P goes to shared memory for WG1
            cute.arch.barrier(barrier_id=PAIR_MAX + 1, number_of_threads=256)
            for r in cutlass.range_constexpr(n_rows):
                new_max = sMax[TILE_H + tScS_rc[r, 0][0]]
                base = new_max * softmax_scale_log2
                if new_max == -Float32.inf:
                    base = Float32(0.0)
                corrections[r] = exp2(row_max[r] * softmax_scale_log2 - base)
                row_max[r] = new_max
                row_sum[r] = row_sum[r] * corrections[r]
                for c in cutlass.range_constexpr(n_cols):
                    acc_S_rc[r, c] = acc_S_rc[r, c] * corrections[r]
            convert_to_bf16_pairs(acc_S, rP)
            cute.autovec_copy(rP, thr_qk.partition_C(sP[None, None, 0]))
            cute.arch.fence_proxy("async.shared", space="cta")          # read by WG1's wgmma (async proxy)
            cute.arch.barrier_arrive(barrier_id=PAIR_P, number_of_threads=256)
            rescale_rows(acc_O_rc, corrections)
            cute.arch.barrier(barrier_id=PAIR_P + 1, number_of_threads=256)
            if not lone:       # (a wgmma only inside a branch that also waits for it: ptxas C7514 otherwise)
                gemm(tiled_mma_pv_ss, acc_O, tOsP[None, None, None, 1], tOsV[None, None, None, 1], False)
            self.release_unless_last(kv_pipes[2], state, last)        # (odd, left)
        else:
            cute.arch.barrier_arrive(barrier_id=PAIR_MAX + 1, number_of_threads=256)
            # a wgmma pipeline stage never crosses the lone branch (ptxas serializes every wgmma otherwise)
            if lone:           # no tile of mine: only WG0's P times (even, right); sP[1] unread
                cute.arch.barrier_arrive(barrier_id=PAIR_P + 1, number_of_threads=256)
                cute.arch.barrier(barrier_id=PAIR_P, number_of_threads=256)
                gemm(tiled_mma_pv_ss, acc_O, tOsP[None, None, None, 0], tOsV[None, None, None, 0], False)
                kv_pipes[3].consumer_release(state)
                self.release_unless_last(kv_pipes[1], state, last)
            else:
                gemm(tiled_mma_pv_rs, acc_O, tOrP, tOrV[None, None, None, 1], False, wait=False)
                cute.autovec_copy(rP, thr_qk.partition_C(sP[None, None, 1]))   # the RS wgmma only reads rP
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier_arrive(barrier_id=PAIR_P + 1, number_of_threads=256)
                cute.arch.barrier(barrier_id=PAIR_P, number_of_threads=256)
                gemm(tiled_mma_pv_ss, acc_O, tOsP[None, None, None, 0], tOsV[None, None, None, 0], False,
                     wait=False)
                warpgroup.wait_group(1)                               # my own tile's PV: (odd, right) free,
                kv_pipes[3].consumer_release(state)                   # the producer's next fill after (even, left)
                warpgroup.wait_group(0)
                self.release_unless_last(kv_pipes[1], state, last)    # (even, right)

    @cute.jit
    def release_unless_last(self, pipe, state, last):
        """``pipe``'s release, held back on a persistent item's last pair (``last`` None: always released)."""
        if const_expr(last is None):
            pipe.consumer_release(state)
        else:
            if not last:
                pipe.consumer_release(state)

    @cute.jit
    def issue_scores(self, w: cutlass.Constexpr, p, state, tiled_mma_qk, acc_S, tSrQ, tSrK, k_half, tScS_rc, kv_pipes,
                     mIdx, batch, token, key_end, seqlen_k, tile_lo, lone):
        """Paired schedule: the key mask of pair ``p``'s tile of warpgroup ``w`` and ``S = Q·Kᵀ`` over it, the half
        that arrives first first (WG0: left, WG1: right).  Returns the tile's key-validity bits.  ``lone``: the pair
        has no odd tile — WG1 waits for its buffers (the pipelines' phases stay in step) but multiplies nothing; its
        columns are past ``key_end``, so every one is masked (acc_S holds nothing else)."""
        key0 = (tile_lo + 2 * p + w) * TILE_N
        n_cols = cute.size(tScS_rc, mode=[1])
        if const_expr(self.key_mask_after_wait):
            key_bits = Int32(0)                         # read while the first QK half runs (scores_after_first_half)
        else:                                           # global loads: issued before the wait, hidden by it
            key_bits = self.key_mask_bits(n_cols, tScS_rc, key0, mIdx, batch, token, key_end, seqlen_k)
        kv_pipes[2 * w + w].consumer_wait(state)
        if const_expr(w == 0):
            key_bits = self.scores_after_first_half(w, state, tiled_mma_qk, acc_S, tSrQ, tSrK, k_half, tScS_rc,
                                                    kv_pipes, mIdx, batch, token, key_end, seqlen_k, key0, key_bits)
        elif lone:         # the pad: no QK, and its columns are past key_end (key_bits 0, all masked)
            kv_pipes[2 * w + 1 - w].consumer_wait(state)
        else:              # (the whole wgmma pipeline stage inside the branch: ptxas C7514 otherwise)
            key_bits = self.scores_after_first_half(w, state, tiled_mma_qk, acc_S, tSrQ, tSrK, k_half, tScS_rc,
                                                    kv_pipes, mIdx, batch, token, key_end, seqlen_k, key0, key_bits)
        return key_bits

    @cute.jit
    def scores_after_first_half(self, w: cutlass.Constexpr, state, tiled_mma_qk, acc_S, tSrQ, tSrK, k_half,
                                tScS_rc, kv_pipes, mIdx, batch, token, key_end, seqlen_k, key0, key_bits):
        """:meth:`issue_scores` once warpgroup ``w``'s first column half has arrived: both QK halves (the second
        after its own wait), the key mask read while the first runs (when published with the tile)."""
        n_cols = cute.size(tScS_rc, mode=[1])
        gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, w], True, wait=False,
             k_blocks=(w * k_half, (w + 1) * k_half))
        if const_expr(self.key_mask_after_wait):   # published with the tile: read while the first QK half runs
            key_bits = self.key_mask_bits(n_cols, tScS_rc, key0, mIdx, batch, token, key_end, seqlen_k)
        kv_pipes[2 * w + 1 - w].consumer_wait(state)
        gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, w], False,
             k_blocks=((1 - w) * k_half, (2 - w) * k_half))
        return key_bits

    @cute.jit
    def cluster_reduce_half(self, half: cutlass.Constexpr, thr_pv, acc_O, mO, mLSE, sLSE, sRed, wtid, token,
                            head_group, batch, split, mSink=None):
        """Consumer warpgroup ``half``'s share of writing the split partial through shared memory (``acc_O``: its O
        half normalized over this split's keys).  ``cluster_splits`` C > 1: merge the cluster's C partials on chip
        first (module docstring) — two cluster barriers, in which the producer warps take part too.  C = 1
        (``staged_partials``): the two consumer warpgroups meet at named barriers, and the fp32 tile leaves as
        row-contiguous 16 B stores (a warp writes 512 B of one row pair) instead of the accumulator's scattered
        8 B pairs — measured a tie (docs/tuning/d2_d6.md), the same code as the cluster's last step.

        The cluster's O halves go into ``sRed`` as they are (bf16, normalized over each split's own keys) before the
        first barrier, and the LSE weights are applied while summing: the thread that sums a row's slice reads that
        row's C LSEs with its C vectors.  (Weighing first needed a barrier between the LSE exchange and the sRed
        writes: ~1.5 µs of the decode's merge, the sRed writes now overlapping the wait for the
        cluster's slowest split.)  :attr:`cluster_final` (paired): the merged row is the output — the sink joins its
        denominator once (``mSink``) and the slice is written in the output's dtype (bf16)."""
        C = self.cluster_splits
        ctid = half * 128 + wtid
        rank = split % C                    # = the CTA's rank in its (1, 1, C) cluster
        part = split // C                   # this cluster's partial in mO / mLSE
        vec = 128 // sRed.element_type.width
        vecs_per_row = HEAD_DIM // C // vec
        steps = TILE_H * vecs_per_row // 256
        sink_rows = None
        if const_expr(self.cluster_final and self.has_sink):
            # each step's row sink, loaded now: the loads land while the cluster meets (a global load inside the
            # merge loop would wait there)
            sink_rows = cute.make_rmem_tensor((steps,), Float32)
            for step in cutlass.range_constexpr(steps):
                sink_rows[step] = mSink[head_group * TILE_H + (step * 256 + ctid) // vecs_per_row]
        # WG1 may not overwrite the KV stages before WG2's last PV wgmma has read them
        cute.arch.barrier(barrier_id=STAGED, number_of_threads=256)
        tOsR = thr_pv.partition_C(cute.local_tile(sRed, (TILE_H, HALF), (0, half)))
        if const_expr(sRed.element_type == Float32):
            cute.autovec_copy(acc_O, tOsR)
        else:
            rO = cute.make_rmem_tensor_like(acc_O, sRed.element_type)
            rO.store(acc_O.load().to(sRed.element_type))
            cute.autovec_copy(rO, tOsR)
        if const_expr(C > 1):
            cute.arch.cluster_arrive()                 # [1] every split's row LSEs and O are in its sLSE / sRed
            cute.arch.cluster_wait()
        else:
            cute.arch.barrier(barrier_id=STAGED, number_of_threads=256)
        # column slice `rank` (512 / C columns × 64 heads) summed in fp32 over the C peers, one 16 B vector (4 fp32
        # or 8 bf16) per peer, thread and step, each weighed by e^{lse_peer - lse_cluster} of its row
        sRed_peer = [sRed]
        sLSE_peer = [sLSE]
        if const_expr(C > 1):
            sRed_peer = [cute.make_tensor(cute.arch.map_dsmem_ptr(sRed.iterator, p), sRed.layout)
                         for p in range(C)]
            sLSE_peer = [cute.make_tensor(cute.arch.map_dsmem_ptr(sLSE.iterator, p), sLSE.layout)
                         for p in range(C)]
        gO = mO[part, batch, token, None, None]                                          # (H, 512)
        parts = cute.make_rmem_tensor(cute.make_layout((C, vec), stride=(vec, 1)), sRed.element_type)
        lse_p = cute.make_rmem_tensor(cute.make_layout((C, 1), stride=(1, 1)), Float32)
        weight = cute.make_rmem_tensor((C,), Float32)
        total = cute.make_rmem_tensor((vec,), Float32)
        for step in cutlass.range_constexpr(steps):
            v = step * 256 + ctid
            row = v // vecs_per_row
            colv = rank * vecs_per_row + v % vecs_per_row                             # in vector units
            for p in cutlass.range_constexpr(C):
                cute.autovec_copy(cute.local_tile(sRed_peer[p][row, None], (vec,), (colv,)), parts[p, None])
            if const_expr(C > 1):
                for p in cutlass.range_constexpr(C):  # (a DSMEM tensor is read by copies, not by indexing)
                    cute.autovec_copy(cute.local_tile(sLSE_peer[p], (1,), (row,)), lse_p[p, None])
                lse_cluster = self.lse_weights(lse_p, weight, C)
                if const_expr(self.cluster_final and self.has_sink):
                    # the value-less sink once, on the merged row: S / (S + e^σ) with S = e^lse_cluster (a row
                    # without keys has weights 0 and stays 0)
                    keep = 1.0 / (1.0 + exp2((sink_rows[step] - lse_cluster) * LOG2_E))
                    for p in cutlass.range_constexpr(C):
                        weight[p] = weight[p] * keep
                for j in cutlass.range_constexpr(vec):
                    total[j] = weight[0] * Float32(parts[0, j])
                    for p in cutlass.range_constexpr(1, C):
                        total[j] += weight[p] * Float32(parts[p, j])
                if rank == 0 and v % vecs_per_row == 0:
                    mLSE[part, batch, head_group * TILE_H + row, token] = lse_cluster
            else:
                for j in cutlass.range_constexpr(vec):
                    total[j] = Float32(parts[0, j])
            gO_v = cute.local_tile(gO[head_group * TILE_H + row, None], (vec,), (colv,))
            if const_expr(mO.element_type == Float32):
                cute.autovec_copy(total, gO_v)
            else:                                           # the output itself (cluster_final): bf16, 16 B a vector
                out_v = cute.make_rmem_tensor((vec,), mO.element_type)
                out_v.store(total.load().to(mO.element_type))
                cute.autovec_copy(out_v, gO_v)
        if const_expr(C > 1):
            cute.arch.cluster_arrive()                 # [2] no CTA exits while a peer still reads its sRed
            cute.arch.cluster_wait()

    @cute.jit
    def lse_weights(self, lse_p: cute.Tensor, weight: cute.Tensor, C: cutlass.Constexpr) -> Float32:
        """One row's C peer LSEs (``lse_p (C, 1)``) → ``weight[p] = e^{lse_p - lse_cluster}`` and the row's
        ``lse_cluster`` (returned).  A row no split of the cluster saw: weights 0 (its O is 0), LSE -inf."""
        mx = lse_p[0, 0]
        for p in cutlass.range_constexpr(1, C):
            mx = cute.arch.fmax(mx, lse_p[p, 0])
        lse_cluster = -Float32.inf
        for p in cutlass.range_constexpr(C):
            weight[p] = Float32(0.0)
        if mx > -Float32.inf:
            norm = Float32(0.0)
            for p in cutlass.range_constexpr(C):
                weight[p] = exp2((lse_p[p, 0] - mx) * LOG2_E)    # exp2(-inf) = 0: empty adds 0
                norm += weight[p]
            lse_cluster = mx + cute.math.log2(norm) * LN_2
            inv_norm = 1.0 / norm
            for p in cutlass.range_constexpr(C):
                weight[p] = weight[p] * inv_norm
        return lse_cluster

    @cute.jit
    def store_half(self, thr_pv, acc_O, mO, split, batch, token, head_group, half):
        """O half → global (bf16 output, or the fp32 partial of a split), straight from the accumulator."""
        gO = cute.local_tile(mO[split, batch, token, None, None], (TILE_H, HALF), (head_group, half))
        tOgO = thr_pv.partition_C(gO)
        rO = cute.make_rmem_tensor_like(acc_O, mO.element_type)
        rO.store(acc_O.load().to(mO.element_type))
        cute.autovec_copy(rO, tOgO)
