#!/usr/bin/env bash
# compute-sanitizer over tiny `oomb-train --device cuda` runs on the GPU machine: every kernel of a
# training step (embedding, norms, RoPE, cuBLASLt projections, paged attention forward and
# backward, page writes and gradient adds, the fused LM head + loss, grad norm, AdamW, page
# selection), dense, offload, kept attention outputs and page-sparse, head_dim 64 and 128.
#   bash tools/gpu/sanitize_training.sh [OOMB_TRAIN]      (default .gpu/sanitize/oomb-train)
# memcheck runs every case; racecheck and synccheck (shared-memory hazards and barrier misuse, where
# the attention kernels' warp specialisation could go wrong) run the dense and sparse in-place
# cases of both head sizes. Logs under $OUT/sanitize-training; one summary line per run; rc 1 if
# any run failed or reported an error. API errors are not reported: the CUDA side probes
# (cudaMemGetInfo, attribute queries) on purpose.
# SPDX-License-Identifier: Apache-2.0
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exe=${1:-$root/.gpu/sanitize/oomb-train}
out=${OUT:-out}/sanitize-training
mkdir -p "$out"
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$(dirname "$exe"):$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# 4 chunks of 256 tokens in pages of 128 (the Hopper kernels' page size); with --offload 4 near
# slots per tier, so the past streams through windows of 2 pages.
common=(--synthetic kv-recall --seq-len 1024 --chunk 256 --page 128 --steps 2 --device cuda --quiet)
sparse=(--seq-len 2048 --sparse-budget 2 --sink 1 --local 1 --tile 64)
declare -A cases=(
  [d64-dense]="--config $root/configs/tiny-d64.json"
  [d64-offload]="--config $root/configs/tiny-d64.json --offload"
  [d64-keep-offload]="--config $root/configs/tiny-d64.json --offload --keep-attention-outputs"
  [d64-sparse]="--config $root/configs/tiny-d64.json ${sparse[*]}"
  [d64-sparse-offload]="--config $root/configs/tiny-d64.json ${sparse[*]} --offload"
  [d128-dense]="--config $root/configs/tiny-d128.json"
  [d128-offload]="--config $root/configs/tiny-d128.json --offload --keep-attention-outputs"
  [d128-sparse]="--config $root/configs/tiny-d128.json ${sparse[*]}"
)
order=(d64-dense d64-offload d64-keep-offload d64-sparse d64-sparse-offload d128-dense d128-offload d128-sparse)
hazard_cases=" d64-dense d64-sparse d128-dense d128-sparse "

failed=0
summary=()
run() {  # run TOOL CASE
  local tool=$1 name=$2 log="$out/$2.$1.log" rc
  local -a extra
  read -r -a extra <<<"${cases[$name]}"
  rm -rf "$out/$name.$tool.run"
  compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 \
      "$exe" "${common[@]}" "${extra[@]}" --out "$out/$name.$tool.run" >"$log" 2>&1
  rc=$?
  summary+=("$name $tool rc=$rc | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) | $(grep -E '^step +2/' "$log" | cut -c1-60)")
  [ "$rc" = 0 ] || { failed=1; grep -m 20 -E "=========|error|Error" "$log"; }
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
compute-sanitizer --version | tail -1
for name in "${order[@]}"; do
  run memcheck "$name"
  if [[ $hazard_cases == *" $name "* ]]; then
    run racecheck "$name"
    run synccheck "$name"
  fi
done
echo "==== compute-sanitizer over oomb-train --device cuda"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit "$failed"
