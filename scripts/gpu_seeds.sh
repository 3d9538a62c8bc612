#!/usr/bin/env bash
# Issue 45's GPU job (docs/results_cpu.md, "What a GPU added"): more converged seeds of the
# miniature study's cells. sweeps/gpu_converged_seeds.yaml is trained GROUP runs at a time
# (sweep.py --group, default 2), each run evaluated and ranked as the CPU's are, within BUDGET
# seconds (default 500); its output in $OUT (default results/gpu_seeds_<date>; the device tool
# sets OUT itself):
#   env.txt        nvidia-smi, torch / CUDA / cuDNN versions
#   sweep.txt      sweep.py's output
#   seeds.tar.gz   the runs this job finished (trained, evaluated and ranked; result files, no
#                  checkpoints), to unpack into results/cpu_ptb_converged/, where the reports pool
#                  them with the CPU's seeds (docs/results_cpu.md says how)
# The runs train in RUNS, by default the plan's own folder (results/cpu_ptb_converged/), so a
# later job skips every run already committed there and trains the next ones; only the runs this
# job finished are packed. A run not finished when the budget ends stops with its last.pt there,
# and the same command again resumes it (on the short GPU loans this repository's own runs get,
# only within the ~30 s the machine keeps its files; on your own machine, whenever). On an H200 a
# converged miniature run takes 8-10 minutes alone, so set BUDGET for your machine and the runs
# you want (BUDGET=500 may finish none); a group of 2 about 8 minutes for both is an estimate
# from a one-step benchmark (docs/gpus.md, "Group runs"), not a trained group.
# Environment:
#   GROUP=N       runs per group (default 2; a group pairs the plan's next unfinished runs, in its
#                 order, whatever their heads)
#   BUDGET=S      seconds for sweep.py (default 500, so that the packing fits a 600-s job)
#   DRY_RUN=1     print what sweep.py would train (its --dry-run) and stop
#   EXTRA='k=v'   overrides for every run, after FAST's (so they win)
#   FAST=1        tiny shapes on the CPU, to check the script itself (tests/test_scripts.py runs
#                 it with a PLAN of two runs on a slice of PTB through EXTRA's data.data_dir); its
#                 runs go to a fresh temporary folder unless RUNS is set
#   PLAN, RUNS, OUT
#   PYTHON        default: .venv/bin/python (scripts/setup.sh's), else python3 (scripts/common.sh)
# The PTB corpus: AWD_DATA_DIR, or corpora/ptb in the repository (the device tool's machine has
# no network: copy it there, `cp -r "$AWD_DATA_DIR/ptb" corpora/`, and carry corpora).
# A machine held for hours trains the whole plan in one call, e.g. GROUP=10 BUDGET=7200.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
PLAN="${PLAN:-sweeps/gpu_converged_seeds.yaml}"
GROUP="${GROUP:-2}"
BUDGET="${BUDGET:-500}"
require_whole_number gpu_seeds "GROUP=$GROUP" "BUDGET=$BUDGET"
find_python
export PYTHONUNBUFFERED=1
if [ "${FAST:-0}" = 1 ] && [ -z "${RUNS:-}" ]; then
  # FAST's tiny runs would take the plan's real run names in its committed folder
  RUNS="$(mktemp -d)"
  echo "gpu_seeds: FAST=1: the runs go to $RUNS (set RUNS to choose)"
fi
if ! runs="${RUNS:-$("$PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["out"])' "$PLAN" 2>/dev/null)}" \
   || [ -z "$runs" ]; then
  echo "gpu_seeds: error: $PLAN: cannot read the plan's out folder (set RUNS)" >&2
  exit 2
fi
if [ "${FAST:-0}" = 1 ]; then
  small=(model.nhid=24 train.batch_size=4 train.bptt=8 train.eval_batch_size=2 train.epochs=1 run.device=cpu)
else
  small=()
fi
# EXTRA last: a key it sets wins over FAST's.
overrides=("${small[@]}")
read -r -a extra <<< "${EXTRA:-}"
overrides+=("${extra[@]}")
if [ "${DRY_RUN:-0}" = 1 ]; then
  exec "$PYTHON" sweep.py "$PLAN" --group "$GROUP" --out "$runs" --dry-run "${overrides[@]}"
fi

finished_runs() {   # the run folders in $runs with both an evaluation and a rank, one a line
  for run in "$runs"/*/; do
    run="${run%/}"
    [ -f "$run/eval_best.json" ] && [ -f "$run/rank_test.json" ] && basename "$run"
  done
}
OUT="${OUT:-results/gpu_seeds_$(date -u +%F)}"
mkdir -p "$OUT"
{ nvidia-smi 2>&1 || echo "nvidia-smi: not found"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '| GPU', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$OUT/env.txt"
before="$(finished_runs)"
# SIGTERM at the budget: sweep.py passes it on, each training run saves last.pt and stops.
timeout --kill-after=60 "$BUDGET" "$PYTHON" sweep.py "$PLAN" --group "$GROUP" --out "$runs" \
  "${overrides[@]}" > "$OUT/sweep.txt" 2>&1
status=$?
new=()
while read -r name; do
  [ -n "$name" ] && ! grep -qxF "$name" <<< "$before" && new+=("$name")
done <<< "$(finished_runs)"
packed="no seeds.tar.gz written"
if [ ${#new[@]} -gt 0 ]; then
  if tar -czf "$OUT/seeds.tar.gz" -C "$runs" --exclude='*.pt' --exclude='.lock' --exclude='.sweep.lock' \
       --exclude='sweep.log' "${new[@]}"; then
    packed="packed in $OUT/seeds.tar.gz"
  else
    status=1
  fi
fi
echo "gpu_seeds: ${#new[@]} runs finished in this job (${new[*]:-none}), $packed; sweep status $status" \
  | tee -a "$OUT/sweep.txt"
if [ "$status" -ne 0 ] && [ "$status" -ne 124 ]; then
  { echo "gpu_seeds: sweep.py failed (status $status); from $OUT/sweep.txt:"
    grep -m 1 -E "^(error: |[A-Za-z_.]*Error: )" "$OUT/sweep.txt"
    tail -n 3 "$OUT/sweep.txt" | head -n 2; } >&2
fi
exit $(( status == 124 ? 0 : status ))
