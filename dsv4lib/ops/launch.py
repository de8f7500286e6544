"""Host-side launch helpers shared by the public kernel functions (``attention``, ``sparse``, ``nvfp4``).

The host path is built for ≤ 25 µs per call on a compiled shape (docs/tuning/host.md): every kernel is compiled
once per build key with CuTeDSL's TVM-FFI ABI (``--enable-tvm-ffi``) and afterwards called with the torch tensors
themselves, Python numbers and the raw stream handle — no per-call ``from_dlpack``, no CuTe tensor objects.  The
compiled function checks each tensor's dtype, rank, static extents, compact strides, device and alignment in C, so
a call that reaches it with a tensor the build was not made for fails with a ``ValueError``, never runs on garbage.
Workspaces, placeholders, device facts and configs are cached here, so a call allocates nothing but its outputs."""
from __future__ import annotations

import contextlib
from typing import Callable

import torch


def raw_stream(device: torch.device) -> int:
    """torch's current stream on ``device`` as a raw handle (what a TVM-FFI build takes): the kernel is ordered
    with the torch work around it (side streams included) and can be captured in a CUDA graph."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def current_stream(device):
    """torch's current stream on ``device`` as the driver handle a build compiled without TVM-FFI launches on
    (benchmark variants and scripts that call ``cute.compile`` themselves)."""
    import cuda.bindings.driver as cuda
    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def compile_stream():
    """The stream parameter of a TVM-FFI build: a raw handle given at call time (:func:`raw_stream`)."""
    import cutlass.cute as cute
    return cute.runtime.make_fake_stream()


def stream_arg(stream, tvm_ffi: bool):
    """The stream argument of a kernel's argument tuple: ``stream`` (a driver handle) for a plain build, the
    call-time handle parameter for a TVM-FFI build, nothing (``None``) for a CPU compile test."""
    return (compile_stream(),) if tvm_ffi else (() if stream is None else (stream,))


def aligned16(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def to_cute(t: torch.Tensor, leading_dim: int, tvm_ffi: bool = False):
    """Every extent and stride dynamic, unit stride at ``leading_dim``; 16 B alignment assumed when true (a key of
    the build: :func:`aligned16`)."""
    from cutlass.cute.runtime import from_dlpack
    align = 16 if aligned16(t) else t.element_size()       # lets the compiler vectorize
    return from_dlpack(t, assumed_align=align, enable_tvm_ffi=tvm_ffi).mark_layout_dynamic(leading_dim=leading_dim)


def rows_dynamic(t: torch.Tensor, static_modes: tuple[int, ...] = (), align: int | None = None, tvm_ffi: bool = False):
    """A contiguous tensor whose extents are dynamic except ``static_modes`` (a head dim or a 16-wide block stays
    static: row copies and MMA tiling need it).  ``align``: the assumed byte alignment (default: 16 when a row
    of the last mode is a multiple of 16 B).  Works on CPU tensors too — how the CPU tests compile exactly what
    a GPU call compiles."""
    from cutlass.cute.runtime import from_dlpack
    if align is None:
        align = 16 if t.element_size() * t.shape[-1] % 16 == 0 else t.element_size()
    ct = from_dlpack(t, assumed_align=align, enable_tvm_ffi=tvm_ffi)
    for mode in range(t.dim()):
        if mode not in static_modes:
            ct = ct.mark_compact_shape_dynamic(mode=mode, stride_order=t.dim_order())
    return ct


_PLANS: dict = {}
MAX_PLANS = 4096


class _Builds(dict):
    """The compiled functions by build key.  Replacing or removing a build (a script stubbing, swapping or clearing
    builds) forgets every call plan, because a plan holds the functions it launches; a new build leaves them be."""

    def __setitem__(self, key, fn):
        if key in self:
            _PLANS.clear()
        super().__setitem__(key, fn)

    def __delitem__(self, key):
        super().__delitem__(key)
        _PLANS.clear()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        _PLANS.clear()

    def clear(self):
        super().clear()
        _PLANS.clear()

    def pop(self, *args):
        _PLANS.clear()
        return super().pop(*args)


_COMPILED: dict = _Builds()
_CONFIGS: dict = {}


def cached_config(make: Callable, *key):
    """``make()`` once per ``key`` (a frozen kernel config for one kind of problem: building one runs its checks)."""
    config = _CONFIGS.get(key)
    if config is None:
        config = _CONFIGS[key] = make()
    return config


def compiled(key, make_kernel: Callable, compile_args: Callable[[], tuple], arch: str = "sm_90a"):
    """The function of the kernel ``make_kernel()`` built for ``key``, called with torch tensors, Python numbers and
    the raw stream.  The first request of a key compiles it as a TVM-FFI function from ``compile_args()`` (CuTe
    tensors of the same torch tensors, ``tvm_ffi=True``); every extent the build leaves dynamic may differ in later
    calls.  The key names the build and whatever of the arguments the compile bakes in that can change between calls
    (a tensor's 16-byte alignment)."""
    fn = _COMPILED.get(key)
    if fn is None:
        import cutlass.cute as cute
        build = cute.compile(make_kernel(), *compile_args(), options=f"--gpu-arch {arch} --enable-tvm-ffi")
        # the tvm_ffi.Function itself: every argument is passed positionally (none left to a default), so the
        # Python keyword wrapper CuTeDSL puts in front of it has nothing to do
        fn = _COMPILED[key] = getattr(build, "_tvm_ffi_function", None) or build
    return fn


def run_compiled(key, make_kernel: Callable, compile_args: Callable[[], tuple], call_args: tuple,
                 arch: str = "sm_90a") -> None:
    """Launch the build of ``key`` (:func:`compiled`) with ``call_args``."""
    compiled(key, make_kernel, compile_args, arch)(*call_args)


class Launch:
    """One kernel launch of a call plan, as a function of the call's tensors.  ``args(*tensors)``: the compiled
    function's arguments (Python numbers and the raw stream included); ``spec(*tensors)``: ``(key, make_kernel,
    compile_args[, arch])`` of its build (:func:`compiled`), asked for once.  Calling it launches on its own; a
    :class:`Sequence` launches several with one compiled function."""
    __slots__ = ("args", "spec", "fn")

    def __init__(self, args: Callable[..., tuple], spec: Callable[..., tuple]):
        self.args, self.spec, self.fn = args, spec, None

    def __call__(self, *tensors) -> None:
        if self.fn is None:
            self.fn = compiled(*self.spec(*tensors))
        self.fn(*self.args(*tensors))


# One compiled function per multi-kernel call (split + combine, the branches of attention_branches): a launch through
# TVM-FFI costs ~7 µs of host time, most of it the argument checks, so the second kernel of a call is nearly free when
# it rides in the first one's call.  The device code of every kernel is its own build's (kernels.common.LaunchSequence).
# False: each kernel its own compiled function (the way before; a switch to A/B the host time).
ONE_CALL = True


class Sequence:
    """Launches (:class:`Launch`) run in order.  Called with one tuple of tensors per launch; with :data:`ONE_CALL`
    (read when the sequence is made) they go out through one compiled
    :class:`~dsv4lib.kernels.common.LaunchSequence`, whose arguments are every launch's own, one after the other."""
    __slots__ = ("launches", "fn", "one_call")

    def __init__(self, *launches: Launch):
        # one launch goes out directly: its own compiled function, no one-step LaunchSequence build beside it
        self.launches, self.fn, self.one_call = launches, None, ONE_CALL and len(launches) > 1

    def __call__(self, *tensors_per_launch) -> None:
        if not self.one_call:
            for go, tensors in zip(self.launches, tensors_per_launch):
                go(*tensors)
            return
        if self.fn is None:
            self.fn = compiled(*self.spec(*tensors_per_launch))
        args = ()
        for go, tensors in zip(self.launches, tensors_per_launch):
            args += go.args(*tensors)
        self.fn(*args)

    def spec(self, *tensors_per_launch) -> tuple:
        """``(key, make_kernel, compile_args, arch)`` of the one compiled function (what :func:`compiled` takes): the
        key is ``("sequence", *the launches' own build keys)``, the arch the first launch's."""
        specs = [go.spec(*tensors) for go, tensors in zip(self.launches, tensors_per_launch)]
        counts = [len(go.args(*tensors)) for go, tensors in zip(self.launches, tensors_per_launch)]

        def make_kernel():
            from ..kernels.common import LaunchSequence
            return LaunchSequence([(spec[1](), n) for spec, n in zip(specs, counts)])

        def compile_args():
            return tuple(a for spec in specs for a in spec[2]())
        arch = specs[0][3] if len(specs[0]) > 3 else "sm_90a"       # a spec may name its arch (default sm_90a)
        return ("sequence", *(spec[0] for spec in specs)), make_kernel, compile_args, arch


# ---- call plans: the host path of a repeated call (issue #28) ----
# A public function validates a call and works out what to launch (config, split count, output shapes, placeholders,
# the compiled functions) once per *kind* of call, and keeps that as a plan: a function of the call's tensors that
# allocates the outputs and launches.  The plan's key holds everything the validation read: each tensor argument's
# shape, strides, dtype, device and 16-byte alignment, and every option as passed with its type (``options_sig``:
# ``True`` is not taken for ``1``, and only plain values make a key).  A call whose key is known skips straight to its plan; any other call
# (a new shape, a bad argument, something unhashable) takes the full path, which raises or makes the plan.  What a
# key cannot hold (two arguments being the same tensor) the plan checks itself.  What a plan reads of the library's
# tuning constants (split rules, ``CLUSTER_SPLITS``, ``HEAD_PAIR_CLUSTER``, ...) is fixed when it is made: whoever
# changes one at run time calls :func:`forget_plans` (tests and probes do).

def tensor_sig(t):
    """What a plan depends on of a tensor argument (``None`` stays ``None``); AttributeError for a non-tensor."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15


PLAIN_OPTIONS = (type(None), bool, int, float, str, torch.dtype)


def options_sig(*options) -> tuple:
    """A call's options as a plan key holds them: each with its type (``True`` is not taken for ``1``), plain values
    only; anything else — a tensor given as the scale, whose value could change in place — gives no key
    (AttributeError, like a non-tensor given for a tensor)."""
    for x in options:
        if type(x) not in PLAIN_OPTIONS:
            raise AttributeError(f"no plan key for an option of type {type(x).__name__}")
    return (*map(type, options), *options)


def find_plan(key):
    """The plan of ``key``, or None (unknown, or a key that cannot be hashed: the full path explains the argument)."""
    try:
        return _PLANS.get(key)
    except TypeError:
        return None


def keep_plan(key, plan):
    """Remember ``plan`` under ``key`` (when the key can be hashed) and return it."""
    if key is not None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        try:
            _PLANS[key] = plan
        except TypeError:
            pass
    return plan


def planned(key, make_plan: Callable):
    """The plan kept for ``key``, or ``make_plan()`` (the full path: it validates the call, raising on a bad argument)
    kept under it — every public function's first line of work."""
    plan = find_plan(key)
    return plan if plan is not None else keep_plan(key, make_plan())


def forget_plans() -> None:
    _PLANS.clear()


def plan_count() -> int:
    """How many kinds of call have a keyed plan (the last-call entries of :func:`keep_last_plan` not counted)."""
    return sum(type(key) is not tuple or key[0] not in ("last", "guard") for key in _PLANS)


# ---- the last call's plan, guarded in C (issue #28) ----
# A repeated call's plan key reads five attributes of each tensor in Python — half of an FP8-cache decode's host
# time (8 tensors: ~16 µs of ~33 on the 2-core CI machine, launches stubbed; docs/tuning/host.md, session 56).
# torch.compile checks the same properties of its inputs with one C++ object, ``TensorGuards``: the exact tensor
# type, dispatch keys (device type), device index, dtype, every size and stride, requires_grad — of many tensors in
# one call (~2 µs for 8 here).  A public function keeps its last call's plan under ``("last", name)`` in ``_PLANS``
# (so whatever forgets the plans forgets it too) with such a guard over that call's tensors and ``rest``: everything
# else its key holds (option values with their types, which arguments are None, a cache object's page size).  A
# call that passes the guard, has the same ``rest``, the same arguments given as one tensor twice (K = V), 16-byte
# aligned tensors (a last plan is kept only for all-aligned calls) and the same current stream is the same kind of
# call as that one — what its full key would say — and takes the plan; any other call takes the keyed path, which
# makes it the last plan (its guard built once per key, ~10 µs, and kept under ``("guard", ...)``: calls alternating
# between kinds pay the guard's check, not its build).  Without the guard class (a torch without dynamo's C guards)
# every call takes the keyed path.  Only calls of many tensors use it: at 3-4 tensors the guard's setup costs what
# the key does (host.md).
try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:                         # pragma: no cover — every torch this project runs has it
    TensorGuards = None
LAST_PLANS = TensorGuards is not None       # False: every call takes its keyed path (a switch to A/B the host time)


def _once_each(tensors) -> tuple[tuple, tuple | None]:
    """``tensors`` with each tensor object once (a guard refuses one object twice) and the pattern of repeats: None,
    or each argument's first position."""
    ids = tuple(map(id, tensors))
    if len(set(ids)) == len(ids):
        return tensors, None
    first = tuple(ids.index(i) for i in ids)
    return tuple(t for j, t in enumerate(tensors) if first[j] == j), first


def _aligned16(tensors) -> bool:
    """Every tensor starts on a 16-byte boundary."""
    address_bits = 0
    for t in tensors:
        address_bits |= t.data_ptr()
    return not address_bits & 15


def last_plan(name: str, tensors, rest: tuple):
    """The plan of ``name``'s last call if this call is the same kind (block comment above), else None.  ``tensors``:
    the call's tensor arguments in a fixed order (not None; a cache object's pages tensor), ``rest`` a tuple of plain
    values, both made the same way for every call of ``name``."""
    entry = _PLANS.get(("last", name)) if LAST_PLANS else None
    if entry is None or entry[1] != rest:
        return None
    guard, _, repeats, stream, plan = entry
    if repeats is not None:                 # without repeats kept, a tensor given twice fails the guard's own check
        tensors, this_repeats = _once_each(tensors)
        if this_repeats != repeats:
            return None
    try:
        if not guard.check(*tensors):
            return None
    except Exception:                       # noqa: BLE001 — a guard that cannot tell: the keyed path decides
        return None
    if not _aligned16(tensors) or raw_stream(tensors[0].device) != stream:
        return None
    return plan


def keep_last_plan(name: str, key, tensors, rest: tuple, plan):
    """Keep ``plan`` — the plan of ``key`` — as ``name``'s last plan, guarded by this call's ``tensors`` and
    ``rest`` (:func:`last_plan`); returns ``plan``.  Not kept without a key, when a tensor starts off 16 bytes (the
    key holds each tensor's alignment; such calls stay on the keyed path) or when the guard cannot be made."""
    if not LAST_PLANS or key is None:
        return plan
    tensors, repeats = _once_each(tensors)
    if not _aligned16(tensors):
        return plan
    made = ("guard", key, rest, repeats)
    try:
        guard = _PLANS.get(made)
        if guard is None:
            guard = TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                 dynamic_dims_strides=[list(t.stride()) for t in tensors])
            _PLANS[made] = guard
        stream = raw_stream(tensors[0].device)
    except Exception:                       # noqa: BLE001 — no guard, no last plan: the keyed path stays correct
        return plan
    _PLANS[("last", name)] = (guard, rest, repeats, stream, plan)
    return plan


_NO_GUARD = contextlib.nullcontext()


def on_device(device: torch.device):
    """``torch.cuda.device(device)`` where it is not already the current device (the common case costs nothing)."""
    return _NO_GUARD if device.index == torch.cuda.current_device() else torch.cuda.device(device)


def check_num_splits(num_splits) -> None:
    """``None`` (heuristic) or a positive int; anything else is refused."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None (heuristic), got {num_splits!r}")


_PLACEHOLDERS: dict[torch.device, dict[str, torch.Tensor]] = {}
_PLACEHOLDER_SPECS = {  # name: (dtype, value, shape)
    "sink": (torch.float32, 0.0, (1,)),
    "indices": (torch.int32, -1, (1, 1, 1)), "lse": (torch.float32, float("nan"), (1, 1, 1)),
    "lengths": (torch.int32, 0, (1,)), "cache": (torch.uint8, 0, (1, 16)),
}


def placeholder(device, name: str) -> torch.Tensor:
    """Stand-ins for arguments a build does not use (no sink, no NVFP4 output, no index list), allocated once
    per device."""
    bank = _PLACEHOLDERS.setdefault(device, {})
    if name not in bank:
        dtype, value, shape = _PLACEHOLDER_SPECS[name]
        bank[name] = torch.full(shape, value, dtype=dtype, device=device)
    return bank[name]


def sink_passer(sink, device) -> Callable:
    """How a call plan hands the sink to its kernels, decided once from the plan's first call (its key holds the sink's
    strides and 16-byte alignment, so every later call of the plan is the same case): the placeholder without a sink,
    the caller's tensor itself when it is contiguous from an aligned start, else :func:`sink_arg`'s copy per call."""
    if sink is None:
        none = placeholder(device, "sink")
        return lambda sink: none
    if sink.is_contiguous() and aligned16(sink):
        return lambda sink: sink
    return lambda sink: sink_arg(sink, device)


def sink_arg(sink, device) -> torch.Tensor:
    """The sink as the kernels read it: contiguous from a 16-byte aligned start (a copy only where the caller's is
    not), or the placeholder."""
    if sink is None:
        return placeholder(device, "sink")
    sink = sink.contiguous()
    return sink if aligned16(sink) else sink.clone()


_UNREAD: dict[tuple, torch.Tensor] = {}


def unread_lse(device, shape: tuple) -> torch.Tensor:
    """An fp32 LSE output of ``shape`` that a build must write but nobody reads (the caller did not ask for the LSE:
    the combine and the hd512 / FP8 builds always write theirs), allocated once per (device, shape) instead of per
    call (a CUDA ``torch.empty`` is ~2.6 µs of host time).  Calls on different streams may write it at the same
    time: nothing reads it, so what it holds does not matter."""
    key = (device, shape)
    lse = _UNREAD.get(key)
    if lse is None:                # kept for good, like the workspaces: kernels on any stream may still write it
        lse = _UNREAD[key] = torch.empty(shape, dtype=torch.float32, device=device)
    return lse


def lse_output(device, shape: tuple, wanted: bool, written: bool = True) -> Callable[[], torch.Tensor]:
    """How a call plan gets the LSE tensor its launch writes, decided once: a new fp32 tensor of ``shape`` per call
    when the caller asked for it (``wanted``), else :func:`unread_lse`'s kept buffer when the build writes one anyway
    (``written``), else the one-element placeholder of a build that writes none."""
    if wanted:
        return lambda: torch.empty(shape, dtype=torch.float32, device=device)
    kept = unread_lse(device, shape) if written else placeholder(device, "lse")
    return lambda: kept


_WORKSPACE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(splits: int, B: int, Sq: int, H: int, D: int, device, stream: int,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial O ``(splits, B, Sq, H, D)`` (fp32, or ``dtype``: the D7 decode's bf16 partials) and fp32 LSE
    ``(splits, B, H, Sq)`` for split-KV, allocated once per shape, dtype and stream (:func:`raw_stream`) and reused:
    two streams running the same split shape at once write their own partials (a plan that holds a workspace is
    keyed by its stream too)."""
    key = (splits, B, Sq, H, D, device, stream, dtype)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = (torch.empty(splits, B, Sq, H, D, dtype=dtype, device=device),
                           torch.empty(splits, B, H, Sq, dtype=torch.float32, device=device))
    return _WORKSPACE[key]


_AMAX_CACHE: dict[tuple, torch.Tensor] = {}


def amax_tensor(amax, device) -> torch.Tensor:
    """A static amax as a device tensor: a tensor is used as is; a Python number is copied to the device once
    (as a ``(1,)`` tensor) and cached (a host→device copy per call would stall the host behind the GPU queue)."""
    if isinstance(amax, torch.Tensor):
        return amax.to(device=device, dtype=torch.float32)
    key = (float(amax), device)
    if key not in _AMAX_CACHE:
        if len(_AMAX_CACHE) > 64:
            _AMAX_CACHE.clear()
        _AMAX_CACHE[key] = torch.tensor([float(amax)], dtype=torch.float32, device=device)     # (1,): as the kernels take it
    return _AMAX_CACHE[key]


_DEVICE_FACTS: dict = {}


def device_facts(device) -> tuple[str, int]:
    """(name, multiprocessor count) of a CUDA device, read once."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if idx not in _DEVICE_FACTS:
        props = torch.cuda.get_device_properties(idx)
        _DEVICE_FACTS[idx] = (props.name, props.multi_processor_count)
    return _DEVICE_FACTS[idx]


_CAPABILITY: dict = {}


def capability(device) -> tuple[int, int]:
    """A CUDA device's compute capability, read once."""
    if device not in _CAPABILITY:
        _CAPABILITY[device] = torch.cuda.get_device_capability(device)
    return _CAPABILITY[device]


def check_hopper(device, what: str) -> None:
    major, minor = capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"{what} runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor} (sm_100a kernels are "
                           "compiled, not run, in this project)")
