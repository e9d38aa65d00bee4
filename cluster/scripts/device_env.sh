# Shared set-up of the scripts that run on a bare GPU node (cluster/scripts/ladder_device.sh).
# Source it from the repository root, then:
#   device_env NAME   OUT (default .cache/NAME, created), PY (default python3), the checkout on PYTHONPATH, unbuffered
#                     output, an inductor cache outside the checkout (TORCHINDUCTOR_CACHE_DIR, if not set)
#   stamp MSG         a progress line with the UTC time ("== 12:34:56 MSG")
#   device_wheels     hydra-core / omegaconf / submitit installed from .whl/ into /tmp/quartet_site when PY lacks them
#                     (made with `bash cluster/scripts/ladder_device.sh wheels` where there is network); returns 2
#                     when it cannot
device_env() {
  OUT=${OUT:-$PWD/.cache/$1}
  mkdir -p "$OUT"
  PY=${PY:-python3}
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/quartet_inductor}
}

device_wheels() {
  "${PY:-python3}" -c "import hydra, omegaconf, submitit" 2>/dev/null && return 0
  [ -d .whl ] || { echo "python lacks hydra/omegaconf/submitit and there is no .whl/ (ladder_device.sh wheels)" >&2; return 2; }
  "${PY:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/quartet_site .whl/*.whl || return 2
  export PYTHONPATH="/tmp/quartet_site${PYTHONPATH:+:$PYTHONPATH}"
}

stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

# sweep_in_background SWEEP WAIT_S: `quartet sweep SWEEP --cluster local_gpu --runs-dir $RUNS $SWEEP_ARGS` in its own
# session (setsid), so it outlives the command that started it; a later call on the same machine finds it running
# (pid in $LOGS/sweep.pid) and only waits. Waits up to WAIT_S seconds, with a progress line a minute; the log is
# $LOGS/sweep.log. Needs PY, RUNS, LOGS; prepare the data before the first call.
sweep_in_background() {
  local sweep=$1 wait_s=$2 t0 pid
  t0=$(date +%s)
  if [ -f "$LOGS/sweep.pid" ] && kill -0 "$(cat "$LOGS/sweep.pid")" 2>/dev/null; then
    stamp "the sweep is already running (pid $(cat "$LOGS/sweep.pid")); waiting for it"
  else
    stamp "sweep: quartet sweep $sweep --cluster local_gpu ${SWEEP_ARGS:-}"
    date +%s > "$LOGS/sweep.start"
    rm -f "$LOGS/sweep.pid"
    # the session leader writes its own pid (setsid may fork), then becomes the launcher
    setsid bash -c 'echo $$ > "$0"; exec "$@"' "$LOGS/sweep.pid" "$PY" -m quartet.cli sweep "$sweep" \
      --cluster local_gpu --runs-dir "$RUNS" ${SWEEP_ARGS:-} > "$LOGS/sweep.log" 2>&1 < /dev/null &
    for _ in $(seq 50); do [ -s "$LOGS/sweep.pid" ] && break; sleep 0.1; done
  fi
  pid=$(cat "$LOGS/sweep.pid")
  while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do
    sleep 15
    [ $(( ($(date +%s) - t0) % 60 )) -lt 15 ] && stamp "$(find "$RUNS/$sweep" -name summary.json 2>/dev/null | wc -l) runs \
finished, sweep running for $(( $(date +%s) - $(cat "$LOGS/sweep.start") )) s"
  done
  if kill -0 "$pid" 2>/dev/null; then
    stamp "sweep still running after $(( $(date +%s) - $(cat "$LOGS/sweep.start") )) s (call again to keep waiting)"
  else
    stamp "sweep finished after $(( $(date +%s) - $(cat "$LOGS/sweep.start") )) s"
  fi
}
