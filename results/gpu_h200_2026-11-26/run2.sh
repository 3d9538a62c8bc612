#!/bin/bash
# Second device call: Mixtape's PTB epoch; the cost of run.deterministic and the gain of run.tf32
# (Softmax and MoS, 300 steps each); several Softmax runs on one GPU (bench_parallel).
export PYTHONUNBUFFERED=1 AWD_DATA_DIR=$PWD/.gpu/data
PY=${PY:-python3}
deadline=$(( $(date +%s) + ${BUDGET:-320} ))
left() { local l=$(( deadline - $(date +%s) )); (( l < $1 )) && echo $l || echo $1; }
train() {  # name cap config overrides...
  local name=$1 cap=$2; shift 2
  echo "== $name $(date -u +%T), up to $(left $cap) s"
  local start=$(date +%s%N)
  timeout $(left $cap) $PY train.py "$@" run.dir=/tmp/gpu-$name run.tensorboard=false ${TRAIN_ARGS:-} 2>&1 | tee $OUT/$name.txt
  echo "wall $(( ($(date +%s%N) - start) / 1000000 )) ms, exit ${PIPESTATUS[0]}" | tee -a $OUT/$name.txt
  cat /tmp/gpu-$name/metrics.jsonl >> $OUT/metrics.jsonl 2>/dev/null
}
train mixtape 70 configs/ptb/mixtape.yaml train.epochs=1 run.log_interval=200
for head in softmax mos; do
  train $head-det 45 configs/ptb/$head.yaml run.max_steps=300 run.log_interval=100 run.deterministic=true
  train $head-tf32 40 configs/ptb/$head.yaml run.max_steps=300 run.log_interval=100 run.tf32=true
done
echo "== bench_parallel $(date -u +%T)"
timeout $(left 120) $PY benchmarks/bench_parallel.py --device cuda --concurrent 1 2 4 --ddp 1 --steps 30 ${PAR_ARGS:-} 2>&1 | tee $OUT/bench_parallel.txt
echo "== done $(date -u +%T)"
