"""Run CuTeDSL layout algebra on the CPU and bring the answers back as plain Python / numpy data.

CuTeDSL builds MMA atoms, tiled MMAs, SMEM layouts (swizzles included) and TMEM tensors only while it
traces a ``@cute.jit`` function; static layouts then evaluate to Python ints.  :func:`run_traced` traces a
builder for an arch and returns what it collected — no GPU involved, no CuTe algebra reimplemented here.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ..kernels.compile import cute_arch


def run_traced(builder: Callable[[], dict[str, Any]], arch: str) -> dict[str, Any]:
    """Trace ``builder`` inside ``@cute.jit`` compiled for ``arch``; return the dict it produced."""
    import cutlass.cute as cute

    result: dict[str, Any] = {}

    @cute.jit
    def _trace():
        result.update(builder())

    with cute_arch(arch):
        cute.compile(_trace, options=f"--gpu-arch {arch}")
    return result


def eval_tv(tv, num_threads: int, num_values: int) -> np.ndarray:
    """A (thread, value) → linear-coordinate layout as an int table ``[T, V]`` (evaluated by CuTeDSL)."""
    return np.array([[tv((t, v)) for v in range(num_values)] for t in range(num_threads)], dtype=np.int64)


def eval_linear(layout, size: int) -> np.ndarray:
    """A layout evaluated at every 1-D index of its domain: ``[size]`` (offsets, swizzle included)."""
    return np.array([layout(i) for i in range(size)], dtype=np.int64)


def cached(fn):
    """Cache traced results per configuration (tracing costs ~0.1–1 s)."""
    return functools.lru_cache(maxsize=None)(fn)
