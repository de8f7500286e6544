"""K = V in one shared buffer (D6): the hd512 kernel stores each 64-key tile once, row-major ``(key, dim)`` with
the 128 B swizzle, and hands the *same* bytes to two wgmmas — QK reads them K-major (``B = K``: N = keys,
K-dim = dims), PV reads them MN-major (``B = Vᵀ``: N = dims, K-dim = keys) through
``composition(sKV, transposed_view(...))``.

Why one buffer can serve both: in the 128 B-swizzle canonical layouts of wgmma, a K-major operand is built
from 8-row × 128 B atoms where a row is 64 consecutive K-elements of one N-index, and an MN-major operand from
8 × 128 B atoms where a "row" is 64 consecutive MN-elements of one K-index.  For K stored as ``(key, dim)``
both descriptions name the same atom: 8 keys × 64 consecutive dims, 1 KiB, rows 128 B apart.  This module
evaluates the kernel's real layouts (``row_major_smem_layout`` and ``transposed_view``, traced by CuTeDSL on
the CPU) at every element and checks exactly that, plus that the V view addresses what the K view addresses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .mapping import physical_offsets
from .trace import cached, run_traced

ELEM_BYTES = 2            # bf16


@dataclass
class KVAlias:
    keys: int
    dims: int
    k_outer: np.ndarray        # [keys, dims] pre-swizzle element offset of K[key, dim]
    v_outer: np.ndarray        # [dims, keys] pre-swizzle element offset of the V view at (dim, key)
    swizzle: tuple[int, int, int]
    layout: str

    @property
    def k_physical(self) -> np.ndarray:
        """Element offsets as the hardware addresses them (byte swizzle in the pointer)."""
        return physical_offsets(self.k_outer, self.swizzle, ELEM_BYTES)

    def checks(self) -> dict[str, bool]:
        phys = self.k_physical
        n_atoms_dim = self.dims // 64
        atoms = self.k_outer.reshape(self.keys // 8, 8, n_atoms_dim, 64)            # (key blk, key, dim blk, dim)
        base = atoms[:, :1, :, :1]
        in_atom = atoms - base                                                       # offset inside the atom
        canonical = (np.arange(8)[:, None] * 64 + np.arange(64)[None, :])            # row r, element c
        return {
            # every element has its own place: the stage is a bijection onto [0, keys·dims)
            "bijective": np.array_equal(np.sort(phys.ravel()), np.arange(self.keys * self.dims)),
            # the V view reads (dim, key) exactly where K keeps (key, dim)
            "v_view_is_k_transposed": np.array_equal(self.v_outer, self.k_outer.T),
            # both canonical forms: 1 KiB atoms of 8 keys × 64 consecutive dims, rows 128 B apart
            "atoms_8x64_rows_128B": bool((in_atom == canonical[None, :, None, :]).all()),
            "atoms_1KiB_aligned": bool((base % 512 == 0).all()),
            # cp.async writes 16 B = 8 consecutive dims: contiguous after the swizzle too
            "16B_chunks_contiguous": bool((np.diff(phys.reshape(self.keys, self.dims // 8, 8), axis=2) == 1).all()),
        }

    def chunk_slots(self) -> np.ndarray:
        """``[keys, dims/8]``: which 16 B slot (0…7) of its 128 B line each 8-dim chunk lands in (the swizzle)."""
        return (self.k_physical[:, ::8] % 64) // 8


@cached
def kv_alias(keys: int = 64, dims: int = 512, view_order: tuple[int, int, int] | None = None) -> KVAlias:
    """Trace the hd512 kernel's K = V stage layout and its V view; evaluate both at every element.
    ``view_order``: replace the kernel's ``transposed_view`` by ``make_ordered_layout(..., order=view_order)``
    (to see the checks catch a wrong view)."""
    def build():
        import cutlass
        import cutlass.cute as cute

        from ..kernels.layouts import row_major_smem_layout, transposed_view
        sKV = row_major_smem_layout(cutlass.BFloat16, keys, dims, 1)                 # (keys, dims, 1 stage)
        view = (transposed_view(dims, keys, 1) if view_order is None
                else cute.make_ordered_layout((dims, keys, 1), order=view_order))
        v_view = cute.composition(sKV.outer, view)                                   # (dims, keys, 1)
        k_outer = np.array([[sKV.outer((n, d, 0)) for d in range(dims)] for n in range(keys)], dtype=np.int64)
        v_outer = np.array([[v_view((d, n, 0)) for n in range(keys)] for d in range(dims)], dtype=np.int64)
        return {"k_outer": k_outer, "v_outer": v_outer, "layout": str(sKV),
                "swizzle": (sKV.inner.num_bits, sKV.inner.num_base, sKV.inner.num_shift)}
    r = run_traced(build, "sm_90a")
    return KVAlias(keys, dims, r["k_outer"], r["v_outer"], r["swizzle"], r["layout"])


def plot_kv_alias(alias: KVAlias, *, keys: int = 16, chunks: int = 16, ax=None):
    """The 16 B slot each (key, 8-dim chunk) occupies in its 128 B line: K reads along a row (one key's dims),
    Vᵀ reads down a column (one dim chunk over 8 keys) — the XOR pattern puts those 8 in 8 different slots."""
    import matplotlib.pyplot as plt
    slots = alias.chunk_slots()[:keys, :chunks]
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    ax.imshow(slots, cmap="tab10", vmin=0, vmax=9, interpolation="nearest")
    for (n, c), v in np.ndenumerate(slots):
        ax.text(c, n, str(v), ha="center", va="center", fontsize=7)
    ax.set_xlabel("8-dim chunk (16 B) of the 512 dims")
    ax.set_ylabel("key (row of the tile)")
    ax.set_title(f"K = V stage, swizzle {alias.swizzle}: 16 B slot within the 128 B line", fontsize=9)
    return ax
