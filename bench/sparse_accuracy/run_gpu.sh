#!/usr/bin/env bash
# The sparse accuracy study in one GPU call (issue 13, "Accuracy, measured"). Staged by
# bench/sparse_accuracy/stage.sh into .gpu/sparse-accuracy (carry that folder):
#   bash .gpu/sparse-accuracy/run_gpu.sh
# 1. Trains the tiny model on kv-recall from one seed, dense and page-sparse side by side (and the
#    no-cross-chunk control: budget, sink and local 0), each for at most TRAIN_S seconds: their
#    log.jsonl are the loss curves, the dense run's checkpoint is the trained model.
# 2. For the trained model and for random initialisation, at each of TOKENS: one step at --lr 0
#    with --dump-grads, dense twice (the second run gives the run-to-run floor: dQ is summed with
#    atomics) and page-sparse for each budget x scoring; compare.py then sets each dump against the
#    state's first dense dump. A budget that covers every past page is dense: recorded, not run.
# Random-init runs start beside the training; the trained model's once its training ends.
# Environment (all optional):
#   DEADLINE_S  seconds for the runs (420; the comparisons after them take ~20 s): later runs are
#               skipped, and said so
#   TRAIN_S     wall time of each training run (180); it stops at a step boundary (SIGTERM)
#   JOBS        oomb-train processes at once on the GPU (6; the model is tiny)
#   TOKENS      "65536 262144"   BUDGETS "16 64 256"   SCORINGS "quest mean"
#   CHUNK 2048, PAGE 128, SINK 1, LOCAL 1, TILE 128 (x GQA 2 = 256 query rows: whole blocks)
#   TRAIN_TOKENS 16384, TRAIN_STEPS 1000, TRAIN_BUDGET 16, LR 2e-3, WARMUP 20, SEED 1234
#   EVAL_SEED   data (and random init) of the gradient runs (4321)
#   OFFLOAD=1   the gradient runs stream their pages (--offload)
#   CONFIG      the model (the staged configs/tiny-d64.json); DEVICE cuda (cpu: to try the script
#               itself at small sizes on a CPU build, see docs/sparse.md)
# Results in $OUT: env.txt, train.jsonl (every training step, "run": dense|sparse|control),
# runs.jsonl (one line per gradient run, skipped ones included), tensors.jsonl and summary.jsonl
# (compare.py's lines), log.txt (oomb-train's output).
# SPDX-License-Identifier: Apache-2.0
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/oomb-train
[ -x "$bin" ] || { echo "run_gpu.sh: no $bin: stage it first (bench/sparse_accuracy/stage.sh)" >&2; exit 1; }
CONFIG=${CONFIG:-$here/configs/tiny-d64.json}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/sparse-accuracy-out}
WORK=${WORK:-/tmp/sparse-accuracy-work}
DEADLINE_S=${DEADLINE_S:-420}
TRAIN_S=${TRAIN_S:-180}
JOBS=${JOBS:-6}
TOKENS=${TOKENS:-65536 262144}
BUDGETS=${BUDGETS:-16 64 256}
SCORINGS=${SCORINGS:-quest mean}
CHUNK=${CHUNK:-2048} PAGE=${PAGE:-128} SINK=${SINK:-1} LOCAL=${LOCAL:-1} TILE=${TILE:-128}
TRAIN_TOKENS=${TRAIN_TOKENS:-16384} TRAIN_STEPS=${TRAIN_STEPS:-1000} TRAIN_BUDGET=${TRAIN_BUDGET:-16}
LR=${LR:-2e-3} WARMUP=${WARMUP:-20} SEED=${SEED:-1234} EVAL_SEED=${EVAL_SEED:-4321}
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
# cuBLASLt is not carried: the toolkit's, else PyTorch's copy.
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT" "$WORK"
rm -rf "${WORK:?}"/* "$OUT"/{train,runs,tensors,summary}.jsonl "$OUT/log.txt"  # this call's lines only
start=$SECONDS
note() { echo "$*" | tee -a "$OUT/env.txt"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "commit $(cat "$here/COMMIT")"
  ldd "$bin" | grep -E "cublas|not found"
  echo "config $(basename "$CONFIG") on $DEVICE, chunk $CHUNK, page $PAGE, sink $SINK, local $LOCAL, tile $TILE; tokens $TOKENS;" \
       "budgets $BUDGETS; scorings $SCORINGS; train $TRAIN_TOKENS tokens, <= $TRAIN_STEPS steps in <= $TRAIN_S s," \
       "lr $LR, sparse budget $TRAIN_BUDGET; deadline $DEADLINE_S s, $JOBS jobs"
} 2>&1 | tee "$OUT/env.txt"
# Mean-key runs need oomb-train's --scoring; without it only Quest (the default) runs.
help=$("$bin" --help)
if [[ $help == *--scoring* ]]; then has_scoring=1; else has_scoring=0; note "this oomb-train has no --scoring: Quest only"; fi

common=(--config "$CONFIG" --synthetic kv-recall --chunk "$CHUNK" --page "$PAGE" --device "$DEVICE" --quiet)
sparse_flags() { echo --sparse-budget "$1" --sink "$SINK" --local "$LOCAL" --tile "$TILE"; }
left() { echo $((DEADLINE_S - (SECONDS - start))); }

# Runs with at most JOBS at once; waits for a free slot first.
launch() {
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
  "$@" &
}

train() {  # train NAME [sparse flags...]
  local name=$1
  shift
  timeout -k 30 -s TERM "$TRAIN_S" "$bin" "${common[@]}" --seq-len "$TRAIN_TOKENS" --steps "$TRAIN_STEPS" \
      --warmup "$WARMUP" --lr "$LR" --seed "$SEED" --out "$WORK/train-$name" "$@" >>"$OUT/log.txt" 2>&1
  local rc=$?  # 143: stopped by TRAIN_S at a step boundary, with its checkpoint
  "$PY" - "$WORK/train-$name/log.jsonl" "$name" "$rc" >>"$OUT/train.jsonl" <<'EOF'
import json, sys
path, name, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    lines = [json.loads(l) for l in open(path) if l.strip()]
except FileNotFoundError:
    lines = []
for l in lines:
    print(json.dumps(dict(l, run=name)))
print(json.dumps({"run": name, "rc": rc, "steps_done": len(lines)}))
EOF
}

# grad STATE TOKENS ATTENTION BUDGET SCORING: one step at --lr 0 with --dump-grads, its record in runs.jsonl.
grad() {
  local state=$1 tokens=$2 attention=$3 budget=$4 scoring=$5
  local name=$state-$tokens-$attention${budget:+-$budget}${scoring:+-$scoring}
  local args=("${common[@]}" --seq-len "$tokens" --steps 1 --lr 0 --seed "$EVAL_SEED" --out "$WORK/$name"
              --dump-grads "$WORK/$name.safetensors")
  [ "$state" = trained ] && args+=(--init "$WORK/train-dense/checkpoint")
  [ "${OFFLOAD:-0}" = 1 ] && args+=(--offload)
  [ "$attention" = sparse ] && args+=($(sparse_flags "$budget"))
  [ -n "$scoring" ] && [ "$has_scoring" = 1 ] && args+=(--scoring "$scoring")
  local t0=$SECONDS rc
  echo "== $name" >>"$OUT/log.txt"
  timeout -k 10 "$(($(left) > 20 ? $(left) - 10 : 10))" "$bin" "${args[@]}" >>"$OUT/log.txt" 2>&1
  rc=$?
  record "$state" "$tokens" "$attention" "$budget" "$scoring" "rc $rc" $((SECONDS - t0)) "$WORK/$name"
}

# record STATE TOKENS ATTENTION BUDGET SCORING NOTE SECONDS [DIR]: a runs.jsonl line (with the
# step's loss and pages from DIR/log.jsonl), also kept as DIR.json for compare.py's --meta.
record() {
  local keep=/dev/null
  [ $# -ge 8 ] && keep=$8.json
  "$PY" - "$@" <<'EOF' | tee -a "$OUT/runs.jsonl" >"$keep"
import json, sys
state, tokens, attention, budget, scoring, note, seconds = sys.argv[1:8]
r = {"state": state, "tokens": int(tokens), "attention": attention, "budget": int(budget) if budget else None,
     "scoring": scoring or None, "note": note, "seconds": int(seconds)}
if len(sys.argv) > 8:
    try:
        step = [json.loads(l) for l in open(sys.argv[8] + "/log.jsonl") if l.strip()][-1]
        for k in ("loss", "sparse_pages_selected", "sparse_pages_candidate", "gpu_bytes_in_use_peak"):
            r[k] = step.get(k)
    except (FileNotFoundError, IndexError):
        pass
print(json.dumps(r))
EOF
}

# Every gradient run of one model state, in the order they matter.
grad_runs() {
  local state=$1 tokens attention budget scoring past
  for tokens in $TOKENS; do
    # The most past pages a tile sees (the last chunk's): a budget reaching it is dense (oomb-train refuses it).
    past=$(((tokens - 1) / CHUNK * (CHUNK / PAGE)))
    for attention in dense dense-repeat; do
      if (($(left) < 30)); then record "$state" "$tokens" "$attention" "" "" "skipped: deadline" 0; continue; fi
      launch grad "$state" "$tokens" "$attention" "" ""
    done
    for budget in $BUDGETS; do
      for scoring in $SCORINGS; do
        if ((budget + SINK + LOCAL >= past)); then
          record "$state" "$tokens" sparse "$budget" "$scoring" "budget covers every past page ($past): dense, not run" 0
        elif [ "$scoring" != quest ] && [ "$has_scoring" = 0 ]; then
          record "$state" "$tokens" sparse "$budget" "$scoring" "skipped: no --scoring in this oomb-train" 0
        elif (($(left) < 30)); then
          record "$state" "$tokens" sparse "$budget" "$scoring" "skipped: deadline" 0
        else
          launch grad "$state" "$tokens" sparse "$budget" "$scoring"
        fi
      done
    done
  done
}

# 1. Training, dense and sparse from the same seed, and the control; random-init runs beside them.
launch train dense
train_dense_pid=$!
launch train sparse $(sparse_flags "$TRAIN_BUDGET")
launch train control --sparse-budget 0 --sink 0 --local 0 --tile "$TILE"
grad_runs random
wait "$train_dense_pid"
if [ -e "$WORK/train-dense/checkpoint" ]; then
  grad_runs trained
else
  note "no trained checkpoint (see log.txt): trained-model runs skipped"
fi
wait
note "runs done at $((SECONDS - start)) s"

# 2. Each dump against its state's first dense dump.
for meta in "$WORK"/*.json; do
  run=${meta%.json}
  [ -e "$run.safetensors" ] || continue
  base=$(basename "$run")
  state=${base%%-*}
  rest=${base#*-}
  dense=$WORK/$state-${rest%%-*}-dense.safetensors
  [ "$run.safetensors" = "$dense" ] && continue
  [ -e "$dense" ] || { note "$base: no dense dump to compare with"; continue; }
  "$PY" "$here/compare.py" "$dense" "$run.safetensors" --meta "$(cat "$meta")" \
      --tensors "$OUT/tensors.jsonl" --summary "$OUT/summary.jsonl" || note "$base: compare.py failed"
done
"$PY" - "$OUT/summary.jsonl" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except FileNotFoundError:
    rows = []
def f(x, spec):
    return "-" if x is None else format(x, spec)
for r in sorted(rows, key=lambda r: (r["state"], r["tokens"], r["attention"], r["scoring"] or "", r["budget"] or 0)):
    print(f"{r['state']:8} {r['tokens']:7} {r['attention']:12} {r['scoring'] or '':6} {r['budget'] or '':4}"
          f" cos median {f(r['median_cosine'], '.6f')} worst {f(r['worst_cosine'], '.6f')}"
          f" | rel L2 median {f(r['median_rel_l2'], '.3e')} worst {f(r['worst_rel_l2'], '.3e')} ({r['worst_rel_l2_tensor']})"
          f" | loss {f(r['sparse_loss'], '.4f')} vs {f(r['dense_loss'], '.4f')}")
EOF
echo "wall $((SECONDS - start)) s"
