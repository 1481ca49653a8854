#!/usr/bin/env bash
# One call on the GPU machine does everything for the attention kernels: gpu tests, compute-sanitizer
# (memcheck, racecheck) on the tiny shapes, the benchmark, and the PyTorch SDPA baseline; logs go to
# $OUT (the benchmark's and the baseline's raw results also as bench.jsonl / sdpa.jsonl). Run from the repository root with the binaries built here copied to $BIN (.gpu/attn):
#   bash bench/attention/run_gpu.sh [all|tests|bench|documents|sdpa|sanitize|memcheck|ncu]...
# documents: bench_attention --documents $DOC_LENGTHS (2048,4096,16384): packed documents, the public
# entries with per-document bounds against the same calls without, time per attended key pair.
# TEST_TC filters the test cases (doctest -tc); BENCH_ENV (e.g. OOMB_ATTENTION_BACKWARD=portable)
# sets the benchmark's kernel choice for the public entries;
# memcheck is sanitize without racecheck; ncu (not part of all) profiles one launch of the dense Hopper
# backward per head size at NCU_PAST (65536) with Nsight Compute's full set and source-level warp-stall
# sampling, then prints the details page and the per-SASS-line source page as text (ncu 2025.3 on the
# H200, ~15 s per head size; tools/analysis/ncu_stalls.py sums the source page's samples by reason and region);
# SAN_TC / RACE_TC override the sanitizer's test filters; BENCH_TIMEOUT (seconds, default 240) bounds the benchmark, TEST_TIMEOUT (default 300)
# each test run, SAN_TIMEOUT (default 150) each sanitizer run.
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
BIN=${BIN:-.gpu/attn}
OUT=${OUT:-/tmp/attn-out}
mkdir -p "$OUT"
steps=${*:-all}
has() { [[ " $steps " == *" all "* || " $steps " == *" $1 "* ]]; }
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  | tee "$OUT/gpu.txt"

if has tests; then
  timeout "${TEST_TIMEOUT:-300}" "$BIN/test_attention" ${TEST_TC:+-tc="$TEST_TC"} 2>&1 | tee "$OUT/tests.log"
  summary+=("tests rc=$?")
fi
if has bench; then
  env ${BENCH_ENV:-} timeout "${BENCH_TIMEOUT:-240}" "$BIN/bench_attention" --json "$OUT/bench.jsonl" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  summary+=("bench rc=$?")
fi
if has documents; then
  timeout "${BENCH_TIMEOUT:-240}" "$BIN/bench_attention" --documents "${DOC_LENGTHS:-2048,4096,16384}" --json "$OUT/documents.jsonl" \
    2>&1 | tee "$OUT/documents.log"
  summary+=("documents rc=$?")
fi
if has sdpa; then
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/attention/sdpa_baseline.py --json "$OUT/sdpa.jsonl" ${SDPA_ARGS:-} 2>&1 | tee "$OUT/sdpa.log"
  summary+=("sdpa rc=$?")
fi
if [[ " $steps " == *" ncu "* ]]; then
  for d in 128 64; do
    # --lean --reps 1: the public backward runs a warm-up and one timed launch; profile the second.
    timeout "${NCU_TIMEOUT:-300}" ncu --clock-control none --kernel-name regex:attention_backward_sm90 --launch-skip 1 \
      --launch-count 1 --set full --import-source yes -f -o "$OUT/ncu-bwd-d$d" "$BIN/bench_attention" \
      --past "${NCU_PAST:-65536}" --reps 1 --lean --no-sparse --head-dim "$d" >"$OUT/ncu-d$d.log" 2>&1
    summary+=("ncu d$d rc=$?")
    ncu --import "$OUT/ncu-bwd-d$d.ncu-rep" --page details >"$OUT/ncu-d$d-details.txt" 2>&1
    ncu --import "$OUT/ncu-bwd-d$d.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu-d$d-source.csv" 2>&1
  done
fi
if has sanitize || has memcheck; then
  timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_attention" \
    -tc="${SAN_TC:-*sanitize*,*bit for bit*,*reject*,*split*}" >"$OUT/memcheck.log" 2>&1
  summary+=("memcheck rc=$?")
  tail -4 "$OUT/memcheck.log"
fi
if has sanitize; then
  timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/test_attention" -tc="${RACE_TC:-*sanitize*,*split*}" \
    >"$OUT/racecheck.log" 2>&1
  summary+=("racecheck rc=$?")
  tail -4 "$OUT/racecheck.log"
fi

echo "==== summary"
for s in "${summary[@]}"; do echo "$s"; done
for t in tests; do
  [[ -f "$OUT/$t.log" ]] && { echo "-- $t"; grep -E "^\[doctest\] (test cases|assertions)|ERROR|FAILED" "$OUT/$t.log" | head -20; }
done
[[ -f "$OUT/bench.log" ]] && grep -vE "^\s*$" "$OUT/bench.log" | tail -12
[[ -f "$OUT/sdpa.log" ]] && tail -14 "$OUT/sdpa.log"
exit 0
