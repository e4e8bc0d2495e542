#!/usr/bin/env bash
# The prepared CUDA check (scripts/gpu_check.py): keeps to its budget (6 minutes by default; the timeout below is
# the hard stop), and writes gpu_check.log plus a CSV per step to OUT.
#   scripts/gpu_check.sh [OUT] [extra arguments of scripts/gpu_check.py, e.g. --budget 300, --steps cost,batch or --cpu]
# OUT defaults to $OUT (the lent machine's return folder) or results/gpu. PY: the Python with CUDA torch.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEST=${1:-${OUT:-results/gpu}}
shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
PYTHONUNBUFFERED=1 timeout 480 "$PY" -m scripts.gpu_check --out "$DEST" "$@"
