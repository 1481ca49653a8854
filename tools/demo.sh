#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs oomb's demo: examples/quickstart, a CPU program that fills a paged KV cache for a
# long context with the far tier on the host and streams pages through a small near tier, printing
# what each tier holds and how many bytes moved. Arguments are passed to the program.
# Usage: bash tools/demo.sh [quickstart arguments...]   (build folder: OOMB_DEMO_DIR, default build-demo)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
dir=${OOMB_DEMO_DIR:-build-demo}
[ -f examples/quickstart/CMakeLists.txt ] || {
  echo "demo: examples/quickstart is not in this checkout yet" >&2
  exit 1
}
command -v ninja >/dev/null || { echo "demo: ninja is missing: run 'bash tools/setup.sh'" >&2; exit 1; }
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOOMB_ENABLE_CUDA=OFF \
  -DOOMB_BUILD_TESTS=OFF -DOOMB_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target quickstart -j "${OOMB_JOBS:-2}"
exe=$(find "$dir" -type f -name quickstart -perm -u+x | head -n 1)
[ -n "$exe" ] || { echo "demo: the build made no quickstart program" >&2; exit 1; }
echo "demo: $exe $*"
exec "$exe" "$@"
