"""Result rows: the verdict rule, and the per-target results files (merged, never clobbered)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .record import write_json_atomic
from .registry import RESULTS_DIR, Stage

VERDICTS = ("PASS", "FAIL", "NOT RUN", "COMPILED-ONLY")
MODES = ("gpu", "cpu", "compile")


def _as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def check_thresholds(metrics: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """Every threshold a metric misses (a missing or NaN metric misses it too)."""
    failures = []
    for key, bound in thresholds.items():
        name, kind = key.rsplit("_", 1)
        if name not in metrics:
            failures.append(f"{name} not recorded (needs {'>=' if kind == 'min' else '<='} {bound})")
            continue
        value = _as_float(metrics[name])
        ok = value >= bound if kind == "min" else value <= bound
        if not ok:   # NaN compares False: fails
            failures.append(f"{name} = {metrics[name]} {'<' if kind == 'min' else '>'} {bound}")
    return failures


def decide_verdict(stage: Stage, target: str, metrics: dict[str, Any], error: str | None) -> tuple[str, str]:
    """(verdict, reason).  Only a GPU target whose notebook really ran kernels on the GPU can PASS a
    stage that needs a GPU; a CPU run of such a stage is at best COMPILED-ONLY."""
    if error:
        return "FAIL", error
    mode = metrics.get("mode")
    if mode not in MODES:
        return "FAIL", f"notebook recorded no valid mode (got {mode!r}; expected one of {MODES})"
    if target == "cpu" and mode == "gpu":
        return "FAIL", "a CPU run recorded mode 'gpu': refusing to record a GPU result from the CPU"
    failures = check_thresholds(metrics, stage.thresholds_for(target if mode == "gpu" else "cpu"))
    if failures:
        return "FAIL", "; ".join(failures)
    if mode == "gpu" or (mode == "cpu" and stage.needs == "none"):
        return "PASS", metrics.get("notes", "")
    if mode == "compile" or metrics.get("compiled"):
        return "COMPILED-ONLY", metrics.get("notes", "") or "kernels compiled, not run (no GPU)"
    return "NOT RUN", metrics.get("notes", "") or "needs a GPU"


def results_path(target: str, results_dir: Path = RESULTS_DIR) -> Path:
    return Path(results_dir) / f"{target}.json"


def load_results(target: str, results_dir: Path = RESULTS_DIR) -> dict[str, Any]:
    p = results_path(target, results_dir)
    if not p.exists():
        return {"target": target, "stages": {}}
    data = json.loads(p.read_text())
    data.setdefault("stages", {})
    return data


def merge_results(target: str, rows: dict[str, dict[str, Any]], results_dir: Path = RESULTS_DIR) -> dict[str, Any]:
    """Replace only the rows of the stages that ran; other stages (and other targets' files) stay."""
    data = load_results(target, results_dir)
    data["target"] = target
    data["stages"].update(rows)
    write_json_atomic(results_path(target, results_dir), data)
    return data


def load_all_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(Path(results_dir).glob("*.json")):
        data = json.loads(p.read_text())
        out[data.get("target", p.stem)] = data
    return out


def recorded_env_metric(target: str, key: str, default: float, results_dir: Path = RESULTS_DIR) -> float:
    """A number stage 00 measured on ``target`` (the pipeline runs it first, so within a pipeline run it is this
    run's); ``default`` when the target has no stage-00 row, or the row no such number."""
    metrics = load_results(target, results_dir)["stages"].get("00-env", {}).get("metrics", {})
    value = _as_float(metrics.get(key, default))
    return default if math.isnan(value) else value


def recorded_copy_gbps(target: str, default: float = 4300.0, results_dir: Path = RESULTS_DIR) -> float:
    """The device-to-device copy bandwidth (GB/s, 1 GiB copy) stage 00 measured on ``target``."""
    return recorded_env_metric(target, "copy_gbps", default, results_dir)


def recorded_launch_floor_ms(target: str, default: float = 0.0, results_dir: Path = RESULTS_DIR) -> float:
    """The timing floor stage 00 measured on ``target`` (ms): :func:`dsv4lib.bench.launch_floor` — what
    ``bench.time_cuda`` reads for a kernel that does nothing.  ``default`` 0: no floor known."""
    return recorded_env_metric(target, "launch_floor_us", default * 1e3, results_dir) / 1e3
