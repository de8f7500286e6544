"""Render STATUS.md from the recorded results (never edited by hand)."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from .gpu_tests import GPU_TESTS_DIR, gpu_tests_lines, load_gpu_tests
from .provenance import REPO_ROOT, file_digests
from .registry import RESULTS_DIR, Stage, load_registry
from .reports import report_paths
from .results import load_all_results

STATUS_PATH = REPO_ROOT / "STATUS.md"


def _fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def _fmt_cos(v: Any) -> str:
    try:
        return f"{float(v):.6f}"
    except (TypeError, ValueError):
        return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def targets_text(metrics: dict[str, Any], targets: dict[str, float]) -> str:
    """``targets 1/2: bw_fraction 0.81 ≥ 0.8 ✓, speedup 2.1 ≥ 3 ✗`` — only for targets the run recorded; a target
    whose metric has a recorded ``<name>_at_copy_rate`` shows it: ``bw_fraction 0.68 ≥ 0.85 ✗ (at copy rate 0.70)``."""
    marks = []
    for key, bound in targets.items():
        name, kind = key[:-4], key[-3:]
        value = metrics.get(name)
        if not _is_number(value):
            continue
        ok = value >= bound if kind == "min" else value <= bound
        # ``<name>_at_copy_rate``: what a call moving its bytes at the copy's rate reads at that size, with the
        # timing floor (bench.fraction_at_copy_rate) — the yardstick a small call is measured against
        yardstick = metrics.get(f"{name}_at_copy_rate")
        limit = f" (at copy rate {_fmt(float(yardstick))})" if _is_number(yardstick) else ""
        marks.append((ok, f"{name} {_fmt(float(value))} {'≥' if kind == 'min' else '≤'} {_fmt(float(bound))} "
                          f"{'✓' if ok else '✗'}{limit}"))
    if not marks:
        return ""
    return f"targets {sum(ok for ok, _ in marks)}/{len(marks)}: " + ", ".join(t for _, t in marks)


def changed_files(commit: str, repo: Path = REPO_ROOT) -> tuple[str, ...] | None:
    """Every file that differs between ``commit`` and the working tree, or None when git cannot tell (no repository,
    an unknown commit)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "diff", "--name-only", commit], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return tuple(line for line in out.stdout.splitlines() if line.strip())


def under(path: str, roots) -> bool:
    """``path`` (a repository path) is one of ``roots`` or inside one of them (folders)."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def changed_since(commit: str, paths: tuple[str, ...] | list[str], repo: Path = REPO_ROOT,
                  files_since=None) -> list[str] | None:
    """The files among ``paths`` (repository paths, folders included) that differ between ``commit`` and the working
    tree, or None when git cannot tell.  ``files_since``: a ``changed_files`` to use (render_status passes one that
    asks git once per recorded commit)."""
    if not commit or not paths:
        return None
    changed = (files_since or (lambda c: changed_files(c, repo)))(commit)
    if changed is None:
        return None
    return [f for f in changed if under(f, paths)]


def stale_note(row: dict[str, Any], depends: tuple[str, ...] | list[str] | None, target: str,
               files_since=None, digests_now=None) -> str:
    """``STALE (flash_fwd.py, … changed since)`` for a GPU result whose stage's files changed after it was recorded;
    empty for CPU rows, fresh rows and rows git cannot check."""
    if target == "cpu" or not depends:
        return ""
    recorded = row.get("depends_digest")
    if recorded:                 # by content: the files as the run saw them against the files here
        now = (digests_now or (lambda paths: file_digests(paths, REPO_ROOT)))(tuple(depends))
        # only files the stage depends on now: one the registry no longer names (a narrowed depends) is not code the
        # result measured; one deleted from a depended-on folder still counts
        changed = {p for p in set(recorded) | set(now) if under(p, depends) and recorded.get(p) != now.get(p)}
        # a file the registry names now but the run did not digest (depends widened after it): the run used it as
        # it was at the row's commit — changed only if git says so (or cannot tell)
        unseen = sorted(p for p in changed if p not in recorded and p in now)
        if unseen:
            commit = str(row.get("commit", ""))
            since = None if "+" in commit else changed_since(commit, unseen, repo=REPO_ROOT, files_since=files_since)
            changed -= set(unseen) - set(unseen if since is None else since)
        changed = sorted(changed)
    else:                        # rows recorded before the digests: by the commit stamp, through git
        changed = changed_since(str(row.get("commit", "")), depends, repo=REPO_ROOT, files_since=files_since)
    if not changed:
        return ""
    names = [p.removeprefix("dsv4lib/") for p in changed]
    shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
    return f"**STALE** ({shown} changed since)"


def report_link(target: str, stage_id: str) -> str:
    """STATUS.md's relative link to a stage's HTML report (:func:`.reports.report_paths`)."""
    return report_paths(Path("runs"), target, stage_id)["html"].as_posix()


def short_commit(commit: Any) -> str:
    return str(commit or "?")[:7]


def cell_text(row: dict[str, Any], targets: dict[str, float] | None = None, stale: str = "") -> str:
    """One target's cell for one stage: verdict (and STALE), then the headline metrics that exist, then speed
    targets; a FAIL shows its reason."""
    m = row.get("metrics", {})
    parts = [f"**{row.get('verdict', '?')}**"]
    if stale:
        parts.append(stale)
    if row.get("verdict") == "FAIL" and row.get("reason"):
        parts.append(str(row["reason"]).replace("|", "\\|").replace("\n", " ")[:120])
    if "cosine" in m:
        parts.append(f"cos {_fmt_cos(m['cosine'])}")
    if "time_ms" in m:
        parts.append(f"{_fmt(m['time_ms'])} ms")
    if "host_us" in m:
        parts.append(f"host {_fmt(m['host_us'])} µs")
    if "tflops" in m:
        parts.append(f"{_fmt(m['tflops'])} TFLOP/s")
    if "gbps" in m:
        parts.append(f"{_fmt(m['gbps'])} GB/s")
    if "matmul_tflops" in m:
        unit = "" if isinstance(m["matmul_tflops"], str) else " TFLOP/s"
        parts.append(f"matmul {_fmt(m['matmul_tflops'])}{unit}")
    if "copy_gbps" in m:
        unit = "" if isinstance(m["copy_gbps"], str) else " GB/s"
        parts.append(f"copy {_fmt(m['copy_gbps'])}{unit}")
    if "ratio_vs_peer" in m:
        parts.append(f"{_fmt(m['ratio_vs_peer'])}× {m.get('peer', 'peer')}")
    if "configs_proven" in m:
        parts.append(f"{m['configs_proven']}/{m.get('configs_total', '?')} maps proven")
    if m.get("sm100a"):
        parts.append(f"sm_100a: {m['sm100a']}")
    if targets and m.get("mode") == "gpu":
        t = targets_text(m, targets)
        if t:
            parts.append(t)
    date = str(row.get("date", ""))[:10]
    parts.append(f"{date} `{short_commit(row.get('commit'))}`")
    return " · ".join(parts)


def render_status(stages: list[Stage] | None = None, results: dict[str, dict[str, Any]] | None = None,
                  results_dir: Path = RESULTS_DIR, gpu_tests_dir: Path = GPU_TESTS_DIR) -> str:
    stages = load_registry() if stages is None else stages
    results = load_all_results(results_dir) if results is None else results
    targets = sorted(results, key=lambda t: (t != "cpu", t))
    ids = [s.id for s in stages]
    for t in targets:   # stages recorded but no longer in the registry still show
        ids += [sid for sid in results[t].get("stages", {}) if sid not in ids]
    titles = {s.id: s.title for s in stages}
    stage_targets = {s.id: s.targets for s in stages}
    stage_depends = {s.id: s.depends for s in stages}
    # one git call per recorded commit, not one per cell
    files_since = functools.lru_cache(maxsize=None)(lambda commit: changed_files(commit, REPO_ROOT))
    # and the files' contents read once per stage, not once per GPU column
    digests_now = functools.lru_cache(maxsize=None)(lambda paths: file_digests(paths, REPO_ROOT))

    lines = ["# STATUS", "",
             "Generated by `python -m dsv4lib.workbook.pipeline` from `stages/results/*.json`; do not edit by hand.",
             "Verdicts: PASS (met every threshold; on a GPU target the kernels ran on that GPU), FAIL, "
             "COMPILED-ONLY (kernels built, not run: no GPU), NOT RUN. `ratio` = peer time / our time "
             "(> 1: faster than the peer). sm_100a kernels are always compiled, not run. STALE: the stage's files "
             "(`depends` in stages/stages.toml) changed after the result was recorded — re-run it on that GPU. "
             "report: the executed notebook as HTML (prose, figures, outputs), written by the pipeline under `runs/` "
             "on the machine that ran it (not committed; `make pipeline` makes the cpu ones here).", ""]
    lines.append("| stage | " + " | ".join(targets) + " |")
    lines.append("|---|" + "---|" * len(targets))
    for sid in ids:
        cells = []
        for t in targets:
            row = results[t].get("stages", {}).get(sid)
            cells.append(cell_text(row, stage_targets.get(sid),
                                   stale_note(row, stage_depends.get(sid), t, files_since, digests_now))
                         if row else "NOT RUN")
        lines.append(f"| {sid} {titles.get(sid, '')} | " + " | ".join(cells) + " |")
    lines.append("")
    for t in targets:
        lines.append(f"## {t}")
        lines.append("")
        lines.append("| stage | verdict | device | versions | date | commit | reason / notes | report |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for sid in ids:
            row = results[t].get("stages", {}).get(sid)
            if not row:
                continue
            vers = ", ".join(f"{k} {v}" for k, v in sorted(row.get("versions", {}).items()))
            reason = str(row.get("reason", "")).replace("|", "\\|").replace("\n", " ")[:300]
            cc = f" (cc {row['capability']})" if row.get("capability") else ""
            lines.append(f"| {sid} | {row.get('verdict')} | {row.get('device', '')}{cc} "
                         f"| {vers} | {row.get('date', '')} | `{short_commit(row.get('commit'))}` | {reason} "
                         f"| [{sid}.html]({report_link(t, sid)}) |")
        lines.append("")
    lines += gpu_tests_lines(load_gpu_tests(gpu_tests_dir))
    return "\n".join(lines)


def write_status(path: Path = STATUS_PATH, **kw) -> str:
    text = render_status(**kw)
    Path(path).write_text(text)
    return text


def verdict_counts(rows: dict[str, dict[str, Any]]) -> str:
    """``3 PASS, 1 FAIL, 4 COMPILED-ONLY`` (only the verdicts that occur, in that order)."""
    order = ("PASS", "FAIL", "COMPILED-ONLY", "NOT RUN")
    counts = {v: sum(1 for r in rows.values() if r.get("verdict") == v) for v in order}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n)


if __name__ == "__main__":   # re-render STATUS.md from the recorded results (e.g. after copying a GPU's back)
    write_status()
    print(f"{STATUS_PATH} written")
