"""The smallest real CuTeDSL kernel, ``y <- alpha * x + y``: proves notebook → dsv4lib → CuTeDSL → GPU.

Stage 00 compiles it for sm_90a and sm_100a on any machine and checks the PTX target; on a GPU it also
runs it and compares with torch.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack, make_fake_tensor

from .compile import CompiledKernel, compile_for_arch

THREADS = 128


@cute.kernel
def _axpy_kernel(gX: cute.Tensor, gY: cute.Tensor, alpha: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx          # one element per thread
    if i < cute.size(gX):
        gY[i] = gX[i] * alpha + gY[i]


@cute.jit
def _axpy(mX: cute.Tensor, mY: cute.Tensor, alpha: cutlass.Float32):
    n = cute.size(mX)
    _axpy_kernel(mX, mY, alpha).launch(grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1))


def compile_axpy(arch: str) -> CompiledKernel:
    """Compile for ``arch`` with symbolic length (no GPU needed)."""
    n = cute.sym_int()
    x = make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=16)
    y = make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=16)
    return compile_for_arch(_axpy, x, y, cutlass.Float32(1.0), arch=arch)


def axpy_(x: torch.Tensor, y: torch.Tensor, alpha: float, compiled: CompiledKernel) -> torch.Tensor:
    """Run the compiled kernel in place on CUDA float32 vectors: ``y = alpha * x + y``."""
    if x.dtype != torch.float32 or y.dtype != torch.float32:
        raise TypeError(f"axpy_ needs float32 tensors, got {x.dtype} and {y.dtype}")
    if not (x.is_cuda and y.is_cuda):
        raise ValueError("axpy_ runs on CUDA tensors only")
    if x.shape != y.shape or x.dim() != 1 or not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(f"axpy_ needs two contiguous 1-D tensors of one shape, got {tuple(x.shape)}, {tuple(y.shape)}")
    # The build has a symbolic length, so the runtime tensors must carry their layout dynamically.
    compiled.fn(from_dlpack(x, assumed_align=16).mark_layout_dynamic(),
                from_dlpack(y, assumed_align=16).mark_layout_dynamic(), cutlass.Float32(alpha))
    return y
