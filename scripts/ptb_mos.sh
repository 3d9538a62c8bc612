#!/usr/bin/env bash
# PTB, mos: train, evaluate and rank one run.  Usage: scripts/ptb_mos.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/mos.yaml "$@"
