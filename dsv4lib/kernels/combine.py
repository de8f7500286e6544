"""D2: merge split-KV partial results by log-sum-exp (arch-neutral CuTeDSL; built for sm_90a and sm_100a).

Each split i produced, for every output row (b, s, h), a partial ``O_i`` normalized over its own keys and
its natural-log ``lse_i`` (``-inf`` for a split that saw no key).  The merge is

    L = log Σ_i e^{lse_i},   O = Σ_i e^{lse_i - L} · O_i,   then the sink once:  O · e^L / (e^L + e^σ)

— :func:`dsv4lib.reference.lse_merge` is the truth.

Work split (why): the merge is a pure stream of the fp32 partials, so what matters is how many bytes are in
flight per SM.  The first version gave one warp per output row and walked the splits one at a time; for the
DSV4 decode shape (64 rows × ~132 splits × 512 columns) that is 64 warps on the whole GPU, each waiting on one
load per split — 0.14 ms for what the copy bandwidth does in ~10 µs.  Now:

* one CTA (4 warps) per (row, 128-column chunk); lane l owns ``cols/32`` contiguous columns, so each load is
  one 16 B vector and a warp's load is 512 contiguous bytes;
* the 4 warps share the splits (warp w takes splits w, w+4, …; the loop is unrolled so several loads are in
  flight), and their sums meet in shared memory;
* the LSE of the row is reduced lane-parallel (lane l reads splits l, l+32, … and a butterfly finishes), not
  in a serial loop over the splits;
* ``pdl=True`` (the hd512 decode): launched with programmatic dependent launch, so its launch hides behind the
  split kernel, which lets its dependents go once each CTA is past its main loop; ``griddepcontrol.wait`` keeps
  every read behind the split kernel's end.  Each CTA then reserves ``PDL_SMEM`` of shared memory: the split
  kernel fills every SM it runs on (one CTA, ~all registers), and without the reservation the early CTAs piled
  onto the few idle SMs (H200, 128 splits on 132 SMs: 64 of the 256 CTAs on 4 SMs; combine 9.6 µs, decode 43 µs
  instead of 37).  With it, H200 decode H64 KV64k 34.3 → 32.9 µs, KV16k 23.7 → 21.6 (cluster of 4).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .common import exp2, launch_stream, with_unit_mode_at, with_unit_modes
from .softmax import LN_2, LOG2_E

WARPS_PER_CTA = 4


def merged_outputs(mO: cute.Tensor, mLSE: cute.Tensor, token_rows: bool) -> tuple:
    """A combine's outputs as its kernel indexes them, ``(B, Sq, H, D)`` and ``(B, H, Sq)``, from the tensors a call
    passes: batched ones as they are; an unbatched ``sparse_attention`` output (o ``[Sq, H, D]`` / lse ``[H, Sq]``)
    with a unit batch mode; with ``token_rows`` (``sparse_prefill``: each token a decode row, B = Sq, s_q = 1) o
    ``[Sq, H, D]`` / lse ``[Sq, H]`` with a unit s_q mode — at trace time, instead of a torch view per call (#28)."""
    if token_rows:
        return with_unit_mode_at(mO, 1), with_unit_mode_at(mLSE, 2)
    return with_unit_modes(mO, 4), with_unit_modes(mLSE, 3)
# split loads a warp keeps in flight (16 instead of 4 changed nothing on the hd512 decode, H200: 9.4 vs 9.6 µs)
SPLIT_UNROLL = 4
PDL_SMEM = 96 << 10      # pdl: shared memory a CTA reserves, so at most two wait on any SM the split kernel left idle
LSE_SLOTS = 5            # splits' LSEs a lane keeps in registers: 160 splits (the decode uses at most 132)


class LSECombineKernel:
    """``O_partial (splits, B, Sq, H, D)`` fp32 (or bf16) and ``LSE_partial (splits, B, H, Sq)`` fp32 →
    ``O (B, Sq, H, D)`` (bf16) and ``LSE (B, H, Sq)`` fp32; optional ``sink [H]`` fp32 applied once.
    ``cols_per_cta``: columns of one row merged by one CTA (default ``min(D, 128)``: 4 fp32 per lane)."""

    def __init__(self, head_dim: int, *, has_sink: bool, cols_per_cta: int | None = None, pdl: bool = False,
                 token_rows: bool = False):
        if head_dim % 32:
            raise ValueError(f"head_dim must be a multiple of 32, got {head_dim}")
        cols = min(head_dim, 128) if cols_per_cta is None else cols_per_cta
        if cols % 32 or head_dim % cols or cols > 256:
            raise ValueError(f"cols_per_cta must be a multiple of 32 dividing head_dim {head_dim} and at most 256, "
                             f"got {cols}")
        self.head_dim = head_dim
        self.pdl = pdl                            # programmatic dependent launch (module docstring)
        self.token_rows = token_rows              # outputs as sparse_prefill returns them (merged_outputs)
        self.has_sink = has_sink
        self.cols = cols                          # columns per CTA
        self.vec = cols // 32                     # contiguous fp32 columns per lane (one ≤ 32 B vector)
        self.chunks = head_dim // cols            # CTAs per output row

    @cute.jit
    def __call__(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor,
                 stream: cuda.CUstream = None):
        mO, mLSE = merged_outputs(mO, mLSE, self.token_rows)
        rows = cute.size(mO.shape[0]) * cute.size(mO.shape[1]) * cute.size(mO.shape[2])      # B * Sq * H
        self.kernel(mOp, mLSEp, mO, mLSE, mSink).launch(grid=(rows * self.chunks, 1, 1),
                                                        block=(32 * WARPS_PER_CTA, 1, 1), use_pdl=self.pdl,
                                                        **({"smem": PDL_SMEM} if self.pdl else {}),
                                                        **launch_stream(stream))

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor):
        if const_expr(self.pdl):
            # the CTAs may start while the split kernel still runs: wait for its end and its partials
            cute.arch.griddepcontrol_wait()
            # and let the grid after this one (the next decode call's, launched with PDL) take the SMs as they free
            # up: its griddepcontrol.wait holds it until every CTA here has written its rows
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx // self.chunks
        chunk = bidx % self.chunks
        H, Sq = mO.shape[2], mO.shape[1]
        # sAcc (warps, cols) fp32: each warp's weighted sum over its share of the splits
        sAcc = cutlass.memory.SmemAllocator().allocate_tensor(
            Float32, cute.make_layout((WARPS_PER_CTA, self.cols), stride=(self.cols, 1)), byte_alignment=16)
        merge_chunk(mOp, mLSEp, mO, mLSE, mSink, row // (H * Sq), (row // H) % Sq, row % H, chunk, tidx, sAcc,
                    self.cols, self.has_sink, 0, SPLIT_UNROLL)


@cute.jit
def butterfly(x: Float32, op) -> Float32:
    for offset in cutlass.range_constexpr(5):
        x = op(x, cute.arch.shuffle_sync_bfly(x, offset=16 >> offset))
    return x


@cute.jit
def merge_chunk(mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor, b, s, h,
                chunk, tidx, sAcc: cute.Tensor, cols: cutlass.Constexpr, has_sink: cutlass.Constexpr,
                barrier_id: cutlass.Constexpr, unroll: cutlass.Constexpr):
    """Merge columns ``[chunk·cols, (chunk+1)·cols)`` of output row (b, s, h) over every split, by one group of
    ``WARPS_PER_CTA`` warps (``tidx`` in [0, 128)): the combine kernel's CTA, or a consumer warpgroup of a split
    kernel that merges its own splits (the hd512 decode, ``fused_merge``).  ``sAcc (warps, cols)`` fp32 scratch;
    ``barrier_id``: the named barrier of these 128 threads.  Writes the bf16 columns and, for chunk 0, the LSE."""
    lane = tidx % 32
    warp = tidx // 32
    vec = cols // 32
    num_splits = mOp.shape[0]
    # the first batch of this warp's splits (see the loop below) is loaded before the row's LSE is reduced: those
    # loads do not depend on it, and with ≤ 4 · unroll splits (the clustered hd512 decode) they are all there is,
    # so the whole merge waits for one L2 round trip instead of two
    tOr = cute.make_rmem_tensor(cute.make_layout((unroll, vec), stride=(vec, 1)), mOp.element_type)   # (split, col)
    lse_i = cute.make_rmem_tensor((unroll,), Float32)
    load_split_batch(mOp, mLSEp, b, s, h, chunk, lane, warp, cols, unroll, tOr, lse_i)
    sink = Float32(0.0)
    if const_expr(has_sink):
        sink = mSink[h]             # loaded here, with the rest, not after the barrier (one more round trip)
    # L = logsumexp over the splits (log2 units), every warp on its own, lane-parallel.  Lane l holds splits l,
    # l + 32, … (the first LSE_SLOTS of them in registers, all loaded at once: one latency, not one per pass; more
    # splits than that are walked by a loop that is usually empty).
    lse_r = cute.make_rmem_tensor((LSE_SLOTS,), Float32)
    for j in cutlass.range_constexpr(LSE_SLOTS):
        lse_r[j] = -Float32.inf
        if lane + 32 * j < num_splits:
            lse_r[j] = mLSEp[lane + 32 * j, b, h, s]
    mx = -Float32.inf
    for j in cutlass.range_constexpr(LSE_SLOTS):
        mx = cute.arch.fmax(mx, lse_r[j])
    for i in cutlass.range(lane + 32 * LSE_SLOTS, num_splits, 32, unroll=1):
        mx = cute.arch.fmax(mx, mLSEp[i, b, h, s])
    mx = butterfly(mx, cute.arch.fmax)
    base = mx * LOG2_E
    if mx == -Float32.inf:
        base = Float32(0.0)                                      # no split saw a key
    total = Float32(0.0)
    for j in cutlass.range_constexpr(LSE_SLOTS):
        total += exp2(lse_r[j] * LOG2_E - base)        # exp2(-inf) = 0: missing splits add nothing
    for i in cutlass.range(lane + 32 * LSE_SLOTS, num_splits, 32, unroll=1):
        total += exp2(mLSEp[i, b, h, s] * LOG2_E - base)
    total = butterfly(total, lambda x, y: x + y)
    lse = -Float32.inf
    inv_total = Float32(0.0)
    if total > 0.0:
        lse = (base + cute.math.log2(total)) * LN_2
        inv_total = 1.0 / total

    # this warp's splits i = warp, warp + 4, …: O_i (cols,) → lane's vec contiguous columns, one vector load each.
    # In batches of ``unroll`` splits whose loads are all issued before any is used: no branch between them (a
    # split past the end loads split 0's row again and gets weight 0), because a branch per split — the
    # early exit of an unrolled loop with a run-time trip count, or an ``if w > 0`` — keeps ptxas from issuing
    # the next loads before this one's arrive (measured in the hd512 decode: the loads then run one L2 latency at
    # a time, ~8 µs for 16 splits a warp).
    acc = cute.make_rmem_tensor((vec,), Float32)
    acc.fill(0.0)
    add_split_batch(acc, tOr, lse_i, warp, num_splits, base, inv_total, vec, unroll)
    for i0 in cutlass.range(warp + WARPS_PER_CTA * unroll, num_splits, WARPS_PER_CTA * unroll, unroll=1):
        load_split_batch(mOp, mLSEp, b, s, h, chunk, lane, i0, cols, unroll, tOr, lse_i)
        add_split_batch(acc, tOr, lse_i, i0, num_splits, base, inv_total, vec, unroll)
    cute.autovec_copy(acc, cute.local_tile(sAcc[warp, None], (vec,), (lane,)))
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=32 * WARPS_PER_CTA)

    gate = Float32(1.0)
    if const_expr(has_sink):
        # e^L / (e^L + e^σ) = 1 / (1 + e^{σ - L}); an empty row stays 0 because its weights are 0
        if total > 0.0:
            gate = 1.0 / (1.0 + exp2((sink - lse) * LOG2_E))
    for c in cutlass.range_constexpr((cols + 32 * WARPS_PER_CTA - 1) // (32 * WARPS_PER_CTA)):
        col = c * 32 * WARPS_PER_CTA + tidx
        if col < cols:
            o = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS_PER_CTA):
                o += sAcc[w, col]
            mO[b, s, h, chunk * cols + col] = (o * gate).to(mO.element_type)
    if tidx == 0 and chunk == 0:
        mLSE[b, h, s] = lse


@cute.jit
def load_split_batch(mOp: cute.Tensor, mLSEp: cute.Tensor, b, s, h, chunk, lane, i0, cols: cutlass.Constexpr,
                     unroll: cutlass.Constexpr, tOr: cute.Tensor, lse_i: cute.Tensor):
    """Splits ``i0, i0 + 4, …`` (``unroll`` of them): their LSEs and the lane's ``cols / 32`` columns of their
    partial rows, every load issued before any is used (no branch between them: a split past the end loads
    split 0's row again — the one split that always exists, even for a warp with none of its own — and
    :func:`add_split_batch` gives it weight 0)."""
    num_splits = mOp.shape[0]
    vec = cols // 32
    for k in cutlass.range_constexpr(unroll):
        i = i0 + WARPS_PER_CTA * k
        i_safe = i if i < num_splits else 0                   # a select
        lse_i[k] = mLSEp[i_safe, b, h, s]
        gOi = cute.local_tile(mOp[i_safe, b, s, h, None], (cols,), (chunk,))               # (cols,)
        cute.autovec_copy(cute.local_tile(gOi, (vec,), (lane,)), tOr[k, None])


@cute.jit
def add_split_batch(acc: cute.Tensor, tOr: cute.Tensor, lse_i: cute.Tensor, i0, num_splits, base: Float32,
                    inv_total: Float32, vec: cutlass.Constexpr, unroll: cutlass.Constexpr):
    """``acc += Σ_k e^{lse_k - L} · O_k`` over a batch loaded by :func:`load_split_batch`."""
    for k in cutlass.range_constexpr(unroll):
        w = exp2(lse_i[k] * LOG2_E - base) * inv_total
        # a split past the end, or an empty split (w = 0: its partial may be unwritten, NaN bits) adds nothing
        w = w if i0 + WARPS_PER_CTA * k < num_splits else Float32(0.0)
        for j in cutlass.range_constexpr(vec):
            acc[j] += w * (Float32(tOr[k, j]) if w > 0.0 else Float32(0.0))


def fake_args(head_dim: int, partial_dtype=Float32):
    """Symbolic (splits, B, Sq, H) — built once for every shape; D is static; partials fp32 (or the D7 decode's
    bf16)."""
    from cutlass.cute.runtime import make_fake_tensor
    sp, b, s, h = (cute.sym_int() for _ in range(4))
    o_part = make_fake_tensor(partial_dtype, (sp, b, s, h, head_dim),
                              stride=tuple(cute.sym_int(divisibility=8) for _ in range(4)) + (1,), assumed_align=16)
    lse_part = make_fake_tensor(Float32, (sp, b, h, s), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                                assumed_align=4)
    out = make_fake_tensor(cutlass.BFloat16, (b, s, h, head_dim),
                           stride=tuple(cute.sym_int(divisibility=8) for _ in range(3)) + (1,), assumed_align=16)
    lse = make_fake_tensor(Float32, (b, h, s), stride=(cute.sym_int(), cute.sym_int(), 1), assumed_align=4)
    sink = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    return o_part, lse_part, out, lse, sink



