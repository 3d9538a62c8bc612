#!/usr/bin/env bash
# Create .venv (or $VENV) and install PyTorch, then requirements.txt.
# TORCH_SPEC picks the PyTorch build: the default, plain `torch`, takes PyPI's default wheel
# (CUDA-enabled on Linux x86_64); CI uses TORCH_SPEC=torch==2.13.0, a CPU build on its disk.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -r requirements.txt
"$VENV/bin/python" -c "import torch; print(f'torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}')"
