"""``dsv4lib.quantize_nvfp4`` / ``dequantize_nvfp4``: NVFP4 on the GPU, bit-compatible with
:mod:`dsv4lib.reference.quant` (Transformer-Engine numerics).  Hopper runs the CuTeDSL kernel with the software
E2M1 encoder; Blackwell would take the hardware-cvt build (compiled, not run, here)."""
from __future__ import annotations

from typing import Callable

import torch

from .launch import (Launch, Sequence, amax_tensor, capability, compiled, device_facts, planned,
                     on_device, options_sig, raw_stream, rows_dynamic, stream_arg, tensor_sig)
from ..reference import quant as ref

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _validate(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.shape[0] < 1:
        raise ValueError(f"x must have M >= 1 rows (empty inputs are refused, as by the reference), got shape "
                         f"{tuple(x.shape)}")
    if x.shape[1] < 16 or x.shape[1] % 16:
        raise ValueError(f"K must be a positive multiple of 16 (NVFP4 blocks are 1x16), got shape {tuple(x.shape)}")
    if not x.is_cuda:
        raise ValueError(f"x must be a CUDA tensor (got device {x.device}); "
                         "dsv4lib.reference.quant.nvfp4_quantize runs anywhere")


def nvfp4_arch(device, what: str) -> str:
    major, minor = capability(device)
    if (major, minor) not in ((9, 0), (10, 0)):
        raise RuntimeError(f"{what} needs sm_90a or sm_100a, this GPU is sm_{major}{minor}")
    return "sm_90a" if major == 9 else "sm_100a"


def aligned_passer(t: torch.Tensor, align: int) -> Callable:
    """How a call plan hands ``t`` to a build that needs contiguous rows from an ``align``-byte aligned start, decided
    once from the plan's first call (its key holds the tensor's strides and 16-byte alignment, so every later call of
    the plan is the same case): the caller's tensor itself, or a contiguous, aligned copy per call."""
    if t.is_contiguous() and t.data_ptr() % align == 0:
        return lambda t: t

    def copy(t):
        t = t.contiguous()
        return t if t.data_ptr() % align == 0 else t.clone()
    return copy


def scalar_passer(value, device) -> Callable:
    """How a call plan hands a scalar (the quantize's amax, the dequantize's global scale) to its build as a ``(1,)``
    fp32 tensor on ``device``, decided once from the plan's first call (the key holds a number's value, a tensor's
    dtype, device and shape): a number → one cached device tensor; an fp32 tensor on the device → a ``(1,)`` view of
    the caller's own bytes (its value is read on the GPU every call), the last call's view kept and used again while
    the caller passes the same tensor over the same bytes (a view costs ~3 µs of host time; ``set_`` moves the bytes
    and makes a new one); any other tensor → converted per call.  (The kept view holds the caller's storage.)"""
    if not isinstance(value, torch.Tensor):
        fixed = amax_tensor(value, device).view(1)
        return lambda value: fixed
    if value.dtype != torch.float32 or value.device != device:
        return lambda value: amax_tensor(value, device).view(1)
    last = [None, None]                                        # (the caller's tensor, its (1,) view)

    def own(value):
        seen, view = last
        if seen is not value or view.data_ptr() != value.data_ptr():
            view = value.view(1)
            last[:] = value, view
        return view
    return own


def kernel_args(blocks, words, scales, amax, s_dec_out, stream=None, tvm_ffi: bool = False) -> tuple:
    """The block build's arguments (:class:`dsv4lib.kernels.nvfp4.NVFP4QuantizeKernel`, the device kernel's own
    shapes): only the block count is dynamic, the 16 values of a block and the two words stay static (the register
    copies need static shapes).  :func:`quantize_nvfp4` launches the matrix build (:func:`matrix_args`), whose
    device code is this one's (a CPU test compares the PTX); benchmarks and compile tests build this one.  Works on
    CPU tensors (``tvm_ffi``: what a TVM-FFI build is compiled from)."""
    rows = lambda t, static, align: rows_dynamic(t, static, align, tvm_ffi=tvm_ffi)
    return (rows(blocks, (1,), 16), rows(words, (1,), 8), rows(scales, (), 1), rows(amax, (0,), 4),
            rows(s_dec_out, (0,), 4), *stream_arg(stream, tvm_ffi))


def matrix_args(x, data, scales, amax, s_dec_out, stream=None, tvm_ffi: bool = False,
                amax_partials: bool = False) -> tuple:
    """The arguments of :class:`dsv4lib.kernels.nvfp4.NVFP4QuantizeMatrixKernel` (what :func:`quantize_nvfp4` builds
    and launches): the caller's ``x [M, K]`` and the outputs as returned — ``data [M, K/2]``, ``scales [M, K/16]`` —
    every extent dynamic; ``data`` 8-byte aligned (its block's two words move as one vector).  ``amax``: one value,
    or with ``amax_partials`` the amax pass's per-CTA maxima (their count dynamic: it follows the shape)."""
    rows = lambda t, static, align: rows_dynamic(t, static, align, tvm_ffi=tvm_ffi)
    return (rows(x, (), 16), rows(data, (), 8), rows(scales, (), 1), rows(amax, () if amax_partials else (0,), 4),
            rows(s_dec_out, (0,), 4), *stream_arg(stream, tvm_ffi))


def quantize_nvfp4(x, global_amax=None, *, swizzle: bool = False, _depth=None, _ctas_per_sm=None, _encode=True,
                   _encoder=None, _pdl=None):
    """x ``[M, K]`` (K % 16 == 0) → ``(data uint8 [M, K/2], scales uint8 [M, K/16] e4m3 bits (or the flat
    128×4 swizzled layout with ``swizzle=True``), global_scale fp32 scalar = S_dec ≈ amax / (6·448))``.
    ``global_amax``: a static amax; by default ``max|x|`` (one extra torch reduction).  ``_depth`` (tiles in
    flight per thread), ``_ctas_per_sm`` (grid cap; 0: no cap), ``_encoder`` (``"lines"`` / ``"magic"``), ``_pdl``
    (programmatic dependent launch; None: ``kernels.nvfp4.PDL``) and ``_encode=False`` (same memory traffic, no
    quantization: wrong bytes) are benchmark knobs."""
    try:          # a tensor amax is read on the GPU every call; a number is part of the plan
        amax_key = tensor_sig(global_amax) if isinstance(global_amax, torch.Tensor) else options_sig(global_amax)
        key = ("quantize_nvfp4", tensor_sig(x), amax_key,
               options_sig(swizzle, _depth, _ctas_per_sm, _encode, _encoder, _pdl))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _quantize_plan(x, global_amax, swizzle=swizzle, depth=_depth, ctas_per_sm=_ctas_per_sm,
                                               encode=_encode, encoder=_encoder, pdl=_pdl))
    return plan(x, global_amax)


def _quantize_plan(x, global_amax, *, swizzle, depth, ctas_per_sm, encode, encoder, pdl):
    _validate(x)
    device = x.device
    arch = nvfp4_arch(device, "quantize_nvfp4")
    M, K = x.shape
    if global_amax is not None:
        amax = amax_tensor(global_amax, device)
        if amax.numel() != 1:
            raise ValueError(f"global_amax must be a scalar, got shape {tuple(amax.shape)}")
    from ..kernels import nvfp4 as nvfp4_kernels
    depth = depth or (nvfp4_kernels.DEPTH_FP32 if x.dtype == torch.float32 else nvfp4_kernels.DEPTH)
    sms = device_facts(device)[1]
    max_ctas = (nvfp4_kernels.CTAS_PER_SM if ctas_per_sm is None else ctas_per_sm) * sms
    encoder = encoder or nvfp4_kernels.ENCODER
    pdl = nvfp4_kernels.PDL if pdl is None else bool(pdl)
    of_x = global_amax is None              # max |x| by our own kernel, in the same compiled call as the quantize
    quantize = Launch(lambda x, data, scales, amax, s_dec: (x, data, scales, amax, s_dec, raw_stream(device)),
                      lambda *tensors: (("quantize", x.dtype, arch, depth, max_ctas, encode, encoder, of_x, pdl),
                                        lambda: nvfp4_kernels.NVFP4QuantizeMatrixKernel(
                                            hardware_cvt=arch == "sm_100a", depth=depth, max_ctas=max_ctas,
                                            encode=encode, encoder=encoder, amax_partials=of_x, pdl=pdl),
                                        lambda: matrix_args(*tensors, tvm_ffi=True, amax_partials=of_x), arch))
    if of_x:
        n_partials = nvfp4_kernels.amax_ctas(M * K // 16, sms)
        amax_then_quantize = Sequence(
            Launch(lambda x, partials: (x, partials, raw_stream(device)),
                   lambda x, partials: (("amax", x.dtype, arch, pdl), lambda: nvfp4_kernels.NVFP4AmaxKernel(pdl),
                                        lambda: amax_args(x, partials, tvm_ffi=True), arch)),
            quantize)

    pass_x = aligned_passer(x, 16)                            # a block's 16 values load as whole vectors
    pass_amax = scalar_passer(global_amax, device) if global_amax is not None else None

    def run(x, global_amax):
        x = pass_x(x)
        # the outputs as returned: the build takes the matrices and makes its block views itself (no torch view)
        data = torch.empty(M, K // 2, dtype=torch.uint8, device=device)
        scale_bytes = torch.empty(M, K // 16, dtype=torch.uint8, device=device)     # e4m3 bits
        s_dec = torch.empty(1, dtype=torch.float32, device=device)                  # the kernel writes S_dec
        with on_device(device):
            if of_x:
                partials = amax_partials(device, raw_stream(device), n_partials)
                amax_then_quantize((x, partials), (x, data, scale_bytes, partials, s_dec))
            else:
                quantize(x, data, scale_bytes, pass_amax(global_amax), s_dec)
        if swizzle:
            scale_bytes = ref.swizzle_scales(scale_bytes)
        return data, scale_bytes, s_dec.view(())
    return run


def amax_args(x, partials, stream=None, tvm_ffi: bool = False) -> tuple:
    """The arguments of :class:`dsv4lib.kernels.nvfp4.NVFP4AmaxKernel`: the caller's ``x [M, K]`` and the fp32
    ``partials [G]`` (one per CTA; G sets the grid), every extent dynamic."""
    return (rows_dynamic(x, (), 16, tvm_ffi=tvm_ffi), rows_dynamic(partials, (), 4, tvm_ffi=tvm_ffi),
            *stream_arg(stream, tvm_ffi))


_AMAX_PARTIALS: dict[tuple, torch.Tensor] = {}


def amax_partials(device, stream: int, n: int) -> torch.Tensor:
    """The amax kernel's per-CTA maxima, ``(n,)`` fp32, one buffer per (device, stream, n): calls on different streams
    never share one (a call's quantize reads what its own amax kernel wrote)."""
    key = (device, stream, n)
    partials = _AMAX_PARTIALS.get(key)
    if partials is None:
        # many streams or sizes: start over — a dropped buffer was allocated on its own stream, so the caching
        # allocator hands its memory out again only behind that stream's kernels
        if len(_AMAX_PARTIALS) >= 256:
            _AMAX_PARTIALS.clear()
        partials = _AMAX_PARTIALS[key] = torch.empty(n, dtype=torch.float32, device=device)
    return partials


_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def dequantize_args(words, scales, global_scale, y, stream=None, tvm_ffi: bool = False) -> tuple:
    """The dequantize block build's arguments (block count dynamic; works on CPU tensors for the compile tests,
    which leave the stream out; ``tvm_ffi``: what a TVM-FFI build is compiled from).  :func:`dequantize_nvfp4`
    launches the matrix build (:func:`dequantize_matrix_args`), whose device code is this one's."""
    rows = lambda t, static, align: rows_dynamic(t, static, align, tvm_ffi=tvm_ffi)
    return (rows(words, (1,), 8), rows(scales, (), 1), rows(global_scale, (0,), 4), rows(y, (1,), 16),
            *stream_arg(stream, tvm_ffi))


def dequantize_matrix_args(data, scales, global_scale, y, stream=None, tvm_ffi: bool = False) -> tuple:
    """The arguments of :class:`dsv4lib.kernels.nvfp4.NVFP4DequantizeMatrixKernel` (what :func:`dequantize_nvfp4`
    builds and launches): ``data [M, K/2]`` (8-byte aligned), ``scales [M, K/16]``, ``global_scale (1,)``,
    ``y [M, K]`` — every extent dynamic."""
    rows = lambda t, static, align: rows_dynamic(t, static, align, tvm_ffi=tvm_ffi)
    return (rows(data, (), 8), rows(scales, (), 1), rows(global_scale, (0,), 4), rows(y, (), 16),
            *stream_arg(stream, tvm_ffi))


def dequantize_nvfp4(data, scales, global_scale, out_dtype=torch.bfloat16):
    """``(e2m1 · e4m3_scale) · global_scale`` → ``[M, K]`` in ``out_dtype`` (bf16 / fp16 / fp32), bit-equal to
    :func:`dsv4lib.reference.quant.nvfp4_dequantize`.  CUDA tensors run the CuTeDSL kernel
    (:class:`dsv4lib.kernels.nvfp4.NVFP4DequantizeKernel`, one 1×16 block per thread); CPU tensors take the
    reference.  ``data`` uint8 ``[M, K/2]``, ``scales`` uint8 ``[M, K/16]`` (the plain layout, not swizzled),
    ``global_scale`` a scalar (Python number or one-element tensor, e.g. the third output of
    :func:`quantize_nvfp4`)."""
    try:          # a tensor global scale is read on the GPU every call; a number is part of the plan
        gs_key = tensor_sig(global_scale) if isinstance(global_scale, torch.Tensor) else options_sig(global_scale)
        key = ("dequantize_nvfp4", tensor_sig(data), tensor_sig(scales), gs_key, options_sig(out_dtype))
    except AttributeError:
        key = None
    plan = planned(key, lambda: _dequantize_plan(data, scales, global_scale, out_dtype))
    return plan(data, scales, global_scale)


def _dequantize_plan(data, scales, global_scale, out_dtype):
    if not isinstance(data, torch.Tensor) or not isinstance(scales, torch.Tensor):
        raise TypeError("data and scales must be torch tensors")
    if data.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"data and scales must be uint8, got {data.dtype}, {scales.dtype}")
    if data.dim() != 2 or scales.dim() != 2:
        raise ValueError(f"data [M, K/2] and scales [M, K/16] must be 2-D, got {tuple(data.shape)}, {tuple(scales.shape)}")
    if data.shape[0] != scales.shape[0] or data.shape[1] != scales.shape[1] * 8 or data.shape[1] < 8:
        raise ValueError(f"data [M, K/2] {tuple(data.shape)} and scales [M, K/16] {tuple(scales.shape)} disagree")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if data.device != scales.device:
        raise ValueError(f"data and scales must be on the same device, got {data.device} and {scales.device}")
    if not data.is_cuda:
        return lambda data, scales, global_scale: ref.nvfp4_dequantize(data, scales, global_scale,
                                                                        out_dtype=out_dtype)
    device = data.device
    gs = amax_tensor(global_scale, device)
    if gs.numel() != 1:
        raise ValueError(f"global_scale must be a scalar, got shape {tuple(gs.shape)}")
    arch = nvfp4_arch(device, "dequantize_nvfp4")
    M, half_k = data.shape

    def make_kernel():
        from ..kernels.nvfp4 import NVFP4DequantizeMatrixKernel
        return NVFP4DequantizeMatrixKernel()

    pass_data = aligned_passer(data, 8)                       # the kernel loads a block's 8 bytes as one vector
    pass_gs = scalar_passer(global_scale, device)

    def run(data, scales, global_scale):
        data = pass_data(data)
        gs = pass_gs(global_scale)
        y = torch.empty(M, half_k * 2, dtype=out_dtype, device=device)
        # the caller's matrices as they are: the build makes its block views itself (no torch view here)
        tensors = (data, scales.contiguous(), gs, y)
        with on_device(device):
            compiled(("dequantize", out_dtype, arch), make_kernel,
                     lambda: dequantize_matrix_args(*tensors, tvm_ffi=True), arch=arch)(*tensors, raw_stream(device))
        return y
    return run
