"""Where are we running? ``cpu``, or a GPU target named after the device (``h200``, ``h100``, ...).

A *target* is what results are recorded under (``stages/results/<target>.json``).  The *arch* is what
CuTeDSL compiles for: ``sm_90a`` on Hopper, ``sm_100a`` on Blackwell.  On a machine without a GPU,
CuTeDSL still compiles for either arch (set ``CUTE_DSL_ARCH``); such builds are "compiled, not run".
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..kernels.compile import SUPPORTED_ARCHS, cute_arch  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Target:
    name: str            # "cpu", "h200", "h100", ...
    device: str          # human-readable device name
    capability: str      # "9.0", "10.0", or "" on CPU
    arch: str | None     # "sm_90a" / "sm_100a" when a supported GPU is present, else None

    @property
    def is_gpu(self) -> bool:
        return self.name != "cpu"


def target_name_for_device(device_name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA B200' -> 'b200'."""
    name = device_name.lower().replace("nvidia", " ").replace("geforce", " ")
    tokens = [t for t in re.split(r"[^a-z0-9]+", name) if t]
    if not tokens:
        raise ValueError(f"cannot derive a target name from device name {device_name!r}")
    return tokens[0]


def arch_for_capability(major: int, minor: int) -> str | None:
    if (major, minor) == (9, 0):
        return "sm_90a"
    if (major, minor) == (10, 0):
        return "sm_100a"
    return None


def detect_target() -> Target:
    """The target of this process: the first CUDA device, or ``cpu``."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return Target("cpu", "cpu", "", None)
    if not torch.cuda.is_available():
        import platform
        return Target("cpu", f"cpu ({platform.machine()}, {os.cpu_count()} cores)", "", None)
    major, minor = torch.cuda.get_device_capability(0)
    device = torch.cuda.get_device_name(0)
    return Target(target_name_for_device(device), device, f"{major}.{minor}", arch_for_capability(major, minor))


def resolve_target(requested: str = "auto") -> Target:
    """Resolve a ``--target`` option.  ``auto`` detects; ``cpu`` forces CPU; a GPU name must match the GPU."""
    detected = detect_target()
    if requested in (None, "", "auto"):
        return detected
    if requested == "cpu":
        if detected.is_gpu:
            return Target("cpu", f"cpu (GPU {detected.device} ignored)", "", None)
        return detected
    if requested != detected.name:
        raise ValueError(f"target {requested!r} requested but this machine is {detected.name!r} ({detected.device}); "
                         "results for a GPU target can only be recorded on that GPU")
    return detected
