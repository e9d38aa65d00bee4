#!/usr/bin/env bash
# Issue #16, round 6, on a bare GPU node (python3 with torch + triton), from the repository root:
#
#   QUARTET_GIT_COMMIT=<commit> OUT=/some/dir bash benchmarks/bench_round6.sh [variants|train|train+quant]
#
# variants (default, ~6 min on an H100): the GPU tests (tests/kernels, tests/quant/test_gpu.py) -> gpu_tests.txt, then
#   benchmarks/layer_variants.py: the fused layer with 128x128 or 1x128 right blocks and bool or packed masks, RTN and
#   SR, against BF16 at the three benchmark shapes, every figure timed interleaved under one clock history; the right
#   operands' quantizer calls and GEMMs under both blocks -> layer_variants.json / .log; an nvidia-smi trace.
# train (~5 min): the 800M and 20M steps as `quartet train` runs them (benchmarks/ladder_speed.py: the real Trainer,
#   bf16 vs quartet vs quartet_sr, compiled; data=pycode built first) with the layer's defaults -> train_speed_*.json
#   (TRAIN_MODELS / TRAIN_CONFIGS, LADDER_MODELS / LADDER_CONFIGS change the sizes and configurations: the ladder
#   sweep runs its models as CUDA graphs, LADDER_CONFIGS=bf16:graphs,quartet:graphs)
# train+quant: the same, then layer_variants.py's quantizer sections (Eᵀ tiles, right operands; each call graphed)
# caps (round 7, ~6 min): the GPU tests, then layer_variants.py's register caps: each quantizer call of the layer under
#   maxnreg none/96/64 (CAPS) at the three shapes (SHAPES="T,K,N;..." for others), and the layer with the measured
#   per-kind caps (the default since round 7) against the uncapped layer and BF16, RTN and SR (VARIANTS); SECTIONS picks
#   other layer_variants.py sections instead (round 7: inscale,layer; round 8: split,layer with
#   VARIANTS=tuned,default,tuned_sr,default_sr)
#   -> gpu_tests.txt, caps.json / .log
set -uo pipefail
mode=${1:-variants}
cd "$(dirname "$0")/.."
. cluster/scripts/device_env.sh
device_env bench_round6
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,driver_version --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
  echo "QUARTET_GIT_COMMIT=${QUARTET_GIT_COMMIT:-unset} QUARTET_RIGHT_BLOCK=${QUARTET_RIGHT_BLOCK:-default} QUARTET_MASK_BITS=${QUARTET_MASK_BITS:-default} QUARTET_MAXNREG=${QUARTET_MAXNREG:-default}"
} > "$OUT/env_${mode/+/_}.txt" 2>&1
cat "$OUT/env_${mode/+/_}.txt"
# the card's state across the run, every 2 s (read-only queries)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu \
  --format=csv -l 2 > "$OUT/nvidia-smi_${mode/+/_}.txt" 2>&1 &
smi_pid=$!
trap 'kill $smi_pid 2>/dev/null' EXIT

if [ "$mode" = variants ] || [ "$mode" = caps ]; then
  xd=""; "$PY" -c "import xdist" 2>/dev/null && xd="-n 12"
  stamp "GPU tests $xd"
  timeout "${TESTS_HARD_S:-240}" "$PY" -m pytest -q -p no:cacheprovider $xd -rfE tests/kernels tests/quant/test_gpu.py \
    -m "slow or not slow" > "$OUT/gpu_tests.txt" 2>&1; echo "exit $?" >> "$OUT/gpu_tests.txt"
  tail -4 "$OUT/gpu_tests.txt"
  if [ "$mode" = caps ]; then
    stamp "register caps"
    timeout -s INT -k 20 "${VARIANTS_HARD_S:-420}" "$PY" benchmarks/layer_variants.py --sections "${SECTIONS:-caps,layer}" \
      --caps "${CAPS:-0,96,64}" ${SHAPES:+--shapes "$SHAPES"} \
      --variants "${VARIANTS:-r128_bits,tuned,r128_bits_sr,tuned_sr}" --out "$OUT/caps.json" > "$OUT/caps.log" 2>&1
    echo "exit $?"
    tail -40 "$OUT/caps.log"  # the table, printed last
  else
    stamp "layer variants"
    timeout -s INT -k 20 "${VARIANTS_HARD_S:-300}" "$PY" benchmarks/layer_variants.py --out "$OUT/layer_variants.json" \
      > "$OUT/layer_variants.log" 2>&1
    echo "exit $?"
    grep -v "^    " "$OUT/layer_variants.log" | tail -30
  fi
  stamp "done"
  exit 0
fi

if [ "$mode" = train ] || [ "$mode" = train+quant ]; then
  device_wheels || exit 2
  export WANDB_MODE=disabled QUARTET_CACHE=${QUARTET_CACHE:-$PWD/.cache}
  stamp "corpus"
  "$PY" -m quartet.cli data prepare data=pycode > "$OUT/data_prepare.log" 2>&1; tail -1 "$OUT/data_prepare.log"
  stamp "800M and 20M steps as quartet train runs them"
  timeout -s INT -k 20 "${TRAIN_HARD_S:-420}" "$PY" benchmarks/ladder_speed.py --models "${TRAIN_MODELS:-llama_800m}" \
    --configs "${TRAIN_CONFIGS:-bf16:compile,quartet:compile,quartet_sr:compile}" --out "$OUT/train_speed_800m.json" \
    model.batch_size=32 optim.micro_batch_size=32 > "$OUT/train_speed_800m.log" 2>&1
  grep -v '^{' "$OUT/train_speed_800m.log" | tail -8
  if [ -n "${LADDER_MODELS-llama_20m}" ]; then
    timeout -s INT -k 20 "${LADDER_HARD_S:-200}" "$PY" benchmarks/ladder_speed.py --models "${LADDER_MODELS-llama_20m}" \
      --configs "${LADDER_CONFIGS:-bf16:compile,quartet:compile}" --out "$OUT/train_speed_ladder.json" > "$OUT/train_speed_ladder.log" 2>&1
    grep -v '^{' "$OUT/train_speed_ladder.log" | tail -6
  fi
  if [ "$mode" = train+quant ]; then
    stamp "quantizer calls, graphed"
    timeout -s INT -k 20 "${QUANT_HARD_S:-150}" "$PY" benchmarks/layer_variants.py --sections tiles,right \
      --out "$OUT/quant_graphed.json" > "$OUT/quant_graphed.log" 2>&1
    grep -v "^    " "$OUT/quant_graphed.log" | tail -4
  fi
  stamp "done"
  exit 0
fi
echo "unknown mode $mode (variants | caps | train | train+quant)" >&2
exit 2
