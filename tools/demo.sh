#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs oomb's demo (CPU, no GPU needed):
#   bash tools/demo.sh               the trainer's demo (examples/trainer/demo.sh): kv-recall learnt
#                                    on short sequences, then 32,768-token steps with chunk-recurrent
#                                    training, page-sparse attention and offload (~4 minutes on 2 cores)
#   bash tools/demo.sh quickstart [args...]
#                                    examples/quickstart: a 1M-token paged KV cache streamed through a
#                                    small near tier, bytes moved per tier (seconds)
# Build folders: OOMB_DEMO_DIR (default build-demo / build-trainer-demo).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command -v ninja >/dev/null || { echo "demo: ninja is missing: run 'bash tools/setup.sh'" >&2; exit 1; }

if [ "${1:-}" != quickstart ]; then
  exec bash examples/trainer/demo.sh "$@"
fi
shift
dir=${OOMB_DEMO_DIR:-build-demo}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOOMB_ENABLE_CUDA=OFF \
  -DOOMB_BUILD_TESTS=OFF -DOOMB_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target quickstart -j "${OOMB_JOBS:-2}"
exe="$dir/examples/quickstart/quickstart"
[ -x "$exe" ] || { echo "demo: the build made no quickstart program at $exe" >&2; exit 1; }
echo "demo: $exe $*"
exec "$exe" "$@"
