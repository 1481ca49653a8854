#!/usr/bin/env bash
# One call on the GPU machine for the trainer's CUDA ops: the gpu tests, the fused LM head
# benchmark beside PyTorch's plain head, the layer ops' benchmark, then compute-sanitizer memcheck
# over the tests. Logs and
# raw JSON lines go to $OUT. Run from the repository root with the binaries built here (targets
# test_trainer_cuda, bench_lm_head, bench_layer_ops) copied to $BIN:
#   BIN=.gpu/h4 bash bench/trainer_ops/run_gpu.sh [all|tests|bench|layer|torch|memcheck]...
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
BIN=${BIN:-.gpu/h4}
OUT=${OUT:-/tmp/trainer-ops-out}
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # cuBLASLt is not carried
mkdir -p "$OUT"
steps=${*:-all}
has() { [[ " $steps " == *" all "* || " $steps " == *" $1 "* ]]; }
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
ldd "$BIN/test_trainer_cuda" | grep -E "cublas|cudart|not found" | tee -a "$OUT/gpu.txt"
if has tests; then
  timeout 150 "$BIN/test_trainer_cuda" 2>&1 | tee "$OUT/tests.log"
  summary+=("tests rc=$?")
fi
if has bench; then
  timeout 150 "$BIN/bench_lm_head" 10 2>&1 | tee "$OUT/bench_lm_head.jsonl"
  summary+=("bench rc=$?")
fi
if has layer; then
  timeout 150 "$BIN/bench_layer_ops" 2>&1 | tee "$OUT/bench_layer_ops.jsonl"
  summary+=("layer rc=$?")
fi
if has torch; then
  timeout 120 "$PY" bench/trainer_ops/torch_baseline.py 10 2>&1 | tee "$OUT/torch_baseline.jsonl"
  summary+=("torch rc=$?")
fi
if has memcheck; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/test_trainer_cuda" 2>&1 | tail -40 | tee "$OUT/memcheck.log"
  summary+=("memcheck rc=$?")
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
