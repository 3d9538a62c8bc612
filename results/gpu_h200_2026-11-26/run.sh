#!/bin/bash
# One device call: the GPU self-check, then one PTB epoch each of [SB] Table 2's Softmax and MoS
# rows (real data, the configs as committed), every part under its own share of a fixed deadline.
export PYTHONUNBUFFERED=1 AWD_DATA_DIR=$PWD/.gpu/data
PY=${PY:-python3}
deadline=$(( $(date +%s) + ${BUDGET:-570} ))
left() { local l=$(( deadline - $(date +%s) )); (( l < $1 )) && echo $l || echo $1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  nproc; } 2>&1 | tee $OUT/env.txt
echo "== gpu_check $(date -u +%T)"
timeout $(left ${CHECK_S:-320}) $PY -m benchmarks.gpu_check ${CHECK_ARGS:-} 2>&1 | tee $OUT/gpu_check.txt
for head in softmax mos; do
  s=$([ $head = softmax ] && echo 90 || echo 160)
  echo "== train $head $(date -u +%T), up to $(left $s) s"
  start=$(date +%s%N)
  timeout $(left $s) $PY train.py configs/ptb/$head.yaml train.epochs=1 run.log_interval=100 \
      run.dir=/tmp/gpu-$head run.tensorboard=false ${TRAIN_ARGS:-} 2>&1 | tee $OUT/train_$head.txt
  echo "wall $(( ($(date +%s%N) - start) / 1000000 )) ms, exit ${PIPESTATUS[0]}" | tee -a $OUT/train_$head.txt
  cp /tmp/gpu-$head/metrics.jsonl $OUT/metrics_$head.jsonl 2>/dev/null
done
echo "== done $(date -u +%T)"
