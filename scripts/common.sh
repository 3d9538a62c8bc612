# Sourced by scripts/run_row.sh, gpu_seeds.sh and gpu_group_check.sh (from the repository root).

# PYTHON: as set, else scripts/setup.sh's .venv, else python3 on PATH (a machine that brings its
# own torch); one line and exit 2 if it cannot import torch, before anything runs.
find_python() {
  PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 || echo python)}"
  "$PYTHON" -c "import torch" 2>/dev/null || {
    echo "error: $PYTHON cannot import torch: run scripts/setup.sh first (it makes .venv, which this script uses), or set PYTHON=/path/to/python" >&2
    exit 2; }
}

# require_whole_number SCRIPT NAME=VALUE ...: each VALUE a whole number above 0, else one line, exit 2.
require_whole_number() {
  local script="$1" setting; shift
  for setting in "$@"; do
    if ! [[ "${setting#*=}" =~ ^[1-9][0-9]*$ ]]; then
      echo "$script: error: ${setting%%=*} must be a whole number above 0, got '${setting#*=}'" >&2
      exit 2
    fi
  done
}
