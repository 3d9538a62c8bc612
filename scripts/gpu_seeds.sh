#!/usr/bin/env bash
# Issue 45's GPU job (docs/results_cpu.md, "What a GPU added"): more converged seeds of the
# miniature study's cells. sweeps/gpu_converged_seeds.yaml is trained GROUP runs at a time
# (sweep.py --group, default 2: two seeds of one head), each run evaluated and ranked as the
# CPU's are, within BUDGET seconds (default 540); its output in $OUT (default
# results/gpu_seeds_<date>; the device tool sets OUT itself):
#   env.txt        nvidia-smi, torch / CUDA / cuDNN versions
#   sweep.txt      sweep.py's output
#   seeds.tar.gz   the finished runs' result files (trained, evaluated and ranked; no checkpoints),
#                  to unpack into results/cpu_ptb_converged/, where the reports pool them with
#                  the CPU's seeds
# A run not finished when the budget ends stops with its last.pt in RUNS (default runs/gpu_seeds/,
# ignored by git): the same command again within the device tool's ~30 s of warmth resumes it on the same
# machine; after that it is lost. On an H200 a converged miniature run takes 8-10 minutes alone and
# a group of 2 about 8 minutes for both (docs/gpus.md, "Group runs"): one job of 10 minutes converges
# a group of 2, two jobs back to back perhaps a group of 4 (GROUP=4).
# Needs the PTB corpus in corpora/ptb (as scripts/gpu_group_check.sh). FAST=1: tiny shapes on the
# CPU, to check the script itself (tests/test_scripts.py, with a PLAN of two runs); EXTRA: key=value
# overrides for every run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/gpu_seeds_$(date -u +%F)}"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONUNBUFFERED=1
runs="${RUNS:-runs/gpu_seeds}"
mkdir -p "$OUT"
if [ "${FAST:-0}" = 1 ]; then
  small=(model.nhid=24 train.batch_size=4 train.bptt=8 train.eval_batch_size=2 train.epochs=1 run.device=cpu)
else
  small=()
fi
{ nvidia-smi 2>&1 || echo "nvidia-smi: not found"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '| GPU', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$OUT/env.txt"
# SIGTERM at the budget: sweep.py passes it on, each training run saves last.pt and stops.
timeout --kill-after=60 "${BUDGET:-540}" "$PYTHON" sweep.py "${PLAN:-sweeps/gpu_converged_seeds.yaml}" \
  --group "${GROUP:-2}" --out "$runs" ${EXTRA:-} "${small[@]}" > "$OUT/sweep.txt" 2>&1
status=$?
finished=()
for run in "$runs"/*/; do
  run="${run%/}"
  [ -f "$run/eval_best.json" ] && [ -f "$run/rank_test.json" ] && finished+=("$(basename "$run")")
done
if [ ${#finished[@]} -gt 0 ]; then
  tar -czf "$OUT/seeds.tar.gz" -C "$runs" --exclude='*.pt' --exclude='.lock' --exclude='.sweep.lock' \
    --exclude='sweep.log' "${finished[@]}" || status=1
fi
echo "gpu_seeds: ${#finished[@]} runs finished (${finished[*]:-none}) in $OUT/seeds.tar.gz; sweep status $status" \
  | tee -a "$OUT/sweep.txt"
exit $(( status == 124 ? 0 : status ))
