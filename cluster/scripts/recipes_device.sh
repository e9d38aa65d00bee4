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
#   bash cluster/scripts/recipes_device.sh speed   # the fast paths: GPU tests, kernel benchmark, every recipe's step
#                                                  # speed at llama_7m and llama_200m, as one background job (below)
#   bash cluster/scripts/recipes_device.sh runs    # GPU tests as a gate, then RUNS_SWEEPS side by side on every GPU,
#                                                  # as one background job (below); call again to keep waiting
#
# On a machine with the project installed none of this is needed: docs/recipes.md gives the plain commands.
# Results go to $OUT (default .cache/recipes_out): logs, gpu_tests.txt, recipe_speed.json, runs.tar.gz (every
# run's small files). RECIPES_RESTORE=<runs.tar.gz of an earlier lease> puts finished runs back first.
# GPU_TESTS: pytest arguments; in sweep mode ';' separates groups that run side by side beside the sweep (the call
# also waits for them), in probe mode "none" skips the tests so that the speeds are timed alone.
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
  [ "${GPU_TESTS:-}" = none ] || ( timeout -k 10 "${TESTS_TIMEOUT:-480}" "$PY" -m pytest -q -p no:cacheprovider -rfE ${GPU_TESTS:-tests/quant/test_gpu_recipes.py tests/quant/test_gpu.py} \
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
  [ "${GPU_TESTS:-}" = none ] && exit 0
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
  if [ -n "${GPU_TESTS:-}" ] && [ ! -f "$LOGS/gpu_tests.started" ]; then
    # GPU tests beside the sweep, on the first GPU: each ';'-separated group of pytest arguments in its own process
    # (compilation is CPU-bound and the node has cores to spare) and its own session (setsid), so that they outlive
    # this call; a later call finds their output in $LOGS and does not start them again
    touch "$LOGS/gpu_tests.started"
    i=0; IFS=';' read -ra groups <<< "$GPU_TESTS"
    for group in "${groups[@]}"; do
      i=$((i + 1))
      stamp "GPU tests beside the sweep on GPU 0, group $i: $group"
      CUDA_VISIBLE_DEVICES=0 setsid bash -c 'echo "# pytest $2" > "$3"; timeout -k 10 "$0" "$1" -m pytest -q \
          -p no:cacheprovider -rfE --tb=short --durations=5 $2 >> "$3" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$3"' \
          "${TESTS_TIMEOUT:-1100}" "$PY" "$group" "$LOGS/gpu_tests.$i.txt" < /dev/null > /dev/null 2>&1 &
    done
  fi
  ls "$QUARTET_CACHE"/data/pycode-*/manifest.json >/dev/null 2>&1 || prepare_data
  t_call=$(date +%s)
  sweep_in_background recipes "${RECIPES_WAIT:-540}"
  # then the tests, within the same wait: a group is done when its file ends with the "exit" line
  while ls "$LOGS"/gpu_tests.*.txt >/dev/null 2>&1 && [ $(( $(date +%s) - t_call )) -lt "${RECIPES_WAIT:-540}" ]; do
    pending=0; for f in "$LOGS"/gpu_tests.*.txt; do tail -1 "$f" | grep -q '^exit ' || pending=$((pending + 1)); done
    [ "$pending" -eq 0 ] && break
    sleep 10
  done
  cp "$LOGS"/sweep.log "$OUT/" 2>/dev/null
  grep -v "━" "$LOGS/sweep.log" | tail -8
  if ls "$LOGS"/gpu_tests.*.txt >/dev/null 2>&1; then
    cat "$LOGS"/gpu_tests.*.txt > "$OUT/gpu_tests.txt"
    for f in "$LOGS"/gpu_tests.*.txt; do stamp "GPU tests $(head -1 "$f" | cut -c3-90): $(grep -E ' in [0-9.]+s' "$f" | tail -1 | cut -c1-100) $(tail -1 "$f")"; done
    grep -hE '^(FAILED|ERROR)' "$LOGS"/gpu_tests.*.txt | cut -c1-300
  fi
  "$PY" -m quartet.cli status recipes --runs-dir "$RUNS" > "$OUT/status.txt" 2>&1
  tail -3 "$OUT/status.txt"
  collect
  stamp "done"
  exit 0
fi
if [ "$mode" = speed ]; then
  # One background job (setsid: it outlives this call; a second call on the same machine waits for it), its stages
  # (SPEED_STAGES, default tests,check,kernels,speed7m,speed200m) in order, everything into $LOGS/speed:
  #   tests      GPU_TESTS groups (';'-separated) side by side while the corpus builds; with SPEED_GATE=1 a failed
  #              test stops the job there (the speeds of a wrong layer are not worth timing)
  #   check      sweeps/recipes_check.yaml (the fused paths re-trained at the recipe table's 7.1M D/N 5 cell, three
  #              seeds; CHECK_WORKERS runs at once) beside the tests, once the corpus is ready; the speed stages
  #              wait for it so that they time alone
  #   kernels    benchmarks/recipe_kernels.py at llama_200m: quantizer calls vs the copy floor, layers vs BF16
  #   speed200m  benchmarks/ladder_speed.py at llama_200m: every recipe, CUDA graphs, micro-batch 64, all at once
  #   speed7m    the same at llama_7m (+ SPEED_BASELINES, "" for none: the compiled path of two recipes, the "before")
  # Each call waits up to SPEED_WAIT s, then packs what is done into $OUT/speed.tar.gz (+ speed.log).
  D=$LOGS/speed
  mkdir -p "$D"
  if [ -f "$D/job.pid" ] && kill -0 "$(cat "$D/job.pid")" 2>/dev/null; then
    stamp "the speed job is running (pid $(cat "$D/job.pid")); waiting"
  elif [ ! -f "$D/job.done" ]; then
    recipes=bf16:graphs,fp8:graphs,mxfp8:graphs,fp8_deepseek:graphs,nvfp4:graphs,nvfp4_recipe:graphs,quartet:graphs
    recipes=$recipes,quartet_sr:graphs,quartet2:graphs,ms_fp4:graphs,luq_int4:graphs
    export D PY recipes GPU_TESTS="${GPU_TESTS:-tests/kernels/test_recipe_quant.py tests/kernels/test_recipe_linear.py \
tests/kernels/test_fp8_block_linear.py tests/kernels/test_wiring.py;tests/quant/test_gpu_recipes.py -k 'block_linear or \
trains';tests/kernels/test_fp8_linear.py tests/kernels/test_kernel_quantizers.py tests/quant/test_gpu.py}"
    export SPEED_STAGES=${SPEED_STAGES:-tests,check,kernels,speed7m,speed200m} SPEED_GATE=${SPEED_GATE:-0}
    export CHECK_WORKERS=${CHECK_WORKERS:-7}
    export SPEED_BASELINES=${SPEED_BASELINES-nvfp4@compiled:graphs,mxfp8@compiled:graphs}
    stamp "speed job: $SPEED_STAGES"
    cat > "$D/job.sh" <<'JOB'
echo $$ > "$D/job.pid"
st() { echo "== $(date -u +%H:%M:%S) $*" >> "$D/job.log"; }
has() { case ",$SPEED_STAGES," in *",$1,"*) return 0;; esac; return 1; }
( "$PY" -m quartet.cli data prepare data=pycode > "$D/data_prepare.log" 2>&1; echo "exit $?" >> "$D/data_prepare.log" ) &
data_pid=$!
if has check; then
  # the check's runs need the corpus: wait for its "exit" line (the data job is not this subshell's child)
  ( until grep -q '^exit' "$D/data_prepare.log" 2>/dev/null; do sleep 5; done
    echo "== $(date -u +%H:%M:%S) check: quartet sweep recipes_check" >> "$D/job.log"
    "$PY" -m quartet.cli sweep recipes_check --cluster local_gpu --runs-dir "$D/runs" \
      cluster.workers_per_gpu="$CHECK_WORKERS" > "$D/check.log" 2>&1
    echo "exit $?" >> "$D/check.log"
    "$PY" -m quartet.cli status recipes_check --runs-dir "$D/runs" > "$D/check_status.txt" 2>&1
    echo "== $(date -u +%H:%M:%S) check $(tail -1 "$D/check.log")" >> "$D/job.log" ) &
  check_pid=$!
fi
if has tests; then
  i=0; IFS=";" read -ra groups <<< "$GPU_TESTS"; pids=""
  for g in "${groups[@]}"; do
    i=$((i + 1)); st "tests $i: $g"
    ( echo "# pytest $g" > "$D/gpu_tests.$i.txt"
      eval "timeout -k 10 ${TESTS_TIMEOUT:-900} \"\$PY\" -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=5 $g" \
        >> "$D/gpu_tests.$i.txt" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$D/gpu_tests.$i.txt" ) &
    pids="$pids $!"
  done
  wait $pids; st "tests done"
  if [ "$SPEED_GATE" = 1 ] && grep -qhE "^(FAILED|ERROR)" "$D"/gpu_tests.*.txt; then
    st "a GPU test failed: the job stops here (SPEED_GATE=1)"; touch "$D/job.done"; exit 0
  fi
fi
if has check; then wait $check_pid; fi
if has kernels; then
  st "kernels"; "$PY" benchmarks/recipe_kernels.py --out "$D/kernels_200m.json" > "$D/kernels.log" 2>&1; st "kernels exit $?"
fi
wait $data_pid; st "corpus: $(tail -1 "$D/data_prepare.log")"
if has speed200m; then
  st "speed 200m"
  "$PY" benchmarks/ladder_speed.py --models llama_200m --configs "$recipes" --split 6 --micro-batch 64 --concurrent "${SPEED_CONCURRENT:-auto}" \
    --out "$D/speed_200m.json" > "$D/speed200m.log" 2>&1
  st "speed 200m exit $?"
fi
if has speed7m; then
  st "speed 7m"
  "$PY" benchmarks/ladder_speed.py --models llama_7m --configs "$recipes${SPEED_BASELINES:+,$SPEED_BASELINES}" --split 4 \
    --out "$D/recipe_speed.json" > "$D/speed7m.log" 2>&1
  st "speed 7m exit $?"
fi
touch "$D/job.done"; st "job done"
JOB
    setsid bash "$D/job.sh" < /dev/null > "$D/job.out" 2>&1 &
    for _ in $(seq 50); do [ -s "$D/job.pid" ] && break; sleep 0.1; done
  fi
  t0=$(date +%s)
  while [ ! -f "$D/job.done" ] && [ $(( $(date +%s) - t0 )) -lt "${SPEED_WAIT:-540}" ]; do
    sleep 10
    if [ -f "$D/job.pid" ] && ! kill -0 "$(cat "$D/job.pid")" 2>/dev/null && [ ! -f "$D/job.done" ]; then
      stamp "the speed job died"; break
    fi
  done
  cat "$D/job.log" 2>/dev/null
  for f in "$D"/gpu_tests.*.txt; do [ -f "$f" ] && stamp "$(head -1 "$f" | cut -c3-100): $(grep -E ' in [0-9.]+s' "$f" | tail -1 | cut -c1-120) $(tail -1 "$f")"; done
  grep -hE "^(FAILED|ERROR)" "$D"/gpu_tests.*.txt 2>/dev/null | cut -c1-300 | head -40
  for f in "$D"/speed7m.log "$D"/speed200m.log; do [ -f "$f" ] && grep -v "^{" "$f" | tail -16; done
  [ -f "$D/check.log" ] && { grep -v "━" "$D/check.log" | tail -4; tail -3 "$D/check_status.txt" 2>/dev/null; }
  (cd "$D" && tar czf "$OUT/speed.tar.gz" --exclude=job.pid --exclude=ckpt --exclude=wandb --exclude='*.pt' .)
  cp "$D/job.log" "$OUT/speed.log" 2>/dev/null
  exit 0
fi
if [ "$mode" = runs ]; then
  # One background job (setsid), everything into $LOGS/runs:
  #   the corpus, beside GPU_TESTS (';'-separated groups, one GPU each: group i on GPU i-1 mod the GPU count); a
  #   failed test stops the job there (runs on a wrong layer are not worth training); then every sweep of
  #   RUNS_SWEEPS (';'-separated `NAME [--only KEY=V,...] [overrides]`) at once, each a local GPU pool over every
  #   GPU (RUNS_WORKERS runs per GPU each). RECIPES_RESTORE: ','-separated run archives extracted into the runs
  #   root first (an archive's top folder is its sweep group; RESTORE_AS=FROM:TO renames one group, e.g.
  #   recipes_check:recipes). Each call waits up to RUNS_WAIT s, then packs every group's small files into
  #   $OUT/<group>.tar.gz and the logs into $OUT/runs_logs.tar.gz. A call that names RUNS_SWEEPS (or GPU_TESTS)
  #   other than a finished job's starts a new job on the same runs root (the next stage in the same lease); a call
  #   without them only waits for, or reports, the last one.
  D=$LOGS/runs
  R=$D/runs
  mkdir -p "$D" "$R"
  spec="sweeps: ${RUNS_SWEEPS:-} | tests: ${GPU_TESTS:-}"
  if [ -f "$D/job.done" ] && [ -n "${RUNS_SWEEPS:-}${GPU_TESTS:-}" ] && [ "$spec" != "$(cat "$D/job.spec" 2>/dev/null)" ]; then
    stamp "the last job ($(cat "$D/job.spec" 2>/dev/null)) is done: a new job"
    mkdir -p "$D/earlier" && for f in "$D"/job.* "$D"/gpu_tests.* "$D"/sweep.*; do [ -f "$f" ] && mv "$f" "$D/earlier/"; done
  fi
  if [ -f "$D/job.pid" ] && kill -0 "$(cat "$D/job.pid")" 2>/dev/null; then
    stamp "the runs job is running (pid $(cat "$D/job.pid")); waiting"
  elif [ ! -f "$D/job.done" ]; then
    IFS=',' read -ra archives <<< "${RECIPES_RESTORE:-}"
    for a in "${archives[@]}"; do [ -f "$a" ] && tar xzf "$a" -C "$R" && stamp "restored $a"; done
    if [ -n "${RESTORE_AS:-}" ] && [ -d "$R/${RESTORE_AS%%:*}" ]; then
      mkdir -p "$R/${RESTORE_AS#*:}" && mv "$R/${RESTORE_AS%%:*}"/llama* "$R/${RESTORE_AS#*:}/" \
        && stamp "moved the runs of ${RESTORE_AS%%:*} into ${RESTORE_AS#*:}"
    fi
    # a restored run without a summary has no checkpoint here (archives hold none): it starts again; runs trained in
    # this lease keep their checkpoints and resume
    [ -n "${RECIPES_RESTORE:-}" ] && for d in "$R"/*/*/; do [ -f "$d/summary.json" ] || [ -d "$d/ckpt" ] || rm -rf "$d"; done
    export D R PY RUNS_SWEEPS RUNS_WORKERS=${RUNS_WORKERS:-4} GPU_TESTS="${GPU_TESTS:-tests/kernels/test_recipe_linear.py;tests/quant/test_gpu_recipes.py \
-k 'block_linear or trains';tests/kernels/test_fp8_block_linear.py tests/kernels/test_auto_backend.py tests/kernels/test_wiring.py}"
    echo "$spec" > "$D/job.spec"
    stamp "runs job: tests, then: $RUNS_SWEEPS"
    cat > "$D/job.sh" <<'JOB'
echo $$ > "$D/job.pid"
st() { echo "== $(date -u +%H:%M:%S) $*" >> "$D/job.log"; }
ngpu=$(nvidia-smi -L | wc -l)
( "$PY" -m quartet.cli data prepare data=pycode > "$D/data_prepare.log" 2>&1; echo "exit $?" >> "$D/data_prepare.log" ) &
data_pid=$!
i=0; IFS=";" read -ra groups <<< "$GPU_TESTS"; pids=""
for g in "${groups[@]}"; do
  [ -n "${g// /}" ] || continue
  i=$((i + 1)); st "tests $i on GPU $(( (i - 1) % ngpu )): $g"
  ( echo "# pytest $g" > "$D/gpu_tests.$i.txt"
    eval "CUDA_VISIBLE_DEVICES=$(( (i - 1) % ngpu )) timeout -k 10 ${TESTS_TIMEOUT:-900} \"\$PY\" -m pytest -q -p no:cacheprovider \
      -rfE --tb=short --durations=5 $g" >> "$D/gpu_tests.$i.txt" 2>&1; echo "exit $? at $(date -u +%H:%M:%S)" >> "$D/gpu_tests.$i.txt" ) &
  pids="$pids $!"
done
[ -n "$pids" ] && wait $pids  # (a bare wait would wait for the corpus too)
st "tests done"
if grep -qhE "^(FAILED|ERROR)" "$D"/gpu_tests.*.txt 2>/dev/null || grep -qh "^exit [1-9]" "$D"/gpu_tests.*.txt 2>/dev/null; then
  st "a GPU test failed: no runs (the job stops here)"; touch "$D/job.done"; exit 0
fi
wait $data_pid; st "corpus: $(tail -1 "$D/data_prepare.log")"
j=0; IFS=";" read -ra sweeps <<< "$RUNS_SWEEPS"; pids=""
for sw in "${sweeps[@]}"; do
  [ -n "${sw// /}" ] || continue
  j=$((j + 1)); st "sweep $j: quartet sweep $sw"
  ( eval "\"\$PY\" -m quartet.cli sweep $sw --cluster local_gpu --runs-dir \"\$R\" cluster.workers_per_gpu=$RUNS_WORKERS" \
      > "$D/sweep.$j.log" 2>&1; echo "exit $?" >> "$D/sweep.$j.log"; st "sweep $j $(tail -1 "$D/sweep.$j.log")" ) &
  pids="$pids $!"
done
wait $pids
touch "$D/job.done"; st "job done"
JOB
    setsid bash "$D/job.sh" < /dev/null > "$D/job.out" 2>&1 &
    for _ in $(seq 50); do [ -s "$D/job.pid" ] && break; sleep 0.1; done
  fi
  t0=$(date +%s)
  while [ ! -f "$D/job.done" ] && [ $(( $(date +%s) - t0 )) -lt "${RUNS_WAIT:-540}" ]; do
    sleep 15
    [ $(( ($(date +%s) - t0) % 120 )) -lt 15 ] && stamp "$(find "$R" -name summary.json | wc -l) runs finished"
    if [ -f "$D/job.pid" ] && ! kill -0 "$(cat "$D/job.pid")" 2>/dev/null && [ ! -f "$D/job.done" ]; then
      stamp "the runs job died"; break
    fi
  done
  cat "$D/job.log" 2>/dev/null
  for f in "$D"/gpu_tests.*.txt; do [ -f "$f" ] && stamp "$(head -1 "$f" | cut -c3-100): $(grep -E ' in [0-9.]+s' "$f" | tail -1 | cut -c1-120) $(tail -1 "$f")"; done
  grep -hE "^(FAILED|ERROR)" "$D"/gpu_tests.*.txt 2>/dev/null | cut -c1-300 | head -40
  for f in "$D"/sweep.*.log; do [ -f "$f" ] && grep -v "━" "$f" | grep -vE "^\s*$" | tail -3; done
  stamp "$(find "$R" -name summary.json | wc -l) runs finished in all; $(find "$R" -name error.txt | wc -l) with error.txt"
  for g in "$R"/*/; do
    [ -d "$g" ] || continue
    (cd "$R" && find "$(basename "$g")" -path '*/ckpt' -prune -o -path '*/wandb' -prune -o -type f \( -name '*.json' \
        -o -name '*.jsonl' -o -name '*.yaml' -o -name '*.log' -o -name 'error.txt' \) -print | tar czf "$OUT/$(basename "$g").tar.gz" -T -)
  done
  (cd "$D" && tar czf "$OUT/runs_logs.tar.gz" --exclude=runs --exclude=job.pid .)
  exit 0
fi
echo "unknown mode $mode (probe | sweep | speed | runs)" >&2
exit 2
