"""Which KV tiles a query tile visits — the kernels' loop bounds and mask tests, in plain Python, for plots
and tests.  0 = skipped (never loaded), 1 = visited with a mask, 2 = visited whole."""
from __future__ import annotations

import numpy as np

SKIPPED, MASKED, FULL = 0, 1, 2


def tile_plan(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, *, causal: bool = False,
              window: int | None = None) -> np.ndarray:
    """``[m_blocks, n_blocks]`` plan, queries aligned to the end of the keys (as in the sm90 kernel)."""
    shift = seqlen_k - seqlen_q
    m_blocks, n_blocks = -(-seqlen_q // tile_m), -(-seqlen_k // tile_n)
    plan = np.zeros((m_blocks, n_blocks), dtype=np.int8)
    for mb in range(m_blocks):
        lo, hi = 0, n_blocks
        if window is not None:
            lo = max(mb * tile_m + shift - window + 1, 0) // tile_n
        if causal or window is not None:
            hi = min(hi, max(((mb + 1) * tile_m - 1 + shift) // tile_n + 1, 0))
        for nb in range(lo, hi):
            masked = (nb + 1) * tile_n > seqlen_k
            if causal or window is not None:
                masked |= (nb + 1) * tile_n - 1 > mb * tile_m + shift
            if window is not None:
                masked |= nb * tile_n <= (mb + 1) * tile_m - 1 + shift - window
            plan[mb, nb] = MASKED if masked else FULL
    return plan


def unmasked_tiles_end(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, *,
                       causal: bool = False, window: int | None = None) -> int:
    """Key tiles below this index need no right-edge mask for any row of ``m_block`` (the sm90 kernel's
    ``unmasked_tiles_end``: with ``unmasked_body`` its loop visits the tiles from this index up first, with masks)."""
    limit = seqlen_k
    if causal or window is not None:
        limit = min(limit, m_block * tile_m + seqlen_k - seqlen_q + 1)
    return max(limit, 0) // tile_n


def unmasked_tiles_start(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, window: int) -> int:
    """With a window: key tiles from this index up need no left-edge mask for any row of ``m_block`` (the kernel's
    ``unmasked_tiles_start``: the tiles below it, visited last, take masks again)."""
    edge = (m_block + 1) * tile_m - 1 + seqlen_k - seqlen_q - window
    return edge // tile_n + 1 if edge >= 0 else 0


def rows_key_tiles(first_row: int, last_row: int, seqlen_q: int, seqlen_k: int, tile_n: int, *,
                   window: int | None = None, causal: bool = False) -> tuple[int, int]:
    """The KV tiles ``[lo, hi)`` the query rows ``first_row..last_row`` visit (the sm90 kernel's
    ``rows_key_tiles``; rows past the end of the queries keep the clipped range the kernel computes for them)."""
    shift = seqlen_k - seqlen_q
    lo, hi = 0, -(-seqlen_k // tile_n)
    if window is not None:
        lo = max(first_row + shift - window + 1, 0) // tile_n
    if causal or window is not None:
        hi = min(hi, max((last_row + shift) // tile_n + 1, 0))
    return lo, hi


def warpgroup_slots(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int, *,
                    window: int | None = None, causal: bool = False) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Warpgroup tiles (the sm90 kernel's ``warpgroup_plan``): the K/V slots of query block ``m_block`` — one run of
    key tiles descending from ``top`` (slot i holds tile ``top - 1 - i``) — and, per 64-row warpgroup, how many slots
    it skips before its own tiles, visits, and skips after.  Returns (top, slots, [(lead, visits, trail), …])."""
    ranges = [rows_key_tiles(m_block * tile_m + 64 * w, m_block * tile_m + 64 * w + 63, seqlen_q, seqlen_k, tile_n,
                             window=window, causal=causal) for w in range(tile_m // 64)]
    full = [(lo, hi) for lo, hi in ranges if hi > lo]
    top = max((hi for _, hi in full), default=0)
    bottom = min((lo for lo, _ in full), default=0)
    parts = []
    for lo, hi in ranges:
        visits = max(hi - lo, 0)
        lead = top - hi if visits > 0 else top - bottom
        parts.append((lead, visits, top - bottom - lead - visits))
    return top, top - bottom, parts


def section_width(l2_section_bytes: int, seqlen_k: int, head_dim: int, heads_all: int) -> int:
    """Heads in one L2 section of the causal deal (the sm90 scheduler's rule): as many as the section's bytes hold
    of K and V (``seqlen_k · head_dim`` bf16 each a head), at least one, at most all of them."""
    return min(max(l2_section_bytes // max(seqlen_k * head_dim * 4, 1), 1), heads_all)


def deal_order(m_blocks: int, heads: int, batch: int = 1, *, longest_first: bool = True,
               width: int = 0) -> list[tuple[int, int, int]]:
    """The persistent scheduler's ``work_coords`` for every work index: ``(m_block, head, batch)`` in the order the
    items are dealt.  ``width`` 0: one head at a time (its blocks in a row); else sections of ``width`` heads, the
    head fastest inside a section (the last section may hold fewer).  ``longest_first``: a head's last query blocks
    (the most keys under a causal mask) first."""
    heads_all = heads * batch
    order = []
    for work in range(m_blocks * heads_all):
        m, head_batch = work % m_blocks, work // m_blocks
        if width:
            first = work // (m_blocks * width) * width
            here = min(width, heads_all - first)                  # the last section may hold fewer heads
            m, head_in_section = divmod(work - first * m_blocks, here)
            head_batch = first + head_in_section
        if longest_first:
            m = m_blocks - 1 - m
        order.append((m, head_batch % heads, head_batch // heads))
    return order


def block_costs(plan: np.ndarray) -> list[int]:
    """The deal model's cost of each query block of a :func:`tile_plan`: the key tiles it visits, + 1 for the item's
    fixed part (Q load, first QK, epilogue)."""
    return [int((row != SKIPPED).sum()) + 1 for row in plan]


def dynamic_deal_finish_times(costs: list[float], ctas: int) -> list[float]:
    """When each of ``ctas`` CTAs finishes (ascending) if each takes the next item (of cost ``costs[i]``, in that
    order) as soon as it is free — the dynamic deal's timing model: no overlap between items, no L2 effects."""
    import heapq
    free = [0.0] * ctas
    for cost in costs:
        heapq.heapreplace(free, free[0] + cost)
    return sorted(free)


def dynamic_deal_makespan(costs: list[float], ctas: int) -> float:
    """When the last CTA of :func:`dynamic_deal_finish_times` finishes."""
    return dynamic_deal_finish_times(costs, ctas)[-1]
