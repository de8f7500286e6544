"""The GPU test run recorded beside the stage results: ``scripts/gpu_check.sh`` writes its per-group summary, and
``python -m dsv4lib.workbook.gpu_tests <summary.json> [<rerun summary.json> ...]`` on the GPU machine stores it with the
device, commit and date in ``stages/gpu_tests/<target>.json`` (groups run again alone replace theirs, noted as reruns);
STATUS.md shows each GPU's last run."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .provenance import REPO_ROOT, git_commit, utc_now
from .targets import detect_target

GPU_TESTS_DIR = REPO_ROOT / "stages" / "gpu_tests"


def merge_reruns(groups: list[dict], reruns: list[list[dict]]) -> tuple[list[dict], list[str]]:
    """A run's groups with some of them run again on the same machine and commit (a group that timed out beside
    three others, run alone): each rerun's group takes the place of the first run's, and the notes say what it
    replaced.  A rerun of a group the run did not have is refused — a rerun completes a run, it does not extend it."""
    merged, notes = [dict(g) for g in groups], []
    for summary in reruns:
        for again in summary:
            i = next((i for i, g in enumerate(merged) if g["group"] == again["group"]), None)
            if i is None:
                raise SystemExit(f"gpu_tests: rerun of group {again['group']!r}, which the run does not have")
            first = merged[i]
            notes.append(f"{again['group']}: rc {first['rc']} ({first['passed']} passed in {first['seconds']} s) in the "
                         f"run, rerun alone: rc {again['rc']} ({again['passed']} passed in {again['seconds']} s)")
            merged[i] = dict(again)
    return merged, notes


def record_gpu_tests(summary_path: Path, out_dir: Path = GPU_TESTS_DIR, reruns: tuple[Path, ...] = ()) -> Path:
    groups, notes = merge_reruns(json.loads(Path(summary_path).read_text()),
                                 [json.loads(Path(p).read_text()) for p in reruns])
    target = detect_target()
    if not target.is_gpu:
        raise SystemExit("gpu_tests: no GPU on this machine; a GPU test run is recorded on the GPU that ran it")
    row = {"target": target.name, "device": target.device, "commit": git_commit(), "date": utc_now(), "groups": groups}
    if notes:
        row["reruns"] = notes
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{target.name}.json"
    path.write_text(json.dumps(row, indent=1) + "\n")
    return path


def load_gpu_tests(out_dir: Path = GPU_TESTS_DIR) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("*.json"))}


def gpu_tests_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    """STATUS.md's section: per GPU, the totals of its last recorded test run and the groups that did not pass."""
    if not runs:
        return []
    lines = ["## GPU tests (`scripts/gpu_check.sh`, last recorded run per GPU)", "",
             "| target | device | passed | failed | errors | skipped | groups not passing (and reruns) | date | commit |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        groups = run.get("groups", [])
        total = {k: sum(int(g.get(k, 0)) for g in groups) for k in ("passed", "failed", "errors", "skipped")}
        bad = [f"{g['group']} (rc {g['rc']})" for g in groups if g.get("rc") != 0]
        bad += [f"rerun: {note}" for note in run.get("reruns", [])]
        lines.append(f"| {name} | {run.get('device', '')} | {total['passed']} | {total['failed']} | {total['errors']} "
                     f"| {total['skipped']} | {', '.join(bad) or 'none'} | {str(run.get('date', ''))[:10]} "
                     f"| `{str(run.get('commit', '?'))[:7]}` |")
    return lines + [""]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m dsv4lib.workbook.gpu_tests <gpu_check summary.json> [<rerun summary.json> ...]")
    print(record_gpu_tests(Path(sys.argv[1]), reruns=tuple(Path(p) for p in sys.argv[2:])))
