"""The stage registry, ``stages/stages.toml``: which notebook each stage runs, its parameters per target,
its pass thresholds and whether it needs a GPU to pass."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .provenance import REPO_ROOT

REGISTRY_PATH = REPO_ROOT / "stages" / "stages.toml"
RESULTS_DIR = REPO_ROOT / "stages" / "results"
NEEDS = ("gpu", "none")   # "none": the stage needs no GPU, so a CPU run may PASS


@dataclass
class Stage:
    id: str
    notebook: Path
    title: str
    needs: str = "gpu"
    timeout_s: float = 900.0
    params: dict[str, Any] = field(default_factory=dict)            # every target
    params_by_target: dict[str, dict[str, Any]] = field(default_factory=dict)   # "cpu", "gpu", "h200", ...
    thresholds: dict[str, float] = field(default_factory=dict)       # GPU runs: "<metric>_min" / "<metric>_max"
    thresholds_cpu: dict[str, float] = field(default_factory=dict)   # CPU runs
    # speed targets from the issues ("<metric>_min" / "_max"): shown met / missed in STATUS.md next to the
    # verdict, which stays about correctness (a slow but right kernel is PASS with its targets marked missed)
    targets: dict[str, float] = field(default_factory=dict)
    # the files and folders (repository paths) whose change makes a recorded GPU result stale; the stage's notebook
    # always counts
    depends: tuple[str, ...] = ()
    # which of the stage's figures (1-based, in cell order) the README's gallery shows; 0: none
    gallery_figure: int = 1

    def params_for(self, target: str) -> dict[str, Any]:
        """Base params, then ``gpu`` (any GPU target) or ``cpu``, then the exact target's overrides."""
        merged = dict(self.params)
        merged.update(self.params_by_target.get("cpu" if target == "cpu" else "gpu", {}))
        if target not in ("cpu", "gpu"):
            merged.update(self.params_by_target.get(target, {}))
        return merged

    def thresholds_for(self, target: str) -> dict[str, float]:
        return dict(self.thresholds_cpu if target == "cpu" else self.thresholds)


def load_registry(path: Path = REGISTRY_PATH) -> list[Stage]:
    data = tomllib.loads(Path(path).read_text())
    stages = []
    for raw in data.get("stage", []):
        raw = dict(raw)
        needs = raw.get("needs", "gpu")
        if needs not in NEEDS:
            raise ValueError(f"stage {raw.get('id')!r}: needs must be one of {NEEDS}, got {needs!r}")
        for key in list(raw.get("thresholds", {})) + list(raw.get("thresholds_cpu", {})) + list(raw.get("targets", {})):
            if not (key.endswith("_min") or key.endswith("_max")):
                raise ValueError(f"stage {raw['id']!r}: threshold / target {key!r} must end in _min or _max")
        stages.append(Stage(
            id=raw["id"], notebook=REPO_ROOT / raw["notebook"], title=raw.get("title", raw["id"]), needs=needs,
            timeout_s=float(raw.get("timeout_s", 900)), params=raw.get("params", {}),
            params_by_target=raw.get("params_by", {}), thresholds=raw.get("thresholds", {}),
            thresholds_cpu=raw.get("thresholds_cpu", {}), targets=raw.get("targets", {}),
            depends=(raw["notebook"],) + tuple(raw.get("depends", ())),
            gallery_figure=int(raw.get("gallery_figure", 1))))
    ids = [s.id for s in stages]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate stage ids in {path}: {ids}")
    return stages
