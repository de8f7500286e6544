# The two commands of README.md: `make pipeline` and `make test`.  Both set up .venv first (once).
PY := .venv/bin/python
ARGS ?=

.PHONY: setup test pipeline lab
setup:
	@bash scripts/bootstrap.sh

test: setup
	$(PY) -m pytest -q $(ARGS)

pipeline: setup
	$(PY) -m dsv4lib.workbook.pipeline $(ARGS)

lab: setup
	$(PY) -m jupyter lab notebooks/
