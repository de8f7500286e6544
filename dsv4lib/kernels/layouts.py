"""The shared-memory and accumulator layouts the attention kernels build on (both archs, dense and sparse).  The
proofs that they put every element where the hardware expects it, and their plots, are in ``dsv4lib.layouts``."""
from __future__ import annotations

import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum


def acc_layout_rows_cols(acc_layout: cute.Layout) -> cute.Layout:
    """View a wgmma accumulator fragment ``((2, 2, V), MMA_M, MMA_N)`` as ``(rows, cols)`` of this thread:
    rows = ((2: row +8), MMA_M), cols = ((2: adjacent column), V, MMA_N).  Same registers, new coordinates."""
    flat = cute.make_layout(acc_layout.shape)                            # column-major over the fragment
    shape = ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[0][2], flat.shape[2]))
    stride = ((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[0][2], flat.stride[2]))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def acc_layout_as_operand_a(acc_layout: cute.Layout) -> cute.Layout:
    """View the QK accumulator ``((2, 2, V), MMA_M, MMA_N)`` as the PV RS-wgmma A fragment
    ``((2, 2, 2), MMA_M, (V/2, MMA_N))``: each 16-column k-block takes two 8-column accumulator groups.
    Proven a same-thread re-view for bf16 by ``dsv4lib.layouts`` (D1.3)."""
    split = cute.logical_divide(acc_layout, ((None, None, 2), None, None))   # ((2, 2, (2, V/2)), M, N)
    s, d = split.shape, split.stride
    return cute.make_layout(((s[0][0], s[0][1], s[0][2][0]), s[1], (s[0][2][1], s[2])),
                            stride=((d[0][0], d[0][1], d[0][2][0]), d[1], (d[0][2][1], d[2])))


def row_major_smem_layout(dtype, rows: int, cols: int, stages: int | None = None):
    """A ``(rows, cols[, stages])`` shared buffer, columns contiguous, in the widest swizzle atom that fits
    ``cols`` (128 B for bf16 ≥ 64 columns): the K-major operand layout of wgmma, stages outermost."""
    atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    return cute.tile_to_shape(atom, shape, order=(0, 1) if stages is None else (0, 1, 2))


def transposed_view(dims: int, rows: int, stages: int):
    """``(dims, rows, stages) → (rows, dims, stages)`` coordinates: composed with a ``(rows, dims, stages)``
    row-major buffer it reads that buffer as ``(dims, rows, stages)`` — V stored like K, seen MN-major by the PV
    wgmma.  (``dsv4lib.layouts.kv_alias`` proves the composition puts every element where it belongs.)"""
    return cute.make_ordered_layout((dims, rows, stages), order=(1, 0, 2))
