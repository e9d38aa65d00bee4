#!/usr/bin/env bash
# Issue #16, round 4: the fair GPU benchmark in ONE device call (about 7 minutes on an H100).
#
# On a bare GPU node whose python3 has torch + triton (nothing else is needed: the bench imports no hydra),
# from the repository root:
#
#   QUARTET_GIT_COMMIT=<commit> OUT=/some/dir bash benchmarks/bench_round4.sh   # $OUT defaults to .cache/bench_round4
#
# (the device copy has no .git: pass the commit, `git rev-parse HEAD` run here, so the JSON records it)
#
# It runs `python3 -m quartet.kernels.bench all` (PYTHONPATH = the checkout): the 1 GiB copy and BF16 GEMM
# ceilings, the quantizers, the linear layer (bf16 / quartet / quartet_sr, eager and CUDA-graphed, at the three
# shapes), then training steps of the ladder sizes (and 800m) while the time budget lasts — a step model or a
# compile that would not fit is skipped and recorded as such. The JSON is rewritten after every section and every
# step model, so a run cut short keeps what it measured. Outputs in $OUT: bench_round4.json, bench.log,
# nvidia-smi.txt, env.txt. The short table comes last.
#
# Knobs (environment): BUDGET_S (seconds the bench may start new step work, default 370), HARD_S (hard stop of the
# python process, default 440), STEP_MODELS (default 20m,7m,3m,1m,800m: the largest ladder size first), STEP_MODES (default eager,compile,graph),
# PY (default python3), QUARTET_GIT_COMMIT (recorded when the copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
. cluster/scripts/device_env.sh
device_env bench_round4
# a commit for the record when the device copy carries no .git
if [ -z "${QUARTET_GIT_COMMIT:-}" ] && [ -f .git_commit ]; then export QUARTET_GIT_COMMIT=$(cat .git_commit); fi

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,driver_version --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
  nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# the card's state across the run, every 5 s (read-only queries; nothing about the card is changed)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu \
  --format=csv -l 5 > "$OUT/nvidia-smi.txt" 2>&1 &
smi_pid=$!

timeout -s INT -k 20 "${HARD_S:-440}" "$PY" -m quartet.kernels.bench all --out "$OUT/bench_round4.json" \
  --budget-s "${BUDGET_S:-370}" --models "${STEP_MODELS:-20m,7m,3m,1m,800m}" --modes "${STEP_MODES:-eager,compile,graph}" \
  > "$OUT/bench.log" 2>&1
rc=$?
kill "$smi_pid" 2>/dev/null
grep -v "^ \{4\}" "$OUT/bench.log" | tail -n 60 | head -n 40   # the progress lines (profiles left in the log)
echo "== bench exit code $rc (124/130: stopped by the hard limit; the JSON holds what finished)"
# the short table, from the JSON (also after a hard stop)
"$PY" - "$OUT/bench_round4.json" <<'PYEOF'
import json, sys
from quartet.kernels.bench import check_result, summary_table
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no JSON: {exc}")
for p in check_result(r):
    print("problem:", p)
print(summary_table(r))
PYEOF
