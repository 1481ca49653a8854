#!/usr/bin/env bash
# Copies what bench/trainer/run_gpu.sh needs into an ignored folder that the GPU call carries (the
# executable, the scripts, the PyTorch competitor from ../shared, which does not travel, the model
# configs and the commit they were built from):
#   bash bench/trainer/stage.sh BUILD_DIR [DIR]      (DIR: .gpu/trainer-bench)
# then on the GPU machine: bash .gpu/trainer-bench/run_gpu.sh 0.5b 32768 65536
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: stage.sh BUILD_DIR [DIR]" >&2; exit 2; }
build=$1
dir=${2:-.gpu/trainer-bench}
competitor=${COMPETITOR:-../shared/tools/strong_baseline.py}
[ -x "$build/bench/trainer/bench_trainer" ] || { echo "stage.sh: no $build/bench/trainer/bench_trainer (ninja -C $build bench_trainer)" >&2; exit 1; }
[ -f "$competitor" ] || { echo "stage.sh: no competitor at $competitor (set COMPETITOR)" >&2; exit 1; }
mkdir -p "$dir/configs"
cp -f "$build/bench/trainer/bench_trainer" bench/trainer/run_gpu.sh bench/trainer/table.py bench/trainer/split.sh \
      bench/trainer/split.py "$competitor" "$dir/"
cp configs/qwen2.5-0.5b.json configs/qwen2.5-7b.json "$dir/configs/"
git describe --always --dirty --abbrev=12 > "$dir/COMMIT"
echo "staged $(cat "$dir/COMMIT") in $dir ($(du -sh "$dir" | cut -f1))"
