"""Host-side launch helpers shared by the public kernel functions (``attention``, ``sparse``, ``nvfp4``): torch
tensors → CuTe tensors, one-element placeholders for unused arguments, the split-KV workspace, static amax
tensors.  Everything that would otherwise allocate per call is cached here, so timed loops allocate nothing
but their outputs."""
from __future__ import annotations

import torch


def current_stream(device):
    """torch's current stream on ``device`` as the CUDA driver handle a compiled kernel launches on: the kernel is
    ordered with the torch work around it (side streams included) and can be captured in a CUDA graph."""
    import cuda.bindings.driver as cuda
    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def tvm_ffi_stream():
    """The stream argument of a TVM-FFI build: taken at call time from the environment (torch's current stream)."""
    import cutlass.cute as cute
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


def to_cute(t: torch.Tensor, leading_dim: int):
    """Every extent and stride dynamic, unit stride at ``leading_dim``; 16 B alignment assumed when true."""
    from cutlass.cute.runtime import from_dlpack
    align = 16 if t.data_ptr() % 16 == 0 else t.element_size()       # lets the compiler vectorize
    return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=leading_dim)


def rows_dynamic(t: torch.Tensor, static_modes: tuple[int, ...] = (), align: int | None = None):
    """A contiguous tensor whose extents are dynamic except ``static_modes`` (a head dim or a 16-wide block stays
    static: row copies and MMA tiling need it).  ``align``: the assumed byte alignment (default: 16 when a row
    of the last mode is a multiple of 16 B).  Works on CPU tensors too — how the CPU tests compile exactly what
    a GPU call compiles."""
    from cutlass.cute.runtime import from_dlpack
    if align is None:
        align = 16 if t.element_size() * t.shape[-1] % 16 == 0 else t.element_size()
    ct = from_dlpack(t, assumed_align=align)
    for mode in range(t.dim()):
        if mode not in static_modes:
            ct = ct.mark_compact_shape_dynamic(mode=mode, stride_order=t.dim_order())
    return ct


def check_num_splits(num_splits) -> None:
    """``None`` (heuristic) or a positive int; anything else is refused."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None (heuristic), got {num_splits!r}")


_PLACEHOLDERS: dict[str, dict[str, torch.Tensor]] = {}
_PLACEHOLDER_SPECS = {  # name: (dtype, value, shape)
    "sink": (torch.float32, 0.0, (1,)), "scales": (torch.uint8, 0, (1,)), "s_enc": (torch.float32, 1.0, (1,)),
    "indices": (torch.int32, -1, (1, 1, 1)),
}


def placeholder(device, name: str) -> torch.Tensor:
    """Stand-ins for arguments a build does not use (no sink, no NVFP4 output, no index list), allocated once
    per device."""
    bank = _PLACEHOLDERS.setdefault(str(device), {})
    if name not in bank:
        dtype, value, shape = _PLACEHOLDER_SPECS[name]
        bank[name] = torch.full(shape, value, dtype=dtype, device=device)
    return bank[name]


def sink_arg(sink, device) -> torch.Tensor:
    return sink.contiguous() if sink is not None else placeholder(device, "sink")


_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(splits: int, B: int, Sq: int, H: int, D: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial O ``(splits, B, Sq, H, D)`` and LSE ``(splits, B, H, Sq)`` for split-KV, allocated once per
    shape and reused."""
    key = (splits, B, Sq, H, D, str(device))
    if key not in _WORKSPACE:
        _WORKSPACE[key] = (torch.empty(splits, B, Sq, H, D, dtype=torch.float32, device=device),
                           torch.empty(splits, B, H, Sq, dtype=torch.float32, device=device))
    return _WORKSPACE[key]


_AMAX_CACHE: dict[tuple, torch.Tensor] = {}


def amax_tensor(amax, device) -> torch.Tensor:
    """A static amax as a device tensor: a tensor is used as is; a Python number is copied to the device once
    and cached (a host→device copy per call would stall the host behind the GPU queue)."""
    if isinstance(amax, torch.Tensor):
        return amax.to(device=device, dtype=torch.float32)
    key = (float(amax), str(device))
    if key not in _AMAX_CACHE:
        if len(_AMAX_CACHE) > 64:
            _AMAX_CACHE.clear()
        _AMAX_CACHE[key] = torch.tensor(float(amax), dtype=torch.float32, device=device)
    return _AMAX_CACHE[key]


_COMPILED: dict = {}


def compile_once(key, make_kernel, args: tuple, arch: str = "sm_90a"):
    """The kernel ``make_kernel()`` compiled for ``args``' runtime types, once per ``key`` (a frozen config, or a
    tuple naming the build): later calls of any shape reuse it (every extent and stride is dynamic)."""
    fn = _COMPILED.get(key)
    if fn is None:
        import cutlass.cute as cute
        fn = _COMPILED[key] = cute.compile(make_kernel(), *args, options=f"--gpu-arch {arch}")
    return fn


_DEVICE_FACTS: dict = {}


def device_facts(device) -> tuple[str, int]:
    """(name, multiprocessor count) of a CUDA device, read once."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx not in _DEVICE_FACTS:
        props = torch.cuda.get_device_properties(idx)
        _DEVICE_FACTS[idx] = (props.name, props.multi_processor_count)
    return _DEVICE_FACTS[idx]


def check_hopper(device, what: str) -> None:
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"{what} runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor} (sm_100a kernels are "
                           "compiled, not run, in this project)")
