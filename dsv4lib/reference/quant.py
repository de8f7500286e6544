"""Quantization references, bit-exact where the spec pins the bits (``../shared/specs/nvfp4.md`` §1.4, §3;
``dsv4_attention.md`` §8).

* DSV4 FP8: e4m3 with power-of-two (UE8M0) scales per 1×64 block, as DSV4 stores its KV.
* DSV4 FP4 (indexer QAT): e2m1 with UE8M0 scales per 1×32 block.
* NVFP4 (Transformer-Engine numerics): e2m1 data, e4m3 scale per 1×16 block, fp32 global decode scale;
  the 128×4 swizzled scale layout of Blackwell block-scaled MMA.
"""
from __future__ import annotations

import torch

FP4_MAX, FP8_MAX = 6.0, 448.0
FLT_MAX = torch.finfo(torch.float32).max
ONE_SIXTH_F32 = torch.tensor(0x3E2AAAAB, dtype=torch.int32).view(torch.float32).item()   # fl(1/6)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _check_last_dim(x, multiple: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what}: input must be floating point, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] % multiple:
        raise ValueError(f"{what}: last dim must be a multiple of {multiple}, got shape {tuple(x.shape)}")


# ---------------------------------------------------------------------------------------------- e2m1
def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """fp32 → 4-bit e2m1 code (uint8), round to nearest, ties to the even code, saturating; keeps -0 (0x8).
    Thresholds on |y|: 0.25→0, 0.75→1.0, 1.25→1.0, 1.75→2.0, 2.5→2.0, 3.5→4.0, 5.0→4.0 (ties even)."""
    y = y.to(torch.float32)
    a = y.abs()
    mag = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5)
           + (a > 5.0)).to(torch.uint8)
    code = mag | ((y.view(torch.int32) < 0).to(torch.uint8) << 3)
    return torch.where(torch.isnan(y), torch.full_like(code, 0x7), code)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)[code.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim: element 2i → low nibble, 2i+1 → high nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0x0F, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


# ------------------------------------------------------------------------------- DSV4 UE8M0 formats
def _ue8m0_scale(amax: torch.Tensor, qmax: float, amax_floor: float) -> torch.Tensor:
    """Power-of-two scale 2^ceil(log2(amax / qmax)) with amax clamped below (DSV4 ``fast_round_scale``)."""
    return torch.exp2(torch.ceil(torch.log2(amax.clamp(min=amax_floor) / qmax)))


def fp8_ue8m0_quantize(x: torch.Tensor, block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[..., K]`` → (e4m3 data ``[..., K]``, fp32 power-of-two scales ``[..., K/block]``)."""
    _check_last_dim(x, block, "fp8_ue8m0_quantize")
    xb = x.to(torch.float32).unflatten(-1, (-1, block))
    s = _ue8m0_scale(xb.abs().amax(-1, keepdim=True), FP8_MAX, 1e-4)
    q = (xb / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2), s.squeeze(-1)


def fp8_ue8m0_dequantize(q: torch.Tensor, scales: torch.Tensor, block: int = 64) -> torch.Tensor:
    return (q.to(torch.float32).unflatten(-1, (-1, block)) * scales.unsqueeze(-1)).flatten(-2)


def fp8_qdq(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Quantize → dequantize (DSV4 QAT of the KV nope dims); returns x's dtype."""
    return fp8_ue8m0_dequantize(*fp8_ue8m0_quantize(x, block), block).to(x.dtype)


def fp8_math_queries(q: torch.Tensor, block: int = 64, nope_dims: int = 448) -> torch.Tensor:
    """The queries an FP8-math QK^T would multiply (issue #36's opt-in path): the ``nope_dims`` (448) nope dims
    quantized to e4m3 and back with a power-of-two (UE8M0) scale per ``block`` dims — 64: per 1x64 block, as the
    MODEL1 cache's keys; 448: one scale per (token, head) — and the rope dims after them as they are (they stay in
    bf16 math).  With the cache's own e4m3 keys, ``q8 · k8`` times both scales, accumulated in fp32, is this query
    against the dequantized key: attention in float64 over these queries is the best the FP8 path can do."""
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got {getattr(q, 'dtype', type(q))}")
    if q.shape[-1] != nope_dims + 64 or block not in (64, nope_dims):
        raise ValueError(f"q must end in {nope_dims} + 64 dims and block be 64 or {nope_dims}, got {tuple(q.shape)}, "
                         f"{block}")
    return torch.cat([fp8_qdq(q[..., :nope_dims], block), q[..., nope_dims:]], -1)


def fp4_qdq(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """e2m1 with UE8M0 1×``block`` scales, quantize → dequantize (DSV4 indexer QAT); returns x's dtype."""
    _check_last_dim(x, block, "fp4_qdq")
    xb = x.to(torch.float32).unflatten(-1, (-1, block))
    s = _ue8m0_scale(xb.abs().amax(-1, keepdim=True), FP4_MAX, FP4_MAX * 2.0 ** -126)
    q = e2m1_decode(e2m1_encode((xb / s).clamp(-FP4_MAX, FP4_MAX)))
    return (q * s).flatten(-2).to(x.dtype)


# ------------------------------------------------------------------------------------ NVFP4 (TE)
def _e4m3_bits(s: torch.Tensor) -> torch.Tensor:
    """fp32 → e4m3 byte, RNE, saturating at 448 (clamped first: torch versions differ on overflow)."""
    return s.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _e4m3_value(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(torch.float8_e4m3fn).to(torch.float32)


def nvfp4_global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_enc = 2688 / amax in fp32, clamped to FLT_MAX; 1.0 when amax is 0 or S_enc is 0 (amax = inf)."""
    amax = amax.to(torch.float32)
    # a true fp32 division (TE: (fp8_max · fp4_max) / amax).  Not ``2688.0 / amax``: torch computes a scalar over
    # a tensor as reciprocal-then-multiply, two roundings, off by an ulp for some amax.  full_like makes the
    # numerator on the device (no host→device copy, which would stall the host behind the GPU queue).
    s = torch.clamp(torch.full_like(amax, FP8_MAX * FP4_MAX) / amax, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def nvfp4_quantize(x: torch.Tensor, global_amax=None):
    """NVFP4 quantization with Transformer-Engine numerics (fp32 op order as TE's kernels).

    x ``[..., K]`` (bf16/fp16/fp32, K % 16 == 0); ``global_amax``: the tensor amax to use (a calibrated,
    static value), default ``max|x|``.  Returns ``(data, scales, global_scale)``:
    ``data`` uint8 ``[..., K/2]`` (even element in the low nibble), ``scales`` uint8 ``[..., K/16]`` (e4m3
    bits), ``global_scale`` fp32 scalar = the decode scale S_dec = 1/S_enc ≈ amax / (6·448), so
    ``x ≈ e2m1 · e4m3_scale · global_scale``.
    """
    _check_last_dim(x, 16, "nvfp4_quantize")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"nvfp4_quantize: input must be float32, bfloat16 or float16, got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"nvfp4_quantize: empty input (shape {tuple(x.shape)}); empty inputs are refused, as by "
                         "dsv4lib.quantize_nvfp4")
    xf = x.to(torch.float32)
    if global_amax is None:
        amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
    else:
        amax = torch.as_tensor(global_amax, dtype=torch.float32, device=x.device)
        if amax.numel() != 1:
            raise ValueError(f"global_amax must be a scalar, got shape {tuple(amax.shape)}")
        amax = amax.reshape(())
    s_enc = nvfp4_global_encode_scale(amax)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    s_dec = one / s_enc
    blocks = xf.unflatten(-1, (-1, 16))
    vec_max = blocks.abs().amax(-1, keepdim=True)
    sf_f32 = vec_max * (s_enc * ONE_SIXTH_F32)                          # TE association order
    sf_bits = _e4m3_bits(torch.clamp(sf_f32, max=FLT_MAX))
    enc = torch.clamp(one / (_e4m3_value(sf_bits) * s_dec), max=FLT_MAX)   # sf == 0 → inf → FLT_MAX
    codes = e2m1_encode(blocks * enc).flatten(-2)
    return pack_fp4(codes), sf_bits.squeeze(-1), s_dec


def nvfp4_dequantize(data: torch.Tensor, scales: torch.Tensor, global_scale, out_dtype=torch.float32):
    """``e2m1 · e4m3_scale`` (exact in fp32) then ``· global_scale`` (one rounding), cast to ``out_dtype``."""
    if data.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"nvfp4_dequantize: data and scales must be uint8, got {data.dtype}, {scales.dtype}")
    if data.shape[:-1] != scales.shape[:-1] or data.shape[-1] * 2 != scales.shape[-1] * 16:
        raise ValueError(f"nvfp4_dequantize: data [..., K/2] {tuple(data.shape)} and scales [..., K/16] "
                         f"{tuple(scales.shape)} disagree")
    v = e2m1_decode(unpack_fp4(data)).unflatten(-1, (-1, 16)) * _e4m3_value(scales).unsqueeze(-1)
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=data.device)
    return (v * gs).flatten(-2).to(out_dtype)


# ---------------------------------------------------------------------------- 128×4 scale swizzle
def swizzled_offset(m: int, kb: int, n_kblocks: int) -> int:
    """Byte offset of scale (row m, k-block kb) in the 128×4 layout (tiles of 512 B, row-tile major)."""
    k_tiles = -(-n_kblocks // 4)
    return ((m // 128) * k_tiles + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (kb % 4)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """``[M, K/16]`` scales → the flat 128×4 layout of tcgen05 block-scaled MMA, zero-padded to
    ``[ceil(M/128)·128, ceil(K/64)·4]`` (view ``[mTiles, kTiles, 32, 4(m_hi), 4(kb)]``)."""
    if scales.dim() != 2:
        raise ValueError(f"swizzle_scales needs 2-D [M, K/16] scales, got shape {tuple(scales.shape)}")
    M, n = scales.shape
    Mp, npad = -(-M // 128) * 128, -(-n // 4) * 4
    pad = torch.zeros((Mp, npad), dtype=scales.dtype, device=scales.device)
    pad[:M, :n] = scales
    return pad.view(Mp // 128, 4, 32, npad // 4, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)


def unswizzle_scales(flat: torch.Tensor, rows: int, n_kblocks: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: back to ``[rows, n_kblocks]`` (padding dropped)."""
    Mp, npad = -(-rows // 128) * 128, -(-n_kblocks // 4) * 4
    if flat.dim() != 1 or flat.numel() != Mp * npad:
        raise ValueError(f"unswizzle_scales: expected a flat tensor of {Mp * npad} scales, got {tuple(flat.shape)}")
    full = flat.view(Mp // 128, npad // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, npad)
    return full[:rows, :n_kblocks].contiguous()
