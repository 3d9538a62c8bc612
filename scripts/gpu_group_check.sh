#!/usr/bin/env bash
# Issue 44's GPU job (docs/gpus.md, "Group runs"): everything a short GPU window should measure of
# group runs (train.py --group), within BUDGET seconds (default 340) on an H100 or H200, its output in at most 8
# files under $OUT (default results/gpu_group_<date>; the device tool sets OUT itself):
#   env.txt            nvidia-smi, torch / CUDA / cuDNN versions
#   gpu_check.txt      python -m benchmarks.gpu_check --only group lstm: one batched group step
#                      against the solo steps from the same weights and masks (1e-5 relative)
#   bench_group.txt    benchmarks/bench_group.py: tokens/s at G = 1 ... 32 (miniature), 1 ... 8 (PTB);
#                      then PTB's rows again with --product streams, batched and per_member
#                      (the time loops' products other ways than the default's choice by shape)
#   plan_steps.txt     bench_group.py --plan sweeps/cpu_converged_heads.yaml: each run's solo step
#                      against one step of the whole plan as a group
#   train_group8.txt   train.py --group: 8 miniature Softmax seeds, 2 epochs
#   train_solo.txt     train.py: seeds 1 and 2 of them alone, 2 epochs, on the same GPU
#   runs.tar.gz        those runs' metrics.jsonl, run.json, config.yaml, group_exit.json (no checkpoints)
#   profile.txt        bench_group.py --products --shapes ptb: the time loop's product several
#                      ways per G (which way cuBLAS runs fastest for a few members at PTB's
#                      shapes); --profile 4 --shapes ptb: where a PTB-shape group step's time goes
#                      (torch.profiler); --profile 16, the same for the miniature; then --layers:
#                      an LSTM layer forward and backward per G, the group's loop against each
#                      member's cuDNN LSTM one after another and on a CUDA stream each
# Needs the PTB corpus in corpora/ptb (the device tool does not bring ../shared):
#   mkdir -p corpora && cp -r ../shared/data/ptb corpora/      # here, then run with carry=["corpora"]
# FAST=1: tiny shapes on the CPU, to check the script itself (tests/test_scripts.py); EXTRA: key=value
# overrides for every run (FAST's test passes its small corpus here); PYTHON: default .venv/bin/python
# (scripts/setup.sh's), else python3 (scripts/common.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
OUT="${OUT:-results/gpu_group_$(date -u +%F)}"
require_whole_number gpu_group_check "BUDGET=${BUDGET:-340}"
find_python
export PYTHONUNBUFFERED=1
# Every part within one deadline (BUDGET seconds, default 340: under 6 minutes), each part at most
# its own cap of what is left, so that a slow part cannot take the others' time; the parts in the
# order of what a window needs most (a short BUDGET leaves out the last): issue 44's measurements
# first, then the diagnostics of PTB's step.
# (FAST=1 on a shared CPU: six times the caps and the budget.)
scale=$([ "${FAST:-0}" = 1 ] && echo 6 || echo 1)
deadline=$(( $(date +%s) + ${BUDGET:-340} * scale ))
left() { local cap=$(( $1 * scale )) l=$(( deadline - $(date +%s) )); (( l < 1 )) && l=1; (( l < cap )) && echo $l || echo $cap; }
mkdir -p "$OUT"
runs="$(mktemp -d)"
if [ "${FAST:-0}" = 1 ]; then
  device=(--device cpu); tiny=(model.emsize=16 model.nhid=24 model.nhidlast=16 train.batch_size=4 train.bptt=8
                                train.eval_batch_size=2 run.device=cpu)
  groups=(--groups 1 2); shapes=(--shapes mini); steps=(--steps 1 --warmup 0); epochs=1; check=(--fast); profiled=2
else
  device=(); tiny=(); groups=(); shapes=(); steps=(); epochs=2; check=(); profiled=16
fi
read -r -a extra <<< "${EXTRA:-}"   # split on spaces only (no globbing), as gpu_seeds.sh
{ nvidia-smi 2>&1 || echo "nvidia-smi: not found"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '| GPU', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$OUT/env.txt"
status=0
timeout $(left 60) "$PYTHON" -m benchmarks.gpu_check --only group lstm "${device[@]}" "${check[@]}" > "$OUT/gpu_check.txt" 2>&1 || status=1
timeout $(left 100) "$PYTHON" benchmarks/bench_group.py "${device[@]}" "${shapes[@]}" "${groups[@]}" "${steps[@]}" \
  "${tiny[@]}" > "$OUT/bench_group.txt" 2>&1 || status=1
# What issue 44 asks of every window after the self-check and the table: the plan's steps and 2
# epochs of a group of 8 seeds beside two solo runs (the solo runs were cut by the budget in two
# windows when the diagnostics below ran first).
timeout $(left 60) "$PYTHON" benchmarks/bench_group.py --plan sweeps/cpu_converged_heads.yaml "${device[@]}" "${steps[@]}" \
  "${tiny[@]}" > "$OUT/plan_steps.txt" 2>&1 || status=1
member() { echo "configs/ptb_mini/softmax.yaml train.seed=$1 train.epochs=$epochs run.dir=$runs/$2-seed$1 run.tensorboard=false run.log_interval=100 ${tiny[*]} ${extra[*]}"; }
members=(); for seed in 1 2 3 4 5 6 7 8; do members+=("$(member $seed group)"); done
timeout $(left 150) "$PYTHON" train.py --group "${members[@]}" > "$OUT/train_group8.txt" 2>&1 || status=1
for seed in 1 2; do
  timeout $(left 60) "$PYTHON" train.py $(member $seed solo) >> "$OUT/train_solo.txt" 2>&1 || status=1
done
# Then the diagnostics of PTB's step (a short BUDGET cuts these first): PTB's products several
# ways and PTB's whole step with one product per member on a stream each (new: the products of
# the members at once), then what three windows of 2026-11-27 measured: where the default's PTB
# step of 4 goes, the miniature's step of 16.
if [ "${FAST:-0}" = 1 ]; then products=(--shapes mini --groups 1 2 --steps 1 --warmup 0); layers=("${products[@]}")
  other_way=(--kind batched "${shapes[@]}" "${groups[@]}" "${steps[@]}" "${tiny[@]}")
else products=(--shapes ptb --steps 5); layers=(--shapes ptb --steps 5); other_way=(--shapes ptb); fi
timeout $(left 40) "$PYTHON" benchmarks/bench_group.py --products "${products[@]}" "${device[@]}" \
  > "$OUT/profile.txt" 2>&1 || status=1
timeout $(left 40) "$PYTHON" benchmarks/bench_group.py --product streams "${other_way[@]}" "${device[@]}" \
  >> "$OUT/bench_group.txt" 2>&1 || status=1
[ "${FAST:-0}" = 1 ] || timeout $(left 40) "$PYTHON" benchmarks/bench_group.py --profile 4 --shapes ptb --steps 5 \
  "${device[@]}" >> "$OUT/profile.txt" 2>&1 || status=1
timeout $(left 45) "$PYTHON" benchmarks/bench_group.py --profile $profiled --steps 5 "${device[@]}" "${tiny[@]}" \
  >> "$OUT/profile.txt" 2>&1 || status=1
# PTB's layer three ways, and PTB's whole step with the other ways of the products than the
# default's choice by shape (every layer batched, then one product per member; each appended to
# the table).
timeout $(left 60) "$PYTHON" benchmarks/bench_group.py --layers "${layers[@]}" "${device[@]}" \
  >> "$OUT/profile.txt" 2>&1 || status=1
for way in batched per_member; do
  timeout $(left 40) "$PYTHON" benchmarks/bench_group.py --product $way "${other_way[@]}" "${device[@]}" \
    >> "$OUT/bench_group.txt" 2>&1 || status=1
done
tar -czf "$OUT/runs.tar.gz" -C "$runs" --exclude='*.pt' --exclude='.lock' . || status=1
rm -rf "$runs"
echo "gpu_group_check: wrote $OUT (status $status)"
exit $status
