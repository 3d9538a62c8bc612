#!/usr/bin/env bash
# Train one config (a table row, or any config) on one GPU, then evaluate it and compute its rank.
#   scripts/run_row.sh CONFIG [SEED] [key=value ...]
# The run goes to $OUT/<dataset>-<config name>-seed<SEED> (OUT defaults to runs; SEED to the
# config's). It is `sweep.py CONFIG --seeds SEED --rank`, the one routine every launcher uses:
# re-running the same command continues an interrupted run, and skips what is already done.
# RANK_ARGS passes options to rank.py (the WikiText-2 rows use it to match the paper).
# The run's folder: OUT, or an --out among the arguments (given both, the arguments' wins).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  echo "usage: scripts/run_row.sh CONFIG [SEED] [key=value ...] (a row's script: scripts/ptb_softmax.sh [SEED] ...)" >&2
  exit 2
fi
config="$1"; shift
source scripts/common.sh
find_python
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"   # a single-GPU run
seeds=()
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then seeds=(--seeds "$1"); shift; fi
out=(--out "${OUT:-runs}")
for arg in "$@"; do [[ "$arg" == --out || "$arg" == --out=* ]] && out=(); done
exec "$PYTHON" sweep.py "$config" "$@" "${seeds[@]}" "${out[@]}" --rank --rank-args="${RANK_ARGS:-}"
