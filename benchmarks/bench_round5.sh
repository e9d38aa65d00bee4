#!/usr/bin/env bash
# Issue #16, round 5, second device call (~7 minutes on an H100): what the round-4 script's time budget left out,
# and where the quantizer's time goes. From the repository root of a bare GPU node (python3 with torch + triton):
#
#   QUARTET_GIT_COMMIT=<commit> OUT=/some/dir bash benchmarks/bench_round5.sh [kernels|train]
#
# kernels (default):
# 1. Nsight Compute (when `ncu` is on the PATH) on the four quantizer calls of benchmarks/quant_profile.py -> ncu.txt
# 2. a tile sweep of the quantizer section: `quartet bench quant` once per (rows,cols,warps of the 1x128 tiles ;
#    warps of the 128x128 tiles), each a complete run with its own copy/GEMM denominators -> sweep_<cfg>.json
# 3. the training steps the round-4 call skipped for time: 800m, 7m, 3m, 1m (eager, compile, graph) -> step.json
# train: the 800M step as `quartet train` runs it (benchmarks/ladder_speed.py: the real Trainer, bf16 vs quartet,
#    both compiled, one micro-batch of 32 x 512 tokens, data=pycode) while nothing else uses the GPU, after the
#    GPU tests (tests/kernels, tests/quant/test_gpu.py) ran beside the corpus build; and whether cuBLAS multiplies
#    two 1x128-block-scaled FP8 operands (the fused layer's right operands use 128x128 blocks) -> probe.txt
set -uo pipefail
mode=${1:-kernels}
cd "$(dirname "$0")/.."
. cluster/scripts/device_env.sh
device_env bench_round5

if [ "$mode" = train ]; then
  device_wheels || exit 2
  export WANDB_MODE=disabled QUARTET_CACHE=${QUARTET_CACHE:-$PWD/.cache}
  ( "$PY" -m quartet.cli data prepare data=pycode > "$OUT/data_prepare.log" 2>&1; echo "exit $?" >> "$OUT/data_prepare.log" ) &
  data_pid=$!
  xd=""; "$PY" -c "import xdist" 2>/dev/null && xd="-n 12"
  stamp "GPU tests $xd"
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider $xd -rfE tests/kernels tests/quant/test_gpu.py -m "slow or not slow" \
    > "$OUT/gpu_tests.txt" 2>&1; echo "exit $?" >> "$OUT/gpu_tests.txt"
  tail -3 "$OUT/gpu_tests.txt"
  "$PY" benchmarks/scaled_mm_probe.py > "$OUT/probe.txt" 2>&1
  cat "$OUT/probe.txt"
  wait $data_pid; tail -1 "$OUT/data_prepare.log"
  stamp "800M step as quartet train runs it"
  timeout -s INT -k 20 "${TRAIN_HARD_S:-300}" "$PY" benchmarks/ladder_speed.py --models llama_800m \
    --configs "${TRAIN_CONFIGS:-bf16:compile,quartet:compile}" --out "$OUT/train_speed_800m.json" \
    model.batch_size=32 optim.micro_batch_size=32 > "$OUT/train_speed.log" 2>&1
  grep -v '^{' "$OUT/train_speed.log" | tail -12
  stamp "done"
  exit 0
fi

if command -v ncu >/dev/null; then
  stamp "ncu"
  timeout 120 ncu --clock-control none -k regex:_mx_quant_kernel -s 5 -c 4 --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section InstructionStats \
    "$PY" benchmarks/quant_profile.py > "$OUT/ncu.txt" 2>&1
  grep -E "^  _mx|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issued Ipc|Executed Ipc A" "$OUT/ncu.txt" | head -60
else
  stamp "no ncu on this node"
fi

for cfg in ${SWEEP:-"32,128,4;8" "64,128,4;16" "16,128,4;4" "32,128,8;4" "64,128,8;16"}; do
  blk=${cfg%;*}; w128=${cfg#*;}
  stamp "sweep QUARTET_QBLOCK=$blk QUARTET_QBLOCK128_WARPS=$w128"
  QUARTET_QBLOCK=$blk QUARTET_QBLOCK128_WARPS=$w128 timeout 120 "$PY" -m quartet.kernels.bench quant \
    --out "$OUT/sweep_${blk//,/-}_${w128}.json" 2>&1 | grep -E "^  quant"
done

stamp "steps"
timeout -s INT -k 20 "${STEP_HARD_S:-260}" "$PY" -m quartet.kernels.bench step --models "${STEP_MODELS:-800m,7m,3m,1m}" \
  --budget-s "${STEP_BUDGET_S:-220}" --out "$OUT/step.json" > "$OUT/step.log" 2>&1
grep -E "^  step|skipped" "$OUT/step.log" | head -30
stamp "done"
