"""NVFP4 (TE numerics), FP8/FP4 UE8M0 and the 128×4 swizzle: the spec's edge cases, bit for bit."""
import pytest
import torch

from dsv4lib.reference import quant as Q

MID = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def hexbytes(t):
    return " ".join(f"{b:02x}" for b in t.flatten().tolist())


def quant1(vals, amax=None, extra_rows=()):
    x = torch.tensor([vals, *extra_rows], dtype=torch.float32)
    return Q.nvfp4_quantize(x, amax)


def test_ties_at_every_midpoint_round_to_even():
    data, sf, gs = quant1([6] + MID + [-m for m in MID] + [-6], 2688.0)
    assert hexbytes(data[0]) == "07 22 44 66 a8 ca ec fe" and sf[0, 0] == 0x38 and gs.item() == 1.0


def test_one_ulp_around_midpoints():
    up = [torch.nextafter(torch.tensor(m), torch.tensor(9.0)).item() for m in MID]
    dn = [torch.nextafter(torch.tensor(m), torch.tensor(0.0)).item() for m in MID]
    data, _, _ = quant1([6.0, dn[0], up[0], dn[1], up[1], dn[2], up[2], dn[3], up[3], dn[4], up[4], dn[5], up[5],
                         dn[6], up[6], 6.0], 2688.0)
    assert hexbytes(data[0]) == "07 11 22 33 44 55 66 77"


@pytest.mark.parametrize("vals,amax,extra,sf_hex,data_hex", [
    ([0.0] * 16, 0.0, (), "00", "00 00 00 00 00 00 00 00"),                          # all-zero block
    ([-0.0] * 8 + [1.0] * 8, None, (), None, "88 88 88 88 77 77 77 77"),                # -0 keeps its sign
    ([-1e-3] * 8 + [1.0] * 8, None, (), None, "88 88 88 88 77 77 77 77"),               # tiny negative -> -0
    ([7, -7, 100, -1e30] + [1.0] * 12, 6.0, (), "7e", "f7 f7 22 22 22 22 22 22"),      # saturation, static amax
    ([10, -3, 1, .5] + [.1] * 12, 1.0, (), "7e", "f7 57 11 11 11 11 11 11"),
    ([1e-7] * 15 + [-3e-7], 1.0, ([1.0] * 16,), "00 7e", "77 77 77 77 77 77 77 f7"),   # scale underflows to 0
    ([2.25] + [0.0] * 15, 3.0, ([3.0] * 16,), "7b 7e", "07 00 00 00 00 00 00 00"),     # e4m3 midpoint 336 -> 352
    ([0.0] * 15 + [3.0], None, (), "7e", "00 00 00 00 00 00 00 70"),
    ([3.3895e38] + [1.0] * 15, None, (), "7e", "07 00 00 00 00 00 00 00"),             # bf16 max
    ([float("inf")] + [1.0] * 15, float("inf"), (), "7e", "07 00 00 00 00 00 00 00"),  # inf amax -> S_enc 1
    ([(-1) ** i * 0.375 * (i + 1) for i in range(16)], None, (), None, "a1 b2 c4 d5 e5 e6 f6 f7"),
])
def test_spec_edge_vectors(vals, amax, extra, sf_hex, data_hex):
    data, sf, _ = quant1(vals, amax, extra)
    assert hexbytes(data[0]) == data_hex
    if sf_hex is not None:
        assert hexbytes(sf) == sf_hex


def test_subnormal_scales_are_used():
    rows = [[2.0 ** -9 * 6 / 448] * 16, [2.0 ** -7 * 6 / 448] * 16, [6.0] * 16]
    _, sf, _ = Q.nvfp4_quantize(torch.tensor(rows), 6.0)
    assert sf[:, 0].tolist() == [0x01, 0x04, 0x7E]


def test_round_trip_and_global_scale(gen):
    x = torch.randn(256, 1024, generator=gen)
    data, sf, gs = Q.nvfp4_quantize(x)
    assert data.shape == (256, 512) and sf.shape == (256, 64) and data.dtype == sf.dtype == torch.uint8
    assert gs.item() == pytest.approx(x.abs().max().item() / 2688, rel=1e-6)
    y = Q.nvfp4_dequantize(data, sf, gs)
    cos = torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), 0).item()
    assert cos >= 0.99
    assert Q.nvfp4_quantize(x.to(torch.bfloat16))[0].shape == data.shape              # bf16 input
    lead = Q.nvfp4_quantize(x.view(4, 64, 1024))                                        # leading dims
    assert torch.equal(lead[0].view(256, 512), data) and torch.equal(lead[1].view(256, 64), sf)


def test_packing_order():
    # element 0 = 1.0 (code 2), element 1 = 6.0 (code 7): byte = 0x72 (even element in the low nibble)
    data, _, _ = quant1([1.0, 6.0] + [0.0] * 14, 2688.0)
    assert data[0, 0].item() == 0x72
    assert torch.equal(Q.unpack_fp4(Q.pack_fp4(torch.arange(16, dtype=torch.uint8))), torch.arange(16, dtype=torch.uint8))


def test_e2m1_encoder_equals_nearest_even_oracle(gen):
    values = torch.tensor(Q.E2M1_VALUES[:8])
    y = torch.cat([torch.randn(20000, generator=gen) * 4, torch.tensor(MID), -torch.tensor(MID), torch.tensor([7.0, -100.0])])
    codes = Q.e2m1_encode(y)
    dist = (y.abs()[:, None].clamp(max=6) - values[None]).abs()
    best = dist.min(1, keepdim=True).values
    cands = dist == best                                   # ties: two candidates; pick the even code
    oracle = torch.where(cands.sum(1) > 1, (cands.float() * (torch.arange(8) % 2 == 0)).argmax(1), dist.argmin(1))
    assert torch.equal(codes & 7, oracle.to(torch.uint8))
    assert torch.equal(codes >> 3, (y.view(torch.int32) < 0).to(torch.uint8))


def test_swizzle_formula_and_round_trip(gen):
    for M, n in [(1, 1), (128, 4), (130, 7), (300, 12), (256, 64)]:
        sf = torch.randint(1, 255, (M, n), generator=gen, dtype=torch.uint8)
        flat = Q.swizzle_scales(sf)
        Mp, npad = -(-M // 128) * 128, -(-n // 4) * 4
        assert flat.numel() == Mp * npad
        direct = torch.zeros(Mp * npad, dtype=torch.uint8)
        for m in range(M):
            for kb in range(n):
                direct[Q.swizzled_offset(m, kb, n)] = sf[m, kb]
        assert torch.equal(flat, direct)                   # padding stays zero in both
        assert torch.equal(Q.unswizzle_scales(flat, M, n), sf)


def test_fp8_and_fp4_ue8m0(gen):
    x = torch.randn(8, 448, generator=gen, dtype=torch.float64) * 3
    q, s = Q.fp8_ue8m0_quantize(x, 64)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (8, 7)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)            # powers of two
    assert (q.float().abs().amax(-1) <= 448).all()
    y = Q.fp8_qdq(x)
    assert y.dtype == x.dtype and ((y - x).abs() <= x.abs() * 2 ** -4 + 1e-12).all()   # e4m3: 3 mantissa bits
    x4 = torch.randn(4, 128, generator=gen)
    z = Q.fp4_qdq(x4).view(4, 4, 32)
    scale = torch.exp2(torch.ceil(torch.log2(x4.view(4, 4, 32).abs().amax(-1, keepdim=True) / 6)))
    assert torch.isin(z / scale, torch.tensor(Q.E2M1_VALUES)).all()      # every value = e2m1 × 2^k of its block
    assert ((z - x4.view(4, 4, 32)).abs() <= scale * 1.0 + 1e-7).all()   # within half the widest step (4→6)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: Q.nvfp4_quantize(torch.randn(4, 24)), ValueError, "multiple of 16"),
    (lambda: Q.nvfp4_quantize(torch.randint(0, 3, (4, 32))), TypeError, "floating"),
    (lambda: Q.nvfp4_quantize(torch.randn(4, 32, dtype=torch.float64)), TypeError, "float32, bfloat16"),
    (lambda: Q.nvfp4_quantize(torch.randn(4, 32), torch.ones(2)), ValueError, "scalar"),
    (lambda: Q.nvfp4_dequantize(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8), 1.0), ValueError, "disagree"),
    (lambda: Q.swizzle_scales(torch.zeros(2, 3, 4, dtype=torch.uint8)), ValueError, "2-D"),
    (lambda: Q.fp8_qdq(torch.randn(3, 50)), ValueError, "multiple of 64"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_global_encode_scale_is_one_correctly_rounded_division():
    """S_enc = 2688 / amax in one IEEE fp32 division (TE's op), not reciprocal-then-multiply: torch's
    ``scalar / tensor`` rounds twice and differs by an ulp for some amax (the GPU kernel divides with div.rn)."""
    import numpy as np
    amax = torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 1000 + 1e-3
    want = (np.float32(2688.0) / amax.numpy().astype(np.float32)).astype(np.float32)
    got = torch.stack([Q.nvfp4_global_encode_scale(a) for a in amax[:2000]]).numpy()
    assert np.array_equal(got, want[:2000])
    twice = (2688.0 / amax).numpy()                                   # what the double rounding gives
    assert (twice != want).any()                                      # so the test can tell the two apart


def test_empty_inputs_are_refused_by_the_reference_and_the_kernel_alike():
    """One rule for the library: an empty input is a ValueError, from the reference and from the GPU function (whose
    shape check runs before its device check, so it is asserted here on the CPU)."""
    import dsv4lib
    with pytest.raises(ValueError, match="empty"):
        Q.nvfp4_quantize(torch.randn(0, 32))
    with pytest.raises(ValueError, match="M >= 1"):
        dsv4lib.quantize_nvfp4(torch.randn(0, 32, dtype=torch.bfloat16))
