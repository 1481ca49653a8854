#!/usr/bin/env bash
# Where the time of one trainer step goes, measured: Nsight Systems over bench_trainer's timed step
# (the warm-up is outside the capture range), the GPU time of each part of the step by the NVTX
# ranges of the CUDA backend's ops (gemm/, attention/, head/, elementwise/, embedding/, pages/,
# selection/),
# the transfers by the copy engines' time, and what is left of the wall clock (host work, waits).
#   bash .gpu/trainer-bench/split.sh 0.5b|7b LENGTH      (staged by stage.sh; run on the GPU machine)
# Environment as run_gpu.sh's: CHUNK, PAGE, OFFLOAD, NEAR_PAGES, KEEP, WARMUP_TOKENS (default: one
# chunk), SPARSE_BUDGET, SINK, LOCAL, TILE, SCORING. Without Nsight Systems (the GPU machine has
# none), run_gpu.sh's SPLIT=1 gives the same parts from the backend's op clock. Writes $OUT/split-<model>-<length>-<time>.{nsys-rep,jsonl,txt} and the csv reports.
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: split.sh 0.5b|7b LENGTH" >&2; exit 2; }
model=$1 length=$2
case $model in 0.5b) chunk_default=16384 ;; 7b) chunk_default=4096 ;; *) echo "split.sh: model '$model' is not 0.5b or 7b" >&2; exit 2 ;; esac
chunk=${CHUNK:-$chunk_default}
OUT=${OUT:-/tmp/trainer-bench-out}
mkdir -p "$OUT"
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
NSYS=${NSYS:-$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)}
[ -x "$NSYS" ] || { echo "split.sh: no nsys found (set NSYS)" >&2; exit 1; }
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tag=split-$model-$length-$(date -u +%Y%m%dT%H%M%S)
args=(--config "$here/configs/qwen2.5-$model.json" --lengths "$length" --phase fwd_bwd --chunk "$chunk"
      --page "${PAGE:-128}" --reps 1 --warmup-tokens "${WARMUP_TOKENS:-$chunk}" --commit "$(cat "$here/COMMIT")"
      --jsonl "$OUT/$tag.bench.jsonl")
[ "${OFFLOAD:-0}" = 1 ] && args+=(--offload --near-pages "${NEAR_PAGES:-0}")
[ "${KEEP:-0}" = 1 ] && args+=(--keep-attention-outputs)
[ -n "${SPARSE_BUDGET:-}" ] && args+=(--sparse-budget "$SPARSE_BUDGET")
[ -n "${SINK:-}" ] && args+=(--sink "$SINK")
[ -n "${LOCAL:-}" ] && args+=(--local "$LOCAL")
[ -n "${TILE:-}" ] && args+=(--tile "$TILE")
[ -n "${SCORING:-}" ] && args+=(--scoring "$SCORING")
"$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \
    --force-overwrite=true -o "$OUT/$tag" "$here/bench_trainer" "${args[@]}" 2>&1 | tee "$OUT/$tag.log"
"$NSYS" stats --force-export=true --report nvtx_gpu_proj_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv \
    --output "$OUT/$tag" "$OUT/$tag.nsys-rep" >"$OUT/$tag.stats.log" 2>&1
"$PY" "$here/split.py" "$OUT/$tag" 2>&1 | tee "$OUT/$tag.txt"
