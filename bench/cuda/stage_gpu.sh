#!/usr/bin/env bash
# Copies what bench/cuda/run_gpu.sh needs into an ignored folder that the GPU call carries:
#   bench/cuda/stage_gpu.sh [BUILD_DIR] [DIR]   (defaults: build-cuda, .gpu/cuda)
set -euo pipefail
build=${1:-build-cuda}
dir=${2:-.gpu/cuda}
mkdir -p "$dir"
cp "$build/tests/cuda/test_cuda" "$build/bench/cuda/page_transfer_bench" bench/cuda/run_gpu.sh "$dir/"
cudart=$(ldd "$dir/test_cuda" | awk '/libcudart/ {print $3}')
[ -n "$cudart" ] && cp -L "$cudart" "$dir/"
du -sh "$dir"
