"""What an FP8-math QK^T (#36 item 3) costs in accuracy, on the CPU, for two kernel designs:

  per-block   the cache's e4m3 key codes as they are, one wgmma accumulator per 64-dim block, each promoted with the
              key's block scale (7 promotions of a 64 x 64 tile per key tile): exact products of the quantized
              query and the cached key — the error is the query's e4m3 rounding alone
  one-scale   each key re-based to ONE power-of-two scale (its largest block's) before the MMA: a block's codes
              shifted down by (e_max - e_b) in the exponent, re-rounded to e4m3 (subnormal or zero when the gap is
              large) — one accumulator over all 448 dims and one scale per key column, cheap in the producer (an
              exponent subtraction per byte instead of a conversion to bf16), at the price of the small blocks' bits

Queries: e4m3 nope dims with a UE8M0 scale per 64 dims (``reference.quant.fp8_math_queries``), rope dims bf16; keys
cache-quantized (``reference.model1``).  Attention in float64 over the approximated operands against the exact one
over the same cached keys (the bf16 path's reference); cosine and the worst row's relative error.  A third design (session 44) also runs the nope part of PV on e4m3
operands: the cache's codes as V, P rounded to e4m3 per 64-column output block with the keys' block scales folded in
(``_attention_fp8_pv``).  Two key
distributions (Gaussian; Student-t with 3 degrees of freedom: heavy-tailed blocks, large gaps between a key's block
scales) and two query scales (1: near-uniform attention; 4: peaked).

    python scripts/fp8_math_accuracy.py [--tokens 32] [--keys 640] [--heads 64]"""
import argparse
import json

import torch

from dsv4lib import reference
from dsv4lib.reference import model1
from dsv4lib.reference.quant import fp8_math_queries
from dsv4lib.workbook import metrics

NOPE, BLOCK = 448, 64


def one_scale_keys(keys: torch.Tensor, records: torch.Tensor) -> torch.Tensor:
    """Cached keys (float64 ``[N, 512]``) with every key's 7 nope blocks re-based to its largest block's scale and
    re-rounded to e4m3 (what a producer that only shifts exponents would hand a one-accumulator FP8 MMA)."""
    exps = records[:, 448 + 128:448 + 128 + 7].long() - 127                       # the blocks' UE8M0 exponents
    top = exps.amax(1, keepdim=True)                                               # [N, 1]
    scale = torch.pow(2.0, top.double())
    nope = keys[:, :NOPE] / scale                                                  # codes x 2^(e_b - e_max)
    nope = nope.float().clamp(-448, 448).to(torch.float8_e4m3fn).double() * scale
    return torch.cat([nope, keys[:, NOPE:]], 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--keys", type=int, default=640)
    ap.add_argument("--heads", type=int, default=64)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    pool = 4096
    for dist in ("gaussian", "student_t3"):
        raw = torch.randn(pool, 512, generator=gen, dtype=torch.float64)
        if dist == "student_t3":       # t(3) = normal / sqrt(chi2(3) / 3), per element
            chi2 = sum(torch.randn(pool, 512, generator=gen, dtype=torch.float64) ** 2 for _ in range(3))
            raw = raw / torch.sqrt(chi2 / 3)
        records = model1.quantize_keys(raw)
        keys = model1.dequantize_records(records)
        rebased = one_scale_keys(keys, records)
        gaps = (records[:, 576:583].long().amax(1, keepdim=True) - records[:, 576:583].long())
        idx = torch.randint(0, pool, (args.tokens, args.keys), generator=gen, dtype=torch.int32)
        sink = torch.randn(args.heads, generator=gen, dtype=torch.float64)
        for q_scale in (1.0, 4.0):
            q = (torch.randn(args.tokens, args.heads, 512, generator=gen, dtype=torch.float64) * q_scale)
            q = q.bfloat16().double()
            exact = reference.sparse_attention(q, keys, idx, sink=sink)
            q8 = fp8_math_queries(q, BLOCK)
            for design, k in (("per-block", keys), ("one-scale", rebased), ("per-block + e4m3 PV", keys)):
                # scores from the approximated operands; PV (and so V) stays the cached keys in bf16 math — or, in
                # the last design, runs on the cache's e4m3 codes with P quantized per output block
                if design.endswith("PV"):
                    approx = _attention_fp8_pv(q8, keys, records, idx, sink)
                else:
                    approx = _attention_scores_from(q8, k, keys, idx, sink)
                print(json.dumps({"keys": dist, "q_scale": q_scale, "design": design,
                                  "cosine": round(metrics.cosine(approx, exact), 7),
                                  "row_rel_err_worst": round(metrics.row_rel_err_worst(approx, exact), 4),
                                  "block_gap_mean": round(gaps.double().mean().item(), 2),
                                  "block_gap_max": int(gaps.max())}), flush=True)


def _attention_scores_from(q, k_scores, v, idx, sink):
    """Sparse attention whose scores use ``k_scores`` and whose values are ``v`` (K = V in the cache, but the FP8
    path only approximates the K side)."""
    scale = 512 ** -0.5
    kk, vv = k_scores[idx.long()], v[idx.long()]                                  # [Sq, K, 512]
    s = torch.einsum("qhd,qkd->qhk", q, kk) * scale
    m = torch.maximum(s.amax(-1), sink[None, :])
    p = torch.exp(s - m[..., None])
    denom = p.sum(-1) + torch.exp(sink[None, :] - m)
    return torch.einsum("qhk,qkd->qhd", p, vv) / denom[..., None]


def _attention_fp8_pv(q, keys, records, idx, sink, tile: int = 64):
    """:func:`_attention_scores_from` (per-block scores) with the nope part of PV on e4m3 operands (docs/tuning/
    d2_d6.md, session 44): the cache's codes as V, and per 64-key tile and 64-column output block b the weights
    ``P · 2^(e[k, b] - E_b)`` (E_b: the tile's largest exponent of block b) rounded to e4m3 after a fixed x448 (P ≤ 1
    after the max subtraction), the block's result times 2^E_b.  The rope columns and the row sums keep P exact."""
    scale = 512 ** -0.5
    kk = keys[idx.long()]                                                          # [Sq, K, 512]
    s = torch.einsum("qhd,qkd->qhk", q, kk) * scale
    m = torch.maximum(s.amax(-1), sink[None, :])
    p = torch.exp(s - m[..., None])                                                # [Sq, H, K]
    denom = p.sum(-1) + torch.exp(sink[None, :] - m)
    exps = (records[:, 576:583].long() - 127)[idx.long()].double()               # [Sq, K, 7]
    codes = kk[..., :NOPE].unflatten(-1, (7, BLOCK)) / torch.pow(2.0, exps)[..., None]   # [Sq, K, 7, 64] e4m3 values
    out = torch.zeros(*q.shape[:2], 512, dtype=torch.float64)
    out[..., NOPE:] = torch.einsum("qhk,qkd->qhd", p, kk[..., NOPE:])
    for t0 in range(0, idx.shape[1], tile):
        e = exps[:, t0:t0 + tile]                                                  # [Sq, T, 7]
        top = e.amax(1, keepdim=True)                                              # [Sq, 1, 7]
        p_b = p[:, :, t0:t0 + tile, None] * torch.pow(2.0, e - top)[:, None]      # [Sq, H, T, 7]
        p_b = (p_b * 448).float().to(torch.float8_e4m3fn).double() / 448
        part = torch.einsum("qhkb,qkbd->qhbd", p_b, codes[:, t0:t0 + tile]) * torch.pow(2.0, top)[:, 0, None, :, None]
        out[..., :NOPE] += part.flatten(-2)
    return out / denom[..., None]


if __name__ == "__main__":
    main()
