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

**Persistent CTAs** (``persistent=True``; D1 hd64 / hd128 and the small windows, ``Sm90FwdConfig.for_problem``):
up to one CTA per SM walks the query blocks; two Q stages and a separate O buffer let the producer load the next
block while the consumers finish this one, and the O store of a block is waited for only when the next block needs
the buffer.  **Dynamic schedule** (``dynamic_schedule=True``): a CTA's first block is its blockIdx.x, every later
one ``gridDim.x`` + a global counter's next value (``atom.add`` by the producer, issued while the current block's
K/V load, so its latency hides); the producer writes the block into ``sWork`` next to its Q stage before the
stage's full barrier is armed (the arrive is a release), and after the last block it completes the next stage's
barrier with a plain arrive and -1 in ``sWork``, which ends the consumers' loop.  The last producer to finish (a
second counter) zeroes both counters for the next launch.  Under a causal mask or a window the last query blocks
of a head come first (longest first).  Why: a static deal ends with the slowest CTAs, and CTAs doing the same work
differ by ~10 % (the SMs the memory system serves last).

**Warpgroup tiles** (``warpgroup_tiles=True``; the small-window schedule): at W = 128 a query tile visits only 2-3
key tiles and the kernel is bound by the L2 re-reads of K/V.  The producer loads the block's tiles once, as one run
of slots descending from the top warpgroup's last tile (``warpgroup_plan``; the rows of adjacent warpgroups are
adjacent, so the run has no gap); each 64-row consumer warpgroup visits its own tiles and skips those above and
below — a skipped slot is waited for and released with no wgmma.  A 192-row tile of three consumer warpgroups loads
5 K/V tiles where three 64-row blocks load 9, and no warpgroup computes a wholly masked tile; each warpgroup decides
which tiles to mask from its own 64 rows (``mask_row``).

**O in its Q stage** (``o_in_q_stage``, persistent): the consumers put O into the item's own Q stage (each
warpgroup its 64 rows, whose QKs have all retired), arrive on that stage's named barrier and go on; an idle producer
warp (``store_persistent``) waits there, TMA-stores the tile, waits for the store's read and hands the stage back to
the producer.  No O buffer (the 192-row tile's two 48 KB Q stages and 4 K/V stages fit only so) and no consumer
waits for a store.  **L2 hints** (``l2_hints``): Q's loads and O's stores evict first, K/V's loads evict last.

KV tiles are visited from the last to the first, so the tiles that need masking (the ragged end of the
keys, the causal diagonal) come first.  The running row max is kept in raw-score units and the softmax
scale is applied inside ``exp2`` (the seed's double-scaling trap); O is rescaled by
``exp2((m_old - m_new)·scale·log2e)`` on every tile; the final normalization uses the row sum of the very
row each thread owns.  Each K/V TMA is indexed by the loop's KV block, never stuck on tile 0.
"""
from __future__ import annotations


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Uint8, const_expr, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from ..common import (L2_EVICT_FIRST, L2_EVICT_LAST, convert_to_bf16_pairs, launch_stream, load_kv_tiles,
                      tma_copy, tma_load_tile)
from ..block_info import BlockInfo
from ..layouts import acc_layout_as_operand_a, acc_layout_rows_cols, row_major_smem_layout, transposed_view
from ..softmax import online_softmax, rescale_rows
from ..tile_scheduler import PersistentScheduler, persistent_grid
from .config import SMEM_PER_SM, Sm90FwdConfig
from .epilogue import Sm90Epilogue
from .wgmma import gemm



class FlashAttentionForwardSm90(Sm90Epilogue):
    """Hopper forward attention, P in registers.  ``head_dim`` 64 / 128 / 256 (Dv = D), bf16."""

    # (producer, consumer) registers per thread after setmaxnreg, by number of consumer warpgroups: the whole
    # 64K-register file is shared out (128·24 + 256·240 = 128·32 + 384·160 = 64K)
    REGS_BY_CONSUMER_WARPGROUPS = {2: (24, 240), 3: (32, 160)}
    EPILOGUE_BARRIER = 7                 # every consumer thread has put its O rows in shared memory
    TURN_BARRIERS = 3                    # wg_pingpong: named barriers 3, 4, 5 (consumer warpgroup i waits on 3 + i)
    STORE_BARRIERS = 1                   # o_in_q_stage: named barriers 1, 2 (by Q stage; SMEM-P's ids, unused there)

    def __init__(self, config: Sm90FwdConfig):
        config.check()
        self.config = config                 # its fields read as the kernel's own (__getattr__): self.tile_m, ...
        self.has_window = config.window
        self.has_sink = config.sink
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
        self.block_info = BlockInfo(tile_m=config.tile_m, tile_n=config.tile_n, causal=config.causal,
                                    has_window=config.window, pack_gqa=config.pack_gqa,
                                    warpgroup_tiles=config.warpgroup_tiles)
        # a one-block-a-CTA causal build whose grid is the scheduler's sectioned order (1-D) instead of (m, head, batch)
        self.sectioned_grid = config.l2_section_mb > 0 and not config.persistent
        self.scheduler = PersistentScheduler(tile_m=config.tile_m, longest_first=config.causal or config.window,
                                             l2_section_bytes=config.l2_section_mb << 20)

    def __getattr__(self, name):
        if name == "config":                 # not set yet (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    # ------------------------------------------------------------------------------ host side
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
                 mSenc: cute.Tensor, stream: cuda.CUstream = None, mWork: cute.Tensor = None,
                 mPrevO: cute.Tensor = None, mPrevLSE: cute.Tensor = None):
        # mWork (dynamic_schedule only): int32 (2,) = (items handed out, producers done), zero before the launch and
        # left zero after it (dsv4lib.ops.attention.work_counters)
        # mPrevO / mPrevLSE (merge_slots only): the earlier branches' fp32 partials, O (slots, b, s, h, d) and LSE
        # (slots, b, h, s), as the split builds wrote them
        # torch (b, s, h, d) -> (s, d, h, b): the TMA tiles the first two modes
        mQ, mK, mV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0])) for t in (mQ, mK, mV)]
        if const_expr(self.split_kv):
            # partials: O (splits, b, s, h, d) -> (s, d, h, b, splits); LSE (splits, b, h, s) -> (s, h, b, splits)
            mO = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[2, 4, 3, 1, 0]))
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[3, 2, 1, 0]))
        else:
            mO = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[1, 3, 2, 0]))    # bf16 O, or NVFP4 bytes
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))   # (b,h,s) -> (s,h,b)
        if const_expr(self.merge_slots):   # the split builds' views: (s, d, h, b, slots) and (s, h, b, slots)
            mPrevO = cute.make_tensor(mPrevO.iterator, cute.select(mPrevO.layout, mode=[2, 4, 3, 1, 0]))
            mPrevLSE = cute.make_tensor(mPrevLSE.iterator, cute.select(mPrevLSE.layout, mode=[3, 2, 1, 0]))
        if const_expr(self.nvfp4_out):   # scales (b, s, h, d/16) -> (s, d/16, h, b)
            mOutScales = cute.make_tensor(mOutScales.iterator, cute.select(mOutScales.layout, mode=[1, 3, 2, 0]))
        if const_expr(self.pack_gqa > 1):    # rows = (q head in group, token); the head mode counts KV heads
            mQ, mO, mLSE = self.pack_heads(mQ, 2), self.pack_heads(mO, 2), self.pack_heads(mLSE, 1)
            if const_expr(self.merge_slots):
                mPrevO, mPrevLSE = self.pack_heads(mPrevO, 2), self.pack_heads(mPrevLSE, 1)
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
        if const_expr(self.sectioned_grid):
            grid = (self.scheduler.work_items(mQ), 1, 1)         # block x = work item, in the scheduler's order
        if const_expr(self.persistent):
            grid = (persistent_grid(self.scheduler.work_items(mQ), self.num_sms), 1, 1)
            if const_expr(self.dynamic_schedule):            # every slot: the faster ones take more items
                grid = (cutlass.min(self.scheduler.work_items(mQ), self.num_sms), 1, 1)
        # what the build does not read may come as None (dsv4lib.ops.attention.launcher: a tensor argument costs host
        # time); the kernel's parameter list takes the LSE tensor in its place
        if const_expr(mSink is None):
            assert not self.has_sink, "a sink build reads mSink"
            mSink = mLSE
        if const_expr(mOutScales is None or mSenc is None):
            assert not self.nvfp4_out, "an NVFP4 build reads mOutScales and mSenc"
            mOutScales, mSenc = mLSE, mLSE
        if const_expr(not self.dynamic_schedule):
            mWork = mSenc                                    # unused
        if const_expr(not self.merge_slots):
            mPrevO, mPrevLSE = mSenc, mSenc                  # unused
        self.kernel(tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, mO, mLSE, softmax_scale_log2,
                    window_size, mSink, mOutScales, mSenc, mWork, mPrevO, mPrevLSE,
                    sQ_layout, sK_layout, sV_layout, sP_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage).launch(
            grid=grid, block=[self.NUM_THREADS, 1, 1], min_blocks_per_mp=1, **launch_stream(stream))

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
               tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_O: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, mOutScales: cute.Tensor,
               mSenc: cute.Tensor, mWork: cute.Tensor, mPrevO: cute.Tensor, mPrevLSE: cute.Tensor,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, tiled_mma_qk: cute.TiledMma,
               tiled_mma_pv: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if const_expr(self.sectioned_grid):
            # blocks launch in index order: the scheduler's L2 sections, each longest first across its heads
            m_block, head, batch = self.scheduler.work_coords(m_block, mQ, mK.shape[0])
        elif const_expr(self.causal):
            # heaviest query blocks first (blocks launch x-fastest): causal work grows with m_block, and the blocks
            # launched last should be the short ones of the last head (not those of a whole section: see sectioned_grid)
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

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
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
        n_block_min, n_block_max = self.block_info.block_range(m_block, seqlen_q, seqlen_k, window_size)
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
                    self.store_persistent(tma_atom_O, mO, mQ, sQ, pipeline_q, sWork, seqlen_k)
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
                         split, seqlen_q, seqlen_k, n_block_min, n_block_max, rows_q, mPrevO, mPrevLSE)

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
        total = self.scheduler.work_items(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        work = bidx                                          # the first item needs no counter (no atomic's latency)
        step = gdim
        while work < total:
            m_block, head, batch = self.scheduler.work_coords(work, mQ, seqlen_k)
            head_kv = self.kv_head(head, mQ, mK)
            n_block_min, n_block_max = self.block_info.block_range(m_block, seqlen_q, seqlen_k, window_size)
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
                step = self.scheduler.take_work(mWork) - work          # fetched now, used after the K/V issue below
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
        total = self.scheduler.work_items(mQ)
        work = bidx
        step = gdim
        self.first_turn(ctidx // 128)
        if const_expr(self.dynamic_schedule):
            work = self.scheduler.announced_work(pipeline_q, q_state, sWork, total)
        while work < total:
            slots = None
            if const_expr(self.warpgroup_tiles):
                m_block, head, batch = self.scheduler.work_coords(work, mQ, seqlen_k)
                # this warpgroup's tiles: skip the other's that come first, visit its own, skip the rest
                _, _, lead_and_own, slots = self.warpgroup_plan(m_block, cute.arch.make_warp_uniform(ctidx // 128),
                                                                seqlen_q, seqlen_k, window_size)
                n_lead, n_block_max, n_trail = lead_and_own
                n_block_min = Int32(0)
            else:
                m_block, head, batch = self.scheduler.work_coords(work, mQ, seqlen_k)
                n_block_min, n_block_max = self.block_info.block_range(m_block, seqlen_q, seqlen_k, window_size)
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
                work = self.scheduler.announced_work(pipeline_q, q_state, sWork, total)
            else:
                work += step
        if const_expr(self.dynamic_schedule and not self.o_in_q_stage):
            pipeline_q.consumer_release(q_state)             # the -1 stage: the producer's tail waits for it
        if const_expr(self.tma_store_o and not self.o_in_q_stage):
            if ctidx < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)            # sO must outlive the last store's reads

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
            lo_w, hi_w = self.block_info.rows_key_tiles(first_row + 64 * w, first_row + 64 * w + 63, seqlen_q, seqlen_k,
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

    # ------------------------------------------------------------------ skipped slots
    @cute.jit
    def release_empty_slots(self, pipeline_k, pipeline_v, kv_state, n_empty):
        """Warpgroup tiles, consumers: the slots above or below this warpgroup's own tiles — waited for and handed
        back with no wgmma, so the producer can refill the stage."""
        for _ in cutlass.range(n_empty, unroll=1):
            pipeline_k.consumer_wait(kv_state)
            pipeline_k.consumer_release(kv_state)
            pipeline_v.consumer_wait(kv_state)
            pipeline_v.consumer_release(kv_state)
            kv_state.advance()
        return kv_state

    # ------------------------------------------------------------------ O staged in its Q stage (o_in_q_stage)
    @cute.jit
    def store_persistent(self, tma_atom_O, mO, mQ, sQ, pipeline_q, sWork, seqlen_k):
        """The storer warp of a persistent CTA with ``o_in_q_stage``: per work item (the consumers' sequence: every
        gridDim.x-th, or as announced in ``sWork``), wait until both consumer warpgroups have put O in the item's Q
        stage (its named barrier: the consumers only arrive), TMA-store it, wait for the store to read the stage and
        hand it back to the producer; with the dynamic schedule also the -1 stage after the last item.  A stage's
        barrier is not reused before the storer has passed it (the consumers' next arrival needs the Q this
        hand-back lets in)."""
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        total = self.scheduler.work_items(mQ)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        work = bidx
        if const_expr(self.dynamic_schedule):
            work = self.scheduler.announced_work(pipeline_q, q_state, sWork, total)
        while work < total:
            m_block, head, batch = self.scheduler.work_coords(work, mQ, seqlen_k)
            self.store_staged_o(tma_atom_O, mO, sQ, pipeline_q, q_state, m_block, head, batch)
            q_state.advance()
            if const_expr(self.dynamic_schedule):
                work = self.scheduler.announced_work(pipeline_q, q_state, sWork, total)
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
    def first_turn(self, wg_idx):
        """``wg_pingpong``: consumer warpgroup 0 holds the first turn to issue MMAs (once per CTA: the turns run on
        from work item to work item — every warpgroup takes the same number of them)."""
        if const_expr(self.wg_pingpong):
            if wg_idx == 0:
                cute.arch.barrier_arrive(barrier_id=self.TURN_BARRIERS, number_of_threads=256)

    @cute.jit
    def turn_begin(self, wg_idx):
        """``wg_pingpong``: wait for this warpgroup's turn (the previous warpgroup has issued its MMAs)."""
        if const_expr(self.wg_pingpong):
            cute.arch.barrier(barrier_id=self.TURN_BARRIERS + wg_idx, number_of_threads=256)

    @cute.jit
    def turn_end(self, wg_idx):
        """``wg_pingpong``: MMAs issued, the turn passes to the next warpgroup (an arrive: no wait)."""
        if const_expr(self.wg_pingpong):
            nxt = wg_idx + 1
            if nxt == self.consumer_warpgroups:
                nxt = 0
            cute.arch.barrier_arrive(barrier_id=self.TURN_BARRIERS + nxt, number_of_threads=256)

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
        j+1 really runs beside PV(j) is ptxas's call: by default it hoists the PV wait above the softmax (SASS);
        ``pv_wait_block`` keeps the wait below it."""
        acc_S, acc_S_rc, tOrP_view, tOrP, corrections = self.overlap_registers(tiled_mma_qk, row_max)
        v_state = kv_state.clone()                                           # one tile behind kv_state
        v_prev = None
        if const_expr(self.pv_wait_block):
            v_prev = kv_state.clone()              # the V stage whose PV the last tile waited for (released late)
        n_iter = n_block_max - n_block_min
        if n_iter > 0:
            # prologue: the first tile alone (O is still zero, so rescaling it now is free)
            pipeline_k.consumer_wait(kv_state)
            self.turn_begin(wg_idx)
            gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True)
            self.turn_end(wg_idx)
            pipeline_k.consumer_release(kv_state)
            self.block_info.mask_scores(acc_S_rc, tScS_rc, self.slot_block(0, n_block_max, slots), m_block, seqlen_k,
                             causal_shift, window_size, wg_idx)
            online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections,
                                not self.rescale_o_early)
            convert_to_bf16_pairs(tOrP_view, tOrP)
            kv_state.advance()
            # unmasked_body: the loop in two (unrolled here: two loops in the program) — the tiles a mask may touch
            # (the keys' ragged end and the causal diagonal are visited first), then the rest without the mask's edge
            # tests: that body is one basic block, where ptxas sinks the PV wait into the softmax as in FA4's unmasked
            # loop instead of hoisting it above (hd256 non-causal +3.5 %, H100, session 45: docs/tuning/d1_d5.md)
            segments = [(True, 1, n_iter)]
            if const_expr(self.unmasked_body):
                masked_end = n_block_max - self.block_info.unmasked_tiles_end(m_block, seqlen_k, causal_shift)
                masked_end = cutlass.min(cutlass.max(masked_end, 1), n_iter)
                segments = [(True, 1, masked_end), (False, masked_end, n_iter)]
                if const_expr(self.has_window):
                    # and a third: the window's left edge crosses the last tiles visited (the lowest)
                    tail = n_block_max - self.block_info.unmasked_tiles_start(m_block, causal_shift, window_size)
                    tail = cutlass.max(cutlass.min(tail, n_iter), masked_end)
                    segments = [(True, 1, masked_end), (False, masked_end, tail), (True, tail, n_iter)]
            for masked, first, end in segments:
                for i in cutlass.range(first, end, unroll=1):
                    n_block = self.slot_block(i, n_block_max, slots)
                    pipeline_k.consumer_wait(kv_state)
                    self.turn_begin(wg_idx)
                    gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True, False)
                    if const_expr(self.rescale_o_early):
                        rescale_rows(acc_O_rc, corrections)                 # O·corr(j) before O += P(j)·V(j)
                    pipeline_v.consumer_wait(v_state)
                    gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False, False)
                    self.turn_end(wg_idx)
                    if const_expr(self.pv_wait_block):
                        if i > 1:
                            pipeline_v.consumer_release(v_prev)                  # PV(j-1): waited for last tile
                    warpgroup.wait_group(1)                                      # S of tile n_block is ready
                    pipeline_k.consumer_release(kv_state)
                    if const_expr(masked):
                        self.block_info.mask_scores(acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift,
                                                    window_size, wg_idx)
                    online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections, False)
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
                        rescale_rows(acc_O_rc, corrections)
                    convert_to_bf16_pairs(tOrP_view, tOrP)
                    if const_expr(self.pv_wait_block):
                        v_prev = v_state.clone()
                    if const_expr(self.one_kv_state):
                        v_state = kv_state.clone()          # one tile behind: a copy, not a second advance
                    else:
                        v_state.advance()
                    kv_state.advance()
            if const_expr(self.pv_wait_block):
                if n_iter > 1:
                    pipeline_v.consumer_release(v_prev)
            if const_expr(self.rescale_o_early):
                rescale_rows(acc_O_rc, corrections)
            pipeline_v.consumer_wait(v_state)                                # the last tile's PV
            self.turn_begin(wg_idx)
            gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, v_state.index], False)
            self.turn_end(wg_idx)
            pipeline_v.consumer_release(v_state)
        return kv_state                          # advanced past this block's tiles (the persistent loop goes on)

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
                seqlen_q, seqlen_k, n_block_min, n_block_max, rows_q, mPrevO, mPrevLSE):
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
            self.first_turn(ctidx // 128)
            self.mainloop_overlapped(tiled_mma_qk, tiled_mma_pv, tSrQ, tSrK, tOrVt, acc_O, acc_O_rc, tScS_rc,
                                     row_max, row_sum, pipeline_k, pipeline_v, kv_state, softmax_scale_log2,
                                     window_size, m_block, seqlen_k, causal_shift, n_block_min, n_block_max,
                                     ctidx // 128)
        else:
            for i in cutlass.range(n_block_max - n_block_min, unroll=1):
                n_block = n_block_max - 1 - i
                acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
                pipeline_k.consumer_wait(kv_state)
                gemm(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, kv_state.index], True)
                pipeline_k.consumer_release(kv_state)

                acc_S_rc = cute.make_tensor(acc_S.iterator, acc_layout_rows_cols(acc_S.layout))
                self.block_info.mask_scores(acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift, window_size)
                online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, None, True)

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
                gemm(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, kv_state.index], False)
                pipeline_v.consumer_release(kv_state)
                kv_state.advance()

        # epilogue: finish the row sums across the quad, normalize, write O (and LSE)
        mO_cur = mO[None, None, head, batch, split] if const_expr(self.split_kv) else mO[None, None, head, batch]
        gO = cute.local_tile(mO_cur, (self.tile_m, self.head_dim), (m_block, 0))
        tOgO = thr_pv.partition_C(gO)
        tOcO, tOcO_rc = self.o_coords(thr_pv)
        self.finish_rows(acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, m_block, head, batch,
                         split, rows_q, mPrevO, mPrevLSE)
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
