#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs all of oomb's checks that need no GPU, in phases, and prints each phase's time:
#   0 docs      every relative link and repository path named in the current docs and in code
#               comments exists (tools/ci/check_docs.py; seconds, no build): counted as one test
#   1 cpu       CPU build (-O0, assertions and bounds checks on) and every CPU test, via ctest
#   2 cuda      CUDA build (Release, sm_90a) of everything but test_trainer (the cpu phase's):
#               compiled, nothing labelled gpu is run.
#               nvcc must be there: this phase fails, never skips, without it
#   3 sanitize  CPU-only AddressSanitizer + UndefinedBehaviorSanitizer build of the tests and
#               examples, running the CPU tests; the first report fails the run
#   4 consumer  install + find_package, pkg-config, add_subdirectory and FetchContent consumers
#   5 python    the PyTorch package: pip install ./python into the venv tools/setup.sh made
#               (OOMB_VENV, default .venv), then its pytest suite (python/tests, CPU, no downloads)
# Usage: bash tools/test.sh [PHASE...]   (default: all six, docs first; e.g. `bash tools/test.sh cpu`)
# Environment: OOMB_TEST_DIR (build folders, default build-test), OOMB_JOBS (default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OOMB_TEST_DIR:-build-test}
jobs=${OOMB_JOBS:-2}
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(docs cpu cuda sanitize consumer python)
for p in "${phases[@]}"; do
  case "$p" in docs|cpu|cuda|sanitize|consumer|python) ;; *) echo "tools/test.sh: unknown phase '$p'" >&2; exit 2;; esac
done
command -v ninja >/dev/null || { echo "tools/test.sh: ninja is missing: run 'bash tools/setup.sh'" >&2; exit 1; }

banner() { printf '\n======== %s ========\n' "$*"; }
# ctest over the `cpu` label; fails when no test ran. Remembers the counts for the last line.
passed=0
failed=0
run_ctest() {
  local dir=$1 log
  log="$dir/ctest.log"
  set +e
  ctest --test-dir "$dir" -L cpu --output-on-failure --no-tests=error --timeout 900 -j "$jobs" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local line
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
  if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=$((failed + BASH_REMATCH[1]))
    passed=$((passed + BASH_REMATCH[2] - BASH_REMATCH[1]))
  else
    failed=$((failed + 1))
  fi
  return "$rc"
}

phase_docs() {
  # Standard library only: runs wherever python3 does, before anything is built.
  if python3 tools/ci/check_docs.py; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    return 1
  fi
}

phase_cpu() {
  # -O0 without NDEBUG: assertions and view bounds checks on, and the cheapest compile (a third of
  # -O2's); the cuda phase compiles every other C++ file again at -O3, so optimisation-time warnings
  # are still caught (the trainer and its tests are -O3 here already: the trainer's own flags).
  # Benchmarks are built once, in the cuda phase.
  cmake -S . -B "$out/cpu" -G Ninja -DOOMB_ENABLE_CUDA=OFF -DOOMB_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0"
  cmake --build "$out/cpu" -j "$jobs"
  run_ctest "$out/cpu"
}

phase_cuda() {
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  command -v nvcc >/dev/null || {
    echo "tools/test.sh: the cuda phase needs nvcc (the CUDA toolkit), which is not on PATH nor" \
         "in /usr/local/cuda/bin. It is never skipped: install the toolkit." >&2
    return 1
  }
  nvcc --version | tail -n 2
  # test_trainer is left out: the cpu phase compiled it at the same -O3 and ran it (~100 s here).
  cmake -S . -B "$out/cuda" -G Ninja -DOOMB_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_BUILD_TYPE=Release -DOOMB_BUILD_TRAINER_CPU_TESTS=OFF
  cmake --build "$out/cuda" -j "$jobs"
  local gpu
  gpu=$(ctest --test-dir "$out/cuda" -N -L gpu | sed -n 's/^Total Tests: //p')
  echo "cuda phase: everything but test_trainer compiled; ${gpu:-0} test(s) labelled gpu are left for the GPU machine"
}

phase_sanitize() {
  # -O0 -g: with both sanitizers g++ compiles -O1 five to six times slower than -O0 (measured on
  # the heaviest test files), and the tests run fast enough either way. Benchmarks are not built.
  cmake -S . -B "$out/sanitize" -G Ninja -DOOMB_ENABLE_CUDA=OFF -DOOMB_BUILD_BENCH=OFF \
    -DOOMB_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g"
  cmake --build "$out/sanitize" -j "$jobs"
  ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_ctest "$out/sanitize"
}

phase_consumer() {
  bash tests/consumer/check.sh "$root"
}

phase_python() {
  local venv=${OOMB_VENV:-$root/.venv}
  if [ ! -x "$venv/bin/python" ]; then
    echo "tools/test.sh: the python phase needs the virtual environment $venv, which" \
         "'bash tools/setup.sh' makes" >&2
    failed=$((failed + 1))
    return 1
  fi
  # The package as this tree has it (an incremental build in python/build), offline, the CPU path
  # (its GPU tests skip without a GPU; the GPU machine runs them: bench/pytorch/run_gpu.sh TESTS=1).
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-build-isolation \
    --no-deps --force-reinstall --config-settings=cmake.define.OOMB_PYTHON_CUDA=OFF ./python
  mkdir -p "$out"
  local log="$out/pytest.log" rc
  set +e
  (cd python && HF_HUB_OFFLINE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests) 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "tools/test.sh: pytest collected no test in python/tests (exit 5): the python phase fails" \
         "when it runs none" >&2
    failed=$((failed + 1))
    return 1
  fi
  # pytest's closing line: "3 failed, 45 passed, 1 skipped in 5.1s" (errors count as failures).
  local line n_pass=0 n_fail=0
  line=$(grep -E '[0-9]+ (passed|failed|error)' "$log" | tail -1 || true)
  [[ $line =~ ([0-9]+)\ passed ]] && n_pass=${BASH_REMATCH[1]}
  [[ $line =~ ([0-9]+)\ failed ]] && n_fail=$((n_fail + BASH_REMATCH[1]))
  [[ $line =~ ([0-9]+)\ errors? ]] && n_fail=$((n_fail + BASH_REMATCH[1]))
  if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then n_fail=1; fi  # it failed without a count
  passed=$((passed + n_pass))
  failed=$((failed + n_fail))
  return "$rc"
}

# CPU seconds (user + system) used by finished child processes: unlike wall time, it does not
# depend on what else the machine is doing, so phases can be compared across machines. `times`
# must run in this shell (in a command substitution it would report the subshell's children).
times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
children_cpu() {
  times >"$times_file"  # line 2: the children's "XmY.YYYs XmY.YYYs"
  children_cpu_s=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; ++i) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] }; printf "%d", t }' "$times_file")
}

declare -A seconds cpu
for p in "${phases[@]}"; do
  banner "phase $p"
  start=$(date +%s)
  children_cpu
  cpu_start=$children_cpu_s
  "phase_$p"
  seconds[$p]=$(($(date +%s) - start))
  children_cpu
  cpu[$p]=$((children_cpu_s - cpu_start))
  echo "phase $p: ${seconds[$p]} s (cpu ${cpu[$p]} s)"
done

banner "summary"
total=0
if [ -n "${OOMB_SETUP_SECONDS:-}" ]; then  # set by .ci/run
  echo "phase setup: $OOMB_SETUP_SECONDS s"
  total=$OOMB_SETUP_SECONDS
fi
cpu_total=0
for p in "${phases[@]}"; do
  echo "phase $p: ${seconds[$p]} s (cpu ${cpu[$p]} s)"
  total=$((total + seconds[$p]))
  cpu_total=$((cpu_total + cpu[$p]))
done
echo "all phases: $total s (cpu $cpu_total s on $(nproc) cores)"
# CI reads this line: the totals of the phases that ran tests (the docs check as one, ctest's in
# cpu and sanitize, pytest's in python).
echo "tests: $passed passed, $failed failed"
