#!/usr/bin/env bash
# DDP check on a 2-GPU machine: the same run with 1 GPU and with 2 GPUs (torchrun, NCCL), then the
# two loss curves and their max difference.
#
#   here (full env):      bash cluster/scripts/ddp_check.sh prepare [--precision quartet] [--amp]
#   on the GPU machine:   bash cluster/scripts/ddp_check.sh run        # needs python3 + torch (+ numpy)
#                         bash cluster/scripts/ddp_check.sh repeat     # 1 GPU twice: the run-to-run spread
#
# `prepare` writes .cache/ddp_check/ (config.yaml, token shards, wheels of omegaconf / antlr4 / PyYAML):
# carry that folder to the GPU machine. Hydra is not needed there: the trainer is built from the
# bundled config.yaml with OmegaConf only. Exit status 1 when the curves differ by more than TOL.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DDP_CHECK_BUNDLE=${DDP_CHECK_BUNDLE:-$PWD/.cache/ddp_check}
BUNDLE=$DDP_CHECK_BUNDLE
mode=${1:-run}; shift || true

if [ "$mode" = prepare ]; then
  PY=${PY:-.venv/bin/python}
  "$PY" cluster/scripts/ddp_check.py prepare "$@"
  mkdir -p "$BUNDLE/wheels"
  # pure-Python wheels (any python3) + PyYAML binaries for the usual CPython versions
  "$PY" -m pip download -q --no-deps -d "$BUNDLE/wheels" omegaconf==2.3.1
  "$PY" -m pip wheel -q --no-deps -w "$BUNDLE/wheels" antlr4-python3-runtime==4.9.3
  for v in 3.10 3.11 3.12 3.13; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --python-version "$v" -d "$BUNDLE/wheels" PyYAML==6.0.3 || echo "no PyYAML wheel for $v"
  done
  du -sh "$BUNDLE"
  exit 0
fi

[ -f "$BUNDLE/config.yaml" ] || { echo "no $BUNDLE: run 'bash cluster/scripts/ddp_check.sh prepare' first and carry $BUNDLE" >&2; exit 2; }
PY=${PY:-python3}
if ! "$PY" -c "import omegaconf, yaml, numpy" 2>/dev/null; then
  echo "installing the bundled wheels into $BUNDLE/site (no network needed)"
  "$PY" -m pip install -q --no-index --find-links "$BUNDLE/wheels" --target "$BUNDLE/site" \
      omegaconf antlr4-python3-runtime PyYAML
  export PYTHONPATH="$BUNDLE/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled OMP_NUM_THREADS=4
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
OUT=${OUT:-$BUNDLE/out}; rm -rf "$OUT"
if [ "$mode" = repeat ]; then
  # the run-to-run spread of one GPU: the floor against which a 1-vs-2-GPU difference is judged
  for i in 1 2; do
    echo "== 1 GPU, run $i"; CUDA_VISIBLE_DEVICES=0 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 \
      cluster/scripts/ddp_check.py train --out "$OUT/1gpu_$i"
  done
  "$PY" cluster/scripts/ddp_check.py compare "$OUT/1gpu_1" "$OUT/1gpu_2" --tol "${TOL:-5e-3}" --labels "run 1,run 2"
  exit $?
fi
[ "$NGPU" -ge 2 ] || { echo "needs 2 GPUs, found $NGPU" >&2; exit 2; }
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
echo "== 1 GPU";  CUDA_VISIBLE_DEVICES=0 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 \
  cluster/scripts/ddp_check.py train --out "$OUT/1gpu"
echo "== 2 GPUs"; CUDA_VISIBLE_DEVICES=0,1 "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
  cluster/scripts/ddp_check.py train --out "$OUT/2gpu"
"$PY" cluster/scripts/ddp_check.py compare "$OUT/1gpu" "$OUT/2gpu" --tol "${TOL:-5e-3}"
