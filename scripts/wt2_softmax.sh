#!/usr/bin/env bash
# WikiText-2, softmax: train, evaluate and rank one run.  Usage: scripts/wt2_softmax.sh [SEED] [key=value ...]
export RANK_ARGS="${RANK_ARGS---contexts 33320}"   # [SB]: the first 33,320 test contexts
exec "$(dirname "$0")/run_row.sh" configs/wt2/softmax.yaml "$@"
