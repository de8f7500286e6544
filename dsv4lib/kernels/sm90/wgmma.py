"""The Hopper warpgroup MMA issue shared by the sm90 attention kernels."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
         zero_init: cutlass.Constexpr, wait: cutlass.Constexpr = True, k_blocks: cutlass.Constexpr = None):
    """acc (+)= A·B over every k-block (or the ``k_blocks = (lo, hi)`` range of them) as one wgmma group;
    then wait for it unless ``wait=False``."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    k_range = k_blocks
    if const_expr(k_blocks is None):
        k_range = (0, cute.size(tCrA.shape[2]))
    for k in cutlass.range_constexpr(k_range[0], k_range[1]):
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if const_expr(wait):
        warpgroup.wait_group(0)
