#!/usr/bin/env bash
# PTB, plif_frozen: train, evaluate and rank one run.  Usage: scripts/ptb_plif_frozen.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/plif_frozen.yaml "$@"
