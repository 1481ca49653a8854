#!/usr/bin/env bash
# Copies what bench/pytorch/run_gpu.sh needs into an ignored folder the GPU call carries: the
# package's two libraries (liboomb_c from the installed package, liboomb_cuda from a CUDA build of
# oomb), the C++ trainer's bench_trainer (for the side-by-side), the PyTorch competitor from
# ../shared (which does not travel) and the commit:
#   bash bench/pytorch/stage.sh CUDA_BUILD_DIR [TRAINER_BUILD_DIR] [DIR]      (DIR: .gpu/py)
# The package's Python sources travel with the tree (python/src); the call runs them from there.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: stage.sh CUDA_BUILD_DIR [TRAINER_BUILD_DIR] [DIR]" >&2; exit 2; }
cuda_build=$1
trainer_build=${2:-$1}
dir=${3:-.gpu/py}
venv=${OOMB_VENV:-.venv}
competitor=${COMPETITOR:-../shared/tools/strong_baseline.py}
c_lib=$("$venv/bin/python" -c "import oomb._lib as l; print(l._find('oomb_c', 'OOMB_C_LIBRARY')[0])")
[ -f "$cuda_build/liboomb_cuda.so" ] || { echo "stage.sh: no $cuda_build/liboomb_cuda.so (ninja -C $cuda_build oomb_python_cuda)" >&2; exit 1; }
mkdir -p "$dir"
cp -f "$c_lib" "$cuda_build/liboomb_cuda.so" bench/pytorch/run_gpu.sh bench/pytorch/bench_driver.py \
      bench/pytorch/profile_split.py bench/pytorch/table.py "$competitor" "$dir/"
if [ -x "$trainer_build/bench/trainer/bench_trainer" ]; then
  cp -f "$trainer_build/bench/trainer/bench_trainer" "$dir/"
  # Debian's fmt, which the GPU machine's image may lack; run_gpu.sh puts $dir on LD_LIBRARY_PATH
  fmt=$(ldd "$trainer_build/bench/trainer/bench_trainer" | awk '/libfmt/ {print $3}')
  [ -z "$fmt" ] || cp -fL "$fmt" "$dir/"
else
  echo "stage.sh: no bench_trainer in $trainer_build: the C++ trainer's column stays empty" >&2
fi
git describe --always --dirty --abbrev=12 > "$dir/COMMIT"
echo "staged $(cat "$dir/COMMIT") in $dir ($(du -sh "$dir" | cut -f1))"
