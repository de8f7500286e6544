"""NVFP4-1.0: the quantize kernel builds for both archs with the right E2M1 path, rejects bad input, and on a
Hopper GPU reproduces the reference's bytes exactly."""
import pytest
import torch

import dsv4lib
from dsv4lib.reference import quant as ref


def _build(arch, hardware_cvt, dtype_name="BFloat16", **knobs):
    import cutlass
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.nvfp4 import NVFP4QuantizeKernel, fake_args
    return compile_for_arch(NVFP4QuantizeKernel(hardware_cvt, **knobs), *fake_args(getattr(cutlass, dtype_name)),
                            arch=arch)


def _common_sm90a_checks(k):
    assert k.count(r"cvt\.rn\.satfinite\.e2m1x2") == 0                 # sm_90a has no FP4 conversion
    assert k.count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 1               # the block scale: hardware e4m3
    # IEEE divisions, as TE: S_enc and S_dec once per thread, enc = 1 / (sf · S_dec) per block
    assert k.count(r"rcp\.rn\.f32|div\.rn\.f32") == 3 and k.count("rcp.approx") == 0
    assert k.count(r"ld\.global\.v4") >= 2 and k.count(r"st\.global\.v2\.b32") == 1


@pytest.mark.compile
@pytest.mark.parametrize("dtype_name", ["BFloat16", "Float16", "Float32"])
def test_sm90a_build_uses_the_line_encoder(dtype_name):
    """The default sm_90a encoder (``quantize_block_lines``): per value one IEEE multiply, three single-rounding
    FMAs (the lines 2a, a + 2, a/2 + 4 onto 2^23), three fp32 mins (the clamp at 6 and two) and one IMAD that
    packs the code, and no integer min/max, shift-per-value or compare; signs by prmt (sign-replicate), 4 per
    word from packed pairs, 6 from fp32 words."""
    k = _build("sm_90a", False, dtype_name, depth=1)
    _common_sm90a_checks(k)
    assert k.count(r"fma\.rn\.f32") == 3 * 16
    assert k.count(r"min\.f32") == 3 * 16 + 3                     # clamp + 2 per value; S_enc's, the scale's two
    assert k.count(r"mad\.lo\.u32") == 16
    assert k.count(r"mul\.rn\.f32") == 16                                 # fl(|x| · enc)
    assert k.count(r"(max|min)\.u32") == 0 and k.count(r"setp\.\w+\.u32") < 4
    assert k.count(r"prmt\.b32") == (12 if dtype_name == "Float32" else 8)
    if dtype_name != "Float32":                                             # the block max: 7 packed max-abs
        assert k.count(r"max\.xorsign\.abs\.(bf16|f16)x2") == 7


@pytest.mark.compile
@pytest.mark.parametrize("dtype_name", ["BFloat16", "Float32"])
def test_sm90a_magic_encoder_build(dtype_name):
    """The first encoder (``encoder="magic"``), kept as a knob: per value one binade max and one saturating min on
    the integer ALU (no threshold compares)."""
    k = _build("sm_90a", False, dtype_name, encoder="magic", depth=1)
    _common_sm90a_checks(k)
    assert k.count(r"max\.u32") == 16 and k.count(r"min\.u32") == 16
    assert k.count(r"setp\.\w+\.u32") < 16                             # only the bounds checks


@pytest.mark.compile
@pytest.mark.parametrize("depth", [2, 4])
def test_register_pipeline_build(depth):
    """``depth`` tiles in flight per thread: ``depth`` block loads up front plus ``depth`` refills in the loop,
    ``depth`` encoded blocks per round, one dynamic loop over rounds."""
    k = _build("sm_90a", False, depth=depth, max_ctas=1056)
    assert k.count(r"ld\.global\.v4\.b32") == 2 * 2 * depth                # 32 B per block: 2 × 16 B loads
    assert k.count(r"st\.global\.v2\.b32") == depth
    assert k.count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == depth


@pytest.mark.compile
def test_block_loads_are_issued_before_the_amax_round_trip():
    """The x loads come first in the kernel, ahead of the amax load and the s_dec store (which the compiler must
    assume may alias x), so no CTA waits for two memory round trips in a row (no measurable gain on the
    H200, but the order is the intent and is kept): all ``DEPTH`` blocks of the first round."""
    import re
    from dsv4lib.kernels.nvfp4 import DEPTH
    k = _build("sm_90a", False)
    accesses = [m.group(0) for m in re.finditer(r"(ld|st)\.global[.\w]*", k.ptx)]
    first_scalar = accesses.index("ld.global.b32")                          # amax
    assert accesses[:first_scalar] == ["ld.global.v4.b32"] * 2 * DEPTH, accesses    # 32 B per block: 2 × 16 B
    assert accesses.index("st.global.b32") > first_scalar                   # s_dec after both


@pytest.mark.compile
def test_sm100a_build_uses_the_hardware_cvt():
    k = _build("sm_100a", True, depth=1)
    assert k.ptx_target == "sm_100a"
    assert k.count(r"cvt\.rn\.satfinite\.e2m1x2\.f32") == 8             # 16 values, two per instruction
    assert k.count("rcp.approx") == 0


@pytest.mark.compile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_public_functions_arguments_compile(dtype):
    """The GPU call compiles from runtime tensors, not from fake_args: build from those exact arguments (CPU
    tensors, same types), so a static/dynamic shape mismatch shows up in CI and not first on the GPU."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.nvfp4 import NVFP4QuantizeMatrixKernel
    from dsv4lib.ops.nvfp4 import matrix_args
    M, K = 37, 48
    args = matrix_args(torch.randn(M, K).to(dtype), torch.empty(M, K // 2, dtype=torch.uint8),
                       torch.empty(M, K // 16, dtype=torch.uint8), torch.ones(1), torch.empty(1))
    k = compile_for_arch(NVFP4QuantizeMatrixKernel(False), *args, arch="sm_90a")
    assert k.count(r"mad\.lo\.u32") >= 16                          # the line encoder's code packing


@pytest.mark.compile
@pytest.mark.parametrize("arch,dtype", [("sm_90a", torch.bfloat16), ("sm_90a", torch.float32), ("sm_100a", torch.float16)])
def test_matrix_builds_are_the_block_builds_device_code(arch, dtype):
    """The public functions launch builds that take the caller's matrices (x [M, K], data [M, K/2], scales
    [M, K/16], y [M, K]) and make the 1×16-block views at trace time, so the host creates no torch view per call
    (issue #28: ~1.5 µs each).  Their device code is the block builds', byte for byte (only the class name in the
    entry's symbol differs): same loads, same stores, same alignment — the views only moved from torch to CuTe."""
    from _builds import device_code
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels import nvfp4 as kernels
    from dsv4lib.ops import nvfp4 as ops
    M, K = 24, 96
    n = M * K // 16
    x = torch.randn(M, K).to(dtype)
    hardware = arch == "sm_100a"
    blocks = compile_for_arch(kernels.NVFP4QuantizeKernel(hardware), *ops.kernel_args(
        x.view(n, 16), torch.empty(n, 2, dtype=torch.uint32), torch.empty(n, dtype=torch.uint8), torch.ones(1),
        torch.empty(1)), arch=arch)
    matrix = compile_for_arch(kernels.NVFP4QuantizeMatrixKernel(hardware), *ops.matrix_args(
        x, torch.empty(M, K // 2, dtype=torch.uint8), torch.empty(M, K // 16, dtype=torch.uint8), torch.ones(1),
        torch.empty(1)), arch=arch)
    assert device_code(matrix.ptx) == device_code(blocks.ptx)
    blocks = compile_for_arch(kernels.NVFP4DequantizeKernel(), *ops.dequantize_args(
        torch.zeros(n, 2, dtype=torch.uint32), torch.zeros(n, dtype=torch.uint8), torch.ones(1),
        torch.empty(n, 16, dtype=dtype)), arch=arch)
    matrix = compile_for_arch(kernels.NVFP4DequantizeMatrixKernel(), *ops.dequantize_matrix_args(
        torch.zeros(M, K // 2, dtype=torch.uint8), torch.zeros(M, K // 16, dtype=torch.uint8), torch.ones(1),
        torch.empty(M, K, dtype=dtype)), arch=arch)
    assert device_code(matrix.ptx) == device_code(blocks.ptx)


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
    # rows of exact ties: a block of 6 · 2^k and midpoints · 2^k, shuffled, random signs; with amax 2688 (S_enc
    # = 1) the scale is 2^k exactly, so every x · enc lands on an e2m1 midpoint
    ties = torch.cat([torch.tensor([6.0]), mids[:-1], mids]).repeat(M, K // 16)
    ties = ties.gather(1, torch.argsort(torch.rand(M, K, generator=gen), dim=1))
    ties[:, ::16] = 6.0
    scale = 2.0 ** torch.randint(-6, 9, (M, K // 16), generator=gen).float().repeat_interleave(16, 1)
    sign = torch.where(torch.rand(M, K, generator=gen) < 0.5, -1.0, 1.0)
    x[5::3] = (ties * scale * sign)[5::3]
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


def test_plans_pass_scalars_and_operands_as_the_builds_take_them():
    """``scalar_passer``: a number → one cached (1,) fp32 tensor; an fp32 tensor on the device → a (1,) view of the
    caller's own bytes, kept while the same tensor keeps the same bytes (written in place: still its bytes; ``set_``:
    a new view); any other tensor → converted each call.  ``aligned_passer``: the caller's tensor when contiguous
    from an aligned start, else a contiguous aligned copy."""
    from dsv4lib.ops.nvfp4 import aligned_passer, scalar_passer
    cpu = torch.device("cpu")
    fixed = scalar_passer(3.0, cpu)
    assert fixed(3.0) is fixed(3.0) and fixed(3.0).shape == (1,) and fixed(3.0).item() == 3.0
    amax = torch.tensor(2.0)
    own = scalar_passer(amax, cpu)
    first = own(amax)
    assert first.shape == (1,) and first.data_ptr() == amax.data_ptr() and own(amax) is first
    amax.fill_(5.0)
    assert own(amax) is first and first.item() == 5.0
    amax.set_(torch.tensor(7.0))
    moved = own(amax)
    assert moved is not first and moved.data_ptr() == amax.data_ptr() and moved.item() == 7.0
    other = torch.tensor(9.0)
    assert own(other).item() == 9.0 and own(other).data_ptr() == other.data_ptr()
    half = torch.tensor(4.0, dtype=torch.float16)
    converted = scalar_passer(half, cpu)(half)
    assert converted.dtype == torch.float32 and converted.shape == (1,) and converted.item() == 4.0
    x = torch.randn(8, 32)
    assert aligned_passer(x, 16)(x) is x
    strided = torch.randn(32, 8).t()
    got = aligned_passer(strided, 16)(strided)
    assert got.is_contiguous() and got.data_ptr() % 16 == 0 and torch.equal(got, strided)
    shifted = torch.randn(8 * 32 + 1)[1:].view(8, 32)                      # 4 bytes past an aligned start
    got = aligned_passer(shifted, 16)(shifted)
    assert got.data_ptr() % 16 == 0 and torch.equal(got, shifted)


@pytest.mark.gpu
def test_a_tensor_amax_is_read_on_the_gpu_every_call():
    """A 0-d fp32 amax tensor (as the NVFP4 stage passes it): the plan keeps a (1,) view of the caller's bytes, so a
    value written in place, a tensor re-pointed with ``set_`` and another tensor of the same kind all reach the
    kernel — each call against the reference with that call's amax."""
    from gpu_checks import fresh_seed
    gen = torch.Generator().manual_seed(fresh_seed())
    x = _hard_inputs(64, 256, gen).to(torch.bfloat16)
    amax = torch.tensor(2688.0, device="cuda")
    other = torch.tensor(96.0, device="cuda")
    steps = [("as made", lambda: None, 2688.0), ("written in place", lambda: amax.fill_(40.0), 40.0),
             ("re-pointed", lambda: amax.set_(torch.tensor(700.0, device="cuda")), 700.0)]
    for what, change, value in steps:
        change()
        data, sf, gs = dsv4lib.quantize_nvfp4(x.cuda(), amax)
        rd, rs, rgs = ref.nvfp4_quantize(x, value)
        assert torch.equal(data.cpu(), rd) and torch.equal(sf.cpu(), rs) and gs.item() == rgs.item(), what
    data, sf, gs = dsv4lib.quantize_nvfp4(x.cuda(), other)
    rd, rs, rgs = ref.nvfp4_quantize(x, 96.0)
    assert torch.equal(data.cpu(), rd) and torch.equal(sf.cpu(), rs) and gs.item() == rgs.item(), "another tensor"


@pytest.mark.gpu
@pytest.mark.parametrize("encoder,depth,ctas_per_sm", [("lines", 1, 0), ("magic", 1, 0), ("lines", 2, 0),
                                                       ("lines", 4, 8), ("magic", 4, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_encoder_and_pipeline_depth_gives_the_reference_bytes(dtype, encoder, depth, ctas_per_sm):
    """Both sm_90a encoders and the register pipeline (tiles in flight per thread, capped grid: CTAs loop over
    several rounds, the last one part-filled) give the reference's bytes."""
    gen = torch.Generator().manual_seed(7)
    for M, K in ((301, 1040), (2000, 4096)):
        x = _hard_inputs(M, K, gen).to(dtype)
        for amax in (None, 2688.0):
            data, sf, gs = dsv4lib.quantize_nvfp4(x.cuda(), amax, _encoder=encoder, _depth=depth,
                                                  _ctas_per_sm=ctas_per_sm)
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


@pytest.mark.compile
def test_pv_accumulator_column_structure_behind_the_fused_epilogue():
    """NVFP4-1.2 packs bytes in registers because, in the PV wgmma accumulator, a thread's columns c..c+3 of
    a row are d0, d0+1, d0+8, d0+9 with d0 = 16·block + 2·(lane % 4): proven here on the real partition."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.layouts import acc_layout_rows_cols
    from dsv4lib.layouts.trace import run_traced
    for D in (64, 128, 256):
        def build():
            mma = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                                    OperandMajorMode.MN, cutlass.Float32, (2, 1, 1), (64, D),
                                                    a_source=warpgroup.OperandSource.RMEM)
            out = {}
            for t in range(256):
                c = mma.get_slice(t).partition_C(cute.make_identity_tensor((128, D)))
                rc = cute.make_tensor(c.iterator, acc_layout_rows_cols(c.layout))
                out[t] = [[tuple(rc[r, j]) for j in range(cute.size(rc, mode=[1]))] for r in range(cute.size(rc, mode=[0]))]
            return out
        coords = run_traced(build, "sm_90a")
        for t, rows in coords.items():
            for row in rows:
                assert len(row) == D // 4
                for blk in range(D // 16):
                    (m0, d0), (m1, d1), (m2, d2), (m3, d3) = row[4 * blk:4 * blk + 4]
                    assert m0 == m1 == m2 == m3
                    assert (d1, d2, d3) == (d0 + 1, d0 + 8, d0 + 9) and d0 % 16 == 2 * (t % 4), (t, blk)


@pytest.mark.compile
@pytest.mark.parametrize("overlap,persistent,unmasked", [(False, False, False), (True, False, False),
                                                         (True, True, False), (True, True, True)])
def test_fused_nvfp4_epilogue_builds(overlap, persistent, unmasked):
    """attention_nvfp4 builds the default mainloop and schedule of plain attention (overlap; at hd128 persistent
    CTAs with the dynamic schedule and the early rescale; the loop split where no mask reaches), only the epilogue
    differs."""
    import collections
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_nvfp4_args, fake_work_counters
    knobs = {"persistent": True, "dynamic_schedule": True, "rescale_o_early": True} if persistent else {}
    if unmasked:                                           # attention_nvfp4's default build without a window
        knobs = {k: v for k, v in Sm90FwdConfig.for_problem(128, nvfp4_out=True).__dict__.items()
                 if k in ("persistent", "dynamic_schedule", "rescale_o_early", "pv_wait_block", "unmasked_body")}
        assert knobs["unmasked_body"] and knobs["persistent"], knobs
    extra = (None, fake_work_counters()) if persistent else ()
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=False, nvfp4_out=True, overlap=overlap,
                                                   **knobs)), *fake_nvfp4_args(128), *extra, arch="sm_90a")
    if persistent:                                         # the counter deals the items; no O buffer, no TMA store
        assert k.count(r"atom\.[\w.]*add") >= 2 and k.count(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared") == 0
    stores = collections.Counter(re.findall(r"\bst\.global\.[\w.]+", k.ptx))
    # the quad assembles each packed row (64 B at hd128): one 16 B vector store per row and thread (a quarter of
    # the row each), the row's 8 scale bytes as two 32-bit words; no byte stores
    # (+ the two counter resets of the dynamic schedule's last producer)
    assert stores == {"st.global.v4.b32": 2, "st.global.b32": 4 + (2 if persistent else 0)}, stores
    assert k.count(r"shfl\.sync\.bfly") >= 16 * (2 + 4)   # per block: 2 for the amax, 2 + 2 to OR the two words
    assert k.count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 16 and k.count("e2m1x2") == 0
    # packed in registers, no shared-memory staging (persistent: only the producer's two work-item announcements)
    assert k.count(r"st\.shared") == (2 if persistent else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("D,causal", [(64, False), (128, True), (256, False)])
def test_fused_nvfp4_output_equals_quantizing_the_fp32_output(D, causal):
    gen = torch.Generator().manual_seed(D)
    q, k, v = (torch.randn(2, 300, 4, D, generator=gen).cuda().bfloat16() for _ in range(3))
    amax = 3.0
    data, sf, gs = dsv4lib.attention_nvfp4(q, k, v, amax, causal=causal)
    o32 = dsv4lib.attention_fp32(q, k, v, causal=causal)             # what the epilogue quantizes
    rd, rs, rgs = ref.nvfp4_quantize(o32.reshape(-1, D).cpu(), amax)
    assert torch.equal(data.reshape(-1, D // 2).cpu(), rd)
    assert torch.equal(sf.reshape(-1, D // 16).cpu(), rs)
    assert gs.item() == rgs.item()


def _e2m1_magic_numpy(y):
    """``dsv4lib.kernels.nvfp4.e2m1_code_magic`` step by step in numpy fp32 / uint32 (IEEE adds, round to
    nearest even — what the GPU's add.f32 does)."""
    import numpy as np
    from dsv4lib.kernels.nvfp4 import BINADE_TO_MAGIC, MAGIC_BASE_BITS
    bits = y.view(np.uint32)
    a = np.minimum(np.abs(y), np.float32(8.0))
    magic = np.maximum((a.view(np.uint32) & np.uint32(0x7F800000)) + np.uint32(BINADE_TO_MAGIC), np.uint32(MAGIC_BASE_BITS))
    steps = (a + magic.view(np.float32)).astype(np.float32).view(np.uint32) - magic
    code = np.minimum(steps + ((magic - np.uint32(MAGIC_BASE_BITS)) >> np.uint32(22)), np.uint32(7))
    return (code | ((bits >> np.uint32(28)) & np.uint32(8))).astype(np.uint8)


def _e2m1_lines_numpy(y):
    """``dsv4lib.kernels.nvfp4.e2m1_code_lines`` (plus the prmt sign) in numpy: clamp |y| at 6, each line's exact
    value (float64 holds it: 2a, a + 2^23 + 2, a/2 + 2^23 + 4 need < 53 bits for |y| ≤ 6) rounded once to fp32 —
    what one fma.rn does — then the min, the code read off the fp32 bits."""
    import numpy as np
    bits = y.view(np.uint32)
    a = np.minimum(np.abs(y), np.float32(6.0)).astype(np.float64)
    magic = 2.0 ** 23
    lines = [(a * 2 + magic).astype(np.float32), (a + (magic + 2)).astype(np.float32),
             (a * 0.5 + (magic + 4)).astype(np.float32)]
    t = np.minimum(np.minimum(lines[0], lines[1]), lines[2])
    code = t.view(np.uint32) - np.uint32(0x4B000000)
    return (code | ((bits >> np.uint32(28)) & np.uint32(8))).astype(np.uint8)


def _encoder_test_values():
    """Every 61st fp32 bit pattern below 16.0, ±2048 ulps around every threshold, grid value and binade edge,
    both signs, zeros, denormals, huge values and inf."""
    import numpy as np
    top = np.array([16.0], dtype=np.float32).view(np.uint32)[0]
    pats = [np.arange(0, top, 61, dtype=np.uint32)]
    for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 2.0 ** -126):
        c = np.array([v], dtype=np.float32).view(np.uint32)[0].astype(np.int64)
        pats.append(np.arange(max(c - 2048, 0), c + 2048, dtype=np.int64).astype(np.uint32))
    pats.append(np.array([1, 0x7FFFFF, 0x7F7FFFFF, 0x7F800000, 0x5F000000, 0x4B7FFFFF], dtype=np.uint32))
    mags = np.concatenate(pats)
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


@pytest.mark.parametrize("encoder", ["lines", "magic"])
def test_e2m1_encoder_equals_the_reference_on_every_tested_fp32(encoder):
    """Both sm_90a encoders, step by step in numpy, against the reference's threshold encoder on the same
    > 10 M values (``_encoder_test_values``)."""
    import numpy as np
    y = _encoder_test_values()
    got = {"lines": _e2m1_lines_numpy, "magic": _e2m1_magic_numpy}[encoder](y)
    want = ref.e2m1_encode(torch.from_numpy(y.copy())).numpy()
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(y[i]), int(got[i]), int(want[i])) for i in bad[:8]]
    assert y.size > 10_000_000


# ---------------------------------------------------------------------------- dequantize kernel
@pytest.mark.compile
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_kernel_builds_from_the_public_functions_arguments(out_dtype):
    """What ``dequantize_nvfp4`` passes (CPU stand-ins of the same shapes): one 8-byte load of the codes, the
    scale byte, the global scale; 16 values as 16-byte vector stores; (e2m1 · sf) · gs as two fp32 multiplies
    per value (16 more for the subnormal codes' ``m · 0.5``), no fused multiply-add that would skip a rounding."""
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.nvfp4 import NVFP4DequantizeMatrixKernel
    from dsv4lib.ops.nvfp4 import dequantize_matrix_args
    M, K = 64, 1024
    args = dequantize_matrix_args(torch.zeros(M, K // 2, dtype=torch.uint8), torch.zeros(M, K // 16, dtype=torch.uint8),
                                  torch.ones(1), torch.empty(M, K, dtype=out_dtype))
    for arch in ("sm_90a", "sm_100a"):
        k = compile_for_arch(NVFP4DequantizeMatrixKernel(), *args, arch=arch)
        assert k.count(r"ld\.global\.v2\.(u32|b32)") == 1
        stores = set(re.findall(r"st\.global\.\S+", k.ptx))
        assert stores == {"st.global.v4.b32"}, stores
        assert k.count(r"st\.global\.v4\.b32") == 16 * out_dtype.itemsize // 16
        assert k.count(r"\bmul\.(rn\.)?f32") == 48 and k.count(r"\bfma\.") == 0


@pytest.mark.parametrize("make,exc,match", [
    (lambda: (torch.zeros(4, 8, dtype=torch.int8), torch.zeros(4, 1, dtype=torch.uint8)), TypeError, "uint8"),
    (lambda: (torch.zeros(32, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8)), ValueError, "2-D"),
    (lambda: (torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8)), ValueError, "disagree"),
    (lambda: (torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(3, 1, dtype=torch.uint8)), ValueError, "disagree"),
])
def test_dequantize_rejects_bad_input(make, exc, match):
    data, sf = make()
    with pytest.raises(exc, match=match):
        dsv4lib.dequantize_nvfp4(data, sf, 1.0)


def test_dequantize_rejects_an_unsupported_out_dtype():
    with pytest.raises(TypeError, match="out_dtype"):
        dsv4lib.dequantize_nvfp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8), 1.0,
                                 out_dtype=torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_kernel_equals_the_reference_bit_for_bit(out_dtype):
    """Every code in every nibble, every finite e4m3 scale byte, global scales that round (1/3, a quantize
    run's S_dec) — the kernel's output bits equal the reference's."""
    gen = torch.Generator().manual_seed(11)
    M, K = 512, 1024
    data = torch.randint(0, 256, (M, K // 2), generator=gen, dtype=torch.uint8)
    data[0, :128] = torch.arange(128, dtype=torch.uint8) * 2 + (torch.arange(128) % 2).to(torch.uint8)  # all codes
    sf = torch.randint(0, 256, (M, K // 16), generator=gen, dtype=torch.uint8)
    sf[(sf & 0x7F) == 0x7F] = 0x38                                    # e4m3 NaN bytes → 1.0
    sf.view(-1)[:254] = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    x = torch.randn(64, 256, generator=gen).cuda().bfloat16()
    _, _, s_dec = dsv4lib.quantize_nvfp4(x)
    for gs in (1.0, 1.0 / 3.0, s_dec, torch.tensor(7.5e-5)):
        got = dsv4lib.dequantize_nvfp4(data.cuda(), sf.cuda(), gs, out_dtype=out_dtype)
        want = ref.nvfp4_dequantize(data, sf, gs.cpu() if isinstance(gs, torch.Tensor) else gs, out_dtype=out_dtype)
        torch.cuda.synchronize()
        bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[out_dtype]
        assert torch.equal(got.cpu().view(bits), want.view(bits)), (got.cpu().view(bits) != want.view(bits)).sum()


@pytest.mark.gpu
@pytest.mark.parametrize("window,with_sink,scale", [(128, True, None), (4096, True, 0.05), (None, False, 0.2)])
def test_fused_nvfp4_window_sink_and_scale_match_float64(window, with_sink, scale):
    """NVFP4-1.1 with a window, a sink and a non-default scale: the dequantized fused output against float64
    attention, row by row (NVFP4's own rounding is ~0.1 of a row; a wrong or unwritten row is ~1), outputs poisoned
    first."""
    from dsv4lib import reference as attention_ref
    from gpu_checks import check_output, fresh_seed, poisoned_outputs
    gen = torch.Generator().manual_seed(fresh_seed())
    B, S, H, D = 2, 700, 4, 128
    q, k, v = (torch.randn(B, S, H, D, generator=gen).cuda().bfloat16() for _ in range(3))
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    ref = attention_ref.attention(q.double(), k.double(), v.double(), window=window, scale=scale,
                                  sink=None if sink is None else sink.double())
    with poisoned_outputs():
        data, sf, gs = dsv4lib.attention_nvfp4(q, k, v, float(ref.abs().max()), window=window, sink=sink, scale=scale)
    got = dsv4lib.dequantize_nvfp4(data.reshape(-1, D // 2), sf.reshape(-1, D // 16), gs, torch.float32)
    check_output(got.reshape(B, S, H, D), ref, row_max=0.2, cos_min=0.99)


@pytest.mark.compile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pdl_builds_wait_for_the_previous_kernel_before_any_load(dtype):
    """With programmatic dependent launch (``kernels.nvfp4.PDL``, the default of ``quantize_nvfp4``) a quantize or
    amax grid may start while the kernel before it still runs: every global load must come after
    ``griddepcontrol.wait`` (x, or the amax partials, may be that kernel's output), and the grid lets its own
    dependents launch (``griddepcontrol.launch_dependents``) only after its first loads are issued."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels import nvfp4 as kernels
    import importlib
    ops = importlib.import_module("dsv4lib.ops.nvfp4")       # the module (dsv4lib.ops re-exports its functions)
    assert kernels.PDL
    x = torch.randn(24, 96).to(dtype)
    out = (torch.empty(24, 48, dtype=torch.uint8), torch.empty(24, 6, dtype=torch.uint8))
    builds = {
        "quantize": (kernels.NVFP4QuantizeMatrixKernel(False, pdl=True), ops.matrix_args(x, *out, torch.ones(1),
                                                                                       torch.empty(1))),
        "quantize of x": (kernels.NVFP4QuantizeMatrixKernel(False, amax_partials=True, pdl=True),
                          ops.matrix_args(x, *out, torch.ones(5), torch.empty(1), amax_partials=True)),
        "amax": (kernels.NVFP4AmaxKernel(pdl=True), ops.amax_args(x, torch.empty(5))),
    }
    for name, (kernel, args) in builds.items():
        ptx = compile_for_arch(kernel, *args, arch="sm_90a").ptx
        wait, trigger = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
        first_load = ptx.find("ld.global")
        assert ptx.count("griddepcontrol.wait") == 1 and ptx.count("griddepcontrol.launch_dependents") == 1, name
        assert 0 <= wait < first_load < trigger, (name, wait, first_load, trigger)
        plain = compile_for_arch(type(kernel)(*(() if name == "amax" else (False,))), *args, arch="sm_90a").ptx
        assert "griddepcontrol" not in plain, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_amax_pass_writes_every_partial_and_the_quantize_waits_for_it(dtype):
    """``quantize_nvfp4`` without an amax: ``NVFP4AmaxKernel`` writes one max |x| per CTA and the quantize, launched
    right after it in the same compiled call (with PDL), reduces them.  The kept partials are poisoned with +inf
    before each call (an ``fmax`` would skip a NaN): every one must be overwritten and read only after the amax grid
    is done — S_dec and the bytes equal the reference's — with the largest |x| in the first, a middle or the last
    block, at block counts that leave the last CTA part-filled and that make each thread loop."""
    import importlib
    from gpu_checks import fresh_seed
    ops = importlib.import_module("dsv4lib.ops.nvfp4")
    gen = torch.Generator().manual_seed(fresh_seed())
    for M, K in ((1, 16), (129, 48), (2000, 4096)):
        for where in (0, M * K // 2, M * K - 1):
            x = torch.randn(M, K, generator=gen)
            x.view(-1)[where] = -1000.0 if where else 900.0
            x = x.to(dtype)
            dsv4lib.quantize_nvfp4(x.cuda())                       # the plan and its partials exist now
            for partials in ops._AMAX_PARTIALS.values():
                partials.fill_(float("inf"))
            data, sf, gs = dsv4lib.quantize_nvfp4(x.cuda())
            rd, rs, rgs = ref.nvfp4_quantize(x, None)
            assert gs.item() == rgs.item(), (M, K, where)
            assert torch.equal(data.cpu(), rd) and torch.equal(sf.cpu(), rs), (M, K, where)
