"""The GPU kernel tests' shared checks: outputs and cached workspaces poisoned with NaN before a call, comparison
with the float64 reference by a per-row bound as well as the cosine (the worst row named on failure), and fresh
seeds printed so a failure can be replayed (``DSV4_TEST_SEED=<seed> pytest ...``)."""
from __future__ import annotations

import contextlib
import os
import random

import torch

# a row's relative error ||out - ref|| / ||ref||: bf16 output and bf16 P give ~0.003-0.006; a wrong, stale or
# missing row gives ~1.  The bound sits between (a whole-tensor cosine misses a few wrong rows among thousands).
ROW_REL_ERR_MAX = 0.02
COSINE_MIN = 0.9999


def fresh_seed() -> int:
    """A new seed per call (or ``DSV4_TEST_SEED``), printed: pytest shows it with a failing test's output."""
    seed = int(os.environ.get("DSV4_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed={seed}")
    return seed


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        t.view(torch.uint8).fill_(0xFF)
    return t


@contextlib.contextmanager
def rebuilt_with(monkeypatch, cls, **class_attrs):
    """Inside: every build of ``cls`` (and its subclasses) compiled afresh with ``class_attrs`` set on the class — an
    A/B candidate's switch that no config and so no compile key holds (the call plans and compiled functions are
    dropped on entry and on exit, so neither side reuses the other's build)."""
    from dsv4lib.ops import launch
    for name, value in class_attrs.items():
        monkeypatch.setattr(cls, name, value)
    launch.forget_plans()
    launch._COMPILED.clear()
    try:
        yield
    finally:
        launch.forget_plans()
        launch._COMPILED.clear()


@contextlib.contextmanager
def poisoned_outputs():
    """Inside: every tensor the library allocates with ``torch.empty`` / ``empty_like`` / ``new_empty`` is NaN (integer
    ones 0xFF bytes), and the cached split-KV workspaces are poisoned first — so a region a kernel fails to write
    shows up as NaN or garbage instead of a previous call's leftovers.  The NVFP4 amax partials get +inf instead (the
    quantize folds them with ``fmax``, which would pass over a NaN)."""
    import importlib
    from dsv4lib.ops import launch
    for bufs in launch._WORKSPACE.values():
        for b in bufs:
            _poison(b)
    for partials in importlib.import_module("dsv4lib.ops.nvfp4")._AMAX_PARTIALS.values():
        partials.fill_(float("inf"))
    real = torch.empty, torch.empty_like, torch.Tensor.new_empty
    torch.empty = lambda *a, **k: _poison(real[0](*a, **k))
    torch.empty_like = lambda *a, **k: _poison(real[1](*a, **k))
    torch.Tensor.new_empty = lambda self, *a, **k: _poison(real[2](self, *a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = real


def row_errors(out: torch.Tensor, ref: torch.Tensor, row_dims: int) -> torch.Tensor:
    """Relative error per row, a row being the last ``row_dims`` dims (e.g. 1: one head's D-vector).  A row whose
    reference is exactly zero (no visible key) must be exactly zero: its error is its norm."""
    o = out.double().reshape(-1, *out.shape[out.dim() - row_dims:]).flatten(1)
    r = ref.double().reshape(-1, *ref.shape[ref.dim() - row_dims:]).flatten(1).to(o.device)
    diff = (o - r).norm(dim=1)
    norm = r.norm(dim=1)
    return torch.where(norm > 0, diff / norm.clamp_min(1e-300), diff)


def check_output(out: torch.Tensor, ref: torch.Tensor, *, row_dims: int = 1, row_max: float = ROW_REL_ERR_MAX,
                 cos_min: float = COSINE_MIN) -> None:
    """``out`` finite, its cosine with ``ref`` ≥ ``cos_min`` and every row's relative error ≤ ``row_max``; the
    message names the worst row (flat index over the leading dims) and its error."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    bad = ~torch.isfinite(out)
    assert not bad.any(), f"{int(bad.sum())} non-finite outputs, first at {tuple(bad.nonzero()[0].tolist())}"
    err = row_errors(out, ref, row_dims)
    worst = int(err.argmax())
    lead = out.shape[:out.dim() - row_dims]
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), lead)) if lead else ()
    assert err[worst] <= row_max, f"row {where} of {tuple(lead)}: relative error {err[worst]:.3g} > {row_max}"
    cos = cosine(out, ref)
    assert cos >= cos_min, f"cosine {cos:.6f} < {cos_min}"


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two tensors in float64, without torch's eps clamp (which reads tiny outputs — a +50 sink scales O
    by ~e^-46 — as orthogonal); two all-zero tensors (no query saw a key) count as equal."""
    x, y = a.double().flatten(), b.double().flatten().to(a.device)
    nx, ny = x.norm(), y.norm()
    if nx == 0 and ny == 0:
        return 1.0
    if nx == 0 or ny == 0:
        return 0.0
    return float((x / nx) @ (y / ny))


def check_lse(lse: torch.Tensor, ref_lse: torch.Tensor, *, empty_rows_exact: bool = True) -> None:
    """LSE close to the reference where it is finite, and -inf exactly where the reference's is (rows with no key)."""
    finite = torch.isfinite(ref_lse.to(lse.device))
    if empty_rows_exact:
        assert torch.equal(torch.isfinite(lse), finite), "LSE finite / -inf pattern differs from the reference"
    torch.testing.assert_close(lse.double()[finite], ref_lse.to(lse.device)[finite], atol=2e-3, rtol=1e-4)


def attention_inputs(B, Sq, Sk, H, Hkv, D, gen, device="cuda"):
    """bf16 q [B, Sq, H, D], k and v [B, Sk, Hkv, D], unit normal from ``gen``."""
    q = torch.randn(B, Sq, H, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, torch.bfloat16)
    v = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, torch.bfloat16)
    return q, k, v


def check_matches(out, lse, ref, ref_lse, *, empty_rows_exact=False):
    """:func:`check_output` on O (a row = one head's D-vector) and :func:`check_lse` on the LSE."""
    check_output(out, ref)
    check_lse(lse, ref_lse, empty_rows_exact=empty_rows_exact)
