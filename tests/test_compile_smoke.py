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
    from dsv4lib.kernels.sm90.config import SparseFwdConfig
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
