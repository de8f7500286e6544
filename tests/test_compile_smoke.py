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
