#!/usr/bin/env bash
# The accuracy study's comparison, checked on the CPU with real dumps of oomb-train (a few seconds;
# ctest sparse_accuracy.cpu_check):
#   bash bench/sparse_accuracy/cpu_check.sh OOMB_TRAIN [WORK_DIR]
# - dense in place against dense with offload over the same windows, and sparse with every page
#   selected wherever a loss is counted, against dense: the trainer makes the same bits, so
#   compare.py must say cosine 1 and relative L2 0 exactly, for every tensor;
# - sparse keeping 10 and 3 pages of up to 16: both differ from dense, the first less;
# - dumps of two different models: compare.py must refuse them.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: cpu_check.sh OOMB_TRAIN [WORK_DIR]" >&2; exit 2; }
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${2:-$(mktemp -d)}
mkdir -p "$work"
rm -rf "${work:?}"/run-* "$work"/*.jsonl
py=${PYTHON:-python3}

# 300 tokens in chunks of 32, pages of 16: the chunks with questions (all but the last, whose 12
# tokens hold none) see up to 16 past pages, the last 18. A budget covering all 18 is dense and
# oomb-train refuses it; 15 + sink 1 + local 1 covers every page that any counted answer's chunk
# sees, so it selects every page where a loss is counted.
dump() {  # dump NAME CONFIG [flags...]
  local name=$1 config=$2
  shift 2
  "$bin" --config "$config" --synthetic kv-recall --seq-len 300 --chunk 32 --page 16 --window-pages 2 \
      --steps 1 --lr 0 --out "$work/run-$name" --dump-grads "$work/run-$name.safetensors" --quiet "$@" >"$work/run-$name.log" 2>&1 \
    || { cat "$work/run-$name.log" >&2; echo "cpu_check: oomb-train failed for $name" >&2; exit 1; }
}
tiny=$root/configs/tiny.json
dump dense "$tiny"
dump offload "$tiny" --offload --near-pages 4
dump every-page "$tiny" --sparse-budget 15 --sink 1 --local 1 --tile 16
dump ten "$tiny" --sparse-budget 8 --sink 1 --local 1 --tile 16
dump three "$tiny" --sparse-budget 1 --sink 1 --local 1 --tile 16
dump other-model "$root/configs/tiny-d64.json"

for run in offload every-page ten three; do
  "$py" "$here/compare.py" "$work/run-dense.safetensors" "$work/run-$run.safetensors" --meta "{\"run\": \"$run\"}" \
      --tensors "$work/tensors.jsonl" --summary "$work/summary.jsonl"
done
if "$py" "$here/compare.py" "$work/run-dense.safetensors" "$work/run-other-model.safetensors" \
    --tensors /dev/null --summary /dev/null 2>"$work/refusal.txt"; then
  echo "cpu_check: compare.py accepted dumps of two different models" >&2
  exit 1
fi

"$py" - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
tensors = [json.loads(l) for l in open(f"{work}/tensors.jsonl")]
summary = {s["run"]: s for s in map(json.loads, open(f"{work}/summary.jsonl"))}
failures = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
for run, what in (("offload", "dense with offload, same windows"), ("every-page", "sparse, every page selected where a loss is counted")):
    same = [t for t in tensors if t["run"] == run]
    check(len(same) == 26 and all(t["cosine"] == 1.0 and t["rel_l2"] == 0.0 for t in same),
          f"{what}: all 26 tensors cosine 1 and rel L2 0 exactly "
          f"(worst {summary[run]['worst_cosine']!r}, {summary[run]['worst_rel_l2']!r})")
near, far = summary["ten"], summary["three"]
check(0 < near["all_rel_l2"] < far["all_rel_l2"] and near["all_cosine"] > far["all_cosine"],
      f"10 pages nearer dense than 3: rel L2 {near['all_rel_l2']:.3g} < {far['all_rel_l2']:.3g}, "
      f"cosine {near['all_cosine']:.6f} > {far['all_cosine']:.6f}")
check(far["worst_cosine"] < 0.99 and far["worst_rel_l2"] > 1e-2,
      f"3 pages measurably off: worst cosine {far['worst_cosine']:.4f}, worst rel L2 {far['worst_rel_l2']:.3g}")
check(near["dense_loss"] == far["dense_loss"] and far["sparse_loss"] != far["dense_loss"],
      "the dumps' losses: dense the same in both pairs, sparse different")
refusal = open(f"{work}/refusal.txt").read()
check("different tensors" in refusal or "shape" in refusal, f"two models refused: {refusal.strip()[:100]}")
sys.exit(1 if failures else 0)
EOF
