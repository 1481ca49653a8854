#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes the recipe's starting point offline: a corpus, a tokenizer trained on it, and a small random
HF model folder, so docs/recipes/long-context.md runs on a machine with no network.

  corpus.jsonl     {"text": ...} documents: the repository's own Markdown and source files
                   (Apache-2.0, ours), one document per folder (files concatenated)
  eval.jsonl       held-out documents: every --holdout-th file, one document per folder
  chat.jsonl       {"messages": [...]} conversations: a user lists records "key K has value V" and
                   asks for some of them; the assistant answers (the SFT mix: loss on the answers)
  model/           config.json + model.safetensors of a random --family model (head_dim 64, the GPU
                   kernels'), tokenizer.json / tokenizer_config.json (a byte-level BPE trained on
                   the corpus, with a chat template), generation_config.json — what a user's
                   checkpoint folder holds

A real run starts from the user's checkpoint folder and corpus instead; every later command of
the recipe is the same.
"""

import argparse
import json
import os
import random

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus_documents(root, holdout):
    """One document per folder of the tree: its files concatenated, each under a "// file:" line
    (long documents with names that recur far apart: what a long context helps to predict).
    Every `holdout`-th file goes to the folder's held-out document instead. Returns (train, eval)."""
    exts = (".md", ".hpp", ".cuh", ".cu", ".cpp", ".py", ".sh", ".txt", ".cmake")
    skip = {".git", ".venv", "build", "out", ".gpu", ".deps", "fixtures", "results", "runs", "__pycache__"}
    train, held = [], []
    index = 0
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("build") and not d.startswith("."))
        parts = {False: [], True: []}
        for f in sorted(files):
            if not f.endswith(exts):
                continue
            path = os.path.join(base, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            index += 1
            parts[index % holdout == 0].append("// file: %s\n%s" % (os.path.relpath(path, root), text))
        for is_held, out in ((False, train), (True, held)):
            doc = "\n".join(parts[is_held])
            if len(doc) > 2000:
                out.append(doc)
    return train, held


def chat_conversations(n, seed):
    rng = random.Random(seed)
    words = ["amber", "basil", "cedar", "delta", "ember", "flint", "garnet", "harbor", "indigo", "juniper",
             "kestrel", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "sable", "tundra"]
    for _ in range(n):
        keys = rng.sample(range(1000), 24)
        values = {k: rng.choice(words) for k in keys}
        records = "\n".join("key %d has value %s" % (k, values[k]) for k in keys)
        asked = rng.sample(keys, 4)
        messages = [{"role": "system", "content": "You answer from the records you were given."},
                    {"role": "user", "content": records + "\n\nWhat is the value of key %d?" % asked[0]},
                    {"role": "assistant", "content": values[asked[0]]}]
        for k in asked[1:]:
            messages += [{"role": "user", "content": "And key %d?" % k},
                         {"role": "assistant", "content": values[k]}]
        yield {"messages": messages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for corpus.jsonl, chat.jsonl and model/")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                    help="the tree the corpus is read from (default: this repository)")
    ap.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "mistral"])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--conversations", type=int, default=2000)
    ap.add_argument("--holdout", type=int, default=10, help="every N-th file is held out (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    docs, held = corpus_documents(os.path.abspath(a.root), a.holdout)
    for name, part in (("corpus.jsonl", docs), ("eval.jsonl", held)):
        with open(os.path.join(a.out, name), "w") as f:
            for d in part:
                f.write(json.dumps({"text": d}) + "\n")
    with open(os.path.join(a.out, "chat.jsonl"), "w") as f:
        for c in chat_conversations(a.conversations, a.seed):
            f.write(json.dumps(c) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    model_dir = os.path.join(a.out, "model")
    fast.save_pretrained(model_dir)

    heads = a.hidden // 64
    cfg = dict(vocab_size=len(fast), hidden_size=a.hidden, intermediate_size=4 * a.hidden, num_hidden_layers=a.layers,
               num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
               max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
               eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if a.family == "mistral":
        cfg["sliding_window"] = None
    if a.family in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
    if a.family == "qwen2":
        cfg.pop("head_dim")
    config = AutoConfig.for_model(a.family, **cfg)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(model_dir)
    print("%s: %d documents (%d characters), %d held out, %d conversations, a %d-token BPE, a random %s model of %.1fM parameters "
          "(transformers %s)" % (a.out, len(docs), sum(map(len, docs)), len(held), a.conversations, len(fast), a.family,
                                 sum(p.numel() for p in model.parameters()) / 1e6, transformers.__version__))


if __name__ == "__main__":
    main()
