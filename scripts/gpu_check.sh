#!/usr/bin/env bash
# Issue 7's CUDA checks in a few minutes, no model weights needed:
#   1. tests/test_cuda.py: every method through each engine on CUDA, fp32 token-identical to CPU greedy;
#      fp16 match rate and first divergence printed;
#   2. the cost curve of random Llamas of Vicuna-7B and 13B shapes in fp16: hf, static eager, and static with
#      compiled steps and CUDA graphs (engine.compile=true engine.compile_mode=reduce-overhead);
#   3. the TR speedups those curves imply: the paper tree at the MAT measured on the CPU (--mat), and
#      tree=auto's choice from the acceptance table a CPU tree=auto run cached (carry data/cache/autotree).
# Usage: scripts/gpu_check.sh [OUT] [MAT]   (PY=python3 by default: the machine's own CUDA torch)
set -euo pipefail
PY=${PY:-python3}
OUT=${1:-results/gpu}
MAT=${2:-2.41}
ACCEPT=$(ls data/cache/autotree/*.json 2>/dev/null | head -1 || true)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -m pytest -q -s tests/test_cuda.py 2>&1 | tee "$OUT/tests.log"
for shape in vicuna-7b vicuna-13b; do
  for engine in hf static static-compiled; do
    set_engine="engine=${engine%-compiled}"
    [[ $engine == *-compiled ]] && set_engine="$set_engine engine.compile=true engine.compile_mode=reduce-overhead"
    $PY -m scripts.profile_cost --shape "$shape" --set model.device=cuda model.dtype=float16 $set_engine \
      --tokens 1,2,4,8,16,32,48,64,81,128 --contexts 512 --repeats 10 --mat "$MAT" \
      ${ACCEPT:+--accept "$ACCEPT"} --out "$OUT/cost-$shape-$engine" 2>&1 | tee -a "$OUT/cost.log"
  done
done
