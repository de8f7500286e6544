"""NVFP4-1.0: the quantize kernel builds for both archs with the right E2M1 path, rejects bad input, and on a
Hopper GPU reproduces the reference's bytes exactly."""
import pytest
import torch

import dsv4lib
from dsv4lib.reference import quant as ref


def _build(arch, hardware_cvt, dtype_name="BFloat16"):
    import cutlass
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.nvfp4 import NVFP4QuantizeKernel, fake_args
    return compile_for_arch(NVFP4QuantizeKernel(hardware_cvt), *fake_args(getattr(cutlass, dtype_name)), arch=arch)


@pytest.mark.compile
@pytest.mark.parametrize("dtype_name", ["BFloat16", "Float16", "Float32"])
def test_sm90a_build_uses_the_software_encoder(dtype_name):
    k = _build("sm_90a", False, dtype_name)
    assert k.count(r"cvt\.rn\.satfinite\.e2m1x2") == 0                 # sm_90a has no FP4 conversion
    assert k.count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 1            # the block scale: hardware e4m3
    assert k.count(r"setp\.\w+\.u32") >= 7 * 16                        # 7 thresholds × 16 elements
    assert k.count(r"rcp\.rn\.f32|div\.rn\.f32") >= 2 and k.count("rcp.approx") == 0   # IEEE, as TE


@pytest.mark.compile
def test_sm100a_build_uses_the_hardware_cvt():
    k = _build("sm_100a", True)
    assert k.ptx_target == "sm_100a"
    assert k.count(r"cvt\.rn\.satfinite\.e2m1x2\.f32") == 8           # 16 values, two per instruction
    assert k.count("rcp.approx") == 0


@pytest.mark.compile
def test_hardware_cvt_is_rejected_for_sm90a():
    with pytest.raises(Exception, match="e2m1x2|not supported"):
        _build("sm_90a", True)


@pytest.mark.parametrize("x,exc,match", [
    (torch.randn(4, 24), ValueError, "multiple of 16"),
    (torch.randn(64), ValueError, "2-D"),
    (torch.randint(0, 4, (4, 32)), TypeError, "bfloat16"),
    (torch.randn(4, 32, dtype=torch.float64), TypeError, "bfloat16"),
    (torch.randn(4, 32), ValueError, "CUDA"),
    ([1.0] * 32, TypeError, "torch.Tensor"),
])
def test_bad_input_is_rejected(x, exc, match):
    with pytest.raises(exc, match=match):
        dsv4lib.quantize_nvfp4(x)


def _hard_inputs(M, K, gen):
    """Random, outlier-heavy, all-zero blocks, tiny blocks and exact e2m1 midpoints, freshly made."""
    x = torch.randn(M, K, generator=gen)
    x[::7] *= 50                                                      # outlier rows
    x[1, :16] = 0                                                     # an all-zero block
    x[2, 16:32] = 1e-30                                               # a tiny block (scale underflows)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[3, :16] = torch.cat([mids, -mids])                              # ties at every midpoint
    x[4, :] = -0.0
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("M,K", [(256, 1024), (130, 80), (1, 16)])
def test_bytes_equal_the_reference(dtype, M, K):
    gen = torch.Generator().manual_seed(M + K)
    x = _hard_inputs(max(M, 5), K, gen)[:M].to(dtype)
    for amax in (None, 2688.0 if M > 3 else None):
        data, sf, gs = dsv4lib.quantize_nvfp4(x.cuda(), amax)
        rd, rs, rgs = ref.nvfp4_quantize(x, amax)
        assert torch.equal(data.cpu(), rd), (data.cpu() != rd).sum()
        assert torch.equal(sf.cpu(), rs), (sf.cpu() != rs).sum()
        assert gs.item() == rgs.item()


@pytest.mark.gpu
def test_swizzled_scales_and_round_trip():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 512, generator=gen).cuda().bfloat16()
    data, sf, gs = dsv4lib.quantize_nvfp4(x)
    _, sw, _ = dsv4lib.quantize_nvfp4(x, swizzle=True)
    assert torch.equal(ref.unswizzle_scales(sw.cpu(), 300, 32), sf.cpu())
    y = dsv4lib.dequantize_nvfp4(data, sf, gs, out_dtype=torch.float32)
    cos = torch.nn.functional.cosine_similarity(y.flatten(), x.float().flatten(), 0).item()
    assert cos >= 0.99
