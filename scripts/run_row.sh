#!/usr/bin/env bash
# Train one config (a table row, or any config) on one GPU, then evaluate it and compute its rank.
#   scripts/run_row.sh CONFIG [SEED] [key=value ...]
# The run goes to $OUT/<dataset>-<config name>-seed<SEED> (OUT defaults to runs; SEED to the
# config's). It is `sweep.py CONFIG --seeds SEED --rank`, the one routine every launcher uses:
# re-running the same command continues an interrupted run, and skips what is already done.
# RANK_ARGS passes options to rank.py (the WikiText-2 rows use it to match the paper).
set -euo pipefail
cd "$(dirname "$0")/.."
config="$1"; shift
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
"$PYTHON" -c "import torch" 2>/dev/null || {
  echo "error: $PYTHON cannot import torch: run scripts/setup.sh first (it makes .venv, which this script uses), or set PYTHON=/path/to/python" >&2
  exit 2; }
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"   # a single-GPU run
seeds=()
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then seeds=(--seeds "$1"); shift; fi
exec "$PYTHON" sweep.py "$config" "$@" "${seeds[@]}" --out "${OUT:-runs}" --rank --rank-args="${RANK_ARGS:-}"
