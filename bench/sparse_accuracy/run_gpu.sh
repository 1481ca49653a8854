#!/usr/bin/env bash
# The sparse accuracy study in one GPU call (issue 13, "Accuracy, measured"). Staged by
# bench/sparse_accuracy/stage.sh into .gpu/sparse-accuracy (carry that folder):
#   bash .gpu/sparse-accuracy/run_gpu.sh
# 1. Trains the tiny model on kv-recall: a short run (no filler after the first chunk, so recall
#    is learnt fast: the CPU reached 0.60 in 400 steps, below ln 6 = 1.79), then from its
#    checkpoint, side by side, the long runs whose logs are the loss curves: dense (its checkpoint
#    is the trained model), page-sparse (TRAIN_BUDGET) and the control without past pages (budget,
#    sink and local 0). Each stops at a step boundary after its seconds (SIGTERM: exit 143, with
#    its checkpoint) if its steps are not done.
# 2. For the trained model and for random initialisation, at each of TOKENS: one step at --lr 0
#    with --dump-grads, dense twice (the second run gives the run-to-run floor: dQ is summed with
#    atomics) and page-sparse for each budget x scoring; compare.py then sets each dump against the
#    state's first dense dump. A budget that covers every past page is dense: recorded, not run.
# The random model's runs start beside the training, the trained model's once its training ends.
# Environment (all optional):
#   DEADLINE_S  seconds for the runs (420; the comparisons after them take ~20 s): runs not started
#               by then are skipped, and said so
#   JOBS        gradient runs at once on the GPU (4; the model is tiny), beside the training runs
#   TOKENS      "65536 262144"   BUDGETS "16 64 256"   SCORINGS "quest mean"
#   CHUNK 2048, PAGE 128, SINK 1, LOCAL 1, TILE 128 (x GQA 2 = 256 query rows: whole blocks)
#   SHORT_TOKENS 128, SHORT_CHUNK 16, SHORT_PAGE 16, SHORT_STEPS 1000, SHORT_S 60, SHORT_LR 3e-3:
#               the short run (the README demo's first part: later chunks hold only questions and
#               answers)
#   TRAIN_TOKENS 16384, TRAIN_STEPS 1000, TRAIN_S 150, TRAIN_BUDGET 16, LR 1e-3: the long runs
#               (chunk CHUNK, page PAGE)
#   WARMUP 20, SEED 1234 (both phases); EVAL_SEED 4321: the gradient runs' data and random
#               initialisation
#   OFFLOAD=1   the gradient runs stream their pages (--offload)
#   CONFIG      the model (the staged configs/tiny-d64.json); DEVICE cuda (cpu: to try the script
#               itself at small sizes on a CPU build, see docs/sparse.md)
# Results in $OUT: env.txt, train.jsonl (every training step, "run": short|dense|sparse|control),
# runs.jsonl (one line per gradient run, skipped ones included), tensors.jsonl and summary.jsonl
# (compare.py's lines), log.txt (each oomb-train run's output, under its name).
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
JOBS=${JOBS:-4}
TOKENS=${TOKENS:-65536 262144}
BUDGETS=${BUDGETS:-16 64 256}
SCORINGS=${SCORINGS:-quest mean}
CHUNK=${CHUNK:-2048} PAGE=${PAGE:-128} SINK=${SINK:-1} LOCAL=${LOCAL:-1} TILE=${TILE:-128}
SHORT_TOKENS=${SHORT_TOKENS:-128} SHORT_CHUNK=${SHORT_CHUNK:-16} SHORT_PAGE=${SHORT_PAGE:-16}
SHORT_STEPS=${SHORT_STEPS:-1000} SHORT_S=${SHORT_S:-60} SHORT_LR=${SHORT_LR:-3e-3}
TRAIN_TOKENS=${TRAIN_TOKENS:-16384} TRAIN_STEPS=${TRAIN_STEPS:-1000} TRAIN_S=${TRAIN_S:-150}
TRAIN_BUDGET=${TRAIN_BUDGET:-16}
LR=${LR:-1e-3} WARMUP=${WARMUP:-20} SEED=${SEED:-1234} EVAL_SEED=${EVAL_SEED:-4321}
PY=${PY:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=python3
# cuBLASLt is not carried: the toolkit's, else PyTorch's copy.
cublas_dir=/usr/local/cuda/lib64
[ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT" "$WORK"
rm -rf "${WORK:?}"/* "$OUT"/{train,runs,tensors,summary}.jsonl "$OUT/log.txt"  # this call's files only
start=$SECONDS
note() { echo "$*" | tee -a "$OUT/env.txt"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "commit $(cat "$here/COMMIT")"
  ldd "$bin" | grep -E "cublas|not found"
  echo "config $(basename "$CONFIG") on $DEVICE; gradient runs: tokens $TOKENS, chunk $CHUNK, page $PAGE, budgets" \
       "$BUDGETS, sink $SINK, local $LOCAL, tile $TILE, scorings $SCORINGS, $JOBS at once, deadline $DEADLINE_S s"
  echo "short run: $SHORT_TOKENS tokens, chunk $SHORT_CHUNK, page $SHORT_PAGE, lr $SHORT_LR, <= $SHORT_STEPS steps in" \
       "<= $SHORT_S s; long runs: $TRAIN_TOKENS tokens, lr $LR, sparse budget $TRAIN_BUDGET, <= $TRAIN_STEPS steps in" \
       "<= $TRAIN_S s"
} 2>&1 | tee "$OUT/env.txt"
# Mean-key runs need oomb-train's --scoring; without it only Quest (the default) runs.
help=$("$bin" --help)
if [[ $help == *--scoring* ]]; then has_scoring=1; else has_scoring=0; note "this oomb-train has no --scoring: Quest only"; fi

common=(--config "$CONFIG" --synthetic kv-recall --device "$DEVICE" --quiet)
sparse_flags() { echo --sparse-budget "$1" --sink "$SINK" --local "$LOCAL" --tile "$TILE"; }
left() { echo $((DEADLINE_S - (SECONDS - start))); }

# train NAME TOKENS CHUNK PAGE STEPS SECONDS LR [flags...]: a training run, its log's lines
# tagged with its name into WORK/train-NAME.jsonl (train.jsonl gathers them at the end: concurrent appends of long
# writes could interleave). --foreground: timeout signals oomb-train alone, once; without it the
# process group gets a second SIGTERM, which ends the run at once, without its checkpoint.
train() {
  local name=$1 tokens=$2 chunk=$3 page=$4 steps=$5 seconds=$6 lr=$7
  shift 7
  timeout --foreground --preserve-status -k 30 -s TERM "$seconds" "$bin" "${common[@]}" --seq-len "$tokens" \
      --chunk "$chunk" --page "$page" --steps "$steps" --warmup "$WARMUP" --lr "$lr" --seed "$SEED" \
      --out "$WORK/train-$name" "$@" >"$WORK/train-$name.log" 2>&1
  local rc=$?
  "$PY" - "$WORK/train-$name/log.jsonl" "$name" "$rc" >"$WORK/train-$name.jsonl" <<'EOF'
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

# The long runs, from the short run's checkpoint, once the short run has ended (polled by launch).
long_started=0 train_dense_pid=
start_long_runs() {
  ((long_started == 0)) && ! kill -0 "$short_pid" 2>/dev/null || return 0
  long_started=1
  local init=$WORK/train-short/checkpoint
  [ -e "$init" ] || { note "the short run left no checkpoint (see log.txt): no long runs, no trained model"; return 0; }
  train dense "$TRAIN_TOKENS" "$CHUNK" "$PAGE" "$TRAIN_STEPS" "$TRAIN_S" "$LR" --init "$init" &
  train_dense_pid=$!
  train sparse "$TRAIN_TOKENS" "$CHUNK" "$PAGE" "$TRAIN_STEPS" "$TRAIN_S" "$LR" --init "$init" \
      $(sparse_flags "$TRAIN_BUDGET") &
  train control "$TRAIN_TOKENS" "$CHUNK" "$PAGE" "$TRAIN_STEPS" "$TRAIN_S" "$LR" --init "$init" \
      --sparse-budget 0 --sink 0 --local 0 --tile "$TILE" &
}

# Starts a gradient run once fewer than JOBS are running (training runs are not counted).
grad_pids=()
launch() {
  while :; do
    start_long_runs
    local live=0 p
    for p in "${grad_pids[@]}"; do kill -0 "$p" 2>/dev/null && live=$((live + 1)); done
    ((live < JOBS)) && break
    sleep 1
  done
  "$@" &
  grad_pids+=($!)
}

run_name() { echo "$1-$2-$3${4:+-$4}${5:+-$5}"; }  # STATE TOKENS ATTENTION [BUDGET [SCORING]]

# grad STATE TOKENS ATTENTION BUDGET SCORING: one step at --lr 0 with --dump-grads, then its record.
grad() {
  local state=$1 tokens=$2 attention=$3 budget=$4 scoring=$5
  local name
  name=$(run_name "$@")
  local args=("${common[@]}" --seq-len "$tokens" --chunk "$CHUNK" --page "$PAGE" --steps 1 --lr 0 --seed "$EVAL_SEED"
              --out "$WORK/$name" --dump-grads "$WORK/$name.safetensors")
  [ "$state" = trained ] && args+=(--init "$WORK/train-dense/checkpoint")
  [ "${OFFLOAD:-0}" = 1 ] && args+=(--offload)
  [ "$attention" = sparse ] && args+=($(sparse_flags "$budget"))
  [ -n "$scoring" ] && [ "$has_scoring" = 1 ] && args+=(--scoring "$scoring")
  local t0=$SECONDS rc
  timeout --foreground -k 10 "$(($(left) > 20 ? $(left) - 10 : 10))" "$bin" "${args[@]}" >"$WORK/$name.log" 2>&1
  rc=$?
  record "$state" "$tokens" "$attention" "$budget" "$scoring" "rc $rc" $((SECONDS - t0))
}

# record STATE TOKENS ATTENTION BUDGET SCORING NOTE SECONDS: the run's line for runs.jsonl (with
# the step's loss and pages from its log.jsonl, if it ran) into WORK/NAME.json, which is also
# compare.py's --meta; runs.jsonl gathers them at the end (no concurrent appends).
record() {
  "$PY" - "$@" "$WORK/$(run_name "$@")" <<'EOF' >"$WORK/$(run_name "$@").json"
import json, sys
state, tokens, attention, budget, scoring, note, seconds, run = sys.argv[1:9]
r = {"state": state, "tokens": int(tokens), "attention": attention, "budget": int(budget) if budget else None,
     "scoring": scoring or None, "note": note, "seconds": int(seconds)}
try:
    step = [json.loads(l) for l in open(run + "/log.jsonl") if l.strip()][-1]
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

# 1. The short run, then the long runs (started by launch's polling); the random model's runs
#    beside them, the trained model's after the dense long run.
train short "$SHORT_TOKENS" "$SHORT_CHUNK" "$SHORT_PAGE" "$SHORT_STEPS" "$SHORT_S" "$SHORT_LR" &
short_pid=$!
grad_runs random
until ((long_started)); do start_long_runs; sleep 1; done
[ -n "$train_dense_pid" ] && wait "$train_dense_pid"
if [ -e "$WORK/train-dense/checkpoint" ]; then
  grad_runs trained
else
  note "no trained checkpoint (see log.txt): trained-model runs skipped"
fi
wait
cat "$WORK"/train-*.jsonl >"$OUT/train.jsonl"
cat "$WORK"/*.json >"$OUT/runs.jsonl"
for log in "$WORK"/*.log; do echo "== $(basename "$log" .log)"; cat "$log"; done >"$OUT/log.txt"
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
