#!/usr/bin/env bash
# Copies what bench/sparse_accuracy/run_gpu.sh needs into an ignored folder that the GPU call
# carries (oomb-train as built with CUDA, the scripts, the model config, the commit):
#   bash bench/sparse_accuracy/stage.sh BUILD_DIR [DIR]      (DIR: .gpu/sparse-accuracy)
# then on the GPU machine: bash .gpu/sparse-accuracy/run_gpu.sh
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: stage.sh BUILD_DIR [DIR]" >&2; exit 2; }
build=$1
dir=${2:-.gpu/sparse-accuracy}
bin=$build/examples/trainer/oomb-train
[ -x "$bin" ] || { echo "stage.sh: no $bin (ninja -C $build oomb-train)" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/configs"
cp -f "$bin" "$here/run_gpu.sh" "$here/compare.py" "$dir/"
cp -f "$here/../../configs/tiny-d64.json" "$dir/configs/"
# The commit the binary was built from: its build folder's source tree, which may be another checkout.
source_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
git -C "${source_dir:-$here}" describe --always --dirty --abbrev=12 > "$dir/COMMIT"
echo "staged $(cat "$dir/COMMIT") in $dir ($(du -sh "$dir" | cut -f1))"
