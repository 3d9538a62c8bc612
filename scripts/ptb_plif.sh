#!/usr/bin/env bash
# PTB, plif: train, evaluate and rank one run.  Usage: scripts/ptb_plif.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/plif.yaml "$@"
