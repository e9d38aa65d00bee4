#!/usr/bin/env bash
# The recipe table (sweeps/recipes.yaml) on a bare GPU machine without network access (python3 with torch +
# triton; hydra-core / omegaconf / submitit carried as wheels in .whl/: `bash cluster/scripts/ladder_device.sh
# wheels` where there is network). Run from anywhere; it works in the checkout.
#
#   bash cluster/scripts/recipes_device.sh probe   # GPU tests of every recipe while the corpus is built, then every
#                                                  # recipe's step speed at llama_7m, alone on the GPU
#   bash cluster/scripts/recipes_device.sh sweep   # corpus, the ladder's bf16/fp8/quartet runs restored, the sweep in
#                                                  # the background on every GPU; waits up to RECIPES_WAIT s, collects;
#                                                  # call again on the same machine to keep waiting
#
# On a machine with the project installed none of this is needed: docs/recipes.md gives the plain commands.
# Results go to $OUT (default .cache/recipes_out): logs, gpu_tests.txt, recipe_speed.json, runs.tar.gz (every
# run's small files). RECIPES_RESTORE=<runs.tar.gz of an earlier lease> puts finished runs back first.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-probe}
export WANDB_MODE=${WANDB_MODE:-disabled}
export QUARTET_CACHE=${QUARTET_CACHE:-$PWD/.cache}
. cluster/scripts/device_env.sh
device_env recipes_out
device_wheels || exit 2
RUNS=${RUNS:-$PWD/runs}
LOGS=$QUARTET_CACHE/recipes_logs
mkdir -p "$LOGS"

stamp "device $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' ')"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

prepare_data() {
  stamp "corpus: quartet data prepare data=pycode"
  "$PY" -m quartet.cli data prepare data=pycode > "$OUT/data_prepare.log" 2>&1
  stamp "corpus ready (exit $?)"
  cp "$QUARTET_CACHE"/data/pycode-*/manifest.json "$OUT/pycode_manifest.json" 2>/dev/null || true
}

collect() {
  # every run's small files (no checkpoints, no wandb folders) in one archive
  [ -d "$RUNS/recipes" ] || return 0
  (cd "$RUNS" && find recipes -path '*/ckpt' -prune -o -path '*/wandb' -prune -o -type f \
      \( -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' -o -name '*.log' -o -name 'error.txt' \) -print \
    | tar czf "$OUT/runs.tar.gz" -T -)
}

if [ "$mode" = probe ]; then
  ( timeout -k 10 "${TESTS_TIMEOUT:-480}" "$PY" -m pytest -q -p no:cacheprovider -rfE ${GPU_TESTS:-tests/quant/test_gpu_recipes.py tests/quant/test_gpu.py} \
      > "$OUT/gpu_tests.txt" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$OUT/gpu_tests.txt" ) &
  tests_pid=$!
  prepare_data
  stamp "step speed of every recipe at ${SPEED_MODEL:-llama_7m} (CUDA graphs; two eager-oracle baselines)"
  configs=bf16:graphs,fp8:graphs,mxfp8:graphs,fp8_deepseek:graphs,nvfp4:graphs,nvfp4_recipe:graphs,quartet:graphs
  configs=$configs,quartet_sr:graphs,quartet2:graphs,ms_fp4:graphs,luq_int4:graphs,${SPEED_EXTRA:-nvfp4@reference:graphs,mxfp8@reference:graphs}
  "$PY" benchmarks/ladder_speed.py --models "${SPEED_MODEL:-llama_7m}" --configs "$configs" --split "${SPEED_SPLIT:-4}" \
    --out "$OUT/recipe_speed.json" > "$OUT/recipe_speed.log" 2>&1
  stamp "speed done (exit $?)"
  grep -v '^{' "$OUT/recipe_speed.log" | tail -20
  wait $tests_pid
  stamp "GPU tests: $(tail -3 "$OUT/gpu_tests.txt" | tr '\n' ' ')"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | cut -c1-300
  exit 0
fi

if [ "$mode" = sweep ]; then
  if [ ! -d "$RUNS/recipes" ]; then
    mkdir -p "$RUNS/recipes"
    # the ladder's bf16 / fp8 / quartet runs are the table's runs of those recipes (same configs, same run ids)
    tmp=$(mktemp -d) && tar xzf benchmarks/results/ladder/runs.tar.gz -C "$tmp"
    "$PY" -m quartet.cli sweep recipes --cluster local_gpu --dry-run --runs-dir "$RUNS" 2>/dev/null \
      | grep -o 'llama_[0-9a-z_]*-dn[0-9]*-[a-z0-9_]*-s[0-9]-[0-9a-f]*' | sort -u > "$tmp/ids"
    n=0; while read -r id; do
      [ -d "$tmp/ladder_1gpu/$id" ] && cp -r "$tmp/ladder_1gpu/$id" "$RUNS/recipes/" && n=$((n + 1))
    done < "$tmp/ids"
    stamp "restored $n ladder runs"
    if [ -n "${RECIPES_RESTORE:-}" ] && [ -f "$RECIPES_RESTORE" ]; then
      tar xzf "$RECIPES_RESTORE" -C "$RUNS"
      stamp "restored the runs of $RECIPES_RESTORE"
    fi
    # a run restored unfinished has no checkpoint here (the archive holds none): it starts again from nothing
    for d in "$RUNS"/recipes/*/; do [ -f "$d/summary.json" ] || rm -rf "$d"; done
  fi
  if [ -n "${GPU_TESTS:-}" ] && [ ! -f "$LOGS/gpu_tests.txt" ]; then
    # GPU tests beside the sweep, on the first GPU, in their own session (setsid) so that they outlive this call;
    # a later call finds their output in $LOGS and does not start them again
    stamp "GPU tests beside the sweep on GPU 0: $GPU_TESTS"
    CUDA_VISIBLE_DEVICES=0 setsid bash -c 'timeout -k 10 "$0" "$1" -m pytest -q -p no:cacheprovider -rfE --tb=short $2 \
        > "$3" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$3"' "${TESTS_TIMEOUT:-1100}" "$PY" "$GPU_TESTS" \
        "$LOGS/gpu_tests.txt" < /dev/null > /dev/null 2>&1 &
  fi
  ls "$QUARTET_CACHE"/data/pycode-*/manifest.json >/dev/null 2>&1 || prepare_data
  sweep_in_background recipes "${RECIPES_WAIT:-540}"
  cp "$LOGS"/sweep.log "$OUT/" 2>/dev/null
  grep -v "━" "$LOGS/sweep.log" | tail -8
  if [ -f "$LOGS/gpu_tests.txt" ]; then
    cp "$LOGS/gpu_tests.txt" "$OUT/"
    stamp "GPU tests so far: $(grep -cE '^(FAILED|ERROR)' "$LOGS/gpu_tests.txt") failed; $(tail -1 "$LOGS/gpu_tests.txt" | cut -c1-160)"
  fi
  "$PY" -m quartet.cli status recipes --runs-dir "$RUNS" > "$OUT/status.txt" 2>&1
  tail -3 "$OUT/status.txt"
  collect
  stamp "done"
  exit 0
fi
echo "unknown mode $mode (probe | sweep)" >&2
exit 2
