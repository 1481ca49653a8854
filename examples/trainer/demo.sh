#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The trainer's demo: builds oomb-train, learns kv-recall on 128-token sequences (a few seconds),
# then trains on 32,768-token sequences whose records sit up to 32K tokens before their questions:
# chunk-recurrent training, page-sparse attention, K/V and gradient pages streamed through a fixed
# near tier with every page's home in the far tier. Prints one line per step and the memory per tier.
# Usage: bash examples/trainer/demo.sh   (build folder: OOMB_DEMO_DIR, default build-trainer-demo;
# output folder: OOMB_DEMO_OUT, default runs)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
dir=${OOMB_DEMO_DIR:-build-trainer-demo}
out=${OOMB_DEMO_OUT:-runs}
command -v ninja >/dev/null || { echo "demo: ninja is missing: run 'bash tools/setup.sh'" >&2; exit 1; }
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOOMB_ENABLE_CUDA=OFF \
  -DOOMB_BUILD_TESTS=OFF -DOOMB_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target oomb-train -j "${OOMB_JOBS:-2}"
exe="$dir/examples/trainer/oomb-train"
rm -rf "$out/short" "$out/long"

echo "== 1. kv-recall on 128-token sequences (chunks of 16): every 50th step"
"$exe" --config configs/tiny.json --synthetic kv-recall --seq-len 128 --chunk 16 --page 16 \
  --steps 400 --warmup 20 --lr 3e-3 --out "$out/short" | awk 'NR <= 3 || /^step/ && ++n % 50 == 0'

echo "== 2. 32K tokens per step, sparse attention, offload"
"$exe" --config configs/tiny.json --synthetic kv-recall --seq-len 32768 --chunk 128 --page 16 \
  --sparse-budget 4 --sink 8 --local 1 --offload --near-pages 32 --steps 20 --warmup 2 --lr 1e-3 \
  --init "$out/short/checkpoint" --out "$out/long" --quiet
