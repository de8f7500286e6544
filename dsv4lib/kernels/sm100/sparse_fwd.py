"""D6 on Blackwell (sm_100a) — **compiled, not run** in this project: the hd512 MQA attention core (K = V, one
shared KV head, 64 query heads as the UMMA M), keys gathered by index or taken as a dense range — the twin of
:class:`dsv4lib.kernels.sm90.sparse_fwd.SparseAttentionForwardSm90`, same arguments, same key rules.

One CTA per query token × 64 heads, 9 warps:

* warps 5-8 **load**: the Hopper kernel's ``cp.async`` row copies (Q with the first tile, 64 KV rows per tile,
  invalid index → row 0, masked later).  ``cp.async`` writes through the generic proxy and UMMA reads through the
  async proxy, so a loader thread marks a stage full only after its own copies have landed
  (``cp.async.wait_group``) and a ``fence.proxy.async`` — one tile behind the one it just issued, so two tiles
  stay in flight.
* warp 4 **MMA**: ``S = Q·Kᵀ`` (M=64, N=64, K=512, SS) and ``O[:, half] += P·V[:, half]`` for the two 256-column
  halves (M=64, N=256, K=64, SS: P from shared memory).  ``V = K``: the PV B operand is the KV stage read
  MN-major through the same transposing composition as on Hopper (``dsv4lib.layouts.kv_alias``).
* warps 0-3 **softmax / correction / epilogue**: ``tcgen05.ld 16x32bx2`` gives thread t of warp w row
  ``16w + t % 16`` and the 32 key columns ``32·(t // 16) …`` of S — a row is shared by lanes t and t ^ 16, one
  shuffle each for its max and sum; P (bf16) is written to ``sP`` as 16-byte vectors; O is rescaled in TMEM
  (``ld → mul → st`` in 64-column chunks, skipped when no row of the warp changed its max); the epilogue
  normalizes O and writes it (bf16, or the fp32 partial of a split).

Tensor memory (512 columns × 128 lanes).  An M=64 accumulator uses half the lanes (PTX "Layout F": rows
``16j + i`` at lane ``32j + i + base``) and may start at lane base 0 or 16.  O (64 × 512 fp32) takes columns
0-511 at base 0 — all 512 columns — and S (64 × 64) lives in the *other* half of the lanes, columns 0-63 at
base 16.  Nothing else needs TMEM: P goes through shared memory (the D1.3 route), since a TMEM A operand with
M=64 would need the lanes O already uses.

Handshakes: KV (loaders → UMMA; released by the ``tcgen05.commit`` of the PV MMAs that read it), S (UMMA →
softmax), P (softmax → UMMA; the release is the commit of the PV MMAs, so P is never overwritten under a running
MMA and O is rescaled only after them), O (UMMA → epilogue, once).  Every tcgen05 ld/st is warp-collective and
followed by its ``wait::ld`` / ``wait::st``.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32, const_expr, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05

from ..common import launch_stream, sm100_allocate_tmem, sm100_softmax_handshakes
from ..layouts import row_major_smem_layout, transposed_view
from ..softmax import finish_row, online_softmax_row
from ..sm90.sparse_config import SparseFwdConfig
from ..sparse_base import HALF, HEAD_DIM, TILE_H, TILE_N, SparseAttentionBase, as_global

S_LANE_BASE = 16          # S in the lanes an M=64 accumulator at base 0 (O) leaves free
O_CHUNK = 64              # O columns per TMEM ld / st round in the correction and the epilogue


class SparseAttentionForwardSm100(SparseAttentionBase):
    """Blackwell twin of the hd512 MQA kernel on the arch-neutral base (the Hopper kernel's config; its
    ``gather_only`` / ``skip_mma`` benchmark knobs and the paired schedule are Hopper's and are refused).  Compiled,
    not run."""

    NUM_THREADS = 288
    MMA_WARP = 4
    LOAD_WARP0 = 5            # warps 5-8
    TMEM_COLS = 512

    def __init__(self, config: SparseFwdConfig):
        if config.schedule != "columns" or config.gather_only or config.skip_mma or config.cluster_splits > 1:
            raise ValueError("the sm100 twin builds the columns schedule only (no benchmark knobs, no clusters)")
        super().__init__(config)
        self.use_tma = False      # dense rows take the cp.async path here too (one producer scheme to prove)

    # ------------------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, stream: cuda.CUstream = None):
        # mQ (B, Sq, H, 512)  mKV (B, Skv, 512)  mIdx (B, Sq, K) int32  mO (splits, B, Sq, H, 512)
        # mLSE (splits, B, H, Sq)  mSink (H,) — the Hopper kernel's arguments
        mQ, mKV, mO = as_global(mQ, 16), as_global(mKV, 16), as_global(mO, 16)
        mIdx, mLSE, mSink = as_global(mIdx, 4), as_global(mLSE, 4), as_global(mSink, 4)
        mma_qk = sm100_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K,
                                                    Float32, tcgen05.CtaGroup.ONE, (TILE_H, TILE_N))
        mma_pv = sm100_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN,
                                                    Float32, tcgen05.CtaGroup.ONE, (TILE_H, HALF))
        # the Hopper kernel's shared layouts: canonical 128 B-swizzled K-major tiles, also UMMA operand layouts
        sQ_layout = row_major_smem_layout(self.dtype, TILE_H, HEAD_DIM)
        sKV_layout = row_major_smem_layout(self.dtype, TILE_N, HEAD_DIM, self.num_stages)
        sP_layout = row_major_smem_layout(self.dtype, TILE_H, TILE_N)

        @cute.struct
        class SharedStorage:
            mbar_KV: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            mbar_S: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_P: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_O: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_holding_buf: cutlass.Int32
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]

        grid = (cute.size(mQ.shape[1]), cute.size(mQ.shape[2]) // TILE_H,
                cute.size(mQ.shape[0]) * cute.size(mO.shape[0]))
        self.kernel(mQ, mKV, mIdx, mO, mLSE, softmax_scale_log2, window_size, mSink, sQ_layout, sKV_layout,
                    sP_layout, mma_qk, mma_pv, SharedStorage).launch(grid=grid, block=[self.NUM_THREADS, 1, 1],
                                                                     **launch_stream(stream))

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout,
               mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        token, head_group, batch, split, num_splits = self.cta_coords(mO)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)

        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        four_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 128)
        pipe_kv = pipeline.PipelineAsyncUmma.create(num_stages=self.num_stages, producer_group=four_warps,
                                                    consumer_group=one, barrier_storage=storage.mbar_KV.data_ptr())
        pipe_s, pipe_p, pipe_o = sm100_softmax_handshakes(storage, one, four_warps)
        tmem, tmem_ptr = sm100_allocate_tmem(storage, self.NUM_THREADS, self.TMEM_COLS)

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)       # (64 heads, 512)
        sKV = storage.sKV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)   # (64 keys, 512, stages)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)       # (64 heads, 64 keys)
        sVt = cute.composition(sKV, transposed_view(HEAD_DIM, TILE_N, self.num_stages))  # (512, 64 keys, stages)

        thr_qk = mma_qk.get_slice(0)
        thr_pv = mma_pv.get_slice(0)
        c_layout_64 = thr_qk.make_fragment_C(thr_qk.partition_shape_C((TILE_H, TILE_N))).layout   # M=64 layout F
        tStS = cute.make_tensor(tmem_ptr + (S_LANE_BASE << 16), c_layout_64)                      # lanes base 16
        c_layout_half = thr_pv.make_fragment_C(thr_pv.partition_shape_C((TILE_H, HALF))).layout
        tOtO_left = cute.make_tensor(tmem_ptr, c_layout_half)                                      # columns 0-255
        tOtO_right = cute.make_tensor(tmem_ptr + HALF, c_layout_half)                              # 256-511

        seqlen_k = mKV.shape[1]
        key_lo, n_keys, tile_lo, tile_hi = self.key_range(mQ, mKV, mIdx, token, window_size, num_splits, split)

        if warp_idx >= self.LOAD_WARP0:
            self.load100(mQ, mKV, mIdx, sQ, sKV, pipe_kv, tidx - 32 * self.LOAD_WARP0, token, head_group, batch,
                         key_lo, n_keys, seqlen_k, tile_lo, tile_hi)
        if warp_idx == self.MMA_WARP:
            self.mma(mma_qk, mma_pv, sQ, sKV, sVt, sP, tStS, tOtO_left, tOtO_right, pipe_kv, pipe_s, pipe_p, pipe_o,
                     tile_lo, tile_hi)
        if warp_idx < 4:
            self.softmax100(tStS, tmem_ptr, c_layout_64, sP, mIdx, mO, mLSE, mSink, pipe_s, pipe_p, pipe_o,
                            softmax_scale_log2, tidx, token, head_group, batch, split, n_keys, seqlen_k, tile_lo,
                            tile_hi)

        tmem.relinquish_alloc_permit()
        pipeline.sync(barrier_id=2)                           # every warp is done with TMEM
        tmem.free(tmem_ptr)

    @cute.jit
    def load100(self, mQ, mKV, mIdx, sQ, sKV, pipe_kv, ltid, token, head_group, batch, key_lo, n_keys, seqlen_k,
                tile_lo, tile_hi):
        """cp.async row copies (the Hopper producer's), each stage marked full one tile late: after this thread's
        copies of it landed (``wait_group 1``) and a generic → async proxy fence, so UMMA sees the bytes."""
        copy_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                        num_bits_per_copy=128)
        warp = ltid // 32
        lane = ltid % 32
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        landed = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        for tile in cutlass.range(tile_lo, tile_hi, unroll=1):
            pipe_kv.producer_acquire(state)
            self.copy_tile_rows(copy_atom, mQ, mKV, mIdx, sQ, sKV, state.index, warp, lane, token, head_group, batch,
                                tile, tile == tile_lo, key_lo, n_keys, seqlen_k)
            cute.arch.cp_async_commit_group()
            if tile > tile_lo:                      # the previous tile's copies are done: publish it
                cute.arch.cp_async_wait_group(1)
                cute.arch.fence_proxy("async.shared", space="cta")
                pipe_kv.producer_commit(landed)
                landed.advance()
            state.advance()
        if tile_hi > tile_lo:
            cute.arch.cp_async_wait_group(0)
            cute.arch.fence_proxy("async.shared", space="cta")
            pipe_kv.producer_commit(landed)
        pipe_kv.producer_tail(state)

    @cute.jit
    def mma(self, mma_qk, mma_pv, sQ, sKV, sVt, sP, tStS, tOtO_left, tOtO_right, pipe_kv, pipe_s, pipe_p, pipe_o,
            tile_lo, tile_hi):
        """Warp 4: per tile S = Q·Kᵀ into TMEM (lanes base 16), then — once the softmax has written P and
        rescaled O — O[:, half] += P·V[:, half] for both halves; the commits release P and the KV stage."""
        thr_qk = mma_qk.get_slice(0)
        thr_pv = mma_pv.get_slice(0)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))                         # (MMA, 1, 32)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sKV))                        # (MMA, 1, 32, stages)
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP))                         # (MMA, 1, 4)
        tOrV_left = thr_pv.make_fragment_B(thr_pv.partition_B(
            cute.local_tile(sVt, (HALF, TILE_N, self.num_stages), (0, 0, 0))))          # (MMA, 1, 4, stages)
        tOrV_right = thr_pv.make_fragment_B(thr_pv.partition_B(
            cute.local_tile(sVt, (HALF, TILE_N, self.num_stages), (1, 0, 0))))
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        for i in cutlass.range(tile_hi - tile_lo, unroll=1):
            pipe_kv.consumer_wait(kv_state)
            pipe_s.producer_acquire(s_state)                  # the softmax has read the previous S
            mma_qk.set(tcgen05.Field.ACCUMULATE, False)
            for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(mma_qk, tStS, tSrQ[None, None, kb], tSrK[None, None, kb, kv_state.index], tStS)
                mma_qk.set(tcgen05.Field.ACCUMULATE, True)
            pipe_s.producer_commit(s_state)                   # tcgen05.commit → S full
            s_state.advance()
            pipe_p.consumer_wait(p_state)                     # P in sP, O rescaled
            for tOtO, tOrV in ((tOtO_left, tOrV_left), (tOtO_right, tOrV_right)):
                mma_pv.set(tcgen05.Field.ACCUMULATE, i > 0)
                for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                    cute.gemm(mma_pv, tOtO, tOrP[None, None, kb], tOrV[None, None, kb, kv_state.index], tOtO)
                    mma_pv.set(tcgen05.Field.ACCUMULATE, True)
            pipe_p.consumer_release(p_state)                  # sP and O free when these MMAs complete
            pipe_kv.consumer_release(kv_state)                # and so is the KV stage (K and V)
            p_state.advance()
            kv_state.advance()
        o_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_o.producer_acquire(o_state)
        pipe_o.producer_commit(o_state)                       # O final once every PV MMA completed

    @cute.jit
    def o_chunk(self, tmem_ptr, c_layout_64, chunk: cutlass.Constexpr):
        """O[:, 64·chunk : 64·chunk + 64] in TMEM: the M=64 layout at base 0, shifted by the chunk's columns."""
        return cute.make_tensor(tmem_ptr + O_CHUNK * chunk, c_layout_64)

    @cute.jit
    def softmax100(self, tStS, tmem_ptr, c_layout_64, sP, mIdx, mO, mLSE, mSink, pipe_s, pipe_p, pipe_o,
                   softmax_scale_log2, tidx, token, head_group, batch, split, n_keys, seqlen_k, tile_lo, tile_hi):
        """Warps 0-3: thread t of warp w owns row 16w + t % 16 and, of every 64-column window of S or O, the 32
        columns 32·(t // 16) …; lanes t and t ^ 16 share the row."""
        ld_atom = cute.make_copy_atom(tcgen05.copy.Ld16x32bx2Op(tcgen05.copy.Repetition(32)), Float32)
        st_atom = cute.make_copy_atom(tcgen05.copy.St16x32bx2Op(tcgen05.copy.Repetition(32)), Float32)
        ld_s = tcgen05.make_tmem_copy(ld_atom, tStS).get_slice(tidx)
        tStS_t = ld_s.partition_S(tStS)
        # (row, key) of each value: the identity tensor partitioned like the accumulator, then like the copy
        tScS = cute.make_tensor(cute.make_identity_tensor((TILE_H, TILE_N)).iterator, cute.make_layout(
            ((TILE_H, TILE_N), 1, 1), stride=((cute.E(0), cute.E(1)), 0, 0)))
        tScS_t = ld_s.partition_D(tScS)
        rS = cute.make_rmem_tensor(tScS_t.shape, Float32)                          # 32 scores of this row
        o0 = self.o_chunk(tmem_ptr, c_layout_64, 0)
        ld_o = tcgen05.make_tmem_copy(ld_atom, o0).get_slice(tidx)
        st_o = tcgen05.make_tmem_copy(st_atom, o0).get_slice(tidx)
        rO = cute.make_rmem_tensor(tScS_t.shape, Float32)
        row = tScS_t[0][0]
        col0 = tScS_t[0][1]                                   # 0 or 32: this thread's half of a 64-column window
        rP = cute.make_rmem_tensor((TILE_N // 2,), self.dtype)

        row_max = -Float32.inf
        row_sum = Float32(0.0)                                # over this thread's columns only
        s_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        p_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        for i in cutlass.range(tile_hi - tile_lo, unroll=1):
            key0 = (tile_lo + i) * TILE_N
            pipe_s.consumer_wait(s_state)
            cute.copy(ld_s, tStS_t, rS)
            cute.arch.fence_view_async_tmem_load()            # tcgen05.wait::ld
            pipe_s.consumer_release(s_state)
            s_state.advance()
            mx = -Float32.inf
            for c in cutlass.range_constexpr(cute.size(rS)):
                key = key0 + tScS_t[c][1]
                ok = key < n_keys
                if const_expr(self.gather):
                    if ok:
                        idx = mIdx[batch, token, key]
                        ok = idx >= 0 and idx < seqlen_k
                if not ok:
                    rS[c] = -Float32.inf
                mx = cute.arch.fmax(mx, rS[c])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=16))     # the row's other half
            row_max, row_sum, correction = online_softmax_row(rS, mx, row_max, row_sum, softmax_scale_log2)
            rP.store(rS.load().to(self.dtype))
            pipe_p.producer_acquire(p_state)                  # the previous PV MMAs completed: sP and O are ours
            if i > 0:
                # rescale O in TMEM, 64 columns at a time; a warp whose rows all kept their max skips it
                if cute.arch.vote_any_sync(correction != 1.0):
                    for chunk in cutlass.range_constexpr(HEAD_DIM // O_CHUNK):
                        tOtO_c = self.o_chunk(tmem_ptr, c_layout_64, chunk)
                        cute.copy(ld_o, ld_o.partition_S(tOtO_c), rO)
                        cute.arch.fence_view_async_tmem_load()
                        for c in cutlass.range_constexpr(cute.size(rO)):
                            rO[c] = rO[c] * correction
                        cute.copy(st_o, rO, st_o.partition_D(tOtO_c))
                    cute.arch.fence_view_async_tmem_store()   # tcgen05.wait::st before the MMA accumulates
            for k in cutlass.range_constexpr(TILE_N // 2 // 8):   # 32 bf16 = four 16-byte vectors
                cute.autovec_copy(cute.local_tile(rP, (8,), (k,)),
                                  cute.local_tile(sP[row, None], (8,), (col0 // 8 + k,)))
            cute.arch.fence_proxy("async.shared", space="cta")    # sP is read by UMMA (async proxy)
            pipe_p.producer_commit(p_state)
            p_state.advance()

        # epilogue: the row's sum over both halves, sink, LSE, normalized O
        o_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_o.consumer_wait(o_state)
        s = row_sum + cute.arch.shuffle_sync_bfly(row_sum, offset=16)
        inv, lse = finish_row(s, row_max, softmax_scale_log2, self.sink_logit(mSink, head_group, row))
        if const_expr(self.has_lse or self.split_kv):
            if col0 == 0:
                mLSE[split, batch, head_group * TILE_H + row, token] = lse
        gO_row = mO[split, batch, token, head_group * TILE_H + row, None]             # (512,)
        rOut = cute.make_rmem_tensor(tScS_t.shape, mO.element_type)
        for chunk in cutlass.range_constexpr(HEAD_DIM // O_CHUNK):
            rO.fill(0.0)
            if tile_hi > tile_lo:                             # no tile: TMEM O was never written
                cute.copy(ld_o, ld_o.partition_S(self.o_chunk(tmem_ptr, c_layout_64, chunk)), rO)
                cute.arch.fence_view_async_tmem_load()
            for c in cutlass.range_constexpr(cute.size(rO)):
                rOut[c] = (rO[c] * inv).to(mO.element_type)
            cute.autovec_copy(rOut, cute.local_tile(gO_row, (O_CHUNK // 2,), ((O_CHUNK * chunk + col0) // 32,)))
        pipe_o.consumer_release(o_state)
