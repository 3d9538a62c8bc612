#!/usr/bin/env bash
# PTB, ss: train, evaluate and rank one run.  Usage: scripts/ptb_ss.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/ss.yaml "$@"
