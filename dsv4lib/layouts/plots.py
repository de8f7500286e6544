"""Matplotlib pictures of layouts (returned as figures; ``imshow`` for big tiles so they draw fast).
Colours follow CuTe's ``print_latex_tv``: 8 pastel colours by ``thread % 8``; row 0 at the top."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from .mapping import PVMapping

CUTE_TV_RGB = np.array([(175, 175, 255), (175, 255, 175), (255, 255, 175), (255, 175, 175),
                        (210, 210, 255), (210, 255, 210), (255, 255, 210), (255, 210, 210)]) / 255.0
LABEL_CELLS_UP_TO = 32 * 32


def owner_grids(mapping: PVMapping) -> tuple[np.ndarray, np.ndarray]:
    """``(thread, value)`` owning each P[m, n] of the accumulator, as two ``[M, N]`` int grids."""
    thr = np.full((mapping.tile_m, mapping.tile_n), -1)
    val = np.full_like(thr, -1)
    for (t, v), _ in np.ndenumerate(mapping.dest):
        m, n = mapping.acc_mn[t, v]
        thr[m, n], val[m, n] = t, v
    return thr, val


def plot_tv_grid(thr: np.ndarray, val: np.ndarray, *, title: str = "", ax=None, color_by: str = "thread"):
    """A TV layout as a coloured grid: cells coloured by thread % 8 (or warp); labelled T/V when small."""
    M, N = thr.shape
    ax = ax or plt.subplots(figsize=(min(12, 0.35 * N + 1), min(10, 0.35 * M + 1)))[1]
    key = thr % 8 if color_by == "thread" else thr // 32
    cmap = ListedColormap(CUTE_TV_RGB if color_by == "thread" else plt.cm.tab10.colors[:max(1, key.max() + 1)])
    ax.imshow(key, cmap=cmap, interpolation="nearest", aspect="auto")
    if M * N <= LABEL_CELLS_UP_TO:
        for m in range(M):
            for n in range(N):
                ax.text(n, m, f"T{thr[m, n]}\nV{val[m, n]}", ha="center", va="center", fontsize=5)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("n (key column)")
    ax.set_ylabel("m (query row)")
    return ax.figure


def plot_swizzle(mapping: PVMapping, *, rows: int = 16, ax=None):
    """The swizzle pattern of the SMEM P buffer: for the first ``rows`` query rows, which 16-byte chunk of
    the 128-byte row each 8-element group of P lands in (identity would be a staircase-free ramp)."""
    if mapping.variant != "smem":
        raise ValueError("plot_swizzle needs an SMEM mapping")
    inv = {addr: mn for addr, mn in mapping.read_mn.items()}
    grid = np.zeros((rows, mapping.tile_n))
    for addr, (m, n) in inv.items():
        if m < rows:
            grid[m, n] = (addr * mapping.elem_bytes // 16) % 8
    ax = ax or plt.subplots(figsize=(10, 3))[1]
    im = ax.imshow(grid, cmap="viridis", interpolation="nearest", aspect="auto")
    ax.figure.colorbar(im, ax=ax, label="16-byte chunk within the 128-byte row")
    ax.set_title(f"{mapping.arch} SMEM-P swizzle: chunk of P[m, n]", fontsize=9)
    ax.set_xlabel("n")
    ax.set_ylabel("m")
    return ax.figure


def plot_thread_map(mapping: PVMapping, thread: int = 0, *, max_cols: int = 64):
    """One thread's accumulator elements (left, in the P tile) and where the mapping puts them (right:
    the SMEM buffer as rows of 64 elements, or the A fragment / TMEM view), value ids labelled."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(12, 4))
    V = mapping.dest.shape[1]
    vcmap = plt.cm.turbo.copy()
    vcmap.set_bad("white")
    tile = np.full((mapping.tile_m, mapping.tile_n), np.nan)      # cell colour = value id: shows the permutation
    for v in range(V):
        m, n = mapping.acc_mn[thread, v]
        tile[m, n] = v
    a0.imshow(tile, cmap=vcmap, vmin=0, vmax=V - 1, interpolation="nearest", aspect="auto")
    if mapping.dest.shape[1] <= 64:
        for v in range(mapping.dest.shape[1]):
            m, n = mapping.acc_mn[thread, v]
            a0.text(n, m, str(v), ha="center", va="center", fontsize=6, color="k")
    rows_m = mapping.acc_mn[thread, :, 0]
    a0.set_ylim(min(mapping.tile_m, rows_m.max() + 4) - 0.5, max(0, rows_m.min() - 4) - 0.5)   # zoom on its rows
    a0.set_title(f"thread {thread}: its accumulator elements P[m, n] (value ids)", fontsize=9)
    a0.set_xlabel("n")
    a0.set_ylabel("m")
    if mapping.variant == "smem":
        width = 64
        size = max(mapping.buffer_elems, int(mapping.dest.max()) + 1)
        buf = np.full((size + width - 1) // width * width, np.nan)
        buf[mapping.dest[thread]] = np.arange(V)
        grid = buf.reshape(-1, width)
        a1.imshow(grid, cmap=vcmap, vmin=0, vmax=V - 1, interpolation="nearest", aspect="auto")
        for v, addr in enumerate(mapping.dest[thread]):
            if mapping.dest.shape[1] <= 64:
                a1.text(addr % width, addr // width, str(v), ha="center", va="center", fontsize=6, color="k")
        used = mapping.dest[thread] // width
        a1.set_ylim(min(grid.shape[0], used.max() + 4) - 0.5, max(0, used.min() - 4) - 0.5)
        a1.set_title("where they go: SMEM P buffer (rows of 64 elements = 128 B, swizzled)", fontsize=9)
        a1.set_xlabel("element in 128-byte row")
        a1.set_ylabel("128-byte row")
    else:
        key = "A-fragment slot (thread, value)" if mapping.variant == "rs" else "TMEM (lane, bf16 column)"
        if mapping.variant == "rs":
            T = mapping.num_threads
            pts = [(int(a) % T, int(a) // T) for a in mapping.dest[thread]]
        else:
            pts = [(int(a) >> 17, int(a) & 0x1FFFF) for a in mapping.dest[thread]]
        xs, ys = zip(*pts)
        a1.scatter([y for y in ys], [x for x in xs], s=8)
        a1.set_title(f"where they go: {key}", fontsize=9)
        a1.set_xlabel("value" if mapping.variant == "rs" else "bf16 column")
        a1.set_ylabel("thread" if mapping.variant == "rs" else "TMEM lane")
    fig.suptitle(f"{mapping.arch} {mapping.variant} {mapping.dtype}: M={mapping.tile_m}, N={mapping.tile_n}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tmem_ownership(mapping: PVMapping, ax=None):
    """sm100: which warp owns which TMEM lanes and P columns (tcgen05.ld/st 32x32b: warp w ↔ lanes 32w..32w+31)."""
    if mapping.arch != "sm_100a":
        raise ValueError("TMEM ownership exists only on sm_100a")
    grid = np.full((128, mapping.tile_n // 2), -1)
    if mapping.variant == "tmem":     # where each thread's P lands: lane = address >> 17, bf16 column // 2
        for (t, _), a in np.ndenumerate(mapping.dest):
            grid[int(a) >> 17, (int(a) & 0x1FFFF) // 2] = t // 32
    else:                             # SMEM-P: the S rows each warp reads from TMEM
        for t in range(mapping.num_threads):
            grid[mapping.acc_mn[t, :, 0], :] = t // 32
    ax = ax or plt.subplots(figsize=(6, 4))[1]
    ax.imshow(grid, cmap=ListedColormap(plt.cm.tab10.colors[:4]), interpolation="nearest", aspect="auto")
    for w in range(4):
        ax.text(grid.shape[1] / 2, 32 * w + 16, f"warp {w}", ha="center", va="center", fontsize=9)
    ax.set_title("TMEM P: lanes × 32-bit columns, coloured by owning warp", fontsize=9)
    ax.set_xlabel("TMEM column (2 bf16 each)")
    ax.set_ylabel("TMEM lane = query row m")
    return ax.figure
