"""The LSE merge of split-KV partials for many rows and few splits: one CTA per output row (every merge of at least
as many rows as SMs: D7's decode from B3 at H64).

The math is :mod:`dsv4lib.kernels.combine`'s (``L = log Σ e^{lse_i}``, ``O = Σ e^{lse_i - L} O_i``, the sink once);
what differs is the work split.  :class:`~dsv4lib.kernels.combine.LSECombineKernel` gives a (row, 128-column chunk)
four warps that share the splits — right for a few rows over many splits (B1: 64 rows × 10 splits; D2: 132 splits),
and with PDL it reserves 96 KB of shared memory a CTA so that its early CTAs do not pile onto the SMs the split
kernel left idle.  At B64 H64 with 2 splits that is 16 384 CTAs of two 2-KB loads each, at most 2 a SM: ~62 waves,
~70 µs for 16 MB (H100, session 39: the decode took 112 µs split in two against 41 unsplit).  Here a row is one CTA
of ``D / 4`` threads (``D / 8`` for bf16 partials), each owning 4 (8) contiguous columns of every split — one
16-byte load a split — the splits taken in batches of ``UNROLL`` whose loads are all issued before any is used,
folded in with an online rescale (any split count, one L2 round trip per batch); no shared memory, no barrier, up to
16 CTAs a SM (32 of the bf16 build's 64 threads).

bf16 partials go 8 columns a thread (one 16-byte load a split, one 16-byte store): 64 threads a row, so 4096 rows fit
the GPU's thread slots at once.  H100, session 42 (``scripts/probe_split_phases.py``, the merge alone, 4096 rows x 2
bf16 splits): 4 columns a thread 8.2 µs (two waves of 128-thread CTAs), 8 columns 5.9; 2 / 4 / 8 rows side by side
in a CTA of 8 columns a thread 6.7 / 7.2 / 9.0 (fewer, larger CTAs lose); 2048 rows x 2 splits 4.7 → 4.2."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .combine import merged_outputs
from .common import exp2, launch_stream
from .softmax import LN_2, LOG2_E
COLS_PER_THREAD = 4         # the fewest columns a thread owns: one 16-byte vector of fp32 partials
VECTOR_BYTES = 16           # a thread's columns of a split: one 16-byte vector (4 fp32 or 8 bf16 columns)
UNROLL = 4                  # splits whose loads are in flight together


class RowCombineKernel:
    """``O_partial (splits, B, Sq, H, D)`` fp32 or bf16 and ``LSE_partial (splits, B, H, Sq)`` → ``O (B, Sq, H, D)`` bf16 and
    ``LSE (B, H, Sq)``; optional ``sink [H]`` applied once; ``pdl``: launched with programmatic dependent launch behind
    the split kernel (its reads wait for that grid's end)."""

    def __init__(self, head_dim: int, *, has_sink: bool, pdl: bool = False, token_rows: bool = False):
        if head_dim % (32 * COLS_PER_THREAD):
            raise ValueError(f"head_dim must be a multiple of {32 * COLS_PER_THREAD}, got {head_dim}")
        self.head_dim = head_dim
        self.has_sink = has_sink
        self.pdl = pdl
        self.token_rows = token_rows          # outputs as sparse_prefill returns them (combine.merged_outputs)

    @staticmethod
    def cols_per_thread(dtype) -> int:
        """A thread's columns of a row: one 16-byte vector of the partials' ``dtype``."""
        return VECTOR_BYTES * 8 // dtype.width

    @cute.jit
    def __call__(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor,
                 stream: cuda.CUstream = None):
        mO, mLSE = merged_outputs(mO, mLSE, self.token_rows)
        rows = cute.size(mO.shape[0]) * cute.size(mO.shape[1]) * cute.size(mO.shape[2])      # B * Sq * H
        threads = self.head_dim // self.cols_per_thread(mOp.element_type)
        self.kernel(mOp, mLSEp, mO, mLSE, mSink).launch(grid=(rows, 1, 1), block=(threads, 1, 1),
                                                        use_pdl=self.pdl, **launch_stream(stream))

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()                 # the split kernel has ended: its partials are there
            cute.arch.griddepcontrol_launch_dependents()     # the next call's grid may take the SMs as they free up
        cols = const_expr(self.cols_per_thread(mOp.element_type))             # 4 fp32 / 8 bf16 partial columns
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        H, Sq = mO.shape[2], mO.shape[1]
        b, s, h = row // (H * Sq), (row // H) % Sq, row % H
        num_splits = mOp.shape[0]
        sink = Float32(0.0)
        if const_expr(self.has_sink):
            sink = mSink[h]
        tOr = cute.make_rmem_tensor(cute.make_layout((UNROLL, cols), stride=(cols, 1)),
                                    mOp.element_type)                          # (split of the batch, my columns)
        lse_b = cute.make_rmem_tensor((UNROLL,), Float32)                      # their LSEs, log2 units
        acc = cute.make_rmem_tensor((cols,), Float32)
        acc.fill(0.0)
        running_max = -Float32.inf                                             # log2 units
        total = Float32(0.0)                                                   # Σ e^{lse_i - running_max}
        for i0 in cutlass.range(0, num_splits, UNROLL, unroll=1):
            # every load of the batch first (a split past the end reads split 0 again and gets weight 0: no branch
            # between the loads)
            for k in cutlass.range_constexpr(UNROLL):
                i = i0 + k
                i_safe = i if i < num_splits else 0
                lse_b[k] = mLSEp[i_safe, b, h, s]
                cute.autovec_copy(cute.local_tile(mOp[i_safe, b, s, h, None], (cols,), (tidx,)),
                                  tOr[k, None])
            batch_max = running_max
            for k in cutlass.range_constexpr(UNROLL):
                lse_b[k] = lse_b[k] * LOG2_E if i0 + k < num_splits else -Float32.inf
                batch_max = cute.arch.fmax(batch_max, lse_b[k])
            if batch_max > running_max:          # rescale what is summed so far (nothing while it is -inf)
                rescale = exp2(running_max - batch_max)
                total *= rescale
                for j in cutlass.range_constexpr(cols):
                    acc[j] *= rescale
                running_max = batch_max
            for k in cutlass.range_constexpr(UNROLL):
                # a split that saw no key (lse -inf; its partial may be unwritten, NaN bits) adds nothing
                w = Float32(0.0)
                if lse_b[k] > -Float32.inf:
                    w = exp2(lse_b[k] - running_max)
                total += w
                for j in cutlass.range_constexpr(cols):
                    acc[j] += w * (Float32(tOr[k, j]) if w > 0.0 else Float32(0.0))
        lse = -Float32.inf
        norm = Float32(0.0)                      # an empty row stays 0
        if total > 0.0:
            lse = (running_max + cute.math.log2(total)) * LN_2
            norm = 1.0 / total
            if const_expr(self.has_sink):        # e^L / (e^L + e^σ)
                norm = norm / (1.0 + exp2((sink - lse) * LOG2_E))
        out = cute.make_rmem_tensor((cols,), mO.element_type)
        for j in cutlass.range_constexpr(cols):
            out[j] = (acc[j] * norm).to(mO.element_type)
        cute.autovec_copy(out, cute.local_tile(mO[b, s, h, None], (cols,), (tidx,)))
        if tidx == 0:
            mLSE[b, h, s] = lse
