"""Tensor memory of the sm100 hd512 kernel (D6 twin, compiled not run): where O and S live, and which thread of the
softmax warps reads what — evaluated from the kernel's own CuTe layouts (traced on the CPU), then checked.

TMEM is 128 lanes × 512 columns of 32 bits.  The kernel's accumulators are M = 64 (64 query heads), and an M=64
``tcgen05.mma`` uses half the lanes: row ``16j + i`` sits in lane ``32j + i + base`` with base 0 or 16 (PTX
"Layout F").  O (64 × 512 fp32) needs every column, so it takes base 0; S (64 × 64) takes columns 0-63 at base 16
— the lanes O leaves free.  A softmax thread reads S and O with ``tcgen05.ld 16x32bx2``: thread t of warp w gets
row ``16w + t % 16`` and 32 consecutive columns of each 64-column window, starting at ``32·(t // 16)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace import cached, run_traced

LANES, COLUMNS = 128, 512


@dataclass
class TmemPlan:
    o_lane: np.ndarray          # [64, 512] TMEM lane of O[row, col]
    o_col: np.ndarray           # [64, 512] TMEM column of O[row, col]
    s_lane: np.ndarray          # [64, 64]
    s_col: np.ndarray           # [64, 64]
    thread_row: np.ndarray      # [128] the S / O row softmax thread t reads
    thread_cols: np.ndarray     # [128, 32] the columns (of a 64-column window) thread t reads, in register order
    thread_lane: np.ndarray     # [128, 32] the TMEM lane each of those S values sits in
    layouts: dict

    def checks(self) -> dict[str, bool]:
        o_cells = self.o_lane * COLUMNS + self.o_col
        s_cells = self.s_lane * COLUMNS + self.s_col
        rows = np.arange(64)
        warp = np.arange(128) // 32
        return {
            "in_range": bool(self.o_lane.max() < LANES and self.s_lane.max() < LANES and self.o_col.max() < COLUMNS
                             and self.s_col.max() < COLUMNS and min(self.o_lane.min(), self.s_lane.min()) >= 0),
            # O: every (row, col) its own cell, rows in Layout F at base 0, column = output column
            "o_bijective": len(np.unique(o_cells)) == o_cells.size,
            "o_layout_f_base_0": bool((self.o_lane == ((rows % 16) + 32 * (rows // 16))[:, None]).all()
                                      and (self.o_col == np.arange(512)[None, :]).all()),
            "s_layout_f_base_16": bool((self.s_lane == ((rows % 16) + 32 * (rows // 16) + 16)[:, None]).all()
                                       and (self.s_col == np.arange(64)[None, :]).all()),
            # S never touches a cell of O: the QK MMA of tile i+1 may run while O is being rescaled
            "s_and_o_disjoint": not np.intersect1d(o_cells, s_cells).size,
            # thread t of warp w: row 16w + t % 16, 32 consecutive columns starting at 32·(t // 16)
            "thread_rows": bool((self.thread_row == 16 * warp + np.arange(128) % 16).all()),
            "thread_cols_contiguous": bool((self.thread_cols == (32 * ((np.arange(128) % 32) // 16))[:, None]
                                            + np.arange(32)[None, :]).all()),
            # a warp only reads the 32 lanes of its own sub-partition (the tcgen05.ld rule)
            "lanes_in_own_subpartition": bool((self.thread_lane // 32 == warp[:, None]).all()),
        }


@cached
def tmem_plan() -> TmemPlan:
    """Trace the sm100 hd512 kernel's M=64 accumulator layouts and its ``16x32bx2`` load partition."""
    def build():
        import cutlass
        import cutlass.cute as cute
        import cutlass.utils.blackwell_helpers as sm100_utils
        from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

        from ..kernels.sm100.sparse_fwd import S_LANE_BASE
        from ..kernels.sparse_base import HALF, TILE_H, TILE_N

        def c_layout(n, b_major):
            mma = sm100_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, b_major,
                                                     cutlass.Float32, tcgen05.CtaGroup.ONE, (TILE_H, n))
            thr = mma.get_slice(0)
            return thr.make_fragment_C(thr.partition_shape_C((TILE_H, n))).layout      # ((M, N), 1, 1)

        lay_s, lay_o = c_layout(TILE_N, OperandMajorMode.K), c_layout(HALF, OperandMajorMode.MN)
        addr = lambda lay, r, c: lay(((r, c), 0, 0))                                  # lane << 16 | column
        o = np.array([[addr(lay_o, r, c % HALF) + HALF * (c // HALF) for c in range(512)] for r in range(TILE_H)])
        s = np.array([[addr(lay_s, r, c) + (S_LANE_BASE << 16) for c in range(TILE_N)] for r in range(TILE_H)])
        # the softmax threads' view: the copy partition of an identity tensor shaped like the accumulator
        ld = tcgen05.make_tmem_copy(cute.make_copy_atom(tcgen05.copy.Ld16x32bx2Op(tcgen05.copy.Repetition(32)),
                                                        cutlass.Float32),
                                    cute.make_tensor(cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem),
                                                     lay_s))
        ident = cute.make_tensor(cute.make_identity_tensor((TILE_H, TILE_N)).iterator, cute.make_layout(
            ((TILE_H, TILE_N), 1, 1), stride=((cute.E(0), cute.E(1)), 0, 0)))
        rows, cols = [], []
        for t in range(128):
            part = ld.get_slice(t).partition_D(ident)
            coords = [part[i] for i in range(cute.size(part))]
            rows.append(coords[0][0])
            cols.append([c[1] for c in coords])
            assert all(c[0] == coords[0][0] for c in coords)
        return {"o": o, "s": s, "rows": np.array(rows), "cols": np.array(cols),
                "layouts": {"S / O window (M=64)": str(lay_s), "O half (M=64, N=256)": str(lay_o)}}
    r = run_traced(build, "sm_100a")
    o, s = r["o"], r["s"]
    rows = r["rows"]
    lane_of_s = s >> 16
    thread_lane = lane_of_s[rows[:, None], r["cols"]]
    return TmemPlan(o >> 16, o & 0xFFFF, lane_of_s, s & 0xFFFF, rows, r["cols"], thread_lane, r["layouts"])


def plot_tmem_plan(plan: TmemPlan, ax=None):
    """Lanes × columns of tensor memory: O (base-0 lanes, all 512 columns), S (base-16 lanes, columns 0-63),
    unused cells white."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    grid = np.zeros((LANES, COLUMNS), dtype=np.int8)
    grid[plan.o_lane.ravel(), plan.o_col.ravel()] = 1
    grid[plan.s_lane.ravel(), plan.s_col.ravel()] = 2
    ax = ax or plt.subplots(figsize=(9, 3))[1]
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap(["white", "tab:blue", "tab:orange"]))
    ax.set_xlabel("TMEM column (32-bit)")
    ax.set_ylabel("TMEM lane")
    ax.set_title("sm100 hd512 kernel: O (blue, M=64 at lane base 0) and S (orange, lane base 16)", fontsize=9)
    return ax
