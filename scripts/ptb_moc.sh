#!/usr/bin/env bash
# PTB, moc: train, evaluate and rank one run.  Usage: scripts/ptb_moc.sh [SEED] [key=value ...]
exec "$(dirname "$0")/run_row.sh" configs/ptb/moc.yaml "$@"
