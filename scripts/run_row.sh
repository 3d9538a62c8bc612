#!/usr/bin/env bash
# Train one table row on one GPU, then evaluate it and compute its rank.
#   scripts/run_row.sh CONFIG [SEED] [RUN_DIR] [key=value ...]
# SEED defaults to the config's seed, RUN_DIR to runs/<dataset>-<head>-seed<SEED>. Re-running
# the same command continues an interrupted run (train.py --resume) instead of starting over.
# RANK_ARGS passes options to rank.py (the WikiText-2 rows use it to match the paper).
set -euo pipefail
cd "$(dirname "$0")/.."
config="$1"; shift
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"   # a single-GPU run
read -r default_seed default_name < <("$PYTHON" -c "
import sys; from experiment.config import load_config
c = load_config(sys.argv[1]); print(c.train.seed, f'{c.data.dataset}-{c.head_name}')" "$config")
seed="$default_seed"
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then seed="$1"; shift; fi
run_dir="runs/$default_name-seed$seed"
if [[ $# -gt 0 && "$1" != *=* ]]; then run_dir="$1"; shift; fi

if [ -f "$run_dir/last.pt" ]; then
  "$PYTHON" train.py --resume "$run_dir"
else
  "$PYTHON" train.py "$config" "train.seed=$seed" "run.dir=$run_dir" "$@"
fi
"$PYTHON" evaluate.py "$run_dir" --json
# shellcheck disable=SC2086  # RANK_ARGS is a list of options
"$PYTHON" rank.py "$run_dir" --json ${RANK_ARGS:-}
