"""Who measured what, with which software: the provenance every result row carries."""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    try:
        import torch
        out["torch"] = torch.__version__
        if torch.version.cuda:
            out["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            out["driver"] = _driver_version() or "unknown"
    except ImportError:  # pragma: no cover
        pass
    for dist, key in (("nvidia-cutlass-dsl", "cutedsl"), ("flash-attn-4", "flash_attn_4")):
        v = _dist_version(dist)
        if v:
            out[key] = v
    return out


def _driver_version() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_commit() -> str:
    """The commit the results describe: ``DSV4_COMMIT`` when set (the GPU machine's copy of the tree may carry
    stale git metadata — a run there once reported a commit from a previous session), else git's short hash
    (``+dirty`` if the tree has edits)."""
    env = os.environ.get("DSV4_COMMIT")
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode == 0 and sha.stdout.strip():
            # the pipeline's own outputs (results, STATUS.md) do not make the measured code dirty
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                    ":!stages/results", ":!stages/gpu_tests", ":!STATUS.md"], cwd=REPO_ROOT,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def file_digests(paths, repo: Path = REPO_ROOT) -> dict[str, str]:
    """What a result depends on, by content: ``{repository path: sha256 prefix}`` for every file at or under
    ``paths`` (folders walked, caches skipped; a path that does not exist is ``"missing"``).  Recorded with a GPU row
    and compared by STATUS.md, it says STALE from the files themselves — right even when the row's commit stamp is
    wrong (a warm GPU machine's copy of ``.git`` can name an older commit)."""
    out: dict[str, str] = {}
    for rel in paths:
        path = Path(repo) / rel
        files = ([path] if path.is_file() else
                 sorted(f for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts
                        and f.suffix != ".pyc") if path.is_dir() else [])
        if not files:
            out[str(rel)] = "missing"
        for f in files:
            out[f.relative_to(repo).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    return out
