"""The online softmax of the attention kernels (Hopper and Blackwell, dense and sparse): scores become
unnormalized probabilities tile by tile, the running row max kept in raw-score units and the softmax scale applied
inside ``exp2`` (one FFMA per score; scaling the scores first was the seed's double-scaling trap), the running sum
and the output rescaled by ``exp2((m_old - m_new)·scale)`` whenever the max grows."""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .common import exp2

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@cute.jit
def online_softmax(acc_S_rc, row_max, row_sum, softmax_scale_log2, acc_O_rc, corrections,
                   rescale_now: cutlass.Constexpr, floor_max=None):
    """Scores → unnormalized probabilities in place, one row at a time (a row is shared by the 4 threads
    of a quad).  The max stays in raw-score units; the scale lives inside exp2.  With ``rescale_now`` O is
    rescaled right away; otherwise the corrections are kept for after the in-flight PV wgmma.  ``floor_max``
    (per row, optional): a max the new one may not fall below (another warpgroup's, already ahead)."""
    # one dependent fmax / fadd chain per row: the other consumer warpgroup hides its latency (FA4's four chains
    # joined by a tree measured no faster here: docs/tuning/d1_d5.md)
    for r in cutlass.range_constexpr(cute.size(row_max)):
        mx = quad_row_max(acc_S_rc, r)
        new_max, new_sum, correction = online_softmax_row(acc_S_rc[r, None], mx, row_max[r], row_sum[r],
                                                          softmax_scale_log2,
                                                          None if floor_max is None else floor_max[r])
        row_max[r] = new_max
        row_sum[r] = new_sum
        if const_expr(rescale_now):
            for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
                acc_O_rc[r, c] = acc_O_rc[r, c] * correction
        else:
            corrections[r] = correction


@cute.jit
def quad_row_max(acc_S_rc, r):
    """The max of score row ``r`` over the whole tile: this thread's columns, then its quad's (the 4 threads that
    share a row of an m64 wgmma accumulator)."""
    mx = acc_S_rc[r, 0]
    for c in cutlass.range_constexpr(1, cute.size(acc_S_rc, mode=[1])):
        mx = cute.arch.fmax(mx, acc_S_rc[r, c])
    mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
    return cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))


@cute.jit
def rescale_rows(acc_O_rc, corrections):
    for r in cutlass.range_constexpr(cute.size(corrections)):
        for c in cutlass.range_constexpr(cute.size(acc_O_rc, mode=[1])):
            acc_O_rc[r, c] = acc_O_rc[r, c] * corrections[r]


@cute.jit
def online_softmax_row(rS: cute.Tensor, tile_max, row_max, row_sum, softmax_scale_log2, floor_max=None):
    """One online-softmax step for a row whose scores ``rS`` this thread holds (``tile_max``: the tile's row max,
    partner lanes already folded in; ``floor_max``: a max the new one may not fall below).  The max stays in raw-score
    units, the scale goes inside exp2; ``rS`` becomes the unnormalized probabilities.  Returns ``(new row max, new
    running sum of this thread's columns, correction e^(old max − new max))`` — the factor O must be rescaled by."""
    new_max = cute.arch.fmax(row_max, tile_max)
    if const_expr(floor_max is not None):
        new_max = cute.arch.fmax(new_max, floor_max)
    base = new_max * softmax_scale_log2
    if new_max == -Float32.inf:
        base = Float32(0.0)                                       # nothing visible yet: keep zeros
    correction = exp2(row_max * softmax_scale_log2 - base)
    tile_sum = Float32(0.0)
    for c in cutlass.range_constexpr(cute.size(rS)):
        p = exp2(rS[c] * softmax_scale_log2 - base)
        rS[c] = p
        tile_sum += p
    return new_max, row_sum * correction + tile_sum, correction


@cute.jit
def finish_row(row_sum: Float32, row_max: Float32, softmax_scale_log2: Float32, sink_logit=None):
    """The end of a row: ``(1 / denominator, LSE)`` from its full row sum (partner lanes folded in) and its raw-score
    max.  ``sink_logit`` (optional, a callable giving σ, read only when the row saw a key): the value-less sink joins
    the denominator once, ``e^(σ - m)`` in the row's max units; the LSE excludes it.  A row that saw no key gets
    ``(0, -inf)``: a zero output, whatever the sink."""
    inv = Float32(0.0)
    lse = -Float32.inf
    if row_sum > 0.0:
        denom = row_sum
        if const_expr(sink_logit is not None):
            denom = row_sum + exp2(sink_logit() * LOG2_E - row_max * softmax_scale_log2)
        inv = 1.0 / denom
        lse = (row_max * softmax_scale_log2 + cute.math.log2(row_sum)) * LN_2
    return inv, lse
