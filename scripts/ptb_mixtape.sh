#!/usr/bin/env bash
# PTB, mixtape: train, evaluate and rank one run.  Usage: scripts/ptb_mixtape.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/mixtape.yaml "$@"
