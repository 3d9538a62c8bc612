#!/usr/bin/env bash
# PTB, gss: train, evaluate and rank one run.  Usage: scripts/ptb_gss.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/gss.yaml "$@"
