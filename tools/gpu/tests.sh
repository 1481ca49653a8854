#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every ctest labelled `gpu`, built here and run on the GPU machine in one call.
#   bash tools/gpu/tests.sh stage BUILD [DIR]   here: copies each gpu test's executable (and the
#                                               CUDA runtime and CUPTI it links) into DIR (default .gpu/tests)
#                                               with a manifest of its command line
#   bash tools/gpu/tests.sh run [DIR] [REGEX]   there, from the repository root: runs them (REGEX
#                                               filters test names), logs to $OUT (or ./out), then
#                                               one summary line per test; rc 1 if any failed
# Paths inside the repository are written relative to its root, so the manifest works wherever the
# checkout lands. Environment for `run`: OOMB_GPU_TEST_TIMEOUT (seconds per test, default 240),
# OOMB_GPU_SANITIZE=1 also runs each test under compute-sanitizer memcheck with
# OOMB_GPU_TEST_QUICK=1 (the tests' small sizes); API errors are not counted, since tests provoke
# them on purpose (out-of-memory and invalid-device cases).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
cmd=${1:-}
shift || true

stage() {
  local build=${1:?usage: tools/gpu/tests.sh stage BUILD [DIR]} dir=${2:-.gpu/tests}
  build=$(cd "$build" && pwd)
  rm -rf "$dir" && mkdir -p "$dir"
  ctest --test-dir "$build" -L gpu --show-only=json-v1 >"$dir/ctest.json" || return 1
  python3 - "$build" "$root" "$dir" <<'PY' || return 1
import json, os, shutil, sys
build, root, out = sys.argv[1:4]
tests = json.load(open(os.path.join(out, "ctest.json")))["tests"]
lines, unbuilt = [], []
for t in tests:
    if "command" not in t:  # ctest knows the test but its executable was not built
        unbuilt.append(t["name"])
        continue
    exe, *args = t["command"]
    name = t["name"]
    shutil.copy2(exe, os.path.join(out, os.path.basename(exe)))
    # Arguments that point into the checkout become relative to its root.
    rel = [a.replace(root + "/", "") for a in args]
    lines.append("\t".join([name, os.path.basename(exe)] + rel))
open(os.path.join(out, "manifest.tsv"), "w").write("\n".join(lines) + "\n")
print(f"staged {len(lines)} gpu test(s): " + ", ".join(l.split("\t")[0] for l in lines))
if unbuilt:
    print("not built, not staged: " + ", ".join(unbuilt))
PY
  rm -f "$dir/ctest.json"
  # The small libraries they link that the GPU machine lacks (the CUDA runtime, CUPTI, Debian's
  # fmt); cuBLAS is on the GPU machine already and too large to carry.
  local lib
  for exe in "$dir"/*; do
    for lib in $(ldd "$exe" 2>/dev/null | awk '/libcudart|libcupti|libfmt/ {print $3}'); do
      cp -L "$lib" "$dir/"
    done
  done
  du -sh "$dir"
}

run() {
  local dir=${1:-.gpu/tests} filter=${2:-.} out=${OUT:-out}
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$root/$dir:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
  local summary=() failed=0 name exe rc
  while IFS=$'\t' read -r name exe rest; do
    [[ $name =~ $filter ]] || continue
    read -r -a args <<<"${rest//$'\t'/ }"
    timeout "${OOMB_GPU_TEST_TIMEOUT:-240}" "$dir/$exe" "${args[@]}" >"$out/$name.log" 2>&1
    rc=$?
    summary+=("$name rc=$rc $(grep -E '^\[doctest\] (test cases|assertions)' "$out/$name.log" | tr -s ' ' | tr '\n' ' ')")
    [ "$rc" = 0 ] || { failed=1; grep -E "ERROR|FAILED|error" "$out/$name.log" | head -20; }
    if [ "${OOMB_GPU_SANITIZE:-0}" = 1 ]; then
      OOMB_GPU_TEST_QUICK=1 timeout "${OOMB_GPU_TEST_TIMEOUT:-240}" compute-sanitizer --tool memcheck \
        --leak-check no --report-api-errors no --error-exitcode 9 "$dir/$exe" "${args[@]}" >"$out/$name.memcheck.log" 2>&1
      rc=$?
      summary+=("$name memcheck rc=$rc $(grep -E 'ERROR SUMMARY' "$out/$name.memcheck.log" | tail -1)")
      [ "$rc" = 0 ] || failed=1
    fi
  done <"$dir/manifest.tsv"
  echo "==== gpu tests"
  printf '%s\n' "${summary[@]}"
  return "$failed"
}

case "$cmd" in
  stage) stage "$@" ;;
  run) run "$@" ;;
  *) echo "usage: tools/gpu/tests.sh stage BUILD [DIR] | run [DIR] [REGEX]" >&2; exit 2 ;;
esac
