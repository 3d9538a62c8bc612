#!/usr/bin/env bash
# WikiText-2, moc: train, evaluate and rank one run.  Usage: scripts/wt2_moc.sh [SEED] [key=value ...]
export RANK_ARGS="${RANK_ARGS---contexts 33320}"   # [SB]: the first 33,320 test contexts
exec "$(dirname "$0")/run_row.sh" configs/wt2/moc.yaml "$@"
