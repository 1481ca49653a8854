#!/usr/bin/env bash
# One call on the GPU machine, from the repository's root: the PyTorch package's step
# (bench_driver.py: oomb.torch.ChunkRecurrent over the HF model), the C++ trainer's (bench_trainer)
# and the PyTorch competitor (strong_baseline.py) at the same lengths, one after the other; JSON
# lines and logs to $OUT, the side-by-side table last. Staged by bench/pytorch/stage.sh (.gpu/py):
#   bash .gpu/py/run_gpu.sh CONFIG LENGTH...
# CONFIG: a configs/*.json name (qwen2.5-0.5b, qwen2.5-7b: all three systems; others, e.g.
# llama-3.1-8b: the package and the C++ trainer, the competitor knowing only Qwen2.5).
# Environment (optional): CHUNK (qwen2.5-0.5b: 16384, else 4096), SYSTEMS ("torch oomb pytorch"),
# DEADLINE_S (the call's budget, 540; shared in proportion 45/25/30), WARMUP_TOKENS (both oomb
# systems' warm-up step, default the first length; the competitor warms up at its smallest),
# TESTS=1 (the package's GPU tests first, python/tests/test_cuda.py and test_ops.py, into
# $OUT/pytest.log; TESTS_K: pytest's -k to run some of them), WEIGHT_GRADS=autograd (the package's
# weight gradients through autograd's accumulation, ChunkRecurrent(weight_grads_in_gemm=False)),
# KEEP=1 (both oomb systems keep stage 1's attention outputs for stage 2), OFFLOAD=pinned|pageable
# (both oomb systems stream their pages from homes in that host memory; NEAR_PAGES slots, 0: the
# trainer's default), SPARSE_BUDGET=B (both page-sparse, sink 1, local 1, 128-query tiles),
# PROFILE=1 (after the systems, profile_split.py splits one step of the package and of the
# competitor at the first length into GEMM, attention, other kernels and the GPU's idle time, into
# $OUT/split-*.jsonl).
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: run_gpu.sh CONFIG LENGTH..." >&2; exit 2; }
model=$1
shift
lengths=("$@")
config=configs/$model.json
[ -f "$config" ] || { echo "run_gpu.sh: no $config" >&2; exit 2; }
case $model in
  qwen2.5-0.5b) chunk=${CHUNK:-16384}; competitor=0.5b ;;
  qwen2.5-7b) chunk=${CHUNK:-4096}; competitor=7b ;;
  *) chunk=${CHUNK:-4096}; competitor= ;;
esac
OUT=${OUT:-/tmp/py-bench-out}
SYSTEMS=${SYSTEMS:-torch oomb pytorch}
DEADLINE_S=${DEADLINE_S:-540}
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
export OOMB_C_LIBRARY=$here/liboomb_c.so OOMB_CUDA_LIBRARY=$here/liboomb_cuda.so
export PYTHONPATH=$PWD/python/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$cublas_dir:$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
start=$SECONDS
tag=$model-$(date -u +%Y%m%dT%H%M%S)
commit=$(cat "$here/COMMIT")
echo "commit $commit  $model  lengths ${lengths[*]}  chunk $chunk  systems $SYSTEMS" | tee "$OUT/env-$tag.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/env-$tag.txt"

if [ "${TESTS:-0}" = 1 ]; then
  (cd python && OOMB_TEST_OUT=$OUT timeout 300 "$PY" -m pytest -q -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} tests/test_cuda.py tests/test_ops.py) \
    2>&1 | tee "$OUT/pytest.log" | tail -25
fi

torch_flags=() trainer_flags=()
[ "${KEEP:-0}" = 1 ] && torch_flags=(--keep) trainer_flags=(--keep-attention-outputs)
[ "${WEIGHT_GRADS:-gemm}" = autograd ] && torch_flags+=(--autograd-weight-grads)
if [ -n "${OFFLOAD:-}" ]; then
  torch_flags+=(--offload "$OFFLOAD" --near-pages "${NEAR_PAGES:-0}")
  trainer_flags+=(--offload --home-memory "$OFFLOAD" --near-pages "${NEAR_PAGES:-0}")
fi
if [ -n "${SPARSE_BUDGET:-}" ]; then
  torch_flags+=(--sparse-budget "$SPARSE_BUDGET")
  trainer_flags+=(--sparse-budget "$SPARSE_BUDGET")
fi
share() { local left=$((DEADLINE_S - (SECONDS - start))); echo $((left * $1 / 100)); }
if [[ " $SYSTEMS " == *" torch "* ]]; then
  s=$(share 45)
  timeout $((s + 60)) "$PY" "$here/bench_driver.py" --config "$config" --lengths "${lengths[@]}" --chunk "$chunk" \
    --warmup-tokens "${WARMUP_TOKENS:-${lengths[0]}}" --deadline-s "$s" --commit "$commit" --jsonl "$OUT/torch-$tag.jsonl" "${torch_flags[@]}" 2>&1 | tee "$OUT/torch-$tag.log"
  echo "bench_driver rc=$?" | tee -a "$OUT/torch-$tag.log"
fi
if [[ " $SYSTEMS " == *" oomb "* ]] && [ -x "$here/bench_trainer" ]; then
  s=$(share 45)
  timeout $((s + 45)) "$here/bench_trainer" --config "$config" --lengths "$(IFS=,; echo "${lengths[*]}")" \
    --phase fwd_bwd --chunk "$chunk" --page 128 --window-pages 0 --reps 1 --warmup-tokens "${WARMUP_TOKENS:-${lengths[0]}}" \
    --deadline-s "$s" --commit "$commit" --jsonl "$OUT/oomb-$tag.jsonl" "${trainer_flags[@]}" 2>&1 | tee "$OUT/oomb-$tag.log"
  echo "bench_trainer rc=$?" | tee -a "$OUT/oomb-$tag.log"
fi
if [[ " $SYSTEMS " == *" pytorch "* ]] && [ -n "$competitor" ]; then
  left=$((DEADLINE_S - (SECONDS - start)))
  timeout "$left" "$PY" "$here/strong_baseline.py" --model "$competitor" --lengths "${lengths[@]}" \
    --deadline-s $((left > 90 ? left - 60 : 30)) --jsonl "$OUT/pytorch-$tag.jsonl" 2>&1 | tee "$OUT/pytorch-$tag.log"
  echo "strong_baseline rc=$?" | tee -a "$OUT/pytorch-$tag.log"
  # strong_baseline.py's rows name no device; plot.py would take them for the H200's
  [ -f "$OUT/pytorch-$tag.jsonl" ] && "$PY" - "$OUT/pytorch-$tag.jsonl" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" <<'PYEOF'
import json, sys
path, device = sys.argv[1], sys.argv[2]
rows = [dict(json.loads(l), device=device) for l in open(path) if l.strip()]
open(path, "w").write("".join(json.dumps(r) + "\n" for r in rows))
PYEOF
fi
if [ "${PROFILE:-0}" = 1 ]; then
  for system in torch pytorch; do
    [ "$system" = pytorch ] && [ -z "$competitor" ] && continue
    flags=()
    [ "$system" = torch ] && [ "${KEEP:-0}" = 1 ] && flags+=(--keep)
    [ "$system" = torch ] && [ "${WEIGHT_GRADS:-gemm}" = autograd ] && flags+=(--autograd-weight-grads)
    timeout 300 "$PY" "$here/profile_split.py" --system "$system" --config "$config" --length "${lengths[0]}" \
      --chunk "$chunk" --commit "$commit" --jsonl "$OUT/split-$tag.jsonl" "${flags[@]}" 2>&1 | tail -3
  done
fi
"$PY" "$here/table.py" "$OUT/torch-$tag.log" "$OUT/oomb-$tag.log" "$OUT/pytorch-$tag.log" 2>&1 | tee "$OUT/table-$tag.txt"
echo "wall $((SECONDS - start)) s"
