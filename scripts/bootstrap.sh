#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install dsv4lib with everything the
# pipeline and the tests need. Safe to run again: it only installs what is missing.
#  - torch: a machine that already has torch (a GPU box with a CUDA build) keeps it; the venv sees it
#    through --system-site-packages. Otherwise the CPU build torch==2.13.0 is installed explicitly,
#    because a bare "torch" requirement would pull gigabytes of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DSV4_VENV:-.venv}
PY=${PYTHON:-python3}
say() { echo "setup: $*" >&2; }         # one line per step: a first run takes minutes, never silently
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
# The browser test (tests/test_browser.py) drives Debian's chromium; install it where we can (root with apt-get), once.
# Anywhere else, or with DSV4_NO_BROWSER=1, that test skips with a one-line reason.
if ! command -v chromedriver >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
   && [ -z "${DSV4_NO_BROWSER:-}" ]; then
  say "installing chromium + chromium-driver (apt-get) for the browser test"
  { apt-get install -y -q chromium chromium-driver || { apt-get update -q && apt-get install -y -q chromium chromium-driver; }; } \
    >/dev/null 2>&1 || say "could not install chromium: the browser test will skip"
fi
stamp="$VENV/.dsv4-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own progress (downloads, bars) on a terminal; quiet in a log or CI, where the step lines say enough
PIP_QUIET=$([ -t 1 ] && echo "" || echo "-q")
if ! "$VPY" -c "import torch" 2>/dev/null; then
  say "installing torch 2.13.0 (the CPU build, ~200 MB)"
  "$VPY" -m pip install $PIP_QUIET "torch==2.13.0"
fi
say "installing dsv4lib with CuTeDSL, ptxas and the notebook stack (pip, a minute or two on a first run)"
"$VPY" -m pip install $PIP_QUIET -e ".[notebooks]"
say "registering the venv's Jupyter kernel"
"$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (dsv4-workbook)" >/dev/null
touch "$stamp"
say "done ($VENV)"
