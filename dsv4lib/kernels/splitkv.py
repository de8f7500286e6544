"""D2 split-KV: how the KV range is cut over CTAs, the number of splits, and the merge — in torch, as the
kernels do it (the combine kernel is :class:`dsv4lib.kernels.combine.LSECombineKernel`)."""
from __future__ import annotations

import math

import torch

LOG2_E = math.log2(math.e)


def split_block_ranges(n_block_min: int, n_block_max: int, num_splits: int) -> list[tuple[int, int]]:
    """KV-tile range ``[lo, hi)`` of each split: ``ceil(n / splits)`` tiles each, the last ones possibly
    empty (``lo >= hi``: that split writes O = 0, lse = -inf).  The kernels use this exact formula."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    n = max(n_block_max - n_block_min, 0)
    per = -(-n // num_splits) if n else 0
    return [(min(n_block_min + i * per, n_block_max), min(n_block_min + (i + 1) * per, n_block_max))
            for i in range(num_splits)]


def nonempty_splits(n_tiles: int, num_splits: int) -> int:
    """How many of ``num_splits`` splits get a tile under :func:`split_block_ranges`' rule (``ceil(n / splits)``
    tiles each): asking for that many cuts the tiles the same way with no empty split.  An empty split still
    launches, writes a zero fp32 partial and an LSE of -inf, and the combine reads them back — the D7 decode's B1
    (10 tiles, 8 splits: 2 tiles each) left 3 of 8 CTAs empty."""
    if n_tiles < 1 or num_splits < 1:
        return max(1, num_splits)
    per = -(-n_tiles // num_splits)
    return -(-n_tiles // per)


def num_splits_heuristic(batch: int, heads: int, m_blocks: int, n_blocks: int, num_sms: int = 132,
                         max_splits: int = 64) -> int:
    """Enough splits that ``batch·heads·m_blocks·splits`` fills the SMs about twice, but at least 4 KV tiles
    per split (each split re-reads Q and writes an fp32 partial), and 1 when the grid is already full; none of them
    empty (:func:`nonempty_splits`)."""
    ctas = batch * heads * m_blocks
    if ctas >= num_sms or n_blocks < 8:
        return 1
    return nonempty_splits(n_blocks, max(1, min(max_splits, -(-2 * num_sms // ctas), n_blocks // 4)))


def combine_torch(o_parts: torch.Tensor, lse_parts: torch.Tensor, sink: torch.Tensor | None = None):
    """The combine kernel's algorithm in torch: ``o_parts (splits, B, Sq, H, D)``, ``lse_parts (splits, B, H, Sq)``
    → ``(out (B, Sq, H, D), lse (B, H, Sq))``; the sink applied once, after the merge."""
    mx = lse_parts.amax(0)                                              # (B, H, Sq)
    base = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx * LOG2_E)
    w = torch.exp2(lse_parts * LOG2_E - base)                           # (splits, B, H, Sq), 0 for empty splits
    total = w.sum(0)
    lse = torch.where(total > 0, (base + torch.log2(total)) / LOG2_E, torch.full_like(total, -math.inf))
    w = w / torch.where(total > 0, total, torch.ones_like(total))
    out = (w.permute(0, 1, 3, 2).unsqueeze(-1) * o_parts).sum(0)        # (B, Sq, H, D)
    if sink is not None:
        gate = torch.where(total > 0, torch.sigmoid(lse - sink.view(1, -1, 1).to(lse.dtype)), torch.zeros_like(lse))
        out = out * gate.permute(0, 2, 1).unsqueeze(-1)
    return out, lse
