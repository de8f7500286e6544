"""``dsv4lib.sparse_decode`` (D7): the DSV4 decode step on the production FP8 MODEL1 caches, FlashMLA's
``flash_mla_with_kvcache(..., is_fp8_kvcache=True)`` semantics, one call
(:class:`dsv4lib.kernels.sm90.model1_decode.Model1DecodeSm90`).  Validate, pick a frozen build and a split count,
launch; split launches merge by LSE (:mod:`dsv4lib.ops.combine`) and apply the sink there."""
from __future__ import annotations

import math

import torch

from ..kernels.sm90.sparse_config import Model1DecodeConfig
from .attention import check_sink
from .combine import combine_launcher
from .kvcache import Model1Cache, cache_pages, check_pages, pages_reader
from .launch import (Launch, Sequence, cached_config, check_hopper, check_num_splits, device_facts, keep_last_plan,
                     last_plan, lse_output, on_device, options_sig, placeholder, planned, raw_stream, rows_dynamic,
                     sink_passer, stream_arg, workspace)
from . import sparse
from .sparse import HEAD_DIM, HEADS_PER_CTA, decode_splits, partial_dtype

DECODE_HEADS = (64, 128)
DECODE_SQ = (1, 2)             # one token, or two with MTP
# H = 128: the two head-group CTAs of a token as one cluster that dequantizes each key once (the crossover)
HEAD_PAIR_CLUSTER = True
# H = 64 split counts whose splits merge in one cluster that writes the output (the gathered bf16 split's
# ``ops.sparse.PAIRED_CLUSTER_SPLITS``), instead of bf16 partials + the row combine.  None: at B64 H64 (the rule's 2
# splits) the cluster took 35.4 µs in the D7 stage against 33.4 through the combine (H200, session 50; bench_d7's
# sweep 33.6 / 33.0), B32 at 4 splits 39.4 / 23.3, B1 at 10 11.9 / 11.8 — the FP8 decode's combine hides behind its
# dequantizing main loop under PDL, and a cluster's CTAs wait for each other.  The build stays for probes.
DECODE_CLUSTER_SPLITS: tuple = ()


def launch_shape(B: int, s_q: int, H: int, n_keys: int, sms: int, num_splits=None) -> tuple[int, int, bool]:
    """(64-key tiles of a query, splits, head-pair cluster) of a decode call: the split rule (or ``num_splits`` as
    given, at most one split a tile) and the crossover at H = 128."""
    n_tiles = -(-n_keys // 64)
    if num_splits is None:
        splits = decode_splits(B * s_q * H // HEADS_PER_CTA, n_tiles, sms)
    else:
        splits = min(num_splits, n_tiles)
    return n_tiles, splits, HEAD_PAIR_CLUSTER and H == 2 * HEADS_PER_CTA


def in_split_cluster(splits: int, head_pair_cluster: bool) -> bool:
    """Whether a split launch's splits merge in one cluster that writes the output (no combine): a split count of
    :data:`DECODE_CLUSTER_SPLITS`, at H = 64 only (H = 128's head-pair cluster is taken)."""
    return not head_pair_cluster and splits in DECODE_CLUSTER_SPLITS


def decode_work(B: int, s_q: int, H: int, n_keys: int, sms: int, num_splits=None) -> dict:
    """What a decode call of this shape launches (the D7 notebook's work-split plot; the same rules as the call):
    CTAs (one per query token x 64-head group x split), splits, the 64-key tiles of a query and of each split
    (``ceil(tiles / splits)``, the last split the rest), each CTA's pairs of tiles (the consumers take tiles in
    turn) and whether its last pair is lone (an odd count: one tile, no pad filled), waves over ``sms``, the
    head-pair clusters (H = 128), whether the splits merge in one cluster (``split_cluster``: H = 64 at a split count
    of :data:`DECODE_CLUSTER_SPLITS`) and whether a combine launch follows."""
    from ..kernels.splitkv import split_block_ranges
    n_tiles, splits, cluster = launch_shape(B, s_q, H, n_keys, sms, num_splits)
    per_split = [max(hi - lo, 0) for lo, hi in split_block_ranges(0, n_tiles, splits)]
    ctas = B * s_q * H // HEADS_PER_CTA * splits
    split_cluster = in_split_cluster(splits, cluster)
    return dict(B=B, s_q=s_q, H=H, n_keys=n_keys, tiles=n_tiles, splits=splits, tiles_per_split=per_split,
                pairs_per_split=[(t + 1) // 2 for t in per_split], lone=[t % 2 == 1 for t in per_split],
                ctas=ctas, waves=ctas / sms, head_pair_cluster=cluster, split_cluster=split_cluster,
                combine=splits > 1 and not split_cluster)


def decode_args(q, pages, idx, lengths, pages2, idx2, lengths2, page_size: int, page_size2: int, o, lse, scale: float,
                sink, stream=None, tvm_ffi: bool = False) -> tuple:
    """The kernel's arguments (CPU tensors too: the compile tests build exactly these)."""
    from cutlass import Float32, Int32
    rows = lambda t, static=(), align=None: rows_dynamic(t, static, align=align, tvm_ffi=tvm_ffi)
    pages_arg = lambda t: rows(t, align=16) if t.dim() == 2 else view_arg(t, tvm_ffi)
    return (rows(q, (q.dim() - 1,)), pages_arg(pages), rows(idx), rows(lengths), pages_arg(pages2),
            rows(idx2), rows(lengths2), Int32(page_size), Int32(page_size2), rows(o, (o.dim() - 1,)), rows(lse),
            Float32(scale * math.log2(math.e)), rows(sink), *stream_arg(stream, tvm_ffi))


def view_arg(view, tvm_ffi: bool = False):
    """A FlashMLA cache view ``[num_pages, page_size, 1, 584]`` (not compact: its page stride is ``page_bytes``) as a
    kernel argument, every extent and stride dynamic but the bytes' unit stride; the build reads it as pages
    (:func:`dsv4lib.kernels.sm90.model1_decode.as_pages`)."""
    from cutlass.cute.runtime import from_dlpack
    return from_dlpack(view, assumed_align=16, enable_tvm_ffi=tvm_ffi).mark_layout_dynamic(leading_dim=3)


def fake_args(extra: bool = True, split_kv: bool = False, heads: int = 64) -> tuple:
    """Runtime-typed stand-ins (CPU tensors) for a CPU build."""
    from ..reference.model1 import page_bytes
    o_dtype = torch.bfloat16                # the output, or the split partials (Model1DecodeConfig.for_decode)
    splits = 2 if split_kv else 1
    return decode_args(torch.empty(3, 1, heads, HEAD_DIM, dtype=torch.bfloat16),
                       torch.empty(5, page_bytes(64), dtype=torch.uint8), torch.empty(3, 1, 128, dtype=torch.int32),
                       torch.empty(3, dtype=torch.int32), torch.empty(7, page_bytes(2), dtype=torch.uint8),
                       torch.empty(3, 1, 512, dtype=torch.int32), torch.empty(3, dtype=torch.int32), 64, 2,
                       torch.empty(splits, 3, 1, heads, HEAD_DIM, dtype=o_dtype),
                       torch.empty(splits, 3, heads, 1, dtype=torch.float32), 1.0, torch.empty(heads))


def launcher(config: Model1DecodeConfig, device, *, page_size: int, page_size2: int, scale: float,
             public: bool | str = False):
    """The launch of the build for ``config`` as a function of :func:`decode_args`' tensors ``(q, pages, idx, lengths,
    pages2, idx2, lengths2, o, lse, sink)``; ``public``: the unsplit build that takes o ``[B, s_q, H, 512]`` / lse
    ``[B, H, s_q]`` as ``sparse_decode`` returns them (no view on the host path) — ``"rows"``: the one that takes
    ``sparse_prefill``'s token rows (q / o ``[Sq, H, 512]``, lists ``[Sq, K]``, lse ``[Sq, H]``).  The build is looked
    up (compiled the first time) on the first launch."""
    scale_log2 = scale * math.log2(math.e)

    def args(q, pages, idx, lengths, pages2, idx2, lengths2, o, lse, sink_t):
        return (q, pages, idx, lengths, pages2, idx2, lengths2, page_size, page_size2, o, lse, scale_log2, sink_t,
                raw_stream(device))

    def spec(q, pages, idx, lengths, pages2, idx2, lengths2, o, lse, sink_t):
        def make_kernel():
            from ..kernels.sm90 import model1_decode as kernels
            if public == "rows":
                return kernels.Model1PrefillPublicSm90(config)
            return (kernels.Model1DecodePublicSm90 if public else kernels.Model1DecodeSm90)(config)
        build_key = (config, "rows" if public == "rows" else "public") if public else config
        if pages.dim() == 4 or pages2.dim() == 4:       # a FlashMLA view taken as it is: its own build
            build_key = (build_key, "views", pages.dtype, pages.dim(), pages2.dtype, pages2.dim())
        return (build_key, make_kernel,
                lambda: decode_args(q, pages, idx, lengths, pages2, idx2, lengths2, page_size, page_size2, o, lse,
                                    scale, sink_t, tvm_ffi=True))
    return Launch(args, spec)


def launch(config: Model1DecodeConfig, args: tuple, public: bool = False) -> None:
    """One launch of the build for ``config`` on :func:`decode_args`' arguments (:func:`launcher`)."""
    q, pages, idx, lengths, pages2, idx2, lengths2, page_size, page_size2, o, lse, scale, sink = args
    launcher(config, q.device, page_size=page_size, page_size2=page_size2, scale=scale, public=public)(
        q, pages, idx, lengths, pages2, idx2, lengths2, o, lse, sink)


def _check_int32(name, t, shape: tuple, device_index: int) -> None:
    """``t`` is an int32 CUDA tensor of ``shape`` (a 0 there: any length ≥ 1) on the device of q, contiguous from a
    16-byte aligned start.  Written for the host path: a few attribute reads, one tuple compare."""
    if not isinstance(t, torch.Tensor) or t.dtype is not torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {getattr(t, 'dtype', type(t))}")
    got = tuple(t.shape)
    if len(got) != len(shape) or got[:-1] != shape[:-1] or got[-1] < 1 or shape[-1] not in (0, got[-1]):
        want = ", ".join(str(x) if x else "K" for x in shape)
        raise ValueError(f"{name} must be [{want}], got {got}")
    if t.get_device() != device_index:
        raise ValueError(f"{name} is on {t.device}, q on cuda:{device_index}")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name} must be contiguous from a 16-byte aligned start (strides {t.stride()})")


def _config(device, B: int, s_q: int, H: int, n_keys: int, num_splits, extra: bool, lengths: bool, lengths2: bool,
            sink: bool):
    """(config, splits) of one kind of call: the split count and the frozen build."""
    _, splits, cluster = launch_shape(B, s_q, H, n_keys, device_facts(device)[1], num_splits)
    flags = dict(extra_cache=extra, topk_length=lengths, extra_topk_length=lengths2, head_pair_cluster=cluster)
    if splits == 1:
        return cached_config(lambda: Model1DecodeConfig.for_decode(sink=sink, split_kv=False, **flags),
                             "model1", sink, *flags.values()), 1
    if in_split_cluster(splits, cluster):
        # every split of a query in one cluster that merges them on chip into the output (the sink too): no combine
        return cached_config(lambda: Model1DecodeConfig.for_decode(sink=sink, split_kv=True, cluster_splits=splits,
                                                                   **flags),
                             "model1 split cluster", splits, sink, *flags.values()), splits
    bf16 = sparse.PAIRED_BF16_PARTIALS          # the split partials' dtype (ops.sparse: one choice for both)
    return cached_config(lambda: Model1DecodeConfig.for_decode(sink=False, split_kv=True, bf16_partials=bf16, **flags),
                         "model1 split", bf16, *flags.values()), splits


def cache_call_key(name: str, args: tuple, options: tuple):
    """The plan key of an FP8-cache call (``sparse_decode``, ``sparse_prefill``, ``sparse_prefill_staged``):
    ``args`` its tensors in signature order — q, the cache, the lists, the extra cache, its lists, the sink, then any
    more tensors (the staged prefill's pages) — and its plain options; ``None`` where an argument cannot be keyed (the
    full path then explains it).  It holds what :func:`tensor_sig` holds of each tensor (a :class:`Model1Cache` by
    its pages and page size, a view as a tensor), read inline into one flat tuple: the key is a third of the call's
    Python (8-10 tensors, five C reads each), and a function call and a nested tuple per tensor cost ~0.5 µs of it
    on this CPU."""
    q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, *more = args
    try:
        key = [name, options_sig(*options)]
        for t in (q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, *more):
            if t is None:
                key.append(None)
                continue
            if isinstance(t, Model1Cache):
                key += (Model1Cache, t.page_size)
                t = t.data
            key += (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)
        key.append(raw_stream(q.device) if q.is_cuda else None)
    except AttributeError:
        return None
    return tuple(key)


def cache_call_plan(name: str, args: tuple, options: tuple, make_plan):
    """The plan of an FP8-cache call (:func:`cache_call_key`'s ``args`` and ``options``): its last call's plan when
    this call is the same kind (:func:`~dsv4lib.ops.launch.last_plan`: one C guard over the tensors instead of the
    key's five Python reads a tensor), else the keyed plan (made by ``make_plan``, which validates the call)."""
    k_cache, extra_k_cache = args[1], args[4]
    try:
        # what the key holds besides the tensors' own properties: the options with their types, which arguments are
        # None or a cache object (their types), the cache objects' page sizes
        rest = (options_sig(*options), *map(type, args), getattr(k_cache, "page_size", None),
                getattr(extra_k_cache, "page_size", None))
        tensors = [t.data if type(t) is Model1Cache else t for t in args if t is not None]     # (a list: ~0.5 µs)
        plan = last_plan(name, tensors, rest)
    except (AttributeError, TypeError):         # an option that makes no key, a non-tensor: the full path explains it
        return planned(cache_call_key(name, args, options), make_plan)
    if plan is None:
        key = cache_call_key(name, args, options)
        plan = keep_last_plan(name, key, tensors, rest, planned(key, make_plan))
    return plan


def sparse_decode(q, k_cache, indices, topk_length=None, *, extra_k_cache=None, extra_indices=None,
                  extra_topk_length=None, sink=None, scale=None, return_lse=False, num_splits=None):
    """DSV4 decode over FP8 MODEL1 caches (FlashMLA's semantics): q ``[B, s_q, H, 512]`` bf16 (s_q 1 or 2, H 64 or
    128); ``k_cache`` a :class:`dsv4lib.Model1Cache` or FlashMLA's ``[num_pages, page_size, 1, 584]`` view;
    ``indices [B, s_q, K]`` int32 into its index space (``page · page_size + slot``; ``-1`` or an address outside the
    cache = no key); ``topk_length [B]`` int32: only the first ``topk_length[b]`` entries count (clamped to
    ``[0, K]`` on the GPU — no host sync).  The optional extra cache (the compressed one, its own page size) comes
    with ``extra_indices [B, s_q, K2]`` and ``extra_topk_length``.  One softmax over both lists, the per-head
    ``sink [H]`` fp32 once.  Returns ``out [B, s_q, H, 512]`` bf16 and with ``return_lse`` ``lse [B, H, s_q]`` fp32
    (natural log, sink excluded; -inf for a query without keys).  ``num_splits``: split each query's keys over that
    many CTAs (merged by LSE); ``None`` = heuristic."""
    args = (q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink)
    plan = cache_call_plan("sparse_decode", args, (scale, return_lse, num_splits),
                           lambda: decode_plan(q, k_cache, indices, topk_length, extra_k_cache=extra_k_cache,
                                               extra_indices=extra_indices, extra_topk_length=extra_topk_length,
                                               sink=sink, scale=scale, return_lse=return_lse, num_splits=num_splits))
    return plan(*args)


def decode_plan(q, k_cache, indices, topk_length, *, extra_k_cache, extra_indices, extra_topk_length, sink, scale,
                 return_lse, num_splits, token_rows: bool = False):
    """Validate one kind of :func:`sparse_decode` call and return its plan: a function of the call's tensors that
    allocates the outputs and launches.  ``token_rows``: the plan of :func:`dsv4lib.sparse_prefill` — validated here
    on views that make each prefill token a decode row (``q.unsqueeze(1)``, the lists too), it takes the token-major
    tensors themselves (q ``[Sq, H, 512]``, lists ``[Sq, K]``) and returns out ``[Sq, H, 512]`` / lse ``[Sq, H]``,
    every launch taking them as they are (``Model1PrefillPublicSm90``, split or not, and a ``token_rows`` combine)."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise TypeError(f"q must be a bf16 tensor, got {getattr(q, 'dtype', type(q))}")
    if q.dim() != 4 or q.shape[3] != HEAD_DIM:
        raise ValueError(f"q must be [B, s_q, H, {HEAD_DIM}], got {tuple(q.shape)}")
    B, s_q, H, _ = q.shape
    if H not in DECODE_HEADS or s_q not in DECODE_SQ or B < 1:
        raise ValueError(f"sparse_decode takes H in {DECODE_HEADS} and s_q in {DECODE_SQ} (B >= 1), got "
                         f"{tuple(q.shape)}")
    if not q.is_cuda or not q.is_contiguous() or q.data_ptr() % 16:
        raise ValueError("q must be a contiguous CUDA tensor from a 16-byte aligned start")
    device = q.device
    dev = q.get_device()
    pages, page_size = cache_pages(k_cache, "k_cache")
    check_pages(pages, page_size, "k_cache")
    if pages.get_device() != dev:
        raise ValueError(f"k_cache is on {pages.device}, q on {device}")
    _check_int32("indices", indices, (B, s_q, 0), dev)
    if topk_length is not None:
        _check_int32("topk_length", topk_length, (B,), dev)
    extra = extra_k_cache is not None
    if extra:
        pages2, page_size2 = cache_pages(extra_k_cache, "extra_k_cache")
        check_pages(pages2, page_size2, "extra_k_cache")
        if pages2.get_device() != dev:
            raise ValueError(f"extra_k_cache is on {pages2.device}, q on {device}")
        if extra_indices is None:
            raise ValueError("extra_k_cache needs extra_indices")
        _check_int32("extra_indices", extra_indices, (B, s_q, 0), dev)
        if extra_topk_length is not None:
            _check_int32("extra_topk_length", extra_topk_length, (B,), dev)
    elif extra_indices is not None or extra_topk_length is not None:
        raise ValueError("extra_indices / extra_topk_length need extra_k_cache")
    check_sink(sink, H, device)
    check_num_splits(num_splits)
    check_hopper(device, "sparse_decode")
    scale = HEAD_DIM ** -0.5 if scale is None else float(scale)

    n_keys = indices.shape[2] + (extra_indices.shape[2] if extra else 0)
    config, splits = _config(device, B, s_q, H, n_keys, num_splits, extra, topk_length is not None,
                             extra_topk_length is not None, sink is not None)
    no_lengths, no_indices, no_cache = (placeholder(device, name) for name in ("lengths", "indices", "cache"))
    read_pages = pages_reader(k_cache, views_as_they_are=True)
    read_pages2 = pages_reader(extra_k_cache, views_as_they_are=True) if extra else None
    if not extra:
        page_size2 = 1
    lse_shape = (B, H) if token_rows else (B, H, s_q)                  # out: q's shape (the run's empty_like)
    new_lse = lse_output(device, lse_shape, bool(return_lse))          # the builds write an LSE either way
    pass_sink = sink_passer(sink, device)
    # the outputs as returned: the unsplit build (its split mode is added at trace time) and the split cluster's,
    # which writes them itself
    in_one_launch = splits == 1 or config.cluster_splits > 1
    # a prefill's token rows are taken as passed, split or not (the rows build writes the workspace when split)
    go = launcher(config, device, page_size=page_size, page_size2=page_size2, scale=scale,
                  public="rows" if token_rows else in_one_launch)
    if not in_one_launch:
        o_part, lse_part = workspace(splits, B, s_q, H, HEAD_DIM, device, raw_stream(device), partial_dtype(config))
        # PDL: the combine's launch hides behind the split kernel, which lets it go once past its main loop; both go
        # out through one compiled function (launch.Sequence)
        # the merge: one CTA a row where there are rows for every SM (B ≥ 3 at H64), else the 4-warp chunks that share
        # many splits (B1: 64 rows over 10 splits) — ops.combine picks
        split_then_combine = Sequence(go, combine_launcher(HEAD_DIM, device, has_sink=sink is not None, pdl=True,
                                                           token_rows=token_rows))

    def run(q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink):
        pages = read_pages(k_cache)
        if extra:
            pages2 = read_pages2(extra_k_cache)
        else:
            pages2, extra_indices = no_cache, no_indices
        lengths = no_lengths if topk_length is None else topk_length
        lengths2 = no_lengths if extra_topk_length is None else extra_topk_length
        sink_t = pass_sink(sink)
        # q's shape and dtype; ~0.5 µs less Python than torch.empty(shape, dtype=, device=)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = new_lse()
        with on_device(device):
            if in_one_launch:
                go(q, pages, indices, lengths, pages2, extra_indices, lengths2, out, lse, sink_t)
            else:
                split_then_combine((q, pages, indices, lengths, pages2, extra_indices, lengths2, o_part, lse_part,
                                    sink_t), (o_part, lse_part, out, lse, sink_t))
        return (out, lse) if return_lse else out
    return run
