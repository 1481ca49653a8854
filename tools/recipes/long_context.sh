#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# docs/recipes/long-context.md, every command in order: a checkpoint folder and a JSONL corpus to
# a long-context model exported for transformers. Stand-ins for the user's own checkpoint and data
# come first (tools/recipes/make_small_model.py); each later step is what a user runs.
#   RECIPE_OUT   where everything goes (default runs/recipe)
#   OOMB_TRAIN   the oomb-train binary (default build/examples/trainer/oomb-train)
#   PYTHON       a python with transformers and tokenizers (default python3)
#   DEVICE       cuda (default) or cpu;  SEQ, STEPS, CHUNK, WARMUP: the run's shape (32768, 300, 4096, 20)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${RECIPE_OUT:-runs/recipe}
train=${OOMB_TRAIN:-build/examples/trainer/oomb-train}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
seq=${SEQ:-32768}
steps=${STEPS:-300}
chunk=${CHUNK:-4096}
warmup=${WARMUP:-20}
export HF_HUB_OFFLINE=1
mkdir -p "$out"
say() { printf '\n== %s\n' "$*"; }

say "0. a checkpoint folder and a corpus (stand-ins: a random 5M-parameter llama, this repository's text)"
$py tools/recipes/make_small_model.py --out "$out/data"

say "1. text and chat to tokens: the SFT mix (loss on the assistant's answers) and a held-out file"
$py tools/prepare_data.py --tokenizer "$out/data/model" --input "$out/data/corpus.jsonl" --input "$out/data/chat.jsonl" \
  --output "$out/train.bin" --quiet
$py tools/prepare_data.py --tokenizer "$out/data/model" --input "$out/data/eval.jsonl" --output "$out/eval.bin" --quiet

args=(--config "$out/data/model/config.json" --init "$out/data/model" --data "$out/train.bin" --packing documents
      --seq-len "$seq" --chunk "$chunk" --page 128
      --rope-scaling '{"rope_type":"yarn","factor":8,"original_max_position_embeddings":4096}'
      --device "$device")

say "2. the memory plan"
"$train" "${args[@]}" --steps "$steps" --out "$out/run" --plan

say "3. train: $steps steps of $seq tokens, evaluated by position every 50 steps, exported at the end"
rm -rf "$out/run" "$out/hf"
"$train" "${args[@]}" --steps "$steps" --warmup "$warmup" --lr 2e-3 --schedule cosine \
  --eval-data "$out/eval.bin" --eval-every 50 --eval-sequences 3 --out "$out/run" --export "$out/hf" --quiet

say "4. the curves"
python3 tools/plot_run.py "$out/run/log.jsonl" --out "$out/run/plot.png" --title "recipe: $seq tokens, yarn x8, packed SFT mix"

say "5. transformers loads the export as it is"
$py tools/recipes/check_export.py "$out/hf" --questions 32 --eval-file "$out/eval.bin" --eval-tokens 8192 | tee "$out/check_export.json"
