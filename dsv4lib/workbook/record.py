"""``record(...)``: how a stage notebook hands its metrics to the pipeline.

The pipeline injects ``metrics_path`` (an absolute path) into each notebook's parameters cell; every
``record`` call merges its keyword arguments into that JSON file at once, so a notebook that fails
later still leaves what it measured.  Called interactively (empty path) it only prints.

Reserved keys the pipeline reads besides the metrics:
  ``mode``   — what the notebook actually did: ``"gpu"`` (kernels ran on a GPU), ``"cpu"`` (ran on the
               CPU, legitimate only for stages that need no GPU), ``"compile"`` (kernels compiled, not run).
  ``notes``  — a short line of prose for STATUS.md.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)   # JSON has no inf/nan; keep them readable ("inf", "nan")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):   # numpy / torch scalars
        return _jsonable(value.item())
    return value


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write JSON so that a reader never sees half a file (temp file + rename in the same folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_jsonable(data), f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_metrics(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else {}


def record(metrics_path: str | os.PathLike | None, **metrics: Any) -> dict[str, Any]:
    """Merge ``metrics`` into the stage's metrics file and return everything recorded so far."""
    if not metrics_path:
        print("record (interactive, not saved):", json.dumps(_jsonable(metrics), sort_keys=True))
        return metrics
    merged = read_metrics(metrics_path)
    merged.update(_jsonable(metrics))
    write_json_atomic(metrics_path, merged)
    return merged
