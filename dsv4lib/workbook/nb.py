"""Small helpers every stage notebook uses at its top: resolve the target, seed, print the setup."""
from __future__ import annotations

import torch

from .provenance import versions
from .targets import Target, resolve_target


def setup(target: str = "auto", seed: int = 0) -> Target:
    """Resolve the target the pipeline asked for (or detect it), seed torch, and say where we run."""
    t = resolve_target(target)
    torch.manual_seed(seed)
    if t.is_gpu:
        torch.cuda.manual_seed_all(seed)
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    print(f"target {t.name}: {t.device} (capability {t.capability or '-'}, arch {t.arch or '-'}); {vers}")
    return t
