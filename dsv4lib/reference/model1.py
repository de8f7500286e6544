"""The FP8 "MODEL1" paged KV cache of DeepSeek-V4 in production (FlashMLA's layout; spec ``dsv4_attention.md`` §8-§9)
and the decode over it, as float64 truth for D7.

A key (K = V, 512 dims) takes **584 bytes**: 448 e4m3 bytes of the "nope" dims (7 tiles of 64, each with its own
power-of-two scale), the 64 rope dims as bf16 (128 bytes), 7 UE8M0 scale bytes and one pad byte.  A page of
``page_size`` keys holds all its keys' 576-byte ``[nope | rope]`` parts first, then their 8-byte scale groups, and is
padded to a multiple of 576 bytes.  A key's address in the index space is ``page * page_size + slot``.

Scale rule (UE8M0, as DeepSeek's and FlashMLA's quantizers): per 64-dim tile ``s = 2^ceil(log2(max(amax / 448,
1e-4)))``, stored as the byte ``log2(s) + 127``; the tile is stored as ``e4m3(x / s)`` (round to nearest even, never
above 448 by construction of s)."""
from __future__ import annotations

import torch

from .attention import sparse_attention

HEAD_DIM = 512
NOPE_DIMS = 448
ROPE_DIMS = 64
TILE = 64
TILES = NOPE_DIMS // TILE             # 7 scales per key
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4                    # amax / 448 is clamped to this before the power-of-two ceiling
PART_BYTES = NOPE_DIMS + 2 * ROPE_DIMS   # 576: a key's [nope | rope] part
SCALE_GROUP_BYTES = TILES + 1            # 8: 7 scale bytes + 1 pad
KEY_BYTES = PART_BYTES + SCALE_GROUP_BYTES   # 584


def page_bytes(page_size: int) -> int:
    """Bytes of one page: ``page_size`` keys of 584 bytes, padded to a multiple of 576."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return -(-page_size * KEY_BYTES // PART_BYTES) * PART_BYTES


def new_cache(num_pages: int, page_size: int, device=None) -> torch.Tensor:
    """An empty (zero) cache: uint8 ``[num_pages, page_bytes(page_size)]``."""
    if num_pages < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    return torch.zeros(num_pages, page_bytes(page_size), dtype=torch.uint8, device=device)


def tile_scales(k: torch.Tensor) -> torch.Tensor:
    """The UE8M0 scale exponents ``log2(s)`` (int32 ``[N, 7]``) of keys ``k [N, 512]``: ``ceil(log2(x))`` of the fp32
    ``x = max(amax / 448, 1e-4)``, exact (from the float's own exponent and mantissa, ``frexp``; a rounded ``log2`` can
    land on the integer below for an x just above a power of two) — the rule the GPU writer computes bit by bit."""
    amax = k[:, :NOPE_DIMS].float().abs().reshape(-1, TILES, TILE).amax(-1)
    mantissa, exponent = torch.frexp(torch.clamp_min(amax / E4M3_MAX, AMAX_FLOOR))     # x = m · 2^e, m in [0.5, 1)
    return (exponent - (mantissa == 0.5).to(exponent.dtype)).to(torch.int32)


def quantize_keys(k: torch.Tensor) -> torch.Tensor:
    """Keys ``k [N, 512]`` (bf16, or float rounded to bf16 first, as the cache stores bf16 keys) → their 584-byte
    records, uint8 ``[N, 584]`` in key order ``[nope e4m3 (448) | rope bf16 (128) | 7 scale bytes | pad 0]``."""
    if k.dim() != 2 or k.shape[1] != HEAD_DIM:
        raise ValueError(f"keys must be [N, {HEAD_DIM}], got {tuple(k.shape)}")
    k = k.to(torch.bfloat16)
    exps = tile_scales(k)                                                        # [N, 7]
    scale = torch.pow(2.0, exps.float())                                          # exact powers of two
    nope = (k[:, :NOPE_DIMS].float().reshape(-1, TILES, TILE) / scale[..., None]).reshape(-1, NOPE_DIMS)
    rec = torch.zeros(k.shape[0], KEY_BYTES, dtype=torch.uint8, device=k.device)
    rec[:, :NOPE_DIMS] = nope.to(torch.float8_e4m3fn).view(torch.uint8)
    rec[:, NOPE_DIMS:PART_BYTES] = k[:, NOPE_DIMS:].contiguous().view(torch.uint8)
    rec[:, PART_BYTES:PART_BYTES + TILES] = (exps + 127).to(torch.uint8)
    return rec


def dequantize_records(rec: torch.Tensor) -> torch.Tensor:
    """584-byte records ``[N, 584]`` → keys, float64 ``[N, 512]`` (exact: e4m3 times a power of two, and bf16)."""
    nope = rec[:, :NOPE_DIMS].contiguous().view(torch.float8_e4m3fn).double().reshape(-1, TILES, TILE)
    scale = torch.pow(2.0, rec[:, PART_BYTES:PART_BYTES + TILES].double() - 127)
    rope = rec[:, NOPE_DIMS:PART_BYTES].contiguous().view(torch.bfloat16).double()
    return torch.cat([(nope * scale[..., None]).reshape(-1, NOPE_DIMS), rope], 1)


def _split_addresses(addresses: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    addresses = addresses.long()
    return addresses // page_size, addresses % page_size


def write_keys(cache: torch.Tensor, page_size: int, addresses: torch.Tensor, k: torch.Tensor) -> None:
    """Quantize keys ``k [N, 512]`` and write them at ``addresses [N]`` (``page * page_size + slot``) of ``cache``
    in place — the decode step's write side."""
    _check_cache(cache, page_size)
    if addresses.shape != (k.shape[0],):
        raise ValueError(f"addresses must be [N={k.shape[0]}], got {tuple(addresses.shape)}")
    if ((addresses < 0) | (addresses >= cache.shape[0] * page_size)).any():
        raise ValueError("addresses must lie in [0, num_pages * page_size)")
    rec = quantize_keys(k)
    page, slot = _split_addresses(addresses, page_size)
    part = slot[:, None] * PART_BYTES + torch.arange(PART_BYTES, device=cache.device)
    group = page_size * PART_BYTES + slot[:, None] * SCALE_GROUP_BYTES + torch.arange(SCALE_GROUP_BYTES,
                                                                                         device=cache.device)
    cache[page[:, None], part] = rec[:, :PART_BYTES]
    cache[page[:, None], group] = rec[:, PART_BYTES:]


def read_keys(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    """Every key of the cache in index-space order, float64 ``[num_pages * page_size, 512]``."""
    _check_cache(cache, page_size)
    P = cache.shape[0]
    parts = cache[:, :page_size * PART_BYTES].reshape(P * page_size, PART_BYTES)
    groups = cache[:, page_size * PART_BYTES:page_size * KEY_BYTES].reshape(P * page_size, SCALE_GROUP_BYTES)
    return dequantize_records(torch.cat([parts, groups], 1))


def _check_cache(cache: torch.Tensor, page_size: int) -> None:
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or cache.dim() != 2:
        raise TypeError(f"a MODEL1 cache is a uint8 [num_pages, page_bytes] tensor, got "
                        f"{getattr(cache, 'dtype', type(cache))} {tuple(getattr(cache, 'shape', ()))}")
    if cache.shape[1] != page_bytes(page_size):
        raise ValueError(f"pages of {page_size} keys take {page_bytes(page_size)} bytes, the cache's rows have "
                         f"{cache.shape[1]}")


def _valid(indices: torch.Tensor, lengths: torch.Tensor | None, n_keys: int) -> torch.Tensor:
    """Which entries of ``indices [B, s_q, K]`` are keys: in ``[0, n_keys)`` and before the row's ``lengths[b]``."""
    ok = (indices >= 0) & (indices < n_keys)
    if lengths is not None:
        ok &= torch.arange(indices.shape[-1], device=indices.device) < lengths.long().view(-1, 1, 1)
    return ok


def sparse_decode(q, k_cache, page_size, indices, topk_length=None, *, extra_k_cache=None, extra_page_size=None,
                  extra_indices=None, extra_topk_length=None, sink=None, scale=None, return_lse=False):
    """FlashMLA's MODEL1 decode (``flash_mla_with_kvcache(..., is_fp8_kvcache=True)``) in float64 over the dequantized
    caches: q ``[B, s_q, H, 512]``; ``indices [B, s_q, K]`` int32 into ``k_cache``'s index space (``-1``, an address
    outside the cache, or a position ``>= topk_length[b]`` = no key); the optional extra cache (the compressed one,
    its own page size) with ``extra_indices [B, s_q, K2]`` and ``extra_topk_length``.  One softmax over both key lists
    with the sink once.  Returns ``out [B, s_q, H, 512]`` and with ``return_lse`` ``lse [B, H, s_q]`` (natural log,
    sink excluded; -inf for a query with no key)."""
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [B, s_q, H, {HEAD_DIM}], got {tuple(q.shape)}")
    B, s_q, H, _ = q.shape
    if indices.dim() != 3 or indices.shape[:2] != (B, s_q) or indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32 [B={B}, s_q={s_q}, K], got {indices.dtype} {tuple(indices.shape)}")
    keys = read_keys(k_cache, page_size)
    idx = torch.where(_valid(indices, topk_length, keys.shape[0]), indices.long(), -1)
    if extra_k_cache is not None:
        if extra_indices is None or extra_page_size is None:
            raise ValueError("extra_k_cache needs extra_page_size and extra_indices")
        if extra_indices.dim() != 3 or extra_indices.shape[:2] != (B, s_q) or extra_indices.dtype != torch.int32:
            raise ValueError(f"extra_indices must be int32 [B={B}, s_q={s_q}, K2], got {extra_indices.dtype} "
                             f"{tuple(extra_indices.shape)}")
        extra = read_keys(extra_k_cache, extra_page_size)
        ok = _valid(extra_indices, extra_topk_length, extra.shape[0])
        idx = torch.cat([idx, torch.where(ok, extra_indices.long() + keys.shape[0], -1)], -1)
        keys = torch.cat([keys, extra])
    res = sparse_attention(q.double().reshape(B * s_q, H, HEAD_DIM), keys, idx.reshape(B * s_q, -1).to(torch.int32),
                           scale=scale, sink=None if sink is None else sink.double(), return_lse=return_lse)
    if not return_lse:
        return res.reshape(B, s_q, H, HEAD_DIM)
    out, lse = res
    return out.reshape(B, s_q, H, HEAD_DIM), lse.reshape(B, s_q, H).permute(0, 2, 1)
