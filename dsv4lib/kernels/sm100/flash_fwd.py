"""D1 on Blackwell: TMEM-P flash-attention forward (sm_100a) — **compiled, not run** in this project.

One CTA per 128 query rows, 6 warps:

* warps 0-3 **softmax** (thread t owns query row t = TMEM lane t): ``tcgen05.ld 32x32b`` reads its row of S,
  online softmax in registers, P (bf16, two per 32-bit column) written back to TMEM with ``tcgen05.st``;
  the O rescale also happens here (``ld → mul → st`` on the O columns) — FA4 gives that to separate
  correction warps, a later optimization;
* warp 4 **MMA**: ``S = Q·Kᵀ`` (SS ``tcgen05.mma``, accumulator in TMEM) and ``O += P·V`` (**TS**
  ``tcgen05.mma``: the A operand is P in TMEM, laid out by the SMEM-A layout over the TMEM pointer, as FA4
  does and as ``dsv4lib.layouts`` proves: P[m, k] at lane m, bf16 column k);
* warp 5 **load**: TMA of Q once and of K / V tiles through mbarrier pipelines.

TMEM columns: S at 0, P at ``tile_n`` (tile_n/2 columns of bf16 pairs), O at 256.  Every handshake is a
pipeline: K/V (TMA → UMMA), S (UMMA → softmax), P (softmax → UMMA; its *release* is the tcgen05.commit of
the PV MMA that read P, so the next P is never written under a running MMA and O is only rescaled after
that MMA finished), O (UMMA → softmax, once, for the epilogue).  All tcgen05 ld/st are executed by whole
warps (warp-collective; the seed's hang) and each is followed by ``tcgen05.wait::ld`` / ``wait::st``.
"""
from __future__ import annotations


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32, const_expr, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05

from ..common import launch_stream, load_kv_tiles, sm100_allocate_tmem, sm100_softmax_handshakes
from ..softmax import finish_row, online_softmax_row



class FlashAttentionForwardSm100:
    """Blackwell forward attention with P in tensor memory.  ``head_dim`` 64 / 128 (Dv = D), bf16."""

    NUM_THREADS = 192                      # 4 softmax warps, 1 MMA warp, 1 load warp
    MMA_WARP, LOAD_WARP = 4, 5
    TMEM_COLS = 512
    O_TMEM_OFFSET = 256

    def __init__(self, head_dim: int, *, causal: bool, has_lse: bool, num_stages: int = 2):
        if head_dim not in (64, 128):
            raise ValueError(f"head_dim {head_dim} not supported by the sm100 TMEM-P kernel (64, 128)")
        self.head_dim = head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.tile_m = 128
        self.tile_n = 128
        self.num_stages = num_stages
        self.dtype = cutlass.BFloat16
        self.p_tmem_offset = self.tile_n                   # fp32 columns; P needs tile_n / 2 of them

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, stream: cuda.CUstream = None):
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                          for t in (mQ, mK, mV, mO)]                               # (s, d, h, b)
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))   # (s, h, b)
        mma_qk = sm100_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K,
                                                    Float32, tcgen05.CtaGroup.ONE, (self.tile_m, self.tile_n))
        mma_pv = sm100_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN,
                                                    Float32, tcgen05.CtaGroup.ONE, (self.tile_m, self.head_dim),
                                                    tcgen05.OperandSource.TMEM)
        qk_tiler = (self.tile_m, self.tile_n, self.head_dim)
        pv_tiler = (self.tile_m, self.head_dim, self.tile_n)
        sQ_layout = sm100_utils.make_smem_layout_a(mma_qk, qk_tiler, self.dtype, 1)
        sK_layout = sm100_utils.make_smem_layout_b(mma_qk, qk_tiler, self.dtype, self.num_stages)
        sV_layout = sm100_utils.make_smem_layout_b(mma_pv, pv_tiler, self.dtype, self.num_stages)
        sP_layout = sm100_utils.make_smem_layout_a(mma_pv, pv_tiler, self.dtype, 1)   # reused over TMEM
        tma_op = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_A(tma_op, mQ, cute.select(sQ_layout, mode=[0, 1, 2]),
                                                             qk_tiler, mma_qk)
        tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_B(tma_op, mK, cute.select(sK_layout, mode=[0, 1, 2]),
                                                             qk_tiler, mma_qk)
        # V is (s, d): the PV B operand is MN-major (d contiguous), K = s
        mVt = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[1, 0, 2, 3]))      # (d, s, h, b)
        tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_B(tma_op, mVt, cute.select(sV_layout, mode=[0, 1, 2]),
                                                             pv_tiler, mma_pv)

        @cute.struct
        class SharedStorage:
            mbar_Q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_K: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            mbar_V: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            mbar_S: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_P: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_O: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_holding_buf: cutlass.Int32
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        grid = (cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m), cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(mma_qk, mma_pv, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, mO, mLSE,
                    softmax_scale_log2, sQ_layout, sK_layout, sV_layout, sP_layout, SharedStorage).launch(
            grid=grid, block=[self.NUM_THREADS, 1, 1], **launch_stream(stream))

    @cute.kernel
    def kernel(self, mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
               tma_atom_K: cute.CopyAtom, mK: cute.Tensor, tma_atom_V: cute.CopyAtom, mVt: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: Float32, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        m_block, head, batch = cute.arch.block_idx()
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        if warp_idx == self.LOAD_WARP:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)

        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        softmax_threads = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128)
        bytes_q = self.tile_m * self.head_dim * 2
        bytes_kv = self.tile_n * self.head_dim * 2
        pipe_q = pipeline.PipelineTmaUmma.create(num_stages=1, producer_group=one, consumer_group=one,
                                                 tx_count=bytes_q, barrier_storage=storage.mbar_Q.data_ptr())
        pipe_k = pipeline.PipelineTmaUmma.create(num_stages=self.num_stages, producer_group=one, consumer_group=one,
                                                 tx_count=bytes_kv, barrier_storage=storage.mbar_K.data_ptr())
        pipe_v = pipeline.PipelineTmaUmma.create(num_stages=self.num_stages, producer_group=one, consumer_group=one,
                                                 tx_count=bytes_kv, barrier_storage=storage.mbar_V.data_ptr())
        pipe_s, pipe_p, pipe_o = sm100_softmax_handshakes(storage, one, softmax_threads)
        tmem, tmem_ptr = sm100_allocate_tmem(storage, self.NUM_THREADS, self.TMEM_COLS)

        thr_qk = mma_qk.get_slice(0)
        thr_pv = mma_pv.get_slice(0)
        tStS = cute.make_tensor(tmem_ptr, thr_qk.make_fragment_C(thr_qk.partition_shape_C((self.tile_m, self.tile_n))).layout)
        tOtO = cute.make_tensor(tmem_ptr + self.O_TMEM_OFFSET,
                                thr_pv.make_fragment_C(thr_pv.partition_shape_C((self.tile_m, self.head_dim))).layout)
        # P as the TS operand: the SMEM-A layout over the TMEM pointer, in bf16 units (2 per 32-bit column)
        tP = cute.make_tensor(tStS.iterator, sP_layout.outer)
        tOrP = thr_pv.make_fragment_A(tP)[None, None, None, 0]
        tOrP = cute.make_tensor(tOrP.iterator + self.p_tmem_offset * 2, tOrP.layout)

        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        head_kv = head // (mQ.shape[2] // mK.shape[2])
        n_block_max = cute.ceil_div(seqlen_k, self.tile_n)
        if const_expr(self.causal):
            last_key = (m_block + 1) * self.tile_m - 1 + seqlen_k - seqlen_q
            n_block_max = cutlass.min(n_block_max, cutlass.max(last_key // self.tile_n + 1, 0))

        if warp_idx == self.LOAD_WARP:
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))
            gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
            gVt = cute.local_tile(mVt[None, None, head_kv, batch], (self.head_dim, self.tile_n), (0, None))
            tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 3),
                                               cute.group_modes(thr_qk.partition_A(gQ), 0, 3))
            tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 3),
                                               cute.group_modes(thr_qk.partition_B(gK), 0, 3))
            tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 3),
                                               cute.group_modes(thr_pv.partition_B(gVt), 0, 3))
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_atom_Q, tQgQ, tQsQ[None, 0], tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            load_kv_tiles(tma_atom_K, tKgK, tKsK, pipe_k, tma_atom_V, tVgV, tVsV, pipe_v, Int32(0), n_block_max,
                          self.num_stages)

        if warp_idx == self.MMA_WARP:
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            tSrQ = mma_qk.make_fragment_A(sQ)                  # (MMA, MMA_M, MMA_K, 1)
            tSrK = mma_qk.make_fragment_B(sK)                  # (MMA, MMA_N, MMA_K, stages)
            tOrV = mma_pv.make_fragment_B(sV)                  # (MMA, MMA_D, MMA_K, stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
            s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipe_q.consumer_wait(q_state)
            for i in cutlass.range(n_block_max, unroll=1):
                pipe_k.consumer_wait(kv_state)
                pipe_s.producer_acquire(s_state)               # softmax has read the previous S
                mma_qk.set(tcgen05.Field.ACCUMULATE, False)
                for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    cute.gemm(mma_qk, tStS, tSrQ[None, None, kb, 0], tSrK[None, None, kb, kv_state.index], tStS)
                    mma_qk.set(tcgen05.Field.ACCUMULATE, True)
                pipe_s.producer_commit(s_state)                # tcgen05.commit → S full
                pipe_k.consumer_release(kv_state)              # K stage free once those MMAs finish
                s_state.advance()
                pipe_p.consumer_wait(p_state)                  # P written (and O rescaled) by softmax
                pipe_v.consumer_wait(kv_state)
                mma_pv.set(tcgen05.Field.ACCUMULATE, i > 0)
                for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    cute.gemm(mma_pv, tOtO, tOrP[None, None, kb], tOrV[None, None, kb, kv_state.index], tOtO)
                    mma_pv.set(tcgen05.Field.ACCUMULATE, True)
                pipe_p.consumer_release(p_state)               # P buffer free when this PV MMA completes
                pipe_v.consumer_release(kv_state)
                p_state.advance()
                kv_state.advance()
            o_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_o.producer_acquire(o_state)
            pipe_o.producer_commit(o_state)                    # O final once every PV MMA completed

        tScS = thr_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))   # (m, n) of each S element
        if warp_idx < 4:
            self.softmax(tStS, tScS, tOtO, mO, mLSE, pipe_s, pipe_p, pipe_o, softmax_scale_log2, tidx, m_block, head,
                         batch, seqlen_q, seqlen_k, n_block_max)

        tmem.relinquish_alloc_permit()
        pipeline.sync(barrier_id=2)                           # everyone is done with TMEM
        tmem.free(tmem_ptr)

    @cute.jit
    def softmax(self, tStS, tScS, tOtO, mO, mLSE, pipe_s, pipe_p, pipe_o, softmax_scale_log2, tidx, m_block, head, batch,
                seqlen_q, seqlen_k, n_block_max):
        # Warp-collective TMEM copies; thread t ↔ lane t ↔ query row t
        ld_s = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(self.tile_n)), Float32), tStS)
        thr_ld_s = ld_s.get_slice(tidx)
        tStS_t = thr_ld_s.partition_S(tStS)
        tScS_t = thr_ld_s.partition_D(tScS)
        rS = cute.make_rmem_tensor(tScS_t.shape, Float32)            # this thread's row of S (tile_n values)
        # P: tile_n bf16 = tile_n/2 packed 32-bit TMEM columns after S
        tStP = cute.make_tensor(tStS.iterator + self.p_tmem_offset,   # same lane/column shape as S, half the columns
                                cute.make_layout(((self.tile_m, self.tile_n // 2), 1, 1), stride=((65536, 1), 0, 0)))
        st_p = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(self.tile_n // 2)), Float32), tStP)
        thr_st_p = st_p.get_slice(tidx)
        tStP_t = thr_st_p.partition_D(tStP)
        rP = cute.make_rmem_tensor((self.tile_n,), self.dtype)
        # register sides are shaped by partitioning an identity tensor the same way as the TMEM side
        rP32_shape = thr_st_p.partition_S(cute.make_identity_tensor(tStP.shape)).shape
        rP32 = cute.make_tensor(cute.recast_ptr(rP.iterator, dtype=Float32), cute.make_layout(rP32_shape))
        # O: this thread's row (head_dim fp32), for the rescale and the epilogue
        tOtO_2d = tOtO                                                  # ((128, D), 1, 1) lanes × columns
        ld_o = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(self.head_dim)), Float32), tOtO_2d)
        st_o = tcgen05.make_tmem_copy(cute.make_copy_atom(
            tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(self.head_dim)), Float32), tOtO_2d)
        tOtO_ld = ld_o.get_slice(tidx).partition_S(tOtO_2d)
        tOtO_st = st_o.get_slice(tidx).partition_D(tOtO_2d)
        rO = cute.make_rmem_tensor(ld_o.get_slice(tidx).partition_D(cute.make_identity_tensor(tOtO.shape)).shape,
                                   Float32)

        row = m_block * self.tile_m + tidx
        causal_limit = row + seqlen_k - seqlen_q
        row_max = -Float32.inf
        row_sum = Float32(0.0)
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        for i in cutlass.range(n_block_max, unroll=1):
            n_block = n_block_max - 1 - i
            pipe_s.consumer_wait(s_state)
            cute.copy(ld_s, tStS_t, rS)
            cute.arch.fence_view_async_tmem_load()                     # tcgen05.wait::ld
            pipe_s.consumer_release(s_state)
            s_state.advance()
            mx = -Float32.inf
            for c in cutlass.range_constexpr(cute.size(rS)):
                col = n_block * self.tile_n + tScS_t[c][1]
                masked = col >= seqlen_k
                if const_expr(self.causal):
                    masked = masked or col > causal_limit
                if masked:
                    rS[c] = -Float32.inf
                mx = cute.arch.fmax(mx, rS[c])
            row_max, row_sum, correction = online_softmax_row(rS, mx, row_max, row_sum, softmax_scale_log2)
            rP.store(rS.load().to(self.dtype))
            pipe_p.producer_acquire(p_state)                           # the previous PV MMA has completed
            if i > 0:                                                  # rescale O in TMEM: ld → mul → st
                cute.copy(ld_o, tOtO_ld, rO)
                cute.arch.fence_view_async_tmem_load()
                for c in cutlass.range_constexpr(cute.size(rO)):
                    rO[c] = rO[c] * correction
                cute.copy(st_o, rO, tOtO_st)
            cute.copy(st_p, rP32, tStP_t)
            cute.arch.fence_view_async_tmem_store()                    # tcgen05.wait::st before the MMA reads
            pipe_p.producer_commit(p_state)
            p_state.advance()

        o_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_o.consumer_wait(o_state)
        cute.copy(ld_o, tOtO_ld, rO)
        cute.arch.fence_view_async_tmem_load()
        inv, lse = finish_row(row_sum, row_max, softmax_scale_log2)
        if row < seqlen_q:
            gO = mO[row, None, head, batch]                            # this thread's output row (D)
            for c in cutlass.range_constexpr(cute.size(rO)):
                gO[c] = (rO[c] * inv).to(self.dtype)
            if const_expr(self.has_lse):
                mLSE[row, head, batch] = lse
        pipe_o.consumer_release(o_state)


def fake_attention_args(head_dim: int):
    """Symbolic stand-ins for (q, k, v, o, lse): the sm100 kernel is only ever compiled here."""
    from ..sm90.flash_fwd import fake_attention_args as sm90_fake
    return sm90_fake(head_dim)[:6]              # q, k, v, o, lse, softmax scale (no window / sink yet)
