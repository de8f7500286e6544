"""What a person looks at after a stage ran: its figures as PNG files, an HTML report, a trusted notebook.

For every executed notebook ``runs/<target>/<stage>.ipynb`` the pipeline writes

* ``runs/<target>/figures/<stage>-<n>.png`` — every image the notebook displayed, numbered from 1 in cell order;
* ``runs/<target>/<stage>.html`` — the notebook rendered by nbconvert (prose, code, outputs, figures inline);
* a signature in Jupyter's trust database, so the notebook opens "trusted" (its outputs render) in JupyterLab.

A notebook that failed half-way still gets its report: the figures and the traceback up to where it stopped are what
explain a FAIL.  None of this is committed (``runs/`` is git-ignored); the README's gallery is a separate, small copy
made by ``make gallery`` (:func:`write_gallery`).
"""
from __future__ import annotations

import base64
from pathlib import Path

from .provenance import REPO_ROOT

FIGURES = "figures"


def report_paths(runs_dir: Path, target: str, stage_id: str) -> dict[str, Path]:
    """Where a stage's executed notebook, report and figures live (whether or not they exist yet)."""
    run_dir = Path(runs_dir) / target
    return {"notebook": run_dir / f"{stage_id}.ipynb", "html": run_dir / f"{stage_id}.html",
            "figures": run_dir / FIGURES}


def notebook_images(nb) -> list[bytes]:
    """The PNG images a notebook's outputs hold, in cell order (display_data and execute_result)."""
    images = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png") if out.get("output_type") in (
                "display_data", "execute_result") else None
            if png:
                images.append(base64.b64decode(png if isinstance(png, str) else "".join(png)))
    return images


def export_figures(nb, figures_dir: Path, stage_id: str) -> list[Path]:
    """Write every image of ``nb`` as ``<figures_dir>/<stage_id>-<n>.png``; old figures of the stage are removed
    first, so a stage that now draws fewer figures leaves none of an earlier run behind."""
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    for old in figures_dir.glob(f"{stage_id}-*.png"):
        if old.stem[len(stage_id) + 1:].isdigit():
            old.unlink()
    paths = []
    for n, png in enumerate(notebook_images(nb), start=1):
        path = figures_dir / f"{stage_id}-{n}.png"
        path.write_bytes(png)
        paths.append(path)
    return paths


def export_html(nb, html_path: Path) -> Path:
    """The notebook as one self-contained HTML page (images embedded), JupyterLab's look."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    Path(html_path).write_text(body, encoding="utf-8")
    return Path(html_path)


def sign_notebook(path: Path) -> None:
    """Mark the executed notebook trusted in this user's Jupyter trust database (what ``jupyter trust`` does): the
    pipeline produced it, so JupyterLab should show its outputs, not the "not trusted" banner."""
    import nbformat
    from nbformat.sign import NotebookNotary

    nb = nbformat.read(str(path), as_version=4)
    NotebookNotary().sign(nb)


def write_reports(runs_dir: Path, target: str, stage_id: str) -> dict[str, object]:
    """Figures, HTML report and trust for one executed stage notebook; ``{}`` when the stage left no notebook (it
    failed before papermill wrote one).  Returns ``{"html": Path, "figures": [Path, ...]}``; ``html`` None (and a
    ``note`` why) where nbconvert is not installed — the GPU machine's bundle has papermill without it."""
    import nbformat

    paths = report_paths(runs_dir, target, stage_id)
    if not paths["notebook"].exists():
        return {}
    nb = nbformat.read(str(paths["notebook"]), as_version=4)
    figures = export_figures(nb, paths["figures"], stage_id)
    sign_notebook(paths["notebook"])
    try:
        html = export_html(nb, paths["html"])
    except ImportError as exc:    # a machine with papermill but no nbconvert (the GPU bundle): figures only
        return {"html": None, "figures": figures, "note": f"no HTML report: {exc}"}
    return {"html": html, "figures": figures}


# --- the README's gallery: one small figure per stage, committed ---------------------------------------------------
GALLERY_DIR = REPO_ROOT / "docs" / "gallery"
GALLERY_WIDTH_PX = 640


def write_gallery(runs_dir: Path, target: str, picks: dict[str, int], out_dir: Path = GALLERY_DIR,
                  width_px: int = GALLERY_WIDTH_PX) -> list[Path]:
    """Copy figure ``picks[stage]`` (1-based) of each stage's run on ``target`` into ``out_dir/<stage>.png``, scaled
    down to ``width_px`` and palette-quantised so the committed tree stays small.  A stage whose figure is missing
    raises (a gallery silently short of a stage is worse than a clear error: run the pipeline first)."""
    from PIL import Image

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stage_id, n in picks.items():
        src = report_paths(runs_dir, target, stage_id)["figures"] / f"{stage_id}-{n}.png"
        if not src.exists():
            raise FileNotFoundError(f"{src} does not exist: run the pipeline on {target} first "
                                    f"(stage {stage_id} should draw at least {n} figure(s))")
        img = Image.open(src).convert("RGB")
        if img.width > width_px:
            img = img.resize((width_px, round(img.height * width_px / img.width)), Image.LANCZOS)
        dst = out_dir / f"{stage_id}.png"
        img.quantize(colors=128, method=Image.MEDIANCUT).save(dst, optimize=True)
        written.append(dst)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m dsv4lib.workbook.reports [--target cpu]`` (``make gallery``): the README's gallery from the figures
    the pipeline wrote on this machine; each stage's figure is ``gallery_figure`` in stages/stages.toml."""
    import argparse

    from .pipeline import RUNS_DIR
    from .registry import load_registry

    ap = argparse.ArgumentParser(prog="python -m dsv4lib.workbook.reports", description=main.__doc__)
    ap.add_argument("--target", default="cpu", help="whose runs/<target>/figures to take (default: cpu)")
    args = ap.parse_args(argv)
    picks = {s.id: s.gallery_figure for s in load_registry() if s.gallery_figure > 0}
    try:
        written = write_gallery(RUNS_DIR, args.target, picks)
    except FileNotFoundError as exc:
        print(f"gallery: {exc}")
        return 1
    total = sum(p.stat().st_size for p in written)
    print(f"gallery: {len(written)} figures, {total / 1024:.0f} KiB, in {GALLERY_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
