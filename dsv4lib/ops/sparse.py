"""``dsv4lib.sparse_attention`` (D6) and the hd512 MQA path of ``dsv4lib.attention``: one shared KV head of dim 512
with K = V, 64 query heads per CTA packed as the MMA M dimension
(:class:`dsv4lib.kernels.sm90.sparse_fwd.SparseAttentionForwardSm90`).  Same semantics as
:func:`dsv4lib.reference.sparse_attention` / :func:`dsv4lib.reference.attention`.  Validate, pick a frozen build
(:class:`dsv4lib.kernels.sm90.sparse_config.SparseFwdConfig`) and a split count, launch."""
from __future__ import annotations

import math

import torch

from ..kernels.sm90.sparse_config import SparseFwdConfig
from ..kernels.splitkv import nonempty_splits
from .attention import check_sink
from .combine import combine_launcher
from .launch import (Launch, Sequence, cached_config, check_hopper, check_num_splits, device_facts, planned,
                     lse_output, on_device, options_sig, placeholder, raw_stream, rows_dynamic, sink_passer,
                     stream_arg, tensor_sig, workspace)

HEAD_DIM = 512
HEADS_PER_CTA = 64
MAX_SPLITS = 64
# clustered split partials (dense keys): C splits of a query merge on chip, so one fp32 partial in C is written and
# read back by the combine; C = 4 measured best of 2 / 4 / 8 at H64 / H128 KV16k-64k (docs/tuning/d2.md)
CLUSTER_SPLITS = 4
MIN_TILES_PER_CLUSTERED_SPLIT = 2
# The gathered split counts whose splits form one cluster that merges them on chip and writes the output itself
# (bf16, the sink once: SparseFwdConfig cluster_splits on the paired schedule) — no partial in global memory, no
# combine launch.  H200, session 50 (probe_split_phases, device µs): at 64 tokens x 1152 keys the combine was 6.1 of
# the 35.2 µs two-split call, the cluster took 30.3 (unsplit 37.3); clusters of 4 / 8 lost (51.6 / 70.5 against 41.9
# split + combine at 4: a cluster of 4 or 8 CTAs waits for SMs free together), so 2 only.  (D7's FP8 decode keeps
# its combine: ``ops.decode.DECODE_CLUSTER_SPLITS``.)  () = every split count through the combine.
PAIRED_CLUSTER_SPLITS = (2,)
# The split rule of the hd512 gathered decodes (D7's FP8 decode and D6's sparse_attention: the paired kernel, bf16
# partials, the same combines): split while the split launch stays within half a wave of SMs — or within one wave
# when the unsplit grid fills at most a quarter of the SMs, or (the FP8 decode, whose dequantizing producer makes a
# tile dearer) at most half of them or the lists are long (≥ 16 tiles, H128's 1152 keys).  H100, session 39, D7 device
# µs by graph replay with the row combine (:func:`dsv4lib.ops.combine.by_rows`; the old combine gave a many-row merge
# ~62 waves of tiny CTAs: B64 H64 at 2 splits 112 vs 41 µs, and B32 H64 — 2 splits by the half-wave rule — 65 vs 40
# unsplit): B32 H64 1 / 2 / 4 splits 40.2 / 31.6 / 28.1 (FlashMLA 27.8), B32 H128 1 / 2 63.4 / 50.4 (FlashMLA 52.5).
# B1 H64 43 / 32 / 24 / 17 µs at 1 / 2 / 4 / 8 splits (8 asked of 10 tiles: 2 tiles each, so 5 did the work and 3
# wrote empty partials; 5 asked measured no faster than 8, 10 — a tile each — as fast: 10 now).  A split keeps at
# least one 64-key tile.  32, not 16, so that B1 H128's 18 tiles get a split each too (H100, session 32: 18 splits
# 16.2 µs; 16 allowed gave 9 splits of two tiles: 16.7 and 17.1 in the same run; FlashMLA 16.0).  With bf16 partials
# (session 41, bench_d7.py --splits) B64 H64 1 / 2 / 3 / 4 splits 41.1 / 37.4 / 49.7 / 46.9 (FlashMLA 48.9; fp32
# partials: 41.1 / 42.8 at 1 / 2) — the half-SMs wave; B64 H128 66.2 / 90.5 / 95.3 / 108.8 (stays 1).  D6's gathered
# split (bf16 rows: a cheaper tile) took this rule in session 41 (H100, split_sweep_sparse.py, 640 / 1152 keys, µs:
# 1 token 11.5 → 8.6 / 11.5 → 9.3, 4 tokens 12.1 → 9.8 / 12.6 → 11.5, 32 tokens 21.9 → 20.0 / 35.0 → 27.2;
# docs/tuning/d2_d6.md) without the FP8 decode's wider waves: 64 tokens at 2 splits 32.7 against 26.1 unsplit (640
# keys), 44.8 against 40.5 (1152).
DECODE_MAX_SPLITS = 32


def kernel_args(q, kv, indices, o, lse, sink, scale: float, window: int, stream=None, tvm_ffi: bool = False) -> tuple:
    """q ``(B, Sq, H, 512)``, kv ``(B, Skv, 512)``, indices ``(B, Sq, K)`` int32, o ``(splits, B, Sq, H, 512)``,
    lse ``(splits, B, H, Sq)``, sink ``(H,)`` → the kernel's arguments (+ the launch stream when given; CPU
    compile tests leave it out; ``tvm_ffi``: the arguments a TVM-FFI build is compiled from).  The public builds
    (:mod:`dsv4lib.kernels.sm90.sparse_public`) take the same without the batch mode (``sparse_attention``: q ``[Sq,
    H, 512]``, kv ``[Skv, 512]``, indices ``[Sq, K]``, o ``[Sq, H, 512]`` and lse ``[H, Sq]`` when unsplit), or with
    the caller's k ``[B, Skv, 1, 512]`` (head dim 512 through ``attention``: its unit head mode stays static, like
    the row) and o ``[B, Sq, H, 512]`` / lse ``[B, H, Sq]``; the head dim (the last mode of q, kv, o) stays static
    either way."""
    from cutlass import Float32, Int32
    rows = lambda t, static=(): rows_dynamic(t, static, tvm_ffi=tvm_ffi)
    last = lambda t: (t.dim() - 1,)
    kv_static = (2, 3) if kv.dim() == 4 else last(kv)
    return (rows(q, last(q)), rows(kv, kv_static), rows(indices), rows(o, last(o)), rows(lse),
            Float32(scale * math.log2(math.e)), Int32(window), rows(sink), *stream_arg(stream, tvm_ffi))


def fake_args(gather: bool = True, split_kv: bool = False, bf16_partials: bool = False):
    """Runtime-typed stand-ins (CPU tensors) for a CPU build of the kernel (split partials fp32, or bf16)."""
    o_dtype = torch.float32 if split_kv and not bf16_partials else torch.bfloat16
    return kernel_args(torch.empty(1, 3, 64, HEAD_DIM, dtype=torch.bfloat16),
                       torch.empty(1, 100, HEAD_DIM, dtype=torch.bfloat16),
                       torch.empty(1, 3, 128 if gather else 1, dtype=torch.int32),
                       torch.empty(2 if split_kv else 1, 1, 3, 64, HEAD_DIM, dtype=o_dtype),
                       torch.empty(2 if split_kv else 1, 1, 64, 3, dtype=torch.float32), torch.empty(64), 1.0, 0)


PUBLIC_BUILDS = ("sparse", "mqa")
# The paired schedule's split partials — D6's gathered split and D7's FP8 decode — in bf16, stored by the output's TMA
# epilogue: at B1 the fp32 partial store (128 KB a CTA from the accumulators) was 3.6 of 13.0 µs and scaled with its
# bytes (H100, session 41: none / half / all of it 9.4 / 11.4 / 12.9 µs; docs/tuning/d7.md) — one bf16 rounding
# more, under the output's own.  The dense split keeps fp32 partials (columns schedule, cluster merge).
PAIRED_BF16_PARTIALS = True


def partial_dtype(config: SparseFwdConfig) -> torch.dtype:
    """The dtype of a split build's partial O (its workspace)."""
    return torch.bfloat16 if config.bf16_partials else torch.float32


def launcher(config: SparseFwdConfig, device, *, scale: float, window, public=None):
    """The launch of the build for ``config`` as a function of ``(q, kv, idx, o, lse, sink_t)``: batched tensors
    (:func:`kernel_args`), or with ``public`` the caller's tensors and the outputs as returned — ``"sparse"``:
    ``sparse_attention``'s unbatched ones; ``"mqa"``: ``attention``'s k ``[B, Skv, 1, 512]`` at head dim 512 (no
    torch view on the host path, issue #28).  Every tensor is contiguous from a 16-byte aligned start (checked, or made here), so the
    build needs no alignment key; the compiled function checks it again.  The build is looked up (compiled the first
    time) on the first launch."""
    scale_log2 = scale * math.log2(math.e)
    win = window or 0
    if public not in (None,) + PUBLIC_BUILDS:
        raise ValueError(f"public must be one of {PUBLIC_BUILDS} or None, got {public!r}")

    def args(q4, kv3, idx3, o, lse, sink_t):
        return q4, kv3, idx3, o, lse, scale_log2, win, sink_t, raw_stream(device)

    def spec(q4, kv3, idx3, o, lse, sink_t):
        def make_kernel():
            from ..kernels.sm90 import sparse_public
            if public == "sparse":
                return sparse_public.SparseAttentionPublicSm90(config)
            if public == "mqa":
                return sparse_public.MQA512PublicSm90(config)
            from ..kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
            return SparseAttentionForwardSm90(config)
        return ((config, public) if public else config, make_kernel,
                lambda: kernel_args(q4, kv3, idx3, o, lse, sink_t, scale, win, tvm_ffi=True))
    return Launch(args, spec)


def launch(config: SparseFwdConfig, q4, kv3, idx3, o, lse, sink_t, *, scale: float, window, public=None) -> None:
    """One launch of the build for ``config`` (:func:`launcher`)."""
    launcher(config, q4.device, scale=scale, window=window, public=public)(q4, kv3, idx3, o, lse, sink_t)


_ACTIVE_CLUSTERS: dict[tuple, int] = {}


def active_clusters(cluster: int, device) -> int:
    """How many (1, 1, ``cluster``) clusters of one-CTA-per-SM blocks the GPU holds at once (a cluster lives in
    one GPC, so this is not simply SMs / cluster)."""
    key = (cluster, device)
    if key not in _ACTIVE_CLUSTERS:
        from cutlass.utils import HardwareInfo
        with on_device(device):
            _ACTIVE_CLUSTERS[key] = HardwareInfo(torch.cuda.current_device()).get_max_active_clusters(cluster)
    return _ACTIVE_CLUSTERS[key]


def cluster_for(num_splits: int, gather: bool) -> int:
    """The cluster size of a split launch: for dense keys the largest of CLUSTER_SIZE, ..., 2 that divides the split
    count; for gathered keys (the paired schedule) the split count itself where it is one of
    :data:`PAIRED_CLUSTER_SPLITS` (the cluster then writes the output: no combine); 1 = no cluster."""
    if gather:
        return num_splits if num_splits in PAIRED_CLUSTER_SPLITS else 1
    if num_splits < 2:
        return 1
    c = CLUSTER_SPLITS
    while c > 1 and num_splits % c:
        c //= 2
    return c


def decode_splits(batch_ctas: int, n_tiles: int, sms: int, dequantizing: bool = True) -> int:
    """The split count of a gathered decode launch of ``batch_ctas`` (token, head group) CTAs over ``n_tiles`` 64-key
    tiles: doubling within half a wave, or within one wave from a grid of at most a quarter of the SMs or (with
    ``dequantizing``: the FP8 decode) at most half of them or over ≥ 16 tiles (the measurements above
    :data:`DECODE_MAX_SPLITS`);
    when every tile can have a CTA of its own within half a wave, one tile a split (a latency-bound call: the fewer
    tiles a CTA walks, the sooner the last partial lands — B1 H64's 10 tiles over 5 / 8 / 10 splits took 16.1 / 15.7
    / 15.7 and 16.2 / 15.9 / 15.8 µs in two runs, H100, session 30); then only as many as get a tile
    (``nonempty_splits``)."""
    splits = 1
    # bf16 rows, long lists: a CTA's chain of ≥ 16 tiles is slower than the DRAM until the split grid passes ~3/4 of
    # the SMs (H100, probe_split_phases, 1152 keys, 2 splits against unsplit: 40 tokens 31.9 / 36.4 µs, 48 tokens
    # 35.1 / 38.1, 56 tokens 39.1 / 39.9 (past 3/4: left unsplit), 64 tokens 42.9 / 40.5; 48 × 640 keys 25.0 / 23.9)
    long_list_wave = n_tiles >= 16 and (dequantizing or 2 * batch_ctas <= 3 * sms // 4)
    one_wave = batch_ctas <= (sms // 2 if dequantizing else sms // 4) or long_list_wave
    while (splits * 2 <= DECODE_MAX_SPLITS and n_tiles // (splits * 2) >= 1
           and batch_ctas * splits * 2 <= (sms if one_wave else sms // 2)):
        splits *= 2
    if splits > 1 and batch_ctas * n_tiles <= sms // 2:
        splits = min(n_tiles, DECODE_MAX_SPLITS)
    if (splits == 1 and not dequantizing and 2 in PAIRED_CLUSTER_SPLITS and 2 * batch_ctas <= sms
            and n_tiles >= 2 * MIN_TILES_PER_CLUSTERED_SPLIT):
        # bf16 rows: two splits merged in one cluster (no partials, no combine) win within one wave where split +
        # combine lost (H200, session 50, probe_split_phases, µs unsplit → 2 clustered splits: 64 tokens x 1152 keys
        # 37.3 → 30.3, 48 x 1152 35.9 → 27.8, 48 x 640 22.5 → 20.3; the split + combine took 35.2 / 30.6 / 22.1)
        splits = 2
    return nonempty_splits(n_tiles, splits)


def choose_splits(num_splits, batch_ctas: int, n_keys: int, device, gather: bool) -> int:
    """``num_splits`` checked and clamped to the key tiles, or (``None``) the split count for this launch."""
    check_num_splits(num_splits)
    n_tiles = max(1, -(-n_keys // 64))
    if num_splits is None and gather:
        return decode_splits(batch_ctas, n_tiles, device_facts(device)[1], dequantizing=False)
    if num_splits is None:
        # clustered partials cost 1/C of the plain ones: fill every cluster slot the GPU has (one CTA per SM),
        # at least MIN_TILES_PER_CLUSTERED_SPLIT tiles a split, a multiple of C splits per query
        c = CLUSTER_SPLITS
        per_query = active_clusters(c, device) // batch_ctas * c
        splits = min(per_query, n_tiles // MIN_TILES_PER_CLUSTERED_SPLIT // c * c)
        if splits >= c:
            return splits
        # one wave: every SM takes part; at least 4 tiles per split keep the fp32 partials small next to the keys,
        # at most MAX_SPLITS (past ~64 the combine costs more than the extra CTAs win)
        sms = device_facts(device)[1]
        num_splits = 1 if batch_ctas >= sms else max(1, min(-(-sms // batch_ctas), n_tiles // 4, MAX_SPLITS))
    return min(num_splits, n_tiles)                      # documented clamp: at least one key tile per split


def _unsplit_config(gather: bool, causal: bool, window_on: bool, with_sink: bool, device) -> SparseFwdConfig:
    sms = device_facts(device)[1]              # the persistent gathered build's grid: one CTA an SM
    return cached_config(lambda: SparseFwdConfig.for_problem(gather=gather, causal=causal, window=window_on,
                                                             sink=with_sink, num_sms=sms),
                         "sparse", gather, causal, window_on, with_sink, sms)


def unsplit_sparse_launcher(device, *, with_sink: bool, scale: float) -> Launch:
    """``sparse_attention``'s unsplit public build as a launch of ``(q [Sq, H, 512], kv [Skv, 512], idx [Sq, K], out
    [Sq, H, 512], lse [H, Sq], sink)``: for a call that puts it in its own :class:`Sequence` (the staged prefill)."""
    return launcher(_unsplit_config(True, False, False, with_sink, device), device, scale=scale, window=None,
                    public="sparse")


def _runner(B: int, Sq: int, H: int, device, *, gather, causal, window, sink, scale, num_splits, public: str,
            return_lse: bool):
    """The launches of one kind of call as a function of ``(q, kv, idx, sink)``, through a public build (no torch
    view on the host path): ``public="sparse"``: ``sparse_attention``'s q [Sq, H, 512], kv [Skv, 512], idx [Sq, K]
    → out [Sq, H, 512], lse [H, Sq]; ``public="mqa"``: ``attention``'s q [B, Sq, H, 512], k [B, Skv, 1, 512], idx
    None → out [B, Sq, H, 512], lse [B, H, Sq].  Without ``return_lse`` the LSE the builds write goes to a buffer
    kept for that (``launch.unread_lse``), not a new tensor."""
    no_idx = placeholder(device, "indices")
    lead = () if public == "sparse" else (B,)
    new_lse = lse_output(device, (*lead, H, Sq), return_lse)
    with_sink, pass_sink = sink is not None, sink_passer(sink, device)
    window_on = window is not None
    go = None
    cluster = cluster_for(num_splits, gather)
    if num_splits == 1:
        go = launcher(_unsplit_config(gather, causal, window_on, with_sink, device), device, scale=scale, window=window,
                      public=public)
    elif gather and cluster > 1:
        # every split of a query in one cluster: merged on chip into the output (the sink too), no combine
        go = launcher(cached_config(lambda: SparseFwdConfig.for_problem(gather=True, split_kv=True,
                                                                        cluster_splits=num_splits, sink=with_sink),
                                    "sparse paired cluster", num_splits, with_sink),
                      device, scale=scale, window=window, public=public)
    else:
        bf16 = gather and PAIRED_BF16_PARTIALS
        config = cached_config(lambda: SparseFwdConfig.for_problem(gather=gather, causal=causal, window=window_on,
                                                                   split_kv=True, cluster_splits=cluster,
                                                                   bf16_partials=bf16),
                               "sparse split", gather, causal, window_on, cluster, bf16)
        o_part, lse_part = workspace(num_splits // cluster, B, Sq, H, HEAD_DIM, device, raw_stream(device),
                                     partial_dtype(config))
        # the combine takes the outputs as returned (the build adds the batch mode).  PDL behind a cluster split and
        # behind the gathered (paired) split, whose CTAs let it go once past their main loops; both kernels go out
        # through one compiled function (launch.Sequence)
        split_then_combine = Sequence(launcher(config, device, scale=scale, window=window, public=public),
                                      combine_launcher(HEAD_DIM, device, has_sink=with_sink, pdl=cluster > 1 or gather))

    def run(q, kv, idx, sink):
        sink_t = pass_sink(sink)
        idx = idx if gather else no_idx
        # q's shape and dtype; ~0.5 µs less Python than torch.empty(shape, dtype=, device=)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = new_lse()
        with on_device(device):
            if go is not None:                 # one launch: unsplit, or a cluster of every split
                go(q, kv, idx, out, lse, sink_t)
            else:
                split_then_combine((q, kv, idx, o_part, lse_part, sink_t), (o_part, lse_part, out, lse, sink_t))
        return out, lse
    return run


def _check_kind(name, t, dims, dtype=torch.bfloat16):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).replace('torch.', '')}, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")


def _check_placement(name, t):
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor (got device {t.device})")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name} must be contiguous with a 16-byte aligned start (strides {t.stride()})")


def check_heads(H):
    if H % HEADS_PER_CTA:
        raise ValueError(f"the hd512 MQA kernel packs {HEADS_PER_CTA} query heads per CTA: H must be a multiple of "
                         f"{HEADS_PER_CTA} (DSV4: 64 or 128), got {H}")


def sparse_attention(q, kv, indices, *, scale=None, sink=None, return_lse=False, num_splits=None):
    """DSV4 / FlashMLA sparse attention on the GPU: q ``[Sq, H, 512]`` bf16 (H a multiple of 64), kv
    ``[Skv, 512]`` bf16 (K = V), indices ``[Sq, K]`` int32 (``-1`` or anything outside ``[0, Skv)`` = no key).
    Returns ``out [Sq, H, 512]`` bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32 (sink excluded).
    ``num_splits``: split each query's key list over that many CTAs (decode), merged by LSE; ``None`` =
    heuristic, ``1`` = no split, clamped to the number of 64-key tiles."""
    try:
        key = ("sparse_attention", tensor_sig(q), tensor_sig(kv), tensor_sig(indices), tensor_sig(sink),
               options_sig(scale, return_lse, num_splits), raw_stream(q.device))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _sparse_plan(q, kv, indices, scale=scale, sink=sink, return_lse=return_lse,
                                             num_splits=num_splits))
    return plan(q, kv, indices, sink)


def _sparse_plan(q, kv, indices, *, scale, sink, return_lse, num_splits):
    _check_kind("q", q, 3)
    _check_kind("kv", kv, 2)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        raise TypeError(f"indices must be an int32 tensor, got {getattr(indices, 'dtype', type(indices))}")
    _check_kind("indices", indices, 2, torch.int32)
    Sq, H, D = q.shape
    if D != HEAD_DIM or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"sparse_attention is built for head dim {HEAD_DIM} (q {D}, kv {kv.shape[1]})")
    if indices.shape[0] != Sq or indices.shape[1] < 1:
        raise ValueError(f"indices must be [Sq={Sq}, K >= 1], got {tuple(indices.shape)}")
    if kv.shape[0] < 1 or Sq < 1:
        raise ValueError(f"need Sq >= 1 and Skv >= 1, got q {tuple(q.shape)}, kv {tuple(kv.shape)}")
    check_heads(H)
    check_sink(sink, H, q.device)
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        _check_placement(name, t)
    if len({q.device, kv.device, indices.device}) != 1:
        raise ValueError("q, kv and indices must be on the same device")
    check_hopper(q.device, "sparse_attention")
    scale = D ** -0.5 if scale is None else float(scale)
    splits = choose_splits(num_splits, Sq * H // HEADS_PER_CTA, indices.shape[1], q.device, gather=True)
    run = _runner(1, Sq, H, q.device, gather=True, causal=False, window=None, sink=sink,
                  scale=scale, num_splits=splits, public="sparse", return_lse=bool(return_lse))

    def run_sparse(q, kv, indices, sink):
        out, lse = run(q, kv, indices, sink)
        return (out, lse.t()) if return_lse else out
    return run_sparse


def mqa512_plan(q, k, *, scale=None, causal=False, window=None, sink=None, num_splits=None, return_lse=True):
    """hd512 MQA with K = V (``dsv4lib.attention`` routes here, validated there but for what follows): the plan of
    q ``[B, Sq, H, 512]``, k ``[B, Skv, 1, 512]`` (as the caller passes it) as a function of ``(q, k, sink)`` →
    ``(out [B, Sq, H, 512], lse [B, H, Sq])``."""
    B, Sq, H, D = q.shape
    check_heads(H)
    check_sink(sink, H, q.device)
    if not q.is_contiguous() or not k.is_contiguous():
        raise ValueError("the hd512 MQA path needs contiguous q and k (= v)")
    scale = D ** -0.5 if scale is None else float(scale)
    splits = choose_splits(num_splits, B * Sq * H // HEADS_PER_CTA, min(k.shape[1], window or k.shape[1]),
                           q.device, gather=False)
    run = _runner(B, Sq, H, q.device, gather=False, causal=bool(causal), window=window, sink=sink,
                  scale=scale, num_splits=splits, public="mqa", return_lse=return_lse)
    return lambda q, k, sink: run(q, k, None, sink)


def gather_roof(q, kv, indices, *, schedule: str = "paired"):
    """Benchmark only: the hd512 kernel's producer alone (consumers wait and release, no math, the output left
    unwritten) on ``sparse_attention``'s inputs — the time the gather by itself takes (``schedule``: whose producer,
    whole tiles "columns" or half tiles "paired").  Returns nothing."""
    config = SparseFwdConfig.for_problem(gather=True).replace(gather_only=True, schedule=schedule)
    run_config(config, q, kv, indices)


def run_config(config: SparseFwdConfig, q, kv, indices):
    """Benchmark / test only: one explicit unsplit build on ``sparse_attention``'s inputs (q [Sq, H, 512], kv
    [Skv, 512], indices [Sq, K] int32).  Returns (out [Sq, H, 512] bf16, lse [Sq, H] fp32), NaN before the launch."""
    Sq, H, _ = q.shape
    out = torch.full((1, 1, Sq, H, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=q.device)
    lse = torch.full((1, 1, H, Sq), float("nan"), dtype=torch.float32, device=q.device)
    with on_device(q.device):
        launch(config, q.unsqueeze(0), kv.unsqueeze(0), indices.unsqueeze(0), out, lse,
               placeholder(q.device, "sink"), scale=HEAD_DIM ** -0.5, window=None)
    return out[0, 0], lse[0, 0].t()
