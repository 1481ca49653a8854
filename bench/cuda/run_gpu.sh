#!/usr/bin/env bash
# One call on the GPU machine: the gpu tests, the same tests under compute-sanitizer memcheck (quick
# sizes), and the page-transfer benchmark; logs to $OUT (or ./out), a short summary last.
#   bench/cuda/run_gpu.sh [DIR]   DIR holds test_cuda, page_transfer_bench (default .gpu/cuda)
# Prepare DIR here:  bench/cuda/stage_gpu.sh  (copies the built binaries and libcudart into it)
set -uo pipefail
dir=${1:-.gpu/cuda}
out=${OUT:-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

timeout 200 "$dir/test_cuda" 2>&1 | tee "$out/test_cuda.log" | tail -25
rc_test=${PIPESTATUS[0]}

export OOMB_CUBLAS=${OOMB_CUBLAS:-$(ls /usr/local/cuda*/lib64/libcublas.so.13 \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcublas.so.13 \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib/libcublas.so.13 2>/dev/null | head -1)}
timeout 240 "$dir/page_transfer_bench" --out "$out/bench.md" 2>&1 | tee "$out/bench.log" | tail -60
rc_bench=${PIPESTATUS[0]}

OOMB_GPU_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck --leak-check no --report-api-errors no --error-exitcode 9 \
  "$dir/test_cuda" >"$out/memcheck.log" 2>&1
rc_memcheck=$?
tail -8 "$out/memcheck.log"

echo "== summary: test_cuda rc=$rc_test  memcheck rc=$rc_memcheck  bench rc=$rc_bench"
grep -E "test cases|assertions" "$out/test_cuda.log" | tail -2
grep -E "ERROR SUMMARY|test cases" "$out/memcheck.log" | tail -2
