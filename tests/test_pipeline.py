"""The papermill pipeline end to end on tiny notebooks: a passing, a raising and a hanging stage."""
import base64
import re
from pathlib import Path
import textwrap

import pytest

from dsv4lib.workbook.pipeline import run_pipeline
from dsv4lib.workbook.registry import Stage
from dsv4lib.workbook.results import load_results
from dsv4lib.workbook.targets import Target

HEADER = '''# %% tags=["parameters"]
target = "auto"
metrics_path = ""
value = 0.0

# %%
from dsv4lib.workbook.record import record
'''


def _stage(tmp_path, sid, body, timeout=120.0, **kw):
    nb = tmp_path / f"{sid}.py"
    nb.write_text(HEADER + textwrap.dedent(body))
    return Stage(sid, nb, sid, needs="none", timeout_s=timeout, thresholds_cpu={"value_min": 1.0}, **kw)


def test_failures_are_recorded_and_the_pipeline_goes_on(tmp_path):
    stages = [
        _stage(tmp_path, "raises", 'record(metrics_path, mode="cpu", value=5.0)\nraise RuntimeError("boom")\n'),
        _stage(tmp_path, "hangs", 'import time\nrecord(metrics_path, mode="cpu", value=5.0)\ntime.sleep(600)\n',
               timeout=20.0),
        _stage(tmp_path, "low", 'record(metrics_path, mode="cpu", value=0.5)\n'),
        _stage(tmp_path, "ok", 'record(metrics_path, mode="cpu", value=value)\n', params={"value": 2.0}),
    ]
    target = Target("cpu", "cpu", "", None)
    rows = run_pipeline(target, stages, results_dir=tmp_path / "results", status_path=tmp_path / "STATUS.md",
                        runs_dir=tmp_path / "runs", registry=stages)
    assert rows["raises"]["verdict"] == "FAIL" and "boom" in rows["raises"]["reason"]
    assert rows["raises"]["metrics"]["value"] == 5.0        # recorded before the failure: kept
    assert rows["hangs"]["verdict"] == "FAIL" and "timed out" in rows["hangs"]["reason"]
    assert rows["hangs"]["wall_s"] < 60
    assert rows["low"]["verdict"] == "FAIL" and "value" in rows["low"]["reason"]
    assert rows["ok"]["verdict"] == "PASS" and rows["ok"]["metrics"]["value"] == 2.0   # parameter injected
    saved = load_results("cpu", tmp_path / "results")["stages"]
    assert set(saved) == {"raises", "hangs", "low", "ok"}
    for key in ("device", "capability", "versions", "commit", "date", "metrics", "thresholds", "verdict", "reason"):
        assert key in saved["ok"], key
    status = (tmp_path / "STATUS.md").read_text()
    assert "| ok ok | **PASS**" in status and "| hangs hangs | **FAIL**" in status


def test_recorded_copy_bandwidth_comes_from_stage_00(tmp_path):
    from dsv4lib.workbook.results import merge_results, recorded_copy_gbps
    assert recorded_copy_gbps("h200", default=1234.0, results_dir=tmp_path) == 1234.0      # no file yet
    merge_results("h200", {"00-env": {"metrics": {"copy_gbps": 4265.5}}}, results_dir=tmp_path)
    assert recorded_copy_gbps("h200", results_dir=tmp_path) == 4265.5
    merge_results("h100", {"00-env": {"metrics": {"copy_gbps": "n/a"}}}, results_dir=tmp_path)
    assert recorded_copy_gbps("h100", default=3000.0, results_dir=tmp_path) == 3000.0      # not a number


def test_recorded_launch_floor_and_the_copy_rate_yardstick(tmp_path):
    """Stage 00's timing floor (µs in the row, ms out) and the bandwidth fraction it leaves a call that moves its bytes
    at exactly the copy rate: t / (t + floor); no floor recorded, 1."""
    from dsv4lib.bench import fraction_at_copy_rate
    from dsv4lib.workbook.results import merge_results, recorded_launch_floor_ms
    assert recorded_launch_floor_ms("h200", results_dir=tmp_path) == 0.0                     # no row: no floor
    merge_results("h200", {"00-env": {"metrics": {"copy_gbps": 4000.0, "launch_floor_us": 4.0}}}, results_dir=tmp_path)
    floor = recorded_launch_floor_ms("h200", results_dir=tmp_path)
    assert floor == pytest.approx(0.004)
    assert fraction_at_copy_rate(40e6, 4000.0, floor) == pytest.approx(10.0 / 14.0)           # 10 µs of bytes + 4 µs
    assert fraction_at_copy_rate(40e6, 4000.0, 0.0) == 1.0
    assert fraction_at_copy_rate(4e9, 4000.0, floor) > 0.996                            # a 1 s call: ~1


def test_status_shows_a_targets_copy_rate_yardstick():
    from dsv4lib.workbook.status import targets_text
    text = targets_text({"bw_fraction_worst": 0.685, "bw_fraction_worst_at_copy_rate": 0.699, "fused_overhead": 0.03},
                        {"bw_fraction_worst_min": 0.85, "fused_overhead_max": 0.05})
    assert text == "targets 1/2: bw_fraction_worst 0.685 ≥ 0.85 ✗ (at copy rate 0.699), fused_overhead 0.03 ≤ 0.05 ✓"


def test_every_stage_declares_files_that_exist():
    """The registry's ``depends`` (what makes a GPU result stale) names real paths: a renamed module would otherwise
    silently stop marking results stale."""
    from dsv4lib.workbook.provenance import REPO_ROOT
    from dsv4lib.workbook.registry import load_registry
    for stage in load_registry():
        assert len(stage.depends) > 1, stage.id                       # the notebook and at least one module
        missing = [p for p in stage.depends if not (REPO_ROOT / p).exists()]
        assert not missing, (stage.id, missing)


def _dsv4lib_imports(path, anywhere: bool = False) -> set[str]:
    """The ``dsv4lib`` files (repository paths) that ``path``'s imports name — at module level, or ``anywhere`` (a
    notebook imports inside its cells' blocks) — each with its packages' ``__init__``, relative imports resolved."""
    import ast
    from dsv4lib.workbook.provenance import REPO_ROOT

    def file_of(name: str):
        for candidate in (REPO_ROOT / (name.replace(".", "/") + ".py"), REPO_ROOT / name.replace(".", "/") / "__init__.py"):
            if candidate.exists():
                return candidate
        return None

    package = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text())
    found = set()
    for node in (ast.walk(tree) if anywhere else tree.body):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.startswith("dsv4lib"):
                modules = [f"{base}.{a.name}" for a in node.names if file_of(f"{base}.{a.name}")]
                found |= set(modules) if modules else {base}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("dsv4lib")}
    with_parents = {".".join(m.split(".")[:n]) for m in found for n in range(1, m.count(".") + 2)}
    files = (file_of(m) for m in with_parents)
    return {f.relative_to(REPO_ROOT).as_posix() for f in files if f is not None}


def test_every_stage_depends_on_the_bench_and_reference_modules_its_notebook_runs():
    """A stage's ``depends`` covers every module of ``dsv4lib.bench`` and ``dsv4lib.reference`` its notebook runs
    (the float64 truth its cosines are read against included; closed over each package's own imports), and names the
    bench modules one by one, so that a change to one stage's benchmark module (bench/d7.py) marks that stage's results
    stale and not every GPU stage's."""
    from dsv4lib.workbook.provenance import REPO_ROOT
    from dsv4lib.workbook.registry import load_registry
    from dsv4lib.workbook.status import under
    for stage in load_registry():
        assert "dsv4lib/bench" not in stage.depends, stage.id          # the whole folder: every stage stale at once
        run = _dsv4lib_imports(stage.notebook, anywhere=True)
        for package in ("dsv4lib/bench", "dsv4lib/reference"):
            need = {f for f in run if under(f, [package])}
            todo = list(need)
            while todo:                          # the package's modules importing each other (d6 → d7)
                for g in _dsv4lib_imports(REPO_ROOT / todo.pop()):
                    if under(g, [package]) and g not in need:
                        need.add(g)
                        todo.append(g)
            missing = sorted(f for f in need if not under(f, stage.depends))
            assert not missing, (stage.id, missing)


def test_every_stage_depends_on_what_its_listed_modules_import():
    """``depends`` is closed under module-level imports: a module a listed kernel or op imports (a helper, a config,
    another kernel it builds on) is listed too, so that changing it marks the stage's GPU results stale (session 38
    found D7 without kernels/splitkv.py and ops/attention.py, which its decode path runs).  The workbook modules and
    the package ``__init__`` aggregators are left out: they record, they do not compute."""
    from dsv4lib.workbook.provenance import REPO_ROOT
    from dsv4lib.workbook.registry import load_registry
    from dsv4lib.workbook.status import under
    skipped = lambda f: f.startswith("dsv4lib/workbook/") or f.endswith("__init__.py")
    for stage in load_registry():
        listed = set()
        for d in stage.depends:
            p = REPO_ROOT / d
            listed |= ({f.relative_to(REPO_ROOT).as_posix() for f in p.rglob("*.py")} if p.is_dir()
                       else {d} if d.endswith(".py") else set())
        todo = sorted(f for f in listed if f.startswith("dsv4lib/") and not skipped(f))
        seen, missing = set(todo), set()
        while todo:
            for g in _dsv4lib_imports(REPO_ROOT / todo.pop()):
                if skipped(g):
                    continue
                if not under(g, stage.depends):
                    missing.add(g)
                if g not in seen:
                    seen.add(g)
                    todo.append(g)
        assert not missing, (stage.id, sorted(missing))


def test_a_gpu_result_is_stale_once_its_stages_files_change(tmp_path):
    """In a scratch repository: a GPU row recorded at commit A shows STALE (naming the file) after a file of its
    stage changed, and not for a change elsewhere; CPU rows are never marked; an unknown commit marks nothing."""
    import subprocess

    from dsv4lib.workbook.status import changed_since, render_status, stale_note

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    (tmp_path / "other.py").write_text("b = 1\n")
    git("add", "."), git("commit", "-qm", "a")
    recorded = git("rev-parse", "--short", "HEAD").strip()
    row = {"verdict": "PASS", "commit": recorded, "metrics": {}}
    assert changed_since(recorded, ["kernel.py"], repo=tmp_path) == []
    (tmp_path / "other.py").write_text("b = 2\n")
    assert changed_since(recorded, ["kernel.py"], repo=tmp_path) == []
    (tmp_path / "kernel.py").write_text("a = 2\n")
    assert changed_since(recorded, ["kernel.py"], repo=tmp_path) == ["kernel.py"]
    assert changed_since("0000000", ["kernel.py"], repo=tmp_path) is None
    import dsv4lib.workbook.status as status
    real = status.REPO_ROOT
    status.REPO_ROOT = tmp_path
    try:
        assert "STALE" in stale_note(row, ["kernel.py"], "h200") and "kernel.py" in stale_note(row, ["kernel.py"], "h200")
        assert stale_note(row, ["kernel.py"], "cpu") == ""
        assert "other.py" in stale_note(row, ["other.py"], "h200")      # it changed too
        stage = Stage("S", tmp_path / "kernel.py", "s", depends=("kernel.py",))
        text = render_status([stage], {"h200": {"stages": {"S": row}}, "cpu": {"stages": {"S": row}}})
        top = [line for line in text.splitlines() if line.startswith("| S ")][0]
        cpu_cell, gpu_cell = top.split(" | ")[1:3]
        assert "STALE" in gpu_cell and "STALE" not in cpu_cell
    finally:
        status.REPO_ROOT = real


def test_the_summary_counts_each_verdict():
    from dsv4lib.workbook.status import verdict_counts
    rows = {"a": {"verdict": "PASS"}, "b": {"verdict": "COMPILED-ONLY"}, "c": {"verdict": "PASS"},
            "d": {"verdict": "FAIL"}}
    assert verdict_counts(rows) == "2 PASS, 1 FAIL, 1 COMPILED-ONLY"


@pytest.mark.parametrize("argv,match", [
    (["--timeout", "-5"], "timeout"), (["--timeout", "0"], "timeout"), (["--stages", ""], "names no stage"),
    (["--stages", "D9"], "unknown stage"), (["--target", "h200"], "can only be recorded on that GPU"),
])
def test_bad_pipeline_arguments_are_one_line_and_exit_2(argv, match, capsys):
    import torch

    from dsv4lib.workbook.pipeline import main
    if argv[:2] == ["--target", "h200"] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and match in err, err


def test_status_shows_each_gpus_last_test_run(tmp_path):
    """A recorded gpu_check summary becomes a row of STATUS.md's GPU-tests section: totals and the groups that
    did not pass."""
    import json

    from dsv4lib.workbook.status import render_status
    run = {"target": "h200", "device": "NVIDIA H200", "commit": "abcdef1234", "date": "2026-11-24T20:00:00Z",
           "groups": [{"group": "d1", "rc": 0, "passed": 43, "failed": 0, "skipped": 0, "errors": 0, "seconds": 80},
                      {"group": "sparse", "rc": 1, "passed": 37, "failed": 4, "skipped": 0, "errors": 0, "seconds": 90}]}
    (tmp_path / "h200.json").write_text(json.dumps(run))
    text = render_status([], {}, gpu_tests_dir=tmp_path)
    row = [line for line in text.splitlines() if line.startswith("| h200 ")][0]
    assert "| 80 | 4 | 0 | 0 | sparse (rc 1) |" in row and "`abcdef1`" in row
    assert "GPU tests" not in render_status([], {}, gpu_tests_dir=tmp_path / "none")


def test_make_lab_opens_stage_notebooks_as_notebooks_at_the_repo_root():
    """`make lab` (dry run): the repo root as the server's root, the repo's lab settings, ARGS passed on, --allow-root
    where it runs as root; the shipped setting opens .py files with jupytext's notebook view."""
    import json
    import os
    import re
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    cmd = subprocess.run(["make", "-n", "lab", "ARGS=--port 8931"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    assert f"--ServerApp.root_dir={root}" in cmd and "--port 8931" in cmd
    assert f"JUPYTERLAB_SETTINGS_DIR={root}/.jupyter/lab/user-settings" in cmd
    assert ("--allow-root" in cmd) == (os.getuid() == 0)
    text = (root / ".jupyter/lab/user-settings/@jupyterlab/docmanager-extension/plugin.jupyterlab-settings").read_text()
    settings = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE))
    assert settings["defaultViewers"] == {"python": "Jupytext Notebook"}      # Markdown stays Markdown


def test_progress_is_plain_lines_off_a_terminal(tmp_path, monkeypatch, capsys):
    """Not a terminal (a log file, CI): no carriage returns — a start line, a line while a long stage runs (elapsed
    time and the cells done so far, read from papermill's autosave), the result line."""
    from dsv4lib.workbook import pipeline
    monkeypatch.setattr(pipeline, "PROGRESS_EVERY_S", 2)
    stages = [_stage(tmp_path, "slow", 'import time\ntime.sleep(7)\nrecord(metrics_path, mode="cpu", value=5.0)\n')]
    rows = run_pipeline(Target("cpu", "cpu", "", None), stages, results_dir=tmp_path / "results",
                        status_path=tmp_path / "STATUS.md", runs_dir=tmp_path / "runs", registry=stages)
    assert rows["slow"]["verdict"] == "PASS"
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[0] == "[1/1] slow …" and lines[-1].split()[:2] == ["slow", "PASS"]
    running = [ln for ln in lines if ln.startswith("      slow")]
    assert running and all(ln.split()[2].rstrip(",") == "s" for ln in running)
    assert any(", cell " in ln for ln in running)             # the autosaved notebook says how far it got


FIGURES = '''
import matplotlib.pyplot as plt
for n in range(n_figures):
    plt.figure(figsize=(2, 1)); plt.plot([0, n + 1]); plt.title(f"figure {n + 1}"); plt.show()
'''


def test_each_stage_leaves_figures_an_html_report_and_a_trusted_notebook(tmp_path, monkeypatch):
    """The pipeline's outputs for a person: figures/<stage>-<n>.png, <stage>.html (prose and figures inline), the
    executed notebook signed — also for a stage that failed after drawing; a re-run drawing fewer figures leaves none of
    the earlier run's behind."""
    import nbformat
    from nbformat.sign import NotebookNotary

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))      # a private trust database
    draw = _stage(tmp_path, "draw", '# %% [markdown]\n# Prose of the draw stage\n# %%\n' + FIGURES +
                  'record(metrics_path, mode="cpu", value=5.0)\n', params={"n_figures": 2})
    dies = _stage(tmp_path, "dies", FIGURES + 'raise RuntimeError("after the figure")\n', params={"n_figures": 1})
    runs = tmp_path / "runs"
    kw = dict(results_dir=tmp_path / "results", status_path=tmp_path / "STATUS.md", runs_dir=runs)
    rows = run_pipeline(Target("cpu", "cpu", "", None), [draw, dies], registry=[draw, dies], **kw)
    assert rows["draw"]["verdict"] == "PASS" and rows["dies"]["verdict"] == "FAIL"
    figures = runs / "cpu" / "figures"
    assert sorted(p.name for p in figures.iterdir()) == ["dies-1.png", "draw-1.png", "draw-2.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figures.iterdir())
    html = (runs / "cpu" / "draw.html").read_text()
    assert "Prose of the draw stage" in html and html.count("<img") == 2
    assert "after the figure" in (runs / "cpu" / "dies.html").read_text()           # the traceback is in the report
    for sid in ("draw", "dies"):
        nb = nbformat.read(str(runs / "cpu" / f"{sid}.ipynb"), as_version=4)
        assert NotebookNotary().check_signature(nb), sid
    assert "[draw.html](runs/cpu/draw.html)" in (tmp_path / "STATUS.md").read_text()

    draw.params["n_figures"] = 1                                # fewer figures now: draw-2.png must go
    run_pipeline(Target("cpu", "cpu", "", None), [draw], registry=[draw, dies], **kw)
    assert sorted(p.name for p in figures.iterdir()) == ["dies-1.png", "draw-1.png"]


def test_the_readme_gallery_shows_one_small_committed_figure_per_stage(tmp_path):
    """README's gallery: every registered stage's picked figure is committed under docs/gallery, shown in the README, and
    small; write_gallery makes them from a run's figures (scaled down) and refuses a run that lacks one."""
    import subprocess

    from PIL import Image

    from dsv4lib.workbook.provenance import REPO_ROOT
    from dsv4lib.workbook.registry import load_registry
    from dsv4lib.workbook.reports import GALLERY_DIR, write_gallery

    readme = (REPO_ROOT / "README.md").read_text()
    shown = [s.id for s in load_registry() if s.gallery_figure > 0]
    assert shown
    tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "docs/gallery"], capture_output=True,
                             text=True).stdout.split()
    total = 0
    for sid in shown:
        path = GALLERY_DIR / f"{sid}.png"
        assert f"(docs/gallery/{sid}.png)" in readme, sid
        assert path.exists() and (not tracked or f"docs/gallery/{sid}.png" in tracked), sid
        total += path.stat().st_size
    assert total < 400 * 1024

    figures = tmp_path / "runs" / "cpu" / "figures"
    figures.mkdir(parents=True)
    Image.new("RGB", (1800, 600), "red").save(figures / "S-2.png")
    out = write_gallery(tmp_path / "runs", "cpu", {"S": 2}, out_dir=tmp_path / "gallery", width_px=600)
    assert Image.open(out[0]).size == (600, 200)
    with pytest.raises(FileNotFoundError, match="run the pipeline"):
        write_gallery(tmp_path / "runs", "cpu", {"S": 1}, out_dir=tmp_path / "gallery")


def test_papermill_parses_every_parameter_of_every_stage_notebook(caplog):
    """``papermill --help-notebook`` lists every parameter with its default: each assignment of each stage's
    parameters cell is understood (a trailing comment with '=' in it made papermill skip the line, with a warning only
    in the stage's log)."""
    import jupytext
    from papermill.inspection import _infer_parameters

    from dsv4lib.workbook.kernelspec import kernel_metadata
    from dsv4lib.workbook.registry import load_registry

    for stage in load_registry():
        nb = jupytext.read(stage.notebook)
        nb.metadata.update(kernel_metadata())
        for cell in nb.cells:
            cell.metadata.setdefault("tags", [])
        cell = next(c for c in nb.cells if "parameters" in c.metadata.tags)
        assigned = [line.split("=")[0].strip() for line in cell.source.splitlines()
                    if re.match(r"^[A-Za-z_]\w*\s*(:[^=]*)?=", line)]
        caplog.clear()
        parsed = [p.name for p in _infer_parameters(nb)]
        assert parsed == [a.split(":")[0].strip() for a in assigned], (stage.id, caplog.text)
        assert "Unable to parse" not in caplog.text, (stage.id, caplog.text)


def test_every_gpu_test_is_in_a_group_of_the_gpu_runner():
    """scripts/gpu_check.sh runs the GPU tests by -k groups: a GPU test no group selects would never run on a GPU (and
    its absence would not show in the pass counts).  Each group expression is evaluated as pytest's -k does (a
    substring of the test's name, its file's name or a marker)."""
    import subprocess
    import sys

    from _pytest.mark.expression import Expression

    from dsv4lib.workbook.provenance import REPO_ROOT

    script = (REPO_ROOT / "scripts" / "gpu_check.sh").read_text()
    groups = dict(re.findall(r'^\s*\[(\w+)\]="([^"]+)"', script, flags=re.M))
    assert len(groups) >= 10, groups
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                          "tests/"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300).stdout
    node_ids = [line for line in out.splitlines() if "::" in line]
    assert len(node_ids) > 100, out[-2000:]
    compiled = {g: Expression.compile(expr) for g, expr in groups.items()}
    orphans = []
    for node in node_ids:
        path, name = node.split("::", 1)
        names = [Path(path).name, name, "gpu"]
        if not any(e.evaluate(lambda sub, **_: any(sub.lower() in n.lower() for n in names)) for e in compiled.values()):
            orphans.append(node)
    assert not orphans, f"GPU tests no group of scripts/gpu_check.sh runs: {orphans}"


def test_recorded_notes_read_true_on_every_target():
    """A stage's recorded note is shown on every target's row: none may speak of "CPU" as if the run were one (the GPU
    rows of D0-ref and D1.3 said "CPU PASS is legitimate")."""
    from dsv4lib.workbook.registry import load_registry

    for stage in load_registry():
        for note in re.findall(r'notes="([^"]*)"', stage.notebook.read_text()):
            assert "CPU PASS" not in note, (stage.id, note)


def test_reports_without_nbconvert_still_write_figures_and_sign(tmp_path, monkeypatch):
    """The GPU machine's bundle has papermill but no nbconvert: a stage's report is then its figures and the signed
    notebook, with a note saying why there is no HTML — never an exception that costs the stage's row."""
    import nbformat
    from nbformat.sign import NotebookNotary
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from dsv4lib.workbook import reports

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
    nb = new_notebook(cells=[new_code_cell("plot()", outputs=[new_output("display_data", data={"image/png": png})])])
    (tmp_path / "cpu").mkdir()
    nbformat.write(nb, str(tmp_path / "cpu" / "S.ipynb"))

    def no_nbconvert(nb, path):
        raise ImportError("No module named 'nbconvert'")
    monkeypatch.setattr(reports, "export_html", no_nbconvert)
    out = reports.write_reports(tmp_path, "cpu", "S")
    assert out["html"] is None and "nbconvert" in out["note"]
    assert [p.name for p in out["figures"]] == ["S-1.png"]
    assert not (tmp_path / "cpu" / "S.html").exists()
    assert NotebookNotary().check_signature(nbformat.read(str(tmp_path / "cpu" / "S.ipynb"), as_version=4))


def test_a_rerun_group_replaces_its_first_run_and_says_so(tmp_path):
    """gpu_check's groups with one run again alone (it timed out beside three others): the rerun's row takes the
    first run's place, the record says what it replaced and STATUS.md shows it; a rerun of a group the run did not
    have is refused."""
    import json

    from dsv4lib.workbook.gpu_tests import merge_reruns
    from dsv4lib.workbook.status import render_status
    run = [{"group": "d1", "rc": 0, "passed": 49, "failed": 0, "skipped": 0, "errors": 0, "seconds": 138},
           {"group": "d7", "rc": 124, "passed": 0, "failed": 0, "skipped": 0, "errors": 0, "seconds": 150}]
    again = [{"group": "d7", "rc": 0, "passed": 26, "failed": 0, "skipped": 0, "errors": 0, "seconds": 156}]
    groups, notes = merge_reruns(run, [again])
    assert [g["rc"] for g in groups] == [0, 0] and groups[1]["passed"] == 26 and run[1]["rc"] == 124
    assert len(notes) == 1 and notes[0].startswith("d7: rc 124") and "rc 0 (26 passed" in notes[0]
    with pytest.raises(SystemExit, match="does not have"):
        merge_reruns(run, [[dict(again[0], group="layer")]])
    record = {"target": "h100", "device": "NVIDIA H100", "commit": "abcdef1234", "date": "2026-11-26T18:30:00Z",
              "groups": groups, "reruns": notes}
    (tmp_path / "h100.json").write_text(json.dumps(record))
    row = [line for line in render_status([], {}, gpu_tests_dir=tmp_path).splitlines() if line.startswith("| h100 ")][0]
    assert "| 75 | 0 | 0 | 0 | rerun: d7: rc 124" in row


def test_a_result_with_file_digests_is_stale_by_content_not_by_its_commit_stamp(tmp_path):
    """A GPU row that carries the digests of its stage's files (the pipeline records them): fresh while the files
    are as the run saw them — even with a wrong commit stamp, the trap of a warm GPU machine's stale .git — and
    STALE naming the file once one changes, a file added to a depended-on folder included."""
    import dsv4lib.workbook.status as status
    from dsv4lib.workbook.provenance import file_digests
    (tmp_path / "kern").mkdir()
    (tmp_path / "kern" / "a.py").write_text("a = 1\n")
    (tmp_path / "nb.py").write_text("# %%\n")
    depends = ("nb.py", "kern")
    row = {"verdict": "PASS", "commit": "0000000", "metrics": {}, "depends_digest": file_digests(depends, tmp_path)}
    assert set(row["depends_digest"]) == {"nb.py", "kern/a.py"}
    real = status.REPO_ROOT
    status.REPO_ROOT = tmp_path
    try:
        assert status.stale_note(row, depends, "h100") == ""             # the commit is unknown: content decides
        (tmp_path / "kern" / "a.py").write_text("a = 2\n")
        assert "kern/a.py" in status.stale_note(row, depends, "h100")
        (tmp_path / "kern" / "a.py").write_text("a = 1\n")
        assert status.stale_note(row, depends, "h100") == ""
        (tmp_path / "kern" / "b.py").write_text("b = 1\n")
        assert "kern/b.py" in status.stale_note(row, depends, "h100")
        assert status.stale_note(row, depends, "cpu") == ""
        # a narrowed depends: a file the stage no longer names does not make it stale, one it still names does
        (tmp_path / "kern" / "b.py").unlink()
        (tmp_path / "kern" / "a.py").write_text("a = 3\n")
        assert status.stale_note(row, ("nb.py",), "h100") == ""
        assert "kern/a.py" in status.stale_note(row, ("nb.py", "kern/a.py"), "h100")
        (tmp_path / "kern" / "a.py").unlink()                              # deleted from a depended-on folder
        assert "kern/a.py" in status.stale_note(row, depends, "h100")
        # a widened depends: a file the run did not digest counts as changed only if git says it changed since the
        # row's commit (an unknown or dirty commit: it does)
        (tmp_path / "ref.py").write_text("r = 1\n")
        assert "ref.py" in status.stale_note(row, depends + ("ref.py",), "h100")          # commit 0000000: unknown
        same = lambda commit: ("kern/a.py",)                                              # git: only a.py changed
        assert status.stale_note(row, depends + ("ref.py",), "h100", files_since=same) == \
            status.stale_note(row, depends, "h100", files_since=same)
        moved = lambda commit: ("kern/a.py", "ref.py")
        assert "ref.py" in status.stale_note(row, depends + ("ref.py",), "h100", files_since=moved)
        assert "ref.py" in status.stale_note({**row, "commit": "0000000+dirty"}, depends + ("ref.py",), "h100",
                                             files_since=same)
    finally:
        status.REPO_ROOT = real



def test_ncu_sass_reader_splits_kernels_and_sums_samples_by_reason_region_and_opcode(tmp_path, monkeypatch):
    """scripts/ncu_sass.py (how session 34 read ncu's per-SASS-instruction samples): each ``"Kernel Name"`` line starts
    a kernel, its next row is the header; samples add up per stall reason, per region and per opcode (predicates and
    modifiers stripped), and the op map shows executed instructions only."""
    from dsv4lib.workbook.provenance import REPO_ROOT
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import ncu_sass
    header = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb",' \
             '"stall_barrier","stall_long_sb (Not Issued)"'
    rows = ['"0x0","  LDG.E.128 R4, desc[UR4][R2.64]","3","10","1","2","9"',
            '"0x10","@!P0  BRA 0x40","7","10","7","0","9"',
            '"0x20","  HMUL2.BF16 R1, R2, R3","0","0","0","0","0"',
            '"0x30","  STS.128 [R9+0x40], R4","5","10","0","5","9"']
    text = "\n".join(['"Kernel Name","first"', header, *rows, '"Kernel Name","second"', header, rows[0]])
    path = tmp_path / "sass.csv"
    path.write_text(text + "\n")
    first, second = ncu_sass.read_table(str(path))
    assert (first.name, len(first.rows), second.name, len(second.rows)) == ("first", 4, "second", 1)
    assert ncu_sass.stall_mix(first, first.rows) == {"long_sb": 8, "barrier": 7}     # "(Not Issued)" left out
    assert ncu_sass.stall_mix(first, first.rows[2:]) == {"barrier": 5}
    assert ncu_sass.opcode_mix(first, first.rows) == {"LDG": 10, "BRA": 10, "HMUL2": 0, "STS": 10}
    assert ncu_sass.op_map(first, 0, 4) == "Gbs"                                     # HMUL2 never executed
    assert ncu_sass.opcode("@!P0  BRA 0x40") == "BRA"


def test_ncu_pipes_reader_puts_the_matching_raw_metrics_of_each_kernel_side_by_side(tmp_path, monkeypatch):
    """scripts/ncu_pipes.py (session 53: which SM pipe a kernel at 55 % "SM throughput" is waiting on): a raw page is
    a header of metric names, a units row, then a row per kernel; the table keeps the metrics matching its patterns,
    in the page's order, one column per kernel, and drops those that read zero for every kernel (unless asked)."""
    from dsv4lib.workbook.provenance import REPO_ROOT
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import ncu_pipes
    names = ["ID", "Kernel Name", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
             "sm__pipe_fp16_cycles_active.avg.pct_of_peak_sustained_active",
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed", "launch__grid_size"]
    text = "\n".join(",".join(f'"{c}"' for c in r) for r in (
        names, ["", "", "%", "%", "%", ""], ["0", "ours", "55.1", "0", "61.0", "4096"],
        ["1", "FlashMLA", "54.9", "0", "58.2", "4096"]))
    path = tmp_path / "raw.csv"
    path.write_text(text + "\n")
    got = ncu_pipes.table(str(path))
    lines = got.splitlines()
    assert "0:ours" in lines[0] and "1:FlashMLA" in lines[0]
    assert [ln.split()[0] for ln in lines[1:]] == [names[2][:66], names[4][:66]]    # fp16 (all zero) and grid dropped
    assert lines[1].split()[-2:] == ["55.1", "54.9"]
    assert len(ncu_pipes.table(str(path), skip_zero=False).splitlines()) == 4
    assert ncu_pipes.pick(names, [r"^launch__"]) == ["launch__grid_size"]
    path.write_text(",".join(names) + "\n")
    with pytest.raises(ValueError, match="no kernel rows"):
        ncu_pipes.read_raw(str(path))
