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
