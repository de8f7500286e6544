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
