#!/usr/bin/env bash
# Create .venv (or $VENV) and install PyTorch, then requirements.txt.
# TORCH_SPEC picks the PyTorch build. The default, torch==2.13.0, is the version CI tests (from
# PyPI on Linux x86_64 that is the CUDA build; CI's machine resolves it to a CPU wheel). Set
# TORCH_SPEC to choose another, e.g. TORCH_SPEC="torch==2.14.0". The last line says what was
# installed: the torch version, the CUDA version it was built for, and whether a GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# The default torch needs Python 3.10 or newer: one line here rather than pip's resolver error.
if [ "$TORCH_SPEC" = torch==2.13.0 ] && ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "scripts/setup.sh: $VENV/bin/python is older than Python 3.10, which torch 2.13.0 needs: make $VENV with a newer python3 (remove it first), or set TORCH_SPEC to a torch for that Python" >&2
  exit 2
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -r requirements.txt
"$VENV/bin/python" -c "
import torch
cuda = torch.version.cuda or 'none (a CPU build)'
print(f'installed torch {torch.__version__}, built for CUDA {cuda}; '
      f'a CUDA GPU usable here: {torch.cuda.is_available()}')"
