#!/usr/bin/env bash
# The one-GPU ladder (sweeps/ladder_1gpu.yaml) on a bare GPU machine without network access: a node whose
# python3 has torch + triton (+ numpy, rich, tqdm, tokenizers, PyYAML) but not the project's pure-Python
# dependencies. Run from anywhere; it works in the checkout.
#
#   bash cluster/scripts/ladder_device.sh wheels      # HERE, with network: hydra-core/omegaconf/antlr4/submitit -> .whl/
#   bash cluster/scripts/ladder_device.sh calibrate   # THERE: env, GPU tests, corpus, step-speed benchmark, a 2-run sweep
#   bash cluster/scripts/ladder_device.sh ladder      # THERE: corpus + the whole sweep in the background; waits up to
#                                                     # LADDER_WAIT s, collects; call again to keep waiting
#   bash cluster/scripts/ladder_device.sh session     # THERE, one lease: GPU tests while the corpus builds, then
#                                                     # `ladder` with the compile mode the tests allow (below);
#                                                     # GPU_TESTS='<pytest args>' narrows the tests
#   bash cluster/scripts/ladder_device.sh lrprobe     # THERE: corpus, the llama_1m bf16 LR probe
#                                                     # (sweeps/ladder_1m_lr.yaml), its rule writes the winner into
#                                                     # conf/model/llama_1m.yaml, then `ladder` (retrains that rung)
#
# On a machine with the project installed (pip install -e .) none of this is needed: docs/ladder.md gives the
# three plain commands. Results go to $OUT (default .cache/ladder_out): logs, benchmark JSON, and runs.tar.gz
# with every run's small files (config, metrics, summary, logs; no checkpoints). On a fresh machine,
# LADDER_RESTORE=<an earlier runs.tar.gz> puts the finished runs back first, so the sweep skips them.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-ladder}
OUT=${OUT:-$PWD/.cache/ladder_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-disabled}
export QUARTET_CACHE=${QUARTET_CACHE:-$PWD/.cache} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}
RUNS=${RUNS:-$PWD/runs}

if [ "$mode" = wheels ]; then
  PY=${PY:-.venv/bin/python}
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps -d .whl hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4
  "$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
  ls -la .whl
  exit 0
fi

PY=${PY:-python3}
. cluster/scripts/device_env.sh
device_wheels || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
quartet() { "$PY" -m quartet.cli "$@"; }

collect() {
  # every run's small files (no checkpoints, no wandb folders) in one archive
  if [ -d "$RUNS" ]; then
    (cd "$RUNS" && find . -path '*/ckpt' -prune -o -path '*/wandb' -prune -o -type f \
        \( -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' -o -name '*.log' -o -name 'error.txt' \) -print \
      | tar czf "$OUT/runs.tar.gz" -T -)
  fi
  cp "$QUARTET_CACHE"/data/pycode-*/manifest.json "$OUT/pycode_manifest.json" 2>/dev/null || true
}

stamp "device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv,noheader
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
nproc

prepare_data() {
  stamp "corpus: quartet data prepare data=pycode"
  local t=$(date +%s)
  "$PY" -m quartet.cli data prepare data=pycode 2>&1 | tee "$OUT/data_prepare.log"
  stamp "corpus ready after $(( $(date +%s) - t )) s" | tee -a "$OUT/data_prepare.log"
}

if [ "$mode" = calibrate ]; then
  # GPU tests in the background while the corpus is built (different resources: GPU vs CPU cores)
  # (they are usually done before the benchmark's timing phase starts; gpu_tests.txt ends with when they ended)
  ( "$PY" -m pytest -q -p no:cacheprovider tests/kernels tests/quant/test_gpu.py tests/quartet/test_compile.py \
      -m "slow or not slow" > "$OUT/gpu_tests.txt" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$OUT/gpu_tests.txt" ) &
  tests_pid=$!
  prepare_data
  stamp "step speed"
  "$PY" benchmarks/ladder_speed.py --out "$OUT/ladder_speed.json" ${SPEED_ARGS:-} 2>&1 | tee "$OUT/ladder_speed.log" | grep -v '^{'
  wait $tests_pid
  stamp "GPU tests: $(tail -2 "$OUT/gpu_tests.txt" | tr '\n' ' ')"
  stamp "a 2-run sweep through the GPU pool"
  timeout -s INT -k 30 ${MINI_TIMEOUT:-150} "$PY" -m quartet.cli sweep ladder_1gpu --cluster local_gpu --runs-dir /tmp/mini_runs \
    'sweep.axes.model=[llama_1m]' 'sweep.axes.budget=[dn5]' 'sweep.axes.precision=[bf16,quartet]' 'sweep.include=[]' \
    2>&1 | tee "$OUT/mini_sweep.log"
  RUNS=/tmp/mini_runs collect
  stamp "done"
  exit 0
fi

if [ "$mode" = session ]; then
  # What one GPU lease needs before the sweep: the GPU tests, run while the corpus is built on the CPUs, then
  # the sweep. It runs CUDA-graph replays of traced fused layers (sweeps/ladder_1gpu.yaml) only where the tests
  # passed: a failed traceable-layer test turns the tracing off (run.compile_fused=false: the eager fused layer,
  # the same numbers), a failed CUDA-graph test drops the graphs (run.compile_mode=default). The choice is
  # logged in session.txt. Time the steps afterwards, with the GPU to itself: `speed`.
  # GPU_TESTS narrows the tests to what the sweep's compile mode depends on when the rest ran in an earlier lease
  ( "$PY" -m pytest -q -p no:cacheprovider ${GPU_TESTS:-tests/kernels tests/quant/test_gpu.py tests/quartet/test_compile.py} \
      -m "slow or not slow" -rfE > "$OUT/gpu_tests.txt" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$OUT/gpu_tests.txt" ) &
  tests_pid=$!
  prepare_data
  prepared=1
  wait $tests_pid
  stamp "GPU tests: $(tail -2 "$OUT/gpu_tests.txt" | tr '\n' ' ')"
  choice=$("$PY" - "$OUT/gpu_tests.txt" <<'PYEOF'
import sys
failed = [ln for ln in open(sys.argv[1]).read().splitlines() if ln.startswith(("FAILED", "ERROR"))]
args = []
if any("traceable" in ln for ln in failed):  # the traced fused layer, or any model in CUDA graphs, failed
    args.append("sweep.fixed.run.compile_fused=false")
if any("graphs" in ln for ln in failed):
    args.append("sweep.fixed.run.compile_mode=default")
print(" ".join(args))
PYEOF
)
  echo "sweep overrides chosen by the GPU tests: '${choice}'" | tee "$OUT/session.txt"
  SWEEP_ARGS="${SWEEP_ARGS:-} $choice"
  mode=ladder
fi

if [ "$mode" = lrprobe ]; then
  # The 1.0M rung's peak LR, chosen on bf16 alone by the rule in benchmarks/ladder_lr_probe.py; the ladder then
  # runs with it (the rung's run ids change with its LR, so LADDER_RESTORE retires the old rung's runs)
  prepare_data
  prepared=1
  stamp "LR probe: quartet sweep ladder_1m_lr --cluster local_gpu ${PROBE_ARGS:-cluster.workers_per_gpu=8}"
  t=$(date +%s)
  "$PY" -m quartet.cli sweep ladder_1m_lr --cluster local_gpu --runs-dir "$RUNS" ${PROBE_ARGS:-cluster.workers_per_gpu=8} \
    > "$OUT/lr_probe_sweep.log" 2>&1
  rc=$?
  stamp "LR probe finished after $(( $(date +%s) - t )) s (exit $rc)"
  "$PY" benchmarks/ladder_lr_probe.py "$RUNS/ladder_1m_lr" --apply conf/model/llama_1m.yaml --csv "$OUT/lr_probe.csv" \
    2>&1 | tee "$OUT/lr_probe.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { collect; exit 2; }
  cp conf/model/llama_1m.yaml "$OUT/"
  mode=ladder
fi

if [ "$mode" = speed ]; then
  # the step-speed benchmark of the ladder sizes, alone on the GPU (after the sweep; the corpus must exist)
  stamp "step speed"
  "$PY" benchmarks/ladder_speed.py --out "$OUT/ladder_speed.json" --models ${SPEED_MODELS:-llama_1m,llama_3m,llama_7m} \
    --configs ${SPEED_CONFIGS:-bf16:compile,bf16:graphs,fp8:graphs,quartet:compile_untraced,quartet:compile,quartet:graphs} \
    2>&1 | tee "$OUT/ladder_speed.log" | grep -v '^{'
  stamp "done"
  exit 0
fi

if [ "$mode" = ladder ]; then
  # The sweep runs in its own session (setsid), so it outlives this command: a later `ladder` call on the same
  # machine finds it running and only waits for it (LADDER_WAIT s per call), then collects what finished.
  LOGS=$QUARTET_CACHE/ladder_logs; mkdir -p "$LOGS"
  if [ -n "${LADDER_RESTORE:-}" ] && [ -f "$LADDER_RESTORE" ] && [ ! -d "$RUNS/ladder_1gpu" ]; then
    stamp "restoring finished runs from $LADDER_RESTORE (a fresh machine: their summaries make the sweep skip them)"
    mkdir -p "$RUNS" && tar xzf "$LADDER_RESTORE" -C "$RUNS"
    find "$RUNS/ladder_1gpu" -name state.json -exec grep -l '"running"\|"pending"' {} + 2>/dev/null \
      | while read -r f; do d=$(dirname "$f"); [ -f "$d/summary.json" ] || rm -f "$f"; done
    # runs of an earlier version of the sweep that its plan no longer has move aside (the analysis reads the folder)
    "$PY" - "$RUNS" <<'PYEOF'
import sys
from pathlib import Path
from cluster.launch import make_plan
root = Path(sys.argv[1]) / "ladder_1gpu"
keep = {r.run_id for r in make_plan("ladder_1gpu", None, ["cluster.gpus=1"], sys.argv[1], with_state=False).runs}
aside = root.parent / "ladder_1gpu_retired"
for d in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in keep):
    aside.mkdir(exist_ok=True)
    d.rename(aside / d.name)
    print(f"retired (not in the sweep's plan): {d.name}")
PYEOF
  fi
  if ! { [ -f "$LOGS/sweep.pid" ] && kill -0 "$(cat "$LOGS/sweep.pid")" 2>/dev/null; }; then
    [ "${prepared:-0}" = 1 ] || prepare_data
  fi
  sweep_in_background ladder_1gpu "${LADDER_WAIT:-540}"
  cp "$LOGS"/sweep.log "$OUT/" 2>/dev/null
  grep -v "━" "$LOGS/sweep.log" | tail -15
  quartet status ladder_1gpu --runs-dir "$RUNS" > "$OUT/status.txt" 2>&1
  collect
  stamp "done"
  exit 0
fi
echo "unknown mode $mode (wheels | calibrate | session | ladder | speed)" >&2
exit 2
