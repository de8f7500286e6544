"""Accuracy metrics, computed in float64 so the metric itself adds no error."""
from __future__ import annotations

import math

import torch


def _pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    return out.detach().to(torch.float64).flatten(), ref.detach().to(torch.float64).flatten().to(out.device)


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors (1.0 = same direction).  NaN anywhere gives NaN."""
    a, b = _pair(out, ref)
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float((a @ b) / (na * nb))


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||."""
    a, b = _pair(out, ref)
    nb = b.norm()
    return float((a - b).norm() / nb) if nb > 0 else float((a - b).norm())


def row_rel_err_worst(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst row's relative L2 error (rows: the last dim), rows whose reference is zero left out."""
    o, r = _pair(out, ref)
    o, r = o.reshape(-1, ref.shape[-1]), r.reshape(-1, ref.shape[-1])
    norms = r.norm(dim=-1)
    keep = norms > 0
    return float(((o[keep] - r[keep]).norm(dim=-1) / norms[keep]).max()) if keep.any() else 0.0


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = _pair(out, ref)
    return float((a - b).abs().max()) if a.numel() else 0.0


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 20 log10(||ref|| / ||out - ref||) in dB (inf when equal)."""
    a, b = _pair(out, ref)
    err = (a - b).norm()
    return math.inf if err == 0 else float(20 * torch.log10(b.norm() / err))


def fa4_rule_margin(out: torch.Tensor, ref: torch.Tensor, bf16_ref: torch.Tensor) -> float:
    """FA4's test rule as a ratio (≤ 1 passes): ``max|out − ref|`` over ``2·max|bf16_ref − ref| + atol``, with
    ``atol`` twice the bf16 rounding of the fp32 reference.  ``ref`` float64 truth, ``bf16_ref`` the same math run
    by torch in bf16."""
    a, b = _pair(out, ref)
    r32 = ref.float()
    atol = 2 * (r32.bfloat16().float() - r32).abs().max().item()
    torch_err = (bf16_ref.double().to(ref.device) - ref).abs().max().item()
    return float((a - b).abs().max()) / (2 * torch_err + atol)


def all_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return {"cosine": cosine(out, ref), "rel_l2": rel_l2(out, ref), "max_abs": max_abs(out, ref),
            "sqnr_db": sqnr_db(out, ref)}
