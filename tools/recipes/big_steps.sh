#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# docs/recipes/long-context.md, the 7B- and 8B-shaped configs at 256K tokens on one GPU: the memory
# plan and the time of a step (random weights: a step's time and memory do not depend on them).
# Each run is stopped once its first step is logged: the checkpoint of an 8B model (weights and
# AdamW moments, ~100 GB) is what a real run writes at its end, not what a timing needs.
#   OOMB_TRAIN (default build/examples/trainer/oomb-train), OUT (default runs/big), SEQ (262144)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
train=${OOMB_TRAIN:-build/examples/trainer/oomb-train}
out=${OUT:-runs/big}
seq=${SEQ:-262144}
mkdir -p "$out"
for cfg in ${MODELS:-qwen2.5-7b llama-3.1-8b}; do
  args=(--config "configs/$cfg.json" --synthetic kv-recall --seq-len "$seq" --chunk 4096 --page 128 --offload
        --near-pages 256 --device cuda --steps 2 --lr 1e-5 --out "$out/$cfg")
  printf '\n== %s at %s tokens: the plan\n' "$cfg" "$seq"
  "$train" "${args[@]}" --plan | grep -E "total|optimizer state|fits"
  printf '== %s: one step\n' "$cfg"
  rm -rf "${out:?}/$cfg"
  "$train" "${args[@]}" > "$out/$cfg.txt" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && ! grep -qE "^step +1/" "$out/$cfg.txt"; do sleep 2; done
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  grep -E "^oomb-train|^  RoPE|^  memory plan|^step +1/" "$out/$cfg.txt"
  [ -f "$out/$cfg/log.jsonl" ] && cp "$out/$cfg/log.jsonl" "$out/$cfg.log.jsonl"
done
