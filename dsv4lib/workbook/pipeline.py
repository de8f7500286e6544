"""Run every stage notebook through papermill on this machine, record the results, render STATUS.md.

    python -m dsv4lib.workbook.pipeline [--target auto|cpu|<gpu>] [--stages D1,D5] [--timeout SECONDS]

Each stage runs in its own process group: a stage that raises, misses a threshold or outlives its
timeout (a hung kernel) is recorded as FAIL with the reason, and the next stage still runs.  The exit
code is 1 if any stage failed.  Executed notebooks go to ``runs/<target>/`` (git-ignored), each with an HTML report
``<stage>.html`` and its figures as ``figures/<stage>-<n>.png`` (:mod:`.reports`); the notebooks are signed (trusted).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .provenance import REPO_ROOT, file_digests, git_commit, utc_now, versions
from .record import read_metrics
from .registry import REGISTRY_PATH, RESULTS_DIR, Stage, load_registry
from .reports import write_reports
from .results import decide_verdict, merge_results
from .status import STATUS_PATH, verdict_counts, write_status
from .targets import Target, resolve_target

RUNS_DIR = REPO_ROOT / "runs"


def _execute_notebook(notebook: str, output: str, parameters: dict[str, Any], cell_timeout: float) -> None:
    """Child-process side: jupytext → papermill (kernel python3)."""
    import jupytext
    import papermill

    from .kernelspec import KERNEL_NAME, kernel_metadata

    nb = jupytext.read(notebook)
    nb.metadata.update(kernel_metadata())   # what JupyterLab sees on connect: the executed notebook opens unmodified
    # autosave every few seconds: the parent reads the partly executed notebook for its progress lines
    papermill.execute_notebook(nb, output, parameters=parameters, kernel_name=KERNEL_NAME, language="python",
                               execution_timeout=int(cell_timeout), progress_bar=False, cwd=str(REPO_ROOT),
                               autosave_cell_every=PROGRESS_EVERY_S // 2)


PROGRESS_EVERY_S = 10     # a long stage says where it is this often (elapsed time, cells done)


def cells_done(output: Path) -> tuple[int, int] | None:
    """(cells completed, cells) of a notebook papermill is executing, from its last autosave; None before the first
    save or while the file is being rewritten."""
    try:
        cells = json.loads(Path(output).read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    done = sum(1 for c in cells if c.get("metadata", {}).get("papermill", {}).get("status") == "completed")
    return done, len(cells)


def run_stage(stage: Stage, target: Target, run_dir: Path, timeout_s: float | None = None,
              on_progress=None) -> dict[str, Any]:
    """Execute one stage notebook in a fresh process group; return its result row.  ``on_progress(elapsed_s,
    cells)`` is called every :data:`PROGRESS_EVERY_S` while it runs (``cells``: :func:`cells_done`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / f"{stage.id}.metrics.json"
    error_path = run_dir / f"{stage.id}.error.txt"
    # an earlier run's notebook and report go first: a stage that dies before papermill writes must not be reported
    # with the previous run's outputs
    for p in (metrics_path, error_path, run_dir / f"{stage.id}.ipynb", run_dir / f"{stage.id}.html"):
        p.unlink(missing_ok=True)
    params = stage.params_for(target.name)
    params.update(target=target.name, metrics_path=str(metrics_path))
    timeout = float(timeout_s or stage.timeout_s)
    job = {"notebook": str(stage.notebook), "output": str(run_dir / f"{stage.id}.ipynb"), "parameters": params,
           "cell_timeout": timeout, "error_path": str(error_path)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="module://matplotlib_inline.backend_inline", PYTHONUNBUFFERED="1")   # plots land in the notebook
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dsv4lib.workbook.pipeline", "--_execute", json.dumps(job)],
                            cwd=REPO_ROOT, env=env, start_new_session=True,
                            stdout=open(run_dir / f"{stage.id}.log", "w"), stderr=subprocess.STDOUT)
    error = None
    try:
        while True:
            left = timeout - (time.monotonic() - t0)
            try:
                rc = proc.wait(timeout=max(0.0, min(left, PROGRESS_EVERY_S)))
                break
            except subprocess.TimeoutExpired:
                if left <= PROGRESS_EVERY_S:
                    raise
                if on_progress is not None:
                    on_progress(time.monotonic() - t0, cells_done(job["output"]))
        if rc != 0:
            error = error_path.read_text().strip() if error_path.exists() else f"stage process exited with {rc}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:.0f} s (hung kernel or too slow); stage killed"
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # the notebook's kernel is in this group too
        except ProcessLookupError:
            pass
        proc.wait()
    wall = time.monotonic() - t0
    metrics = read_metrics(metrics_path)
    thresholds = stage.thresholds_for(target.name if metrics.get("mode") == "gpu" else "cpu")
    verdict, reason = decide_verdict(stage, target.name, metrics, error)
    return {"stage": stage.id, "target": target.name, "verdict": verdict, "reason": reason,
            "device": target.device, "capability": target.capability, "versions": versions(),
            "commit": git_commit(), "date": utc_now(), "wall_s": round(wall, 1),
            "depends_digest": file_digests(stage.depends),
            "metrics": metrics, "thresholds": thresholds}


def run_pipeline(target: Target, stages: list[Stage], *, timeout_s: float | None = None,
                 results_dir: Path = RESULTS_DIR, status_path: Path = STATUS_PATH,
                 runs_dir: Path = RUNS_DIR, registry: list[Stage] | None = None) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    progress = Progress(target.name, len(stages))
    for i, stage in enumerate(stages):
        progress.start(i, stage.id)
        row = run_stage(stage, target, Path(runs_dir) / target.name, timeout_s,
                        on_progress=lambda t, cells, sid=stage.id: progress.running(sid, t, cells))
        rows[stage.id] = row
        merge_results(target.name, {stage.id: row}, results_dir)   # saved per stage: a crash loses nothing
        progress.done(f"  {stage.id:<10} {row['verdict']:<14} {row['wall_s']:>7.1f} s  {row['reason'][:100]}")
        try:      # the report of a failed stage too: its figures and traceback explain the FAIL
            note = write_reports(Path(runs_dir), target.name, stage.id).get("note")
            if note:
                progress.done(f"  {stage.id:<10} ({note}; figures written)"[:160])
        except Exception as exc:  # noqa: BLE001 - a report that cannot be written never costs the recorded result
            progress.done(f"  {stage.id:<10} (no HTML report / figures: {type(exc).__name__}: {exc})"[:160])
    progress.close()
    write_status(status_path, stages=registry if registry is not None else stages, results_dir=results_dir)
    return rows


class Progress:
    """The pipeline's console: a tqdm bar on a terminal; plain lines otherwise (a log file or a CI run gets no
    carriage returns): ``[i/n] stage …`` when a stage starts, a line every :data:`PROGRESS_EVERY_S` while it runs
    (elapsed seconds, cells done), its result line when it ends."""

    def __init__(self, target: str, n: int, stream=None):
        self.stream = stream or sys.stderr
        self.n = n
        self.bar = None
        if self.stream.isatty():
            from tqdm.auto import tqdm
            self.bar = tqdm(total=n, desc=f"stages on {target}", unit="stage", file=self.stream)

    def start(self, i: int, sid: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(sid)
        else:
            print(f"[{i + 1}/{self.n}] {sid} …", file=self.stream, flush=True)

    def running(self, sid: str, elapsed_s: float, cells) -> None:
        where = f", cell {cells[0]}/{cells[1]}" if cells else ""
        if self.bar is not None:
            self.bar.set_postfix_str(f"{sid} {elapsed_s:.0f} s{where}")
        else:
            print(f"      {sid} {elapsed_s:5.0f} s{where}", file=self.stream, flush=True)

    def done(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
            self.bar.update(1)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def select_stages(all_stages: list[Stage], spec: str | None) -> list[Stage]:
    """The stages ``--stages`` names (None: all of them).  ValueError for an empty list or an unknown id."""
    if spec is None:
        return all_stages
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    if not wanted:
        raise ValueError("--stages names no stage (leave it out to run every stage)")
    known = {s.id: s for s in all_stages}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; known: {list(known)}")
    return [known[w] for w in wanted]


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):
        """A bad argument: one line on stderr, exit status 2 (``--help`` has the usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineErrors(prog="python -m dsv4lib.workbook.pipeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="auto", help="auto (detect), cpu, or the GPU's name (h200, h100, ...)")
    ap.add_argument("--stages", default=None, help="comma-separated stage ids (default: all)")
    ap.add_argument("--timeout", type=positive_seconds, default=None,
                    help="per-stage timeout in seconds, > 0 (default: the registry's)")
    ap.add_argument("--registry", default=str(REGISTRY_PATH), help=argparse.SUPPRESS)
    ap.add_argument("--_execute", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._execute:   # child process: run one notebook, write any error where the parent reads it
        job = json.loads(args._execute)
        try:
            _execute_notebook(job["notebook"], job["output"], job["parameters"], job["cell_timeout"])
        except Exception as exc:  # noqa: BLE001 - every failure becomes the stage's FAIL reason
            msg = f"{type(exc).__name__}: {getattr(exc, 'evalue', None) or exc}"
            if getattr(exc, "ename", None):
                msg = f"{exc.ename}: {exc.evalue}"
            Path(job["error_path"]).write_text(msg[:2000])
            return 1
        return 0

    try:                 # a bad argument is one line and exit status 2, not a traceback
        target = resolve_target(args.target)
        registry = load_registry(Path(args.registry))
        stages = select_stages(registry, args.stages)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"dsv4 pipeline: target {target.name} ({target.device}), {len(stages)} stage(s)", file=sys.stderr)
    rows = run_pipeline(target, stages, timeout_s=args.timeout, registry=registry)
    failed = [sid for sid, r in rows.items() if r["verdict"] == "FAIL"]
    print(f"STATUS.md written: {verdict_counts(rows)}{' ' + str(failed) if failed else ''}; results in "
          f"stages/results/{target.name}.json; reports in runs/{target.name}/<stage>.html, figures in "
          f"runs/{target.name}/figures/, executed (trusted) notebooks in runs/{target.name}/<stage>.ipynb",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
