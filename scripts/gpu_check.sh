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
# The vLLM arm (engine=vllm: vLLM's engine beside ours, token for token) where this machine's Python has vLLM: the
# lent machine reaches no package registry to install it from, so elsewhere this says so and goes on.
if "$PY" -c "import vllm" 2>/dev/null; then
	timeout 150 "$PY" -m scripts.bench_methods "method=vanilla" "method=pld" "method=vanilla engine=vllm" \
		"method=pld engine=vllm" --bench spec_bench_smoke --set bench.max_new_tokens=64 --warmup 1 \
		--out "$DEST/vllm" 2>&1 | grep -v "^INFO\|^WARNING\|^(" | tail -30 | tee "$DEST/vllm.log"
else
	echo "vLLM arm: not run: $PY has no vllm on this machine, which reaches no package registry to install it from" \
		| tee "$DEST/vllm.log"
fi
