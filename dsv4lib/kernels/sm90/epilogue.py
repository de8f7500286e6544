"""The epilogue of the dense Hopper kernel: rows finished (row sums across the quad, the sink once, O normalized,
the LSE written), then O out — bf16 by stmatrix into shared memory and one TMA store of the tile (into the dead Q
buffer, O's own buffer when persistent, or the item's Q stage for a storer warp), the fp32 split partials and the
NVFP4 bytes (NVFP4-1.1/1.2: quantized and packed in the accumulator registers) by register stores."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from ..common import exp2, tma_store_tile
from ..nvfp4 import e2m1_code_magic, nvfp4_block_scale
from ..softmax import LOG2_E, finish_row


class Sm90Epilogue:
    """Mixed into :class:`FlashAttentionForwardSm90`: reads its config (``tile_m``, ``head_dim``, ``has_sink``, ...)
    and its barrier ids through ``self``."""

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

    @cute.jit
    def finish_rows(self, acc_O_rc, tOcO_rc, row_max, row_sum, mSink, mLSE, softmax_scale_log2, m_block, head, batch,
                    split, rows_q, mPrevO=None, mPrevLSE=None):
        """Epilogue, rows: the row sums finished across the quad, the earlier branches' partials folded in
        (``merge_slots``), the sink added to the denominator, O normalized in place, the LSE (sink excluded) written
        by the thread holding column 0."""
        for r in cutlass.range_constexpr(cute.size(row_sum)):
            s = row_sum[r]
            s += cute.arch.shuffle_sync_bfly(s, offset=2)
            s += cute.arch.shuffle_sync_bfly(s, offset=1)
            row_top, top_scale = row_max[r], softmax_scale_log2
            if const_expr(self.merge_slots):
                s, row_top = self.merge_previous(acc_O_rc, tOcO_rc, r, s, row_max[r] * softmax_scale_log2, mPrevO,
                                                 mPrevLSE, m_block, head, batch, rows_q)
                top_scale = Float32(1.0)               # row_top is in log2 units already
            inv, lse = finish_row(s, row_top, top_scale,
                                  self.sink_logit(mSink, head, m_block * self.tile_m + tOcO_rc[r, 0][0]))
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

    @cute.jit
    def merge_previous(self, acc_O_rc, tOcO_rc, r: cutlass.Constexpr, own_sum, own_max2, mPrevO, mPrevLSE, m_block,
                       head, batch, rows_q):
        """The combine's merge inside the last branch (``merge_slots``): row ``r`` of this CTA's unnormalized O
        (its sum ``own_sum``, its max ``own_max2`` in log2 units) joined by the earlier branches' normalized fp32
        partials ``mPrevO[row, d, head, batch, slot]`` weighed by ``2^(lse2 - top)``, ``top`` the largest of the row's
        maxima.  O's row is rewritten in place (still unnormalized, in units of ``2^top``); returns ``(sum, top)`` for
        :func:`finish_row` at scale 1 — the sink then joins the merged denominator once, as the combine adds it."""
        m, _ = tOcO_rc[r, 0]
        row = m_block * self.tile_m + m
        in_rows = row < rows_q
        own = own_max2
        if own_sum == 0.0:
            own = -Float32.inf                             # no key of its own (the max may be a masked -inf)
        prev = cute.make_rmem_tensor((self.merge_slots,), Float32)         # the slots' LSEs, log2 units
        weight = cute.make_rmem_tensor((self.merge_slots,), Float32)
        top = own
        for i in cutlass.range_constexpr(self.merge_slots):
            lse2 = -Float32.inf
            if in_rows:
                lse2 = mPrevLSE[row, head, batch, i] * LOG2_E
            prev[i] = lse2
            weight[i] = Float32(0.0)
            top = cute.arch.fmax(top, lse2)
        mine = Float32(0.0)
        total = Float32(0.0)
        if top > -Float32.inf:                             # else no branch saw a key: a zero row, LSE -inf
            if own_sum > 0.0:
                mine = exp2(own - top)
            total = own_sum * mine
            for i in cutlass.range_constexpr(self.merge_slots):
                weight[i] = exp2(prev[i] - top)
                total += weight[i]
        for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
            o = acc_O_rc[r, c] * mine
            if in_rows:
                _, d = tOcO_rc[r, c]
                for i in cutlass.range_constexpr(self.merge_slots):
                    o += weight[i] * mPrevO[row, d, head, batch, i]
            acc_O_rc[r, c] = o
        return total, top

    def sink_logit(self, mSink, head, row):
        """The sink of M row ``row``'s own q head (its head within the KV head's group when q heads are packed into
        M), as :func:`finish_row` reads it; None without a sink."""
        if not self.has_sink:
            return None
        if self.pack_gqa > 1:
            return lambda: mSink[head * self.pack_gqa + row % self.pack_gqa]
        return lambda: mSink[head]

    @cute.jit
    def store_o_tma(self, acc_O, tiled_mma_pv, sO, tma_atom_O, gO, ctidx, reuse: cutlass.Constexpr = False):
        """bf16 O → shared memory by stmatrix, then one TMA store of the whole tile.  The buffer is Q's: each
        warpgroup writes only the 64 rows its own QK wgmmas read, all of them retired, so no barrier is needed
        before the writes; rows past the end of the sequence are clipped by the TMA unit.  ``reuse`` (persistent
        CTAs, O's own buffer): first wait until the previous block's store has read the buffer, and leave this
        store in flight (the next block, or the end of the CTA, waits for it).  Every consumer thread meets at
        EPILOGUE_BARRIER."""
        barrier_id, threads = self.EPILOGUE_BARRIER, 128 * self.consumer_warpgroups
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
