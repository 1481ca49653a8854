#!/usr/bin/env bash
# One call on the GPU machine: the trainer's fwd_bwd step (bench_trainer) and the PyTorch
# competitor (strong_baseline.py) at the same lengths, JSON lines and logs to $OUT, a side-by-side
# table last. Staged by bench/trainer/stage.sh into .gpu/trainer-bench (carry that folder):
#   bash .gpu/trainer-bench/run_gpu.sh 0.5b|7b LENGTH...
# Environment (all optional):
#   CHUNK          tokens per chunk; a comma list sweeps (0.5b: 16384, 7b: 4096)
#   PAGE           tokens per page (128)          WINDOW_PAGES  pages per window (0)
#   OFFLOAD=1      pages at home in pinned host memory (NEAR_PAGES: device slots per tier, 0 = auto)
#   GRAD_HOMES     with OFFLOAD=1: fp32 (default), bf16 or bf16-stochastic gradient homes (--grad-homes)
#   HOME_MEMORY    with OFFLOAD=1: pinned (default) or pageable homes (--home-memory)
#   KEEP=1         keep stage 1's attention outputs for stage 2 (--keep-attention-outputs)
#   PREFETCH_LAST=0  sparse with offload: stage 1 does not prefetch the last chunk's selection
#                  (--no-prefetch-last-selection; on by default)
#   DETERMINISTIC=1  the attention backward in a fixed order (--deterministic; dense and page-sparse)
#   SPLIT=1        time the backend's ops by kind on the device (--split: each row's split_s)
#   SPARSE_BUDGET  page-sparse attention, B scored past pages per query tile (--sparse-budget); SINK,
#                  LOCAL, TILE, SCORING (quest|mean) shape it (--sink, --local, --tile, --scoring;
#                  bench_trainer's defaults 1, 1, 128, quest; refused without SPARSE_BUDGET). Sparse
#                  runs default to SPLIT=1 (the rows' scoring_s comes from the op clock) and to
#                  SYSTEMS=oomb (the competitor is dense)
#   REPS           timed steps per point (0: 3 below 10 s a step, else 1)
#   WARMUP_TOKENS  our warm-up step's length on each point's trainer (0: the point's length; the
#                  competitor warms up once, at its smallest length)
#   PHASE          fwd_bwd (as the competitor) or step (with the optimizer: its state on the GPU,
#                  split with pinned host memory where it does not fit, as oomb-train plans it)
#   SYSTEMS        "oomb pytorch" (or one of them; PHASE=step: oomb)
#   DEADLINE_S     the whole call's budget in seconds (540); OOMB_S: our share of it (55% with both)
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: run_gpu.sh 0.5b|7b LENGTH..." >&2; exit 2; }
model=$1
shift
case $model in
  0.5b) chunk_default=16384 ;;
  7b) chunk_default=4096 ;;
  *) echo "run_gpu.sh: model '$model' is not 0.5b or 7b" >&2; exit 2 ;;
esac
lengths=("$@")
OUT=${OUT:-/tmp/trainer-bench-out}
PHASE=${PHASE:-fwd_bwd}
sparse=()
[ -n "${SPARSE_BUDGET:-}" ] && sparse+=(--sparse-budget "$SPARSE_BUDGET")
[ -n "${SINK:-}" ] && sparse+=(--sink "$SINK")
[ -n "${LOCAL:-}" ] && sparse+=(--local "$LOCAL")
[ -n "${TILE:-}" ] && sparse+=(--tile "$TILE")
[ -n "${SCORING:-}" ] && sparse+=(--scoring "$SCORING")
if [ -n "${SPARSE_BUDGET:-}" ]; then SPLIT=${SPLIT:-1}; SYSTEMS=${SYSTEMS:-oomb}; fi
if [ "$PHASE" = step ]; then SYSTEMS=${SYSTEMS:-oomb}; else SYSTEMS=${SYSTEMS:-oomb pytorch}; fi
DEADLINE_S=${DEADLINE_S:-540}
if [[ " $SYSTEMS " == *" pytorch "* ]]; then OOMB_S=${OOMB_S:-$((DEADLINE_S * 55 / 100))}; else OOMB_S=${OOMB_S:-$DEADLINE_S}; fi
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
# cuBLASLt is not carried: the toolkit's, else PyTorch's copy.
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
start=$SECONDS
tag=$model-$(date -u +%Y%m%dT%H%M%S)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  echo "commit $(cat "$here/COMMIT")"
  ldd "$here/bench_trainer" | grep -E "cublas|not found"
  echo "lengths ${lengths[*]}  phase $PHASE  chunk ${CHUNK:-$chunk_default}  offload ${OFFLOAD:-0}  grad homes ${GRAD_HOMES:-fp32}  homes ${HOME_MEMORY:-pinned}  keep ${KEEP:-0}  deterministic ${DETERMINISTIC:-0}  budget $DEADLINE_S s (ours $OOMB_S s)"
  echo "attention ${sparse[*]:-dense}  split ${SPLIT:-0}"
} 2>&1 | tee "$OUT/env-$tag.txt"

if [[ " $SYSTEMS " == *" oomb "* ]]; then
  args=(--config "$here/configs/qwen2.5-$model.json" --lengths "$(IFS=,; echo "${lengths[*]}")" --phase "$PHASE"
        --chunk "${CHUNK:-$chunk_default}" --page "${PAGE:-128}" --window-pages "${WINDOW_PAGES:-0}"
        --reps "${REPS:-0}" --warmup-tokens "${WARMUP_TOKENS:-0}" --deadline-s "$OOMB_S"
        --commit "$(cat "$here/COMMIT")" --jsonl "$OUT/oomb-$tag.jsonl")
  [ "${OFFLOAD:-0}" = 1 ] && args+=(--offload --near-pages "${NEAR_PAGES:-0}")
  [ -n "${GRAD_HOMES:-}" ] && args+=(--grad-homes "$GRAD_HOMES")
  [ -n "${HOME_MEMORY:-}" ] && args+=(--home-memory "$HOME_MEMORY")
  [ "${KEEP:-0}" = 1 ] && args+=(--keep-attention-outputs)
  [ "${PREFETCH_LAST:-1}" = 0 ] && args+=(--no-prefetch-last-selection)
  [ "${DETERMINISTIC:-0}" = 1 ] && args+=(--deterministic)
  [ "${SPLIT:-0}" = 1 ] && args+=(--split)
  args+=("${sparse[@]}")
  timeout $((OOMB_S + 45)) "$here/bench_trainer" "${args[@]}" 2>&1 | tee "$OUT/oomb-$tag.log"
  echo "bench_trainer rc=$?" | tee -a "$OUT/oomb-$tag.log"
fi

if [[ " $SYSTEMS " == *" pytorch "* ]]; then
  left=$((DEADLINE_S - (SECONDS - start)))
  # Its --deadline-s counts from after the model is built (~30 s for the 7B); timeout is the backstop.
  timeout "$left" "$PY" "$here/strong_baseline.py" --model "$model" --lengths "${lengths[@]}" \
      --deadline-s $((left > 90 ? left - 60 : 30)) --jsonl "$OUT/pytorch-$tag.jsonl" 2>&1 | tee "$OUT/pytorch-$tag.log"
  echo "strong_baseline rc=$?" | tee -a "$OUT/pytorch-$tag.log"
fi

"$PY" "$here/table.py" "$OUT/oomb-$tag.log" "$OUT/pytorch-$tag.log" 2>&1 | tee "$OUT/table-$tag.txt"
echo "wall $((SECONDS - start)) s"
