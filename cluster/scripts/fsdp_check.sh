#!/usr/bin/env bash
# FSDP2 and DDP on a 2-GPU machine (NCCL), one call of under 9 minutes: cluster/scripts/fsdp_check.py (its docstring
# says what it measures and checks) on a bare node whose python3 has torch + triton but not hydra/omegaconf.
#
#   here, with network:   bash cluster/scripts/ladder_device.sh wheels     # -> .whl/ (git-ignored): carry it along
#   there:                bash cluster/scripts/fsdp_check.sh [fsdp_check.py options, e.g. --budget 420]
#
# Results: $OUT (default .cache/fsdp_check): fsdp_check.json, logs/<run>.log, runs/<run>/ (metrics, summaries;
# checkpoints removed). The table printed last is the summary; exit status 1 when a check fails.
# QUARTET_GIT_COMMIT=<commit> records the commit where the copy's git HEAD is stale.
set -uo pipefail
cd "$(dirname "$0")/../.."
. cluster/scripts/device_env.sh
device_env fsdp_check
device_wheels || exit 2
# NVLink multicast off (the GPU machine requires it); the script sets both for every run too
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 WANDB_MODE=${WANDB_MODE:-offline}
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
# the script keeps to its --budget (480 s by default); this only guards against a hang
timeout -k 10 "${FSDP_CHECK_HARD_S:-520}" "$PY" cluster/scripts/fsdp_check.py --device cuda --out "$OUT" "$@"
