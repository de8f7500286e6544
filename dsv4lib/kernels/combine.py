"""D2: merge split-KV partial results by log-sum-exp (arch-neutral CuTeDSL; built for sm_90a and sm_100a).

Each split i produced, for every output row (b, s, h), a partial ``O_i`` normalized over its own keys and
its natural-log ``lse_i`` (``-inf`` for a split that saw no key).  The merge is

    L = log Σ_i e^{lse_i},   O = Σ_i e^{lse_i - L} · O_i,   then the sink once:  O · e^L / (e^L + e^σ)

— :func:`dsv4lib.reference.lse_merge` is the truth.  One warp per output row: every lane reads the
``num_splits`` LSEs (tiny), lane l accumulates columns ``l, l+32, …`` of O so each load of 32 lanes is one
128-byte line.

``cols_per_warp`` (default: the whole row) cuts a row into column chunks, one warp each — for few rows with
many splits and a wide row (DSV4 decode: 64 rows × 132 splits × 512 columns is only 64 warps, each streaming
~270 KB).  Each warp recomputes the row's LSE weights (cheap); only chunk 0 writes the LSE.  Built and
PTX-checked; not yet measured on a GPU, so the default stays one warp per row.
"""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
WARPS_PER_CTA = 4


class LSECombineKernel:
    """``O_partial (splits, B, Sq, H, D)`` fp32 and ``LSE_partial (splits, B, H, Sq)`` fp32 →
    ``O (B, Sq, H, D)`` (bf16) and ``LSE (B, H, Sq)`` fp32; optional ``sink [H]`` fp32 applied once."""

    def __init__(self, head_dim: int, *, has_sink: bool, cols_per_warp: int | None = None):
        if head_dim % 32:
            raise ValueError(f"head_dim must be a multiple of 32, got {head_dim}")
        cols = head_dim if cols_per_warp is None else cols_per_warp
        if cols % 32 or head_dim % cols:
            raise ValueError(f"cols_per_warp must be a multiple of 32 dividing head_dim {head_dim}, got {cols}")
        self.head_dim = head_dim
        self.has_sink = has_sink
        self.cols = cols                          # columns per warp
        self.chunks = head_dim // cols            # warps per output row

    @cute.jit
    def __call__(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor):
        rows = cute.size(mO.shape[0]) * cute.size(mO.shape[1]) * cute.size(mO.shape[2])      # B * Sq * H
        if const_expr(self.chunks > 1):
            rows = rows * self.chunks                                 # one warp per (row, column chunk)
        self.kernel(mOp, mLSEp, mO, mLSE, mSink).launch(
            grid=((rows + WARPS_PER_CTA - 1) // WARPS_PER_CTA, 1, 1), block=(32 * WARPS_PER_CTA, 1, 1))

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        row = bidx * WARPS_PER_CTA + tidx // 32
        col0 = 0
        if const_expr(self.chunks > 1):
            col0 = (row % self.chunks) * self.cols
            row = row // self.chunks
        num_splits = mOp.shape[0]
        B, Sq, H = mO.shape[0], mO.shape[1], mO.shape[2]
        if row < B * Sq * H:
            h = row % H
            s = (row // H) % Sq
            b = row // (H * Sq)
            # L = logsumexp over the splits (computed in log2 units)
            mx = -Float32.inf
            for i in cutlass.range(num_splits, unroll=1):
                mx = cute.arch.fmax(mx, mLSEp[i, b, h, s])
            total = Float32(0.0)
            base = mx * LOG2_E
            if mx == -Float32.inf:
                base = Float32(0.0)                                  # no split saw a key
            for i in cutlass.range(num_splits, unroll=1):
                total += cute.arch.exp2(mLSEp[i, b, h, s] * LOG2_E - base)
            lse = -Float32.inf
            inv_total = Float32(0.0)
            if total > 0.0:
                lse = (base + cute.math.log2(total)) * LN_2
                inv_total = 1.0 / total
            gate = Float32(1.0)
            if const_expr(self.has_sink):
                # e^L / (e^L + e^σ) = 1 / (1 + e^{σ - L}); an empty row stays 0 because its weights are 0
                if total > 0.0:
                    gate = 1.0 / (1.0 + cute.arch.exp2((mSink[h] - lse) * LOG2_E))
            acc = cute.make_rmem_tensor((self.cols // 32,), Float32)
            acc.fill(0.0)
            for i in cutlass.range(num_splits, unroll=1):
                w = cute.arch.exp2(mLSEp[i, b, h, s] * LOG2_E - base) * inv_total
                if w > 0.0:                                           # skip empty splits (and their memory)
                    for j in cutlass.range_constexpr(self.cols // 32):
                        acc[j] += w * mOp[i, b, s, h, col0 + lane + 32 * j]
            for j in cutlass.range_constexpr(self.cols // 32):
                mO[b, s, h, col0 + lane + 32 * j] = (acc[j] * gate).to(mO.element_type)
            if lane == 0 and col0 == 0:
                mLSE[b, h, s] = lse


def fake_args(head_dim: int):
    """Symbolic (splits, B, Sq, H) — built once for every shape; D is static."""
    from cutlass.cute.runtime import make_fake_tensor
    sp, b, s, h = (cute.sym_int() for _ in range(4))
    o_part = make_fake_tensor(Float32, (sp, b, s, h, head_dim),
                              stride=tuple(cute.sym_int(divisibility=4) for _ in range(4)) + (1,), assumed_align=16)
    lse_part = make_fake_tensor(Float32, (sp, b, h, s), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                                assumed_align=4)
    out = make_fake_tensor(cutlass.BFloat16, (b, s, h, head_dim),
                           stride=tuple(cute.sym_int(divisibility=8) for _ in range(3)) + (1,), assumed_align=16)
    lse = make_fake_tensor(Float32, (b, h, s), stride=(cute.sym_int(), cute.sym_int(), 1), assumed_align=4)
    sink = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    return o_part, lse_part, out, lse, sink



