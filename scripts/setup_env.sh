#!/usr/bin/env bash
# Set up a virtual environment for twell on a fresh machine (used by .ci/run and scripts/demo.sh).
# torch is pinned to the 2.13.0 CPU wheel first: an unpinned torch would pull a multi-GB CUDA build.
# triton 3.6.0 is what the GPU machines run; its interpreter runs the kernels' CPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TWELL_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "triton==3.6.0"
"$VENV/bin/python" -m pip install -q -e ".[dev,hf]"
"$VENV/bin/python" -c "import torch, triton, twell; print('twell', twell.__version__, '| torch', torch.__version__, '| triton', triton.__version__)"
