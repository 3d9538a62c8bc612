#!/usr/bin/env bash
# PTB, softmax: train, evaluate and rank one run.  Usage: scripts/ptb_softmax.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/softmax.yaml "$@"
