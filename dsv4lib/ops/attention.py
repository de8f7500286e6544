"""``dsv4lib.attention`` and its relatives: the public, torch-facing attention forward (D1, D1.3, D2, D5, NVFP4-1.1).
Same signature and semantics as :func:`dsv4lib.reference.attention`.  Each function validates its input, picks a
frozen build (:class:`dsv4lib.kernels.sm90.config.Sm90FwdConfig`) and launches it."""
from __future__ import annotations

import math

import torch

from ..kernels.sm90.config import SUPPORTED_HEAD_DIMS, Sm90FwdConfig
from ..reference.attention import check_attention_shapes, check_window
from .combine import combine_launcher
from .launch import (Launch, Sequence, aligned16, amax_tensor, cached_config, check_hopper, check_num_splits,
                     compile_stream, device_facts, keep_last_plan, last_plan, lse_output, on_device, options_sig,
                     placeholder, planned, raw_stream, sink_passer, tensor_sig, to_cute, unread_lse, workspace)

SUPPORTED_DTYPES = (torch.bfloat16,)
MQA_HEAD_DIM = 512          # DSV4: one shared KV head, K = V, through dsv4lib.ops.sparse's MQA kernel
P_PATHS = ("rs", "smem")
# GQA head packing (the q heads of one KV head folded into the M rows, so each K/V tile is loaded once per group):
# decode B1 H32 Hkv4 KV64k 291 -> 75 us, prefill a tie (docs/tuning/d2.md)
DEFAULT_PACK_GQA = True


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def check_sink(sink, H: int, device) -> None:
    if sink is None:
        return
    if not isinstance(sink, torch.Tensor) or sink.dtype != torch.float32:
        raise TypeError(f"sink must be a float32 tensor of shape [H], got {getattr(sink, 'dtype', type(sink))}")
    if sink.shape != (H,):
        raise ValueError(f"sink must be [H={H}], got {tuple(sink.shape)}")
    if sink.device != device:
        raise ValueError(f"sink must be on {device}, got {sink.device}")


def _validate(q, k, v, window, sink) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
    _, _, _, D, _, _ = check_attention_shapes(q, k, v)                 # ranks, batch, heads, lengths
    if v.shape[3] != D:
        raise ValueError(f"head dims must match (q {D}, v {v.shape[3]}); Dv != D is not supported yet")
    if D == MQA_HEAD_DIM:
        if k.shape[2] != 1 or not _same_tensor(k, v):
            raise ValueError(f"head dim {MQA_HEAD_DIM} is supported for DSV4's shape only: MQA (Hkv = 1) with K = V "
                             f"(pass the same tensor as k and v); got Hkv={k.shape[2]}, k is v: {_same_tensor(k, v)}")
    elif D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {D} is not supported (supported: {SUPPORTED_HEAD_DIMS}, and {MQA_HEAD_DIM} for "
                         "MQA with K = V)")
    check_window(window)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor (got device {t.device})")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride {t.stride(-1)})")
        if any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % 16:
            raise ValueError(f"{name} needs 16-byte aligned rows (strides multiple of 8 elements, aligned pointer); "
                             f"got strides {t.stride()}")
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError("q, k, v (and sink) must be on the same device")
    check_sink(sink, q.shape[2], q.device)


def pack_factor(pack_gqa, H: int, Hkv: int) -> int:
    """q heads per KV head to pack into M: 1 (no packing) unless asked for (or defaulted) and it divides 128."""
    want = DEFAULT_PACK_GQA if pack_gqa is None else bool(pack_gqa)
    g = H // Hkv
    return g if want and g > 1 and 128 % g == 0 else 1


def config_for(q, *, causal=False, has_lse=True, window=None, sink=False, split_kv=False, p_in_smem=False,
               overlap=None, nvfp4_out=False, pack_gqa=1) -> Sm90FwdConfig:
    """The build for a call on ``q``'s device (its name decides persistence, its SM count the persistent grid),
    made once per problem kind."""
    device = q.device

    def make():
        name, sms = device_facts(device)
        return Sm90FwdConfig.for_problem(q.shape[3], causal=causal, has_lse=has_lse, window=window, sink=sink,
                                         split_kv=split_kv, p_in_smem=p_in_smem, overlap=overlap, nvfp4_out=nvfp4_out,
                                         pack_gqa=pack_gqa, gpu_name=name, num_sms=sms)
    return cached_config(make, "fwd", device, q.shape[3], causal, has_lse, window, sink, split_kv, p_in_smem, overlap,
                         nvfp4_out, pack_gqa)


def merge_config(q, *, causal, window, sink: bool, slots: int) -> Sm90FwdConfig:
    """The last branch of :func:`attention_branches`: the plain (not overlapped) build of the final output (bf16 O,
    LSE, the sink) that folds the ``slots`` earlier branches' partials into its rows — the combine, without its own
    launch."""
    return cached_config(lambda: Sm90FwdConfig.for_problem(q.shape[3], causal=causal, window=window, sink=sink,
                                                           has_lse=True, overlap=False,
                                                           gpu_name=device_facts(q.device)[0]).replace(
                             merge_slots=slots), "merge", q.device, q.shape[3], causal, window, sink, slots)


def plain_split_config(q, *, causal, window) -> Sm90FwdConfig:
    """The plain (not overlapped) split build, one per problem kind: what the branch merge was measured and recorded
    with, and whose fp32 sums the NVFP4 epilogue's bits are checked on (``attention_fp32``)."""
    return cached_config(lambda: Sm90FwdConfig.for_problem(q.shape[3], causal=causal, window=window, split_kv=True,
                                                           overlap=False, gpu_name=device_facts(q.device)[0]),
                         "plain split", q.device, q.shape[3], causal, window)


_WORK_COUNTERS: dict[tuple, torch.Tensor] = {}


def work_counters(device, stream: int) -> torch.Tensor:
    """The dynamic persistent schedule's (items handed out, producers done) int32 counters, one pair per (device,
    stream) so kernels on different streams never share them; zeroed once, every launch leaves them at zero."""
    key = (device, stream)
    counters = _WORK_COUNTERS.get(key)
    if counters is None:
        counters = _WORK_COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return counters


def launcher(config: Sm90FwdConfig, device, *, scale: float, window, prev=None):
    """The launch of the Hopper kernel built for ``config`` as a function of the call's tensors ``(q, k, v, o, lse,
    sink_t[, out_scales, s_enc])``: ``o`` / ``lse`` (B, Sq, H, D) and (B, H, Sq), or the split workspace (splits, ...)
    for a split build; ``out_scales`` / ``s_enc`` the NVFP4 build's extra outputs; ``prev`` (a ``merge_slots``
    build): the workspace ``(o_part, lse_part)`` of the earlier branches, fixed with the plan.  The build is looked
    up (compiled the first time) on the first launch; a call plan keeps the launcher, so later launches only pass
    arguments."""
    if bool(config.merge_slots) != (prev is not None) or (prev is not None and prev[0].shape[0] != config.merge_slots):
        raise ValueError("a merge_slots build takes the workspace of exactly that many earlier branches")
    merged = (None, None) if prev is None else tuple(prev)        # the build's last two arguments, always passed
    split = config.split_kv
    leading = (3, 3, 3, 4 if split else 3, 3 if split else 2, 0, 3, 0)
    scale_log2 = scale * math.log2(math.e)
    win = window or 0
    dynamic, reads_sink = config.dynamic_schedule, config.sink

    # An operand the build does not read (the sink of a build without one, a split's sink — the combine applies it —,
    # the NVFP4 scales and S_enc of a bf16 build) goes as None, not as a placeholder tensor: a tensor argument costs
    # 0.14-0.5 µs of host time a call (docs/tuning/host.md, session 52: probe_ffi_args), a None next to nothing.
    def args(q, k, v, o, lse, sink_t, out_scales=None, s_enc=None):
        stream = raw_stream(device)
        counters = work_counters(device, stream) if dynamic else None     # every argument positional
        return (q, k, v, o, lse, scale_log2, win, sink_t if reads_sink else None, out_scales, s_enc, stream,
                counters, *merged)

    def spec(q, k, v, o, lse, sink_t, out_scales=None, s_enc=None):
        if (out_scales is not None, s_enc is not None) != (config.nvfp4_out, config.nvfp4_out):
            raise ValueError("an NVFP4 build takes out_scales and s_enc, any other build neither")
        tensors = args(q, k, v, o, lse, sink_t, out_scales, s_enc)
        tensors, counters = tensors[:5] + tensors[7:10], tensors[11]

        def compile_args():
            from cutlass import Float32, Int32
            t = [None if x is None else to_cute(x, d, tvm_ffi=True) for x, d in zip(tensors, leading)]
            return (*t[:5], Float32(scale_log2), Int32(win), *t[5:], compile_stream(),
                    None if counters is None else to_cute(counters, 0, tvm_ffi=True),
                    *[None if x is None else to_cute(x, d, tvm_ffi=True) for x, d in zip(merged, (4, 3))])

        def make_kernel():
            from ..kernels.sm90.flash_fwd import FlashAttentionForwardSm90
            return FlashAttentionForwardSm90(config)
        return (config, *[x is not None and aligned16(x) for x in tensors]), make_kernel, compile_args
    return Launch(args, spec)


def launch(config: Sm90FwdConfig, q, k, v, o, lse, *, scale: float, window, sink_t, out_scales=None, s_enc=None):
    """One launch of the Hopper kernel built for ``config`` (:func:`launcher`)."""
    launcher(config, q.device, scale=scale, window=window)(q, k, v, o, lse, sink_t, out_scales, s_enc)


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, return_lse=False, num_splits=None):
    """Forward attention on the GPU.  q ``[B, Sq, H, D]``, k / v ``[B, Sk, Hkv, D]`` bf16 (v may be k);
    returns ``out [B, Sq, H, D]`` bf16 and with ``return_lse`` ``lse [B, H, Sq]`` fp32 (natural log).
    See :func:`dsv4lib.reference.attention` for the exact semantics.  ``num_splits`` (D2): split the KV range
    over that many CTAs and merge by LSE; ``None`` = heuristic, ``1`` = no split; values above the number of KV
    tiles are clamped to it."""
    try:
        key = ("attention", tensor_sig(q), tensor_sig(k), tensor_sig(v), tensor_sig(sink),
               options_sig(scale, causal, window, return_lse, num_splits), raw_stream(q.device))
    except AttributeError:
        key = None                                   # a non-tensor argument: the full path says which
    plan = planned(key, lambda: _plan(q, k, v, scale=scale, causal=causal, window=window, sink=sink,
                                      return_lse=return_lse, p_path="auto", num_splits=num_splits, overlap=None,
                                      pack_gqa=None))
    return plan(q, k, v, sink)


def attention_with_p_path(q, k, v, *, scale=None, causal=False, window=None, sink=None, return_lse=False,
                          p_path="auto", num_splits=None, overlap=None, pack_gqa=None):
    """:func:`attention` with an explicit choice of where P lives: ``"rs"`` (registers, RS-wgmma; ``"auto"``: it
    wins or ties at every head dim) or ``"smem"`` (shared memory via the D1.3 mapping, SS-wgmma); of the
    intra-warpgroup overlap (``None``: on with P in registers); and of GQA head packing (``None``: default)."""
    try:
        key = ("attention_with_p_path", tensor_sig(q), tensor_sig(k), tensor_sig(v), tensor_sig(sink),
               options_sig(scale, causal, window, return_lse, p_path, num_splits, overlap, pack_gqa),
               raw_stream(q.device))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _plan(q, k, v, scale=scale, causal=causal, window=window, sink=sink,
                                      return_lse=return_lse, p_path=p_path, num_splits=num_splits, overlap=overlap,
                                      pack_gqa=pack_gqa))
    return plan(q, k, v, sink)


def _plan(q, k, v, *, scale, causal, window, sink, return_lse, p_path, num_splits, overlap, pack_gqa):
    """Validate one kind of :func:`attention_with_p_path` call and return its plan: a function of ``(q, k, v, sink)``
    that allocates the outputs and launches (see ``launch.tensor_sig`` for what may differ between calls of a plan)."""
    if p_path not in P_PATHS + ("auto",):
        raise ValueError(f"p_path must be one of {P_PATHS + ('auto',)}, got {p_path!r}")
    check_num_splits(num_splits)
    if isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[3] == MQA_HEAD_DIM and (p_path != "auto" or overlap):
        raise ValueError("head dim 512 has one path (P to registers and shared memory, see dsv4lib.ops.sparse): "
                         "p_path must be 'auto' and overlap None")
    _validate(q, k, v, window, sink)
    check_hopper(q.device, "dsv4lib.attention")
    B, Sq, H, D = q.shape
    device = q.device
    if D == MQA_HEAD_DIM:
        from .sparse import mqa512_plan
        run512 = mqa512_plan(q, k, scale=scale, causal=causal, window=window, sink=sink, num_splits=num_splits,
                             return_lse=bool(return_lse))

        def run_mqa(q, k, v, sink):
            if not _same_tensor(k, v):               # what a plan's key cannot see: K = V must hold every call
                _validate(q, k, v, window, sink)
            out, lse = run512(q, k, sink)
            return (out, lse) if return_lse else out
        return run_mqa
    p_in_smem = p_path == "smem"
    if overlap and p_in_smem:
        raise ValueError("overlap=True needs P in registers (p_path='rs')")
    scale = D ** -0.5 if scale is None else float(scale)
    pack = pack_factor(pack_gqa, H, k.shape[2])
    problem = dict(causal=bool(causal), window=window, p_in_smem=p_in_smem, overlap=overlap, pack_gqa=pack)
    config = config_for(q, has_lse=bool(return_lse), sink=sink is not None, **problem)
    n_blocks = -(-k.shape[1] // config.tile_n)
    if num_splits is None:
        from ..kernels.splitkv import num_splits_heuristic
        num_splits = num_splits_heuristic(B, H // pack, -(-Sq * pack // config.tile_m), n_blocks,
                                          device_facts(device)[1])
    num_splits = min(num_splits, n_blocks)                  # documented clamp: at most one KV tile per split
    lse_shape = (B, H, Sq)
    # an unsplit build without LSE never writes it (a placeholder); the combine always writes one
    new_lse = lse_output(device, lse_shape, bool(return_lse), written=num_splits > 1)
    with_sink = sink is not None
    pass_sink = sink_passer(sink, device)
    if num_splits == 1:
        go = launcher(config, device, scale=scale, window=window)
    else:
        go = launcher(config_for(q, split_kv=True, **problem), device, scale=scale, window=window)
        o_part, lse_part = workspace(num_splits, B, Sq, H, D, device, raw_stream(device))
        split_then_combine = Sequence(go, combine_launcher(D, device, has_sink=with_sink))

    def run(q, k, v, sink):
        out = torch.empty_like(q)
        lse = new_lse()
        sink_t = pass_sink(sink)
        with on_device(device):
            if num_splits == 1:
                go(q, k, v, out, lse, sink_t)
            else:
                split_then_combine((q, k, v, o_part, lse_part, sink_t), (o_part, lse_part, out, lse, sink_t))
        return (out, lse) if return_lse else out
    return run


def attention_branches(q, branches, *, sink=None, scale=None, return_lse=False):
    """D5b: one softmax over the union of several key sets, computed branch by branch and merged by LSE
    on the GPU, the sink applied once after the merge (DSV4: the window branch and the compressed branch).

    ``branches``: a list of dicts ``{"k": ..., "v": ..., "causal": bool, "window": int | None}``, each a key
    set for the same queries ``q``.  Every branch but the last runs the kernel's split-KV build with one split into
    its own slot of an fp32 workspace (output normalized over its keys + LSE, no sink); the last branch's build
    (``merge_slots``) folds those slots into its own rows before its epilogue — the combine's merge, weights
    ``2^(lse - max)``, the sink once — and writes the bf16 output and the LSE: n launches for n branches.  Equals
    :func:`dsv4lib.reference.attention` over the concatenated keys."""
    try:
        rest, tensors = _branches_parts(q, branches, sink, scale, return_lse)
        plan = last_plan("attention_branches", tensors, rest)
        key = None if plan is not None else _key_of_parts(rest, tensors, q.device)
    except (AttributeError, TypeError, KeyError):      # no key: the full path explains the argument
        plan = key = rest = tensors = None
    if plan is None:
        plan = planned(key, lambda: _branches_plan(q, branches, sink=sink, scale=scale, return_lse=return_lse))
        keep_last_plan("attention_branches", key, tensors, rest, plan)      # keeps nothing without a key
    return plan(q, branches, sink)


def _key_of_parts(rest: tuple, tensors: tuple, device) -> tuple:
    """The plan key of an ``attention_branches`` call from :func:`_branches_parts`: its plain parts, each tensor's
    :func:`tensor_sig` and the stream, in one flat tuple."""
    return (*rest, *map(tensor_sig, tensors), raw_stream(device))


def _branches_parts(q, branches, sink, scale, return_lse) -> tuple[tuple, tuple]:
    """An ``attention_branches`` call as ``(rest, tensors)``: its plain parts (the options with their types — a
    branch's ``causal`` and ``window`` too —, whether there is a sink, and for each branch whether its ``v`` *is* its
    ``k`` — K = V, DSV4's case, passed once) and its tensors (q, the sink, each branch's k and v).  The plan key is
    ``rest``, each tensor's :func:`tensor_sig` and the stream; :func:`last_plan` takes ``rest`` and the tensors as
    they are.  AttributeError / TypeError / KeyError for an argument that makes no key (the full path explains it)."""
    rest = ["branches", sink is None, *options_sig(scale, return_lse)]
    tensors = [q] if sink is None else [q, sink]
    for br in branches:
        k, v = br["k"], br["v"]
        rest += (v is k, *options_sig(br.get("causal", False), br.get("window")))
        tensors += (k,) if v is k else (k, v)
    return tuple(rest), tuple(tensors)


def _branches_plan(q, branches, *, sink, scale, return_lse):
    if not isinstance(branches, (list, tuple)) or not branches:
        raise ValueError("branches must be a non-empty list of {'k', 'v', 'causal', 'window'} dicts")
    for i, br in enumerate(branches):
        if not isinstance(br, dict) or "k" not in br or "v" not in br:
            raise ValueError(f"branch {i} must be a dict with at least 'k' and 'v'")
        _validate(q, br["k"], br["v"], br.get("window"), sink)
    check_hopper(q.device, "attention_branches")
    B, Sq, H, D = q.shape
    device = q.device
    if D == MQA_HEAD_DIM:
        raise ValueError("attention_branches runs the head dims of the dense kernel (64, 128, 256)")
    scale = D ** -0.5 if scale is None else float(scale)
    earlier, last = branches[:-1], branches[-1]
    prev = workspace(len(earlier), B, Sq, H, D, device, raw_stream(device)) if earlier else None
    # each earlier branch into its own slot of the workspace (views made once, with the plan)
    slots = [(launcher(plain_split_config(q, causal=bool(br.get("causal", False)), window=br.get("window")), device,
                       scale=scale, window=br.get("window")), prev[0][i:i + 1], prev[1][i:i + 1])
             for i, br in enumerate(earlier)]
    # the last branch merges the slots in its epilogue and writes the output (no combine launch)
    last_go = launcher(merge_config(q, causal=bool(last.get("causal", False)), window=last.get("window"),
                                    sink=sink is not None, slots=len(earlier)), device,
                       scale=scale, window=last.get("window"), prev=prev)
    all_branches = Sequence(*(go for go, _, _ in slots), last_go)
    lse_shape = (B, H, Sq)
    new_lse = lse_output(device, lse_shape, bool(return_lse))          # the last build writes it either way
    pass_sink = sink_passer(sink, device)

    def run(q, branches, sink):
        out = torch.empty_like(q)
        lse = new_lse()
        sink_t = pass_sink(sink)
        last = branches[-1]
        with on_device(device):
            all_branches(*[(q, br["k"], br["v"], o_slot, lse_slot, sink_t)
                           for (_, o_slot, lse_slot), br in zip(slots, branches)],
                         (q, last["k"], last["v"], out, lse, sink_t))
        return (out, lse) if return_lse else out
    return run


_SCALES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def global_scales(out_global_amax, device) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's global encode scale ``(1,)`` and decode scale ``()`` (fp32, on ``device``) for a static amax: computed on
    the device for a tensor amax, once per value for a Python number (their torch ops would otherwise be most of the
    call's host time; the decode scale returned for a number is then one shared read-only tensor per value)."""
    from ..reference.quant import nvfp4_global_encode_scale
    key = None if isinstance(out_global_amax, torch.Tensor) else (float(out_global_amax), device)
    if key is not None and key in _SCALES:
        return _SCALES[key]
    amax = amax_tensor(out_global_amax, device)
    if amax.numel() != 1:
        raise ValueError(f"out_global_amax must be a scalar, got shape {tuple(amax.shape)}")
    s_enc = nvfp4_global_encode_scale(amax.reshape(())).reshape(1).contiguous()
    scales = (s_enc, (1.0 / s_enc).reshape(()))
    if key is not None:
        _SCALES[key] = scales
    return scales


def attention_nvfp4(q, k, v, out_global_amax, *, scale=None, causal=False, window=None, sink=None):
    """NVFP4-1.1: attention whose output leaves the kernel already quantized to NVFP4 (no bf16 round trip
    through HBM): returns ``(data uint8 [B, Sq, H, D/2], scales uint8 [B, Sq, H, D/16] (e4m3 bits),
    global_scale fp32 = S_dec)`` with the caller's static ``out_global_amax``.  The epilogue quantizes the
    fp32-normalized O with TE's order of operations (see ``dsv4lib.reference.quant.nvfp4_quantize``), packing
    the bytes in registers (NVFP4-1.2)."""
    try:          # a tensor amax is read on the GPU every call; a number is part of the plan
        amax_key = tensor_sig(out_global_amax) if isinstance(out_global_amax, torch.Tensor) else (
            options_sig(out_global_amax))
        key = ("attention_nvfp4", tensor_sig(q), tensor_sig(k), tensor_sig(v), tensor_sig(sink), amax_key,
               options_sig(scale, causal, window))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _nvfp4_plan(q, k, v, out_global_amax, scale=scale, causal=causal, window=window,
                                            sink=sink))
    return plan(q, k, v, out_global_amax, sink)


def _nvfp4_plan(q, k, v, out_global_amax, *, scale, causal, window, sink):
    _validate(q, k, v, window, sink)
    check_hopper(q.device, "attention_nvfp4")
    if q.shape[3] == MQA_HEAD_DIM:
        raise ValueError("attention_nvfp4 runs the head dims of the dense kernel (64, 128, 256)")
    device = q.device
    number_amax = not isinstance(out_global_amax, torch.Tensor)
    fixed_scales = global_scales(out_global_amax, device) if number_amax else None
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else float(scale)
    no_lse = placeholder(device, "lse")                 # the NVFP4 build writes no LSE
    # the same mainloop and schedule as plain attention, so the comparison isolates the epilogue; the kernel
    # writes whole 32-bit words (a quad assembles each block's 8 bytes, the scale bytes go 4 at a time)
    go = launcher(config_for(q, causal=bool(causal), has_lse=False, window=window, sink=sink is not None,
                             nvfp4_out=True), device, scale=scale, window=window)
    pass_sink = sink_passer(sink, device)

    def run(q, k, v, out_global_amax, sink):
        s_enc, s_dec = fixed_scales or global_scales(out_global_amax, device)
        data = torch.empty(B, Sq, H, D // 2, dtype=torch.uint8, device=device)
        scales = torch.empty(B, Sq, H, D // 16, dtype=torch.uint8, device=device)
        with on_device(device):
            go(q, k, v, data.view(torch.int32), no_lse, pass_sink(sink), scales.view(torch.int32), s_enc)
        return data, scales, s_dec
    return run


def attention_fp32(q, k, v, *, scale=None, causal=False, window=None):
    """The kernel's own fp32-normalized output (no sink), through the split build with one split: what the
    NVFP4 epilogue quantizes.  For tests and comparisons."""
    try:
        key = ("attention_fp32", tensor_sig(q), tensor_sig(k), tensor_sig(v), options_sig(scale, causal, window))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _fp32_plan(q, k, v, scale=scale, causal=causal, window=window))
    return plan(q, k, v)


def _fp32_plan(q, k, v, *, scale, causal, window):
    _validate(q, k, v, window, None)
    check_hopper(q.device, "attention_fp32")
    if q.shape[3] == MQA_HEAD_DIM:
        raise ValueError("attention_fp32 runs the head dims of the dense kernel (64, 128, 256)")
    device = q.device
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else float(scale)
    go = launcher(plain_split_config(q, causal=bool(causal), window=window), device, scale=scale, window=window)
    lse_part = unread_lse(device, (1, B, H, Sq))           # the split build writes it; this function returns O only

    def run(q, k, v):
        o_part = torch.empty(1, B, Sq, H, D, dtype=torch.float32, device=device)
        with on_device(device):
            go(q, k, v, o_part, lse_part, None)          # a split reads no sink
        return o_part[0]
    return run
