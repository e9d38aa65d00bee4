#!/usr/bin/env bash
# Issue #16, round 5, second device call (~7 minutes on an H100): what the round-4 script's time budget left out,
# and where the quantizer's time goes. From the repository root of a bare GPU node (python3 with torch + triton):
#
#   QUARTET_GIT_COMMIT=<commit> OUT=/some/dir bash benchmarks/bench_round5.sh
#
# 1. Nsight Compute (when `ncu` is on the PATH) on the four quantizer calls of benchmarks/quant_profile.py -> ncu.txt
# 2. a tile sweep of the quantizer section: `quartet bench quant` once per (rows,cols,warps of the 1x128 tiles ;
#    warps of the 128x128 tiles), each a complete run with its own copy/GEMM denominators -> sweep_<cfg>.json
# 3. the training steps the round-4 call skipped for time: 800m, 7m, 3m, 1m (eager, compile, graph) -> step.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.cache/bench_round5}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/quartet_inductor}
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

if command -v ncu >/dev/null; then
  stamp "ncu"
  timeout 120 ncu --clock-control none -k regex:_mx_quant_kernel -s 4 -c 4 --section SpeedOfLight --section Occupancy \
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
