# The two commands of README.md: `make pipeline` and `make test`.  Both set up .venv first (once).
PY := .venv/bin/python
ARGS ?=

.PHONY: setup test pipeline lab gallery
setup:
	@bash scripts/bootstrap.sh

test: setup
	$(PY) -m pytest -q $(ARGS)

pipeline: setup
	$(PY) -m dsv4lib.workbook.pipeline $(ARGS)

# JupyterLab at the repository root (notebooks/, runs/ with the executed notebooks and figures, STATUS.md), with the
# repo's own lab settings (.jupyter/lab/user-settings: .py files open as notebooks); --allow-root where it runs as root
# (GPU boxes, containers); dsv4lib.workbook.lab's contents manager gives the .py notebooks the venv kernel's metadata,
# so opening one does not mark it modified.  ARGS go to jupyter lab, e.g.  make lab ARGS="--no-browser --port 8890"
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: setup
	JUPYTERLAB_SETTINGS_DIR=$(CURDIR)/.jupyter/lab/user-settings $(PY) -m jupyter lab --ServerApp.root_dir=$(CURDIR) \
		--ServerApp.contents_manager_class=dsv4lib.workbook.lab.WorkbookContentsManager $(ROOT_FLAG) $(ARGS)

# The README's gallery (docs/gallery/<stage>.png, committed, small): one figure per stage from the last pipeline run
# on this machine (runs/cpu by default; TARGET=h200 after copying a GPU's runs/ back).  Run `make pipeline` first.
TARGET ?= cpu
gallery: setup
	$(PY) -m dsv4lib.workbook.reports --target $(TARGET)
