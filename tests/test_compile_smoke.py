"""The smoke kernel builds for both archs on any machine, and runs correctly on a Hopper GPU."""
import pytest
import torch

from dsv4lib.kernels import smoke


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_smoke_compiles_for_arch(arch):
    k = smoke.compile_axpy(arch)
    assert k.ptx_target == arch
    assert k.count(r"\bfma\.rn\.f32\b") >= 1          # the axpy really is in the PTX


@pytest.mark.gpu
def test_smoke_runs_on_gpu():
    k = smoke.compile_axpy("sm_90a")
    x = torch.randn(100_003, device="cuda")
    y = torch.randn(100_003, device="cuda")
    expect = 2.5 * x + y
    smoke.axpy_(x, y, 2.5, k)
    torch.testing.assert_close(y, expect)
    with pytest.raises(TypeError):
        smoke.axpy_(x.double(), y, 1.0, k)


@pytest.mark.compile
def test_kernels_launch_on_the_callers_stream_with_the_same_device_code():
    """Every public function passes torch's current stream (``dsv4lib.ops.launch.current_stream``) as the kernels'
    last argument, so they order with the torch work around them and can be captured in CUDA graphs.  The
    stream is a host-side launch parameter: each build with a stream has the PTX of the build without one."""
    import cuda.bindings.driver as cuda
    from dsv4lib.kernels.combine import LSECombineKernel
    from dsv4lib.kernels.combine import fake_args as combine_fake
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.nvfp4 import NVFP4DequantizeKernel, NVFP4QuantizeKernel, fake_dequantize_args
    from dsv4lib.kernels.nvfp4 import fake_args as quant_fake
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.ops.sparse import fake_args as sparse_fake
    builds = {
        "attention": (lambda: FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=True, has_lse=True, overlap=True)),
                      lambda: fake_attention_args(128)),
        "hd512": (lambda: SparseAttentionForwardSm90(SparseFwdConfig(gather=True, has_lse=True)), lambda: sparse_fake(True)),
        "combine": (lambda: LSECombineKernel(128, has_sink=True), lambda: combine_fake(128)),
        "quantize": (lambda: NVFP4QuantizeKernel(False), quant_fake),
        "dequantize": (lambda: NVFP4DequantizeKernel(), fake_dequantize_args),
    }
    strip = lambda ptx: [l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "//"))]
    for name, (make, args) in builds.items():
        plain = compile_for_arch(make(), *args(), arch="sm_90a")
        streamed = compile_for_arch(make(), *args(), cuda.CUstream(0), arch="sm_90a")
        assert strip(plain.ptx) == strip(streamed.ptx), name


def _ops(name):
    import importlib
    return importlib.import_module(f"dsv4lib.ops.{name}")     # dsv4lib.ops re-exports functions of the same names


def _reaching_compiled(real_compiled, launched: list):
    """``launch.compiled`` wrapped: every compiled function it hands out must, when called, get through its build's
    argument checks and stop only at the launch itself (there is no GPU); each call appends to ``launched`` the number
    of kernels its build launches (a ``launch.Sequence`` build's key is ``("sequence", *its builds' keys)``)."""
    def compiled(key, *args, **kwargs):
        kernels = len(key) - 1 if isinstance(key, tuple) and key and key[0] == "sequence" else 1
        fn = real_compiled(key, *args, **kwargs)

        def launch_or_stop(*call_args):
            with pytest.raises(Exception) as err:
                fn(*call_args)
            assert not isinstance(err.value, (ValueError, TypeError)), err.value      # an argument check failed
            assert "cuda" in str(err.value).lower(), err.value
            launched.append(kernels)
        return launch_or_stop
    return compiled


def _without_a_gpu(monkeypatch, stream_modules, device_modules) -> list:
    """What the plan tests switch off on a machine without a GPU: the runtime's arch (so sm_90a builds load), the raw
    stream (0) in ``stream_modules``, and in ``device_modules`` whichever of the Hopper check, the device guard and
    the device facts (an H200's 132 SMs) they use; every compiled function is wrapped by :func:`_reaching_compiled`.
    Returns the list the wrapped functions report into."""
    from cutlass.cutlass_dsl import CuTeDSL
    launch = _ops("launch")
    monkeypatch.setattr(CuTeDSL._get_dsl().envar, "arch", "sm_90a")
    for module in stream_modules:
        monkeypatch.setattr(module, "raw_stream", lambda device: 0)
    stand_ins = {"check_hopper": lambda device, what: None, "on_device": lambda device: launch._NO_GUARD,
                 "device_facts": lambda device: ("NVIDIA H200", 132)}
    # the combine launcher asks the device facts too (which merge kernel: rows against SMs)
    for module in (*device_modules, _ops("combine")):
        for name, stand_in in stand_ins.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, stand_in)
    launched = []
    monkeypatch.setattr(launch, "compiled", _reaching_compiled(launch.compiled, launched))
    return launched


def _plans_reach_their_launches(calls: dict, launched: list, monkeypatch):
    """Each call of ``calls`` (name: (call, kernels it launches)) twice, with every multi-kernel call going out as one
    compiled function (``launch.ONE_CALL``) and as one per kernel: the kernels reached, one plan per kind."""
    launch = _ops("launch")
    for one_call in (True, False):
        monkeypatch.setattr(launch, "ONE_CALL", one_call)
        launch.forget_plans()
        for name, (call, kernels) in calls.items():
            for repeat in range(2):
                launched.clear()
                plans = launch.plan_count()
                call()
                assert launched == ([kernels] if one_call else [1] * kernels), (name, one_call)
                assert launch.plan_count() == plans + (repeat == 0), name      # the second call took the first's plan


@pytest.mark.compile
@pytest.mark.no_gpu
def test_tvm_ffi_builds_take_the_arguments_each_public_launch_passes(monkeypatch):
    """The public functions compile each kernel with CuTeDSL's TVM-FFI ABI from one argument list and call it with
    another (torch tensors, Python numbers, the raw stream).  On CPU tensors every launch path gets through the build's
    argument checks (dtype, rank, static extents, strides, alignment, done in C before the launch) and stops only at
    the launch itself — there is no GPU.  A tensor that does not fit the build is refused by those checks."""
    from cutlass.cutlass_dsl import CuTeDSL
    # no GPU here: CuTeDSL takes the runtime to be sm_100 and would not load an sm_90a build's host side at all
    monkeypatch.setattr(CuTeDSL._get_dsl().envar, "arch", "sm_90a")
    _check_tvm_ffi_launches(monkeypatch)


def _check_tvm_ffi_launches(monkeypatch):
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    attention, sparse, combine, nvfp4, launch, decode = (_ops(n) for n in ("attention", "sparse", "combine", "nvfp4",
                                                                            "launch", "decode"))
    for module in (attention, sparse, combine, nvfp4, decode):
        monkeypatch.setattr(module, "raw_stream", lambda device: 0)
    monkeypatch.setattr(combine, "device_facts", lambda device: ("NVIDIA H200", 132))     # which merge kernel

    def reaches_launch(call):
        with pytest.raises(Exception) as err:
            call()
        assert not isinstance(err.value, (ValueError, TypeError)), err.value     # an argument check failed
        assert "cuda" in str(err.value).lower(), err.value

    gen = torch.Generator().manual_seed(0)
    bf = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)
    q, k = bf(1, 300, 4, 128), bf(1, 300, 4, 128)
    sink = launch.sink_arg(torch.randn(4, generator=gen), q.device)
    for config, o, lse, extra in (
            (Sm90FwdConfig.for_problem(128, causal=True), torch.empty_like(q), torch.empty(1, 4, 300), {}),
            (Sm90FwdConfig.for_problem(128, window=64, split_kv=True), torch.empty(3, 1, 300, 4, 128),
             torch.empty(3, 1, 4, 300), {}),
            (Sm90FwdConfig.for_problem(128, sink=True, has_lse=False, nvfp4_out=True),
             torch.empty(1, 300, 4, 64, dtype=torch.uint8).view(torch.int32), torch.empty(1, 4, 300),
             dict(out_scales=torch.empty(1, 300, 4, 8, dtype=torch.uint8).view(torch.int32), s_enc=torch.ones(1)))):
        reaches_launch(lambda: attention.launch(config, q, k, k, o, lse, scale=0.1, window=64, sink_t=sink, **extra))
    q4, kv, idx = bf(1, 2, 64, 512), bf(1, 100, 512), torch.randint(-1, 100, (1, 2, 128), dtype=torch.int32)
    o_part, lse_part = torch.empty(2, 1, 2, 64, 512), torch.empty(2, 1, 64, 2)
    sink64 = launch.sink_arg(torch.randn(64, generator=gen), q.device)
    reaches_launch(lambda: sparse.launch(SparseFwdConfig.for_problem(gather=True, split_kv=True), q4, kv, idx, o_part,
                                         lse_part, sink64, scale=0.05, window=None))
    # sparse_attention's public build: the caller's unbatched tensors, unsplit and into the split workspace
    reaches_launch(lambda: sparse.launch(SparseFwdConfig.for_problem(gather=True, sink=True), q4[0], kv[0], idx[0],
                                         torch.empty(2, 64, 512, dtype=torch.bfloat16), torch.empty(64, 2), sink64,
                                         scale=0.05, window=None, public="sparse"))
    reaches_launch(lambda: sparse.launch(SparseFwdConfig.for_problem(gather=True, split_kv=True), q4[0], kv[0], idx[0],
                                         o_part, lse_part, sink64, scale=0.05, window=None, public="sparse"))
    with pytest.raises((ValueError, TypeError)):             # the public build's q has no batch mode
        sparse.launch(SparseFwdConfig.for_problem(gather=True, sink=True), q4, kv[0], idx[0],
                      torch.empty(2, 64, 512, dtype=torch.bfloat16), torch.empty(64, 2), sink64, scale=0.05,
                      window=None, public="sparse")
    # attention's head-dim-512 build: the caller's k [B, Skv, 1, 512], the outputs as returned (unsplit) or the
    # split workspace (dense keys: the index list is the placeholder)
    k4, no_idx = bf(1, 100, 1, 512), torch.full((1, 1, 1), -1, dtype=torch.int32)
    reaches_launch(lambda: sparse.launch(SparseFwdConfig.for_problem(gather=False, causal=True, sink=True), q4, k4,
                                         no_idx, torch.empty(1, 2, 64, 512, dtype=torch.bfloat16),
                                         torch.empty(1, 64, 2), sink64, scale=0.05, window=None, public="mqa"))
    reaches_launch(lambda: sparse.launch(SparseFwdConfig.for_problem(gather=False, split_kv=True), q4, k4, no_idx,
                                         o_part, lse_part, sink64, scale=0.05, window=None, public="mqa"))
    with pytest.raises((ValueError, TypeError)):             # a k with two heads: the build's static unit mode
        sparse.launch(SparseFwdConfig.for_problem(gather=False, causal=True, sink=True), q4, bf(1, 100, 2, 512),
                      no_idx, torch.empty(1, 2, 64, 512, dtype=torch.bfloat16), torch.empty(1, 64, 2), sink64,
                      scale=0.05, window=None, public="mqa")
    out, lse = torch.empty(1, 2, 64, 512, dtype=torch.bfloat16), torch.empty(1, 64, 2)
    reaches_launch(lambda: combine.combine_partials(o_part, lse_part, out, lse, sink64, has_sink=True))
    reaches_launch(lambda: combine.combine_partials(o_part, lse_part, out[0], lse[0], sink64, has_sink=True))
    # bf16 partials (the FP8 decode's) are a build of their own; an LSE that is not fp32 is refused by the build
    reaches_launch(lambda: combine.combine_partials(o_part.bfloat16(), lse_part, out, lse, sink64, has_sink=True))
    with pytest.raises((ValueError, TypeError)):
        combine.combine_partials(o_part, lse_part.bfloat16(), out, lse, sink64, has_sink=True)
    with pytest.raises((ValueError, TypeError)):             # head dim 512 is static in the sparse build
        sparse.launch(SparseFwdConfig.for_problem(gather=True, split_kv=True), q4, kv[..., :256].contiguous(), idx,
                      o_part, lse_part, sink64, scale=0.05, window=None)
    # the FP8 decode: the unsplit build writes sparse_decode's outputs as returned, the split build its workspace
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.reference.model1 import page_bytes
    q1 = bf(2, 1, 64, 512)
    cache_args = (torch.zeros(3, page_bytes(64), dtype=torch.uint8), torch.zeros(2, 1, 128, dtype=torch.int32),
                  torch.zeros(2, dtype=torch.int32), torch.zeros(3, page_bytes(64), dtype=torch.uint8),
                  torch.zeros(2, 1, 64, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 64, 64)
    flags = dict(extra_cache=True, topk_length=True, extra_topk_length=True)
    unsplit = Model1DecodeConfig.for_decode(sink=True, split_kv=False, **flags)
    reaches_launch(lambda: decode.launch(unsplit, (q1, *cache_args, torch.empty(2, 1, 64, 512, dtype=torch.bfloat16),
                                                   torch.empty(2, 64, 1), 0.05, sink64), public=True))
    reaches_launch(lambda: decode.launch(Model1DecodeConfig.for_decode(sink=False, split_kv=True, **flags),
                                         (q1, *cache_args, torch.empty(2, 2, 1, 64, 512, dtype=torch.bfloat16),
                                          torch.empty(2, 2, 64, 1), 0.05, sink64)))
    # NVFP4 quantize / dequantize: the builds the ops compile, called as the ops call them
    from dsv4lib.kernels.nvfp4 import NVFP4DequantizeMatrixKernel, NVFP4QuantizeMatrixKernel
    import cutlass.cute as cute
    x = bf(8, 64)
    quant = (x, torch.empty(8, 32, dtype=torch.uint8), torch.empty(8, 4, dtype=torch.uint8), torch.ones(1), torch.empty(1))
    dequant = (quant[1], quant[2], torch.ones(1), torch.empty(8, 64, dtype=torch.bfloat16))
    for kernel, tensors, make_args in ((NVFP4QuantizeMatrixKernel(False), quant, nvfp4.matrix_args),
                                       (NVFP4DequantizeMatrixKernel(), dequant, nvfp4.dequantize_matrix_args)):
        fn = cute.compile(kernel, *make_args(*tensors, tvm_ffi=True), options="--gpu-arch sm_90a --enable-tvm-ffi")
        reaches_launch(lambda: fn(*tensors, 0))


@pytest.mark.compile
@pytest.mark.no_gpu
def test_the_plans_of_the_hd512_paths_pass_each_launch_its_builds_checks(monkeypatch):
    """The call plans of ``attention`` at head dim 512 (the public MQA build, unsplit and split + combine) and of
    ``sparse_attention``'s split path (the combine on unbatched outputs), run on CPU tensors with the device checks
    switched off: every launch of a plan — the split kernel and the combine after it — gets through its TVM-FFI
    build's argument checks (dtype, rank, static extents, strides, alignment) and stops only at the launch itself;
    a second call of the same kind takes the same plan.  What the GPU tests check for values, this checks for the
    plumbing, without a GPU."""
    import dsv4lib
    attention, sparse, combine = (_ops(n) for n in ("attention", "sparse", "combine"))
    launched = _without_a_gpu(monkeypatch, (attention, sparse, combine), (attention, sparse))
    monkeypatch.setattr(attention, "_validate", lambda *a: None)
    monkeypatch.setattr(sparse, "_check_placement", lambda name, t: None)
    monkeypatch.setattr(sparse, "active_clusters", lambda cluster, device: 132 // cluster)
    gen = torch.Generator().manual_seed(0)
    bf = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)
    q, k = bf(1, 2, 64, 512), bf(1, 300, 1, 512)
    sink = torch.randn(64, generator=gen)
    qs, kv, idx = bf(2, 64, 512), bf(500, 512), torch.randint(-1, 500, (2, 640), generator=gen, dtype=torch.int32)
    q2, k2 = bf(2, 3, 64, 512), bf(2, 450, 1, 512)
    idx2 = torch.randint(-1, 300, (1, 400), generator=gen, dtype=torch.int32)
    calls = {
        "hd512 unsplit": (lambda: dsv4lib.attention(q, k, k, sink=sink, num_splits=1), 1),
        "hd512 split + combine": (lambda: dsv4lib.attention(q, k, k, causal=True, num_splits=4, return_lse=True), 2),
        "sparse split + combine": (lambda: dsv4lib.sparse_attention(qs, kv, idx, sink=sink, num_splits=4), 2),
        # two splits: one cluster merges them into the output (ops.sparse.PAIRED_CLUSTER_SPLITS), no combine
        "sparse split 2, one cluster": (lambda: dsv4lib.sparse_attention(qs, kv, idx, sink=sink, num_splits=2), 1),
        # the same builds at other extents (another plan each): nothing the builds leave dynamic may be baked in
        "hd512 split + combine, other lengths": (lambda: dsv4lib.attention(q2, k2, k2, causal=True, num_splits=4,
                                                                           return_lse=True), 2),
        "sparse split + combine, other lengths": (lambda: dsv4lib.sparse_attention(qs[:1], kv[:300], idx2, sink=sink,
                                                                                   num_splits=4), 2),
        "sparse split 2, one cluster, other lengths": (lambda: dsv4lib.sparse_attention(qs[:1], kv[:300], idx2,
                                                                                        sink=sink, num_splits=2), 1),
    }
    _plans_reach_their_launches(calls, launched, monkeypatch)


@pytest.mark.compile
@pytest.mark.no_gpu
def test_the_plans_of_the_dense_paths_pass_each_launch_its_builds_checks(monkeypatch):
    """As above for the dense kernel's public functions: ``attention`` (unsplit and split + combine),
    ``attention_branches`` (a launch per earlier branch into its workspace slot, then the last branch's build that
    merges them — two branches, two launches; three, three; one, one), ``attention_nvfp4`` and
    ``attention_fp32`` — every launch of each plan passes its build's argument checks, twice, one plan per kind."""
    import dsv4lib
    attention, combine = _ops("attention"), _ops("combine")
    launched = _without_a_gpu(monkeypatch, (attention, combine), (attention,))
    monkeypatch.setattr(attention, "_validate", lambda *a: None)
    gen = torch.Generator().manual_seed(0)
    bf = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)
    q, k, v = bf(1, 300, 4, 128), bf(1, 300, 4, 128), bf(1, 300, 4, 128)
    qd, kd = bf(2, 1, 4, 128), bf(2, 3000, 4, 128)
    qd3, kd3 = bf(3, 2, 4, 128), bf(3, 1700, 4, 128)
    sink = torch.randn(4, generator=gen)
    branches = [dict(k=k, v=v, window=64, causal=True), dict(k=k[:, :200], v=v[:, :200])]
    calls = {
        "attention": (lambda: dsv4lib.attention(q, k, v, causal=True, sink=sink), 1),
        "attention split + combine": (lambda: dsv4lib.attention(qd, kd, kd, num_splits=4, return_lse=True), 2),
        "attention split + combine, other lengths": (lambda: dsv4lib.attention(qd3, kd3, kd3, num_splits=4,
                                                                               return_lse=True), 2),
        "attention_branches": (lambda: dsv4lib.attention_branches(q, branches, sink=sink, return_lse=True), 2),
        "attention_branches, other lengths": (lambda: dsv4lib.attention_branches(
            q[:, :170].contiguous(), [dict(k=k[:, :250], v=v[:, :250], window=64, causal=True),
                                      dict(k=k[:, :90], v=v[:, :90])], sink=sink, return_lse=True), 2),
        "attention_branches, three": (lambda: dsv4lib.attention_branches(
            q, [dict(k=k[:, :90], v=v[:, :90]), *branches], return_lse=False), 3),
        "attention_branches, one": (lambda: dsv4lib.attention_branches(q, branches[:1], sink=sink), 1),
        "attention_nvfp4": (lambda: dsv4lib.attention_nvfp4(q, k, v, 8.0, window=64), 1),
        "attention_fp32": (lambda: dsv4lib.attention_fp32(q, k, v), 1),
    }
    _plans_reach_their_launches(calls, launched, monkeypatch)


def _entries(ptx: str) -> list[str]:
    """The device code of each kernel entry of a module, in order (``_builds.device_code``, branch labels numbered
    per module made neutral)."""
    import re
    from _builds import device_code
    code = re.sub(r"\$L__BB\d+_", "$L__BB_", device_code(ptx))
    return re.findall(r"^\.(?:visible|weak)?\s*\.entry.*?^\}", code, flags=re.M | re.S)


@pytest.mark.compile
@pytest.mark.no_gpu
def test_a_one_call_sequence_launches_each_kernel_with_its_own_builds_device_code(monkeypatch):
    """A call that launches several kernels (split + combine, a kernel per branch with the last one merging, the FP8
    decode's split + PDL combine) goes out as ONE compiled TVM-FFI function (``launch.Sequence``, issue #28: one round of argument
    checks instead of one per kernel).  Its module holds exactly the kernels of the separate builds, in launch order,
    each byte for byte the device code its own build compiles to; and the sequence's arguments pass the builds'
    argument checks and stop only at the launch (no GPU here)."""
    from cutlass.cutlass_dsl import CuTeDSL
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.reference.model1 import page_bytes
    attention, combine, launch, decode = (_ops(n) for n in ("attention", "combine", "launch", "decode"))
    monkeypatch.setattr(CuTeDSL._get_dsl().envar, "arch", "sm_90a")
    for module in (attention, combine, decode, _ops("sparse")):
        monkeypatch.setattr(module, "raw_stream", lambda device: 0)
    monkeypatch.setattr(combine, "device_facts", lambda device: ("NVIDIA H200", 132))
    gen = torch.Generator().manual_seed(0)
    bf = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)
    cpu = torch.device("cpu")
    q, k = bf(2, 1, 4, 128), bf(2, 700, 4, 128)
    sink = launch.sink_arg(torch.randn(4, generator=gen), cpu)
    o_part, lse_part = torch.empty(2, 2, 1, 4, 128), torch.empty(2, 2, 4, 1)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1)
    split = lambda **problem: attention.launcher(Sm90FwdConfig.for_problem(128, split_kv=True, **problem), cpu,
                                                 scale=0.1, window=problem.get("window"))
    q1 = bf(2, 1, 64, 512)
    cache_args = (torch.zeros(3, page_bytes(64), dtype=torch.uint8), torch.zeros(2, 1, 128, dtype=torch.int32),
                  torch.zeros(2, dtype=torch.int32), torch.zeros(3, page_bytes(64), dtype=torch.uint8),
                  torch.zeros(2, 1, 64, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    d_part, d_lse_part = torch.empty(2, 2, 1, 64, 512, dtype=torch.bfloat16), torch.empty(2, 2, 64, 1)   # bf16 partials
    sink64 = launch.sink_arg(torch.randn(64, generator=gen), cpu)
    decode_split = decode.launcher(Model1DecodeConfig.for_decode(sink=False, split_kv=True, extra_cache=True,
                                                                 topk_length=True, extra_topk_length=True),
                                   cpu, page_size=64, page_size2=64, scale=0.05)
    cases = {
        "split + combine": [(split(), (q, k, k, o_part, lse_part, sink)),
                            (combine.combine_launcher(128, cpu, has_sink=True), (o_part, lse_part, out, lse, sink))],
        "branches, the last one merging": [
            (split(window=64), (q, k, k, o_part[:1], lse_part[:1], sink)),
            (split(), (q, k[:, :300], k[:, :300], o_part[1:], lse_part[1:], sink)),
            (attention.launcher(Sm90FwdConfig.for_problem(128, sink=True, overlap=False).replace(merge_slots=2), cpu,
                                scale=0.1, window=None, prev=(o_part, lse_part)), (q, k[:, :90], k[:, :90], out, lse, sink))],
        "FP8 decode split + PDL combine": [
            (decode_split, (q1, *cache_args, d_part, d_lse_part, sink64)),
            (combine.combine_launcher(512, cpu, has_sink=True, pdl=True),
             (d_part, d_lse_part, torch.empty(2, 1, 64, 512, dtype=torch.bfloat16), torch.empty(2, 64, 1), sink64))],
    }
    # quantize_nvfp4 without an amax: our own max |x| (one partial per CTA), then the quantize that reduces them
    nvfp4 = _ops("nvfp4")
    from dsv4lib.kernels import nvfp4 as nvfp4_kernels
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(24, 96, generator=gen).to(dtype)
        partials = torch.empty(nvfp4_kernels.amax_ctas(24 * 96 // 16, 132))
        data = torch.empty(24, 48, dtype=torch.uint8)
        amax = launch.Launch(lambda x, p: (x, p, 0), lambda x, p: (("amax", x.dtype), nvfp4_kernels.NVFP4AmaxKernel,
                                                                    lambda: nvfp4.amax_args(x, p, tvm_ffi=True)))
        quantize = launch.Launch(
            lambda *t: (*t, 0), lambda *t: (("quantize of x", x.dtype),
                                            lambda: nvfp4_kernels.NVFP4QuantizeMatrixKernel(False, amax_partials=True),
                                            lambda: nvfp4.matrix_args(*t, tvm_ffi=True, amax_partials=True)))
        cases[f"amax + quantize {dtype}"] = [
            (amax, (x, partials)),
            (quantize, (x, data, torch.empty(24, 6, dtype=torch.uint8), partials, torch.empty(1)))]
    for name, steps in cases.items():
        sequence = launch.Sequence(*(go for go, _ in steps))
        key, make_kernel, compile_args, arch = sequence.spec(*(tensors for _, tensors in steps))
        assert key == ("sequence", *(go.spec(*tensors)[0] for go, tensors in steps)), name
        together = _entries(compile_for_arch(make_kernel(), *compile_args(), arch="sm_90a",
                                             options="--enable-tvm-ffi").ptx)
        alone = [entry for go, tensors in steps for entry in _entries(compile_for_arch(
            go.spec(*tensors)[1](), *go.spec(*tensors)[2](), arch="sm_90a", options="--enable-tvm-ffi").ptx)]
        assert len(together) == len(steps) == len(alone), name
        assert together == alone, name
        with pytest.raises(Exception) as err:                     # the arguments pass every build's checks
            sequence(*(tensors for _, tensors in steps))
        assert not isinstance(err.value, (ValueError, TypeError)), (name, err.value)
        assert "cuda" in str(err.value).lower(), (name, err.value)


@pytest.mark.compile
@pytest.mark.no_gpu
def test_the_plans_of_quantize_and_dequantize_pass_each_launch_its_builds_checks(monkeypatch):
    """``quantize_nvfp4`` with a static amax (one kernel), without one (our own max |x| kernel, then the quantize that
    reduces its partials: two kernels, one compiled call) and ``dequantize_nvfp4``: every launch of each plan passes
    its build's argument checks and stops only at the launch, twice, one plan per kind."""
    import dsv4lib
    nvfp4, launch = _ops("nvfp4"), _ops("launch")
    launched = _without_a_gpu(monkeypatch, (nvfp4,), (nvfp4,))
    monkeypatch.setattr(nvfp4, "nvfp4_arch", lambda device, what: "sm_90a")
    monkeypatch.setattr(nvfp4, "_validate", lambda x: None)
    monkeypatch.setattr(nvfp4, "compiled", launch.compiled)          # the dequantize's build, wrapped as well
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 160, generator=gen).to(torch.bfloat16)
    data, scales = torch.zeros(40, 80, dtype=torch.uint8), torch.zeros(40, 10, dtype=torch.uint8)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))       # the dequantize takes its GPU path
    monkeypatch.setattr(nvfp4, "amax_tensor", lambda amax, device: torch.full((1,), float(amax)))
    amax_t = torch.tensor(6.0)
    calls = {
        "quantize_nvfp4 static amax": (lambda: dsv4lib.quantize_nvfp4(x, 6.0), 1),
        "quantize_nvfp4 amax of x": (lambda: dsv4lib.quantize_nvfp4(x), 2),
        # a 0-d fp32 amax on x's device: the plan hands the build a (1,) view of the caller's own bytes
        "quantize_nvfp4 tensor amax": (lambda: dsv4lib.quantize_nvfp4(x, amax_t), 1),
        "quantize_nvfp4 amax of x, fp32": (lambda: dsv4lib.quantize_nvfp4(x.float()), 2),
        # another shape, another partial count (1 instead of 4): the same build takes it (the count is dynamic)
        "quantize_nvfp4 amax of x, few blocks": (lambda: dsv4lib.quantize_nvfp4(x[:8, :64].contiguous()), 2),
        "dequantize_nvfp4": (lambda: dsv4lib.dequantize_nvfp4(data, scales, 0.5), 1),
    }
    _plans_reach_their_launches(calls, launched, monkeypatch)


@pytest.mark.compile
@pytest.mark.no_gpu
def test_the_plans_of_sparse_decode_pass_each_launch_its_builds_checks(monkeypatch):
    """``sparse_decode`` over two MODEL1 caches on CPU tensors (the device checks off): the split path (the decode's
    split kernel + the PDL combine, one compiled call) at B = 1 and, with other list lengths, at B = 2, and the unsplit
    public build at B = 80 — every launch passes its build's argument checks and stops only at the launch, twice,
    one plan per kind."""
    import dsv4lib
    from dsv4lib.ops.kvcache import Model1Cache
    decode, combine = _ops("decode"), _ops("combine")
    launched = _without_a_gpu(monkeypatch, (decode, combine), (decode,))
    monkeypatch.setattr(decode, "check_pages", lambda pages, page_size, name: None)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))      # the first call's q check
    gen = torch.Generator().manual_seed(0)
    window, compressed = Model1Cache(8, 64, device="cpu"), Model1Cache(16, 64, device="cpu")
    sink = torch.randn(64, generator=gen)

    def call(B, K1, K2):
        q = torch.randn(B, 1, 64, 512, generator=gen).to(torch.bfloat16)
        idx = torch.randint(-1, window.num_keys, (B, 1, K1), generator=gen, dtype=torch.int32)
        idx2 = torch.randint(-1, compressed.num_keys, (B, 1, K2), generator=gen, dtype=torch.int32)
        lengths = torch.full((B,), K1, dtype=torch.int32), torch.full((B,), K2 - 3, dtype=torch.int32)
        return lambda: dsv4lib.sparse_decode(q, window, idx, lengths[0], extra_k_cache=compressed,
                                             extra_indices=idx2, extra_topk_length=lengths[1], sink=sink)
    calls = {"B1 split + combine": (call(1, 128, 512), 2), "B2 split + combine, other lengths": (call(2, 64, 300), 2),
             "B80 unsplit": (call(80, 128, 512), 1)}
    _plans_reach_their_launches(calls, launched, monkeypatch)


@pytest.mark.compile
@pytest.mark.no_gpu
@pytest.mark.parametrize("problem", [dict(causal=True), dict(causal=True, window=128, sink=True), dict(split_kv=True),
                                     dict(causal=False, overlap=False)])
def test_operands_a_dense_build_does_not_read_go_as_none_with_the_same_device_code(problem):
    """``ops.attention.launcher`` passes None for what a build does not read (no sink, a split's sink, the NVFP4
    scales and S_enc of a bf16 build): a tensor argument costs host time, None nothing.  The kernel takes the LSE
    tensor in their place, so the build with None has the device code of the build with stand-in tensors, instruction
    for instruction; a build that reads one of them refuses None."""
    from _builds import device_code, instruction_counts
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args, fake_split_args
    config = Sm90FwdConfig.for_problem(128, gpu_name="H200", **problem)
    args = fake_split_args(128) if config.split_kv else fake_attention_args(128, config.dynamic_schedule)
    unread = (None if not config.sink else args[7], None, None)
    stand_ins = compile_for_arch(FlashAttentionForwardSm90(config), *args, arch="sm_90a")
    with_none = compile_for_arch(FlashAttentionForwardSm90(config), *args[:7], *unread, *args[10:], arch="sm_90a")
    assert instruction_counts(device_code(stand_ins.ptx)) == instruction_counts(device_code(with_none.ptx))
    if config.sink:
        with pytest.raises(Exception, match="a sink build reads mSink"):
            compile_for_arch(FlashAttentionForwardSm90(config), *args[:7], None, *args[8:], arch="sm_90a")
