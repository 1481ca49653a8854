#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The recipe's last check: transformers loads the exported HF folder as it is and answers.

Loads the folder with AutoModelForCausalLM / AutoTokenizer (bf16 weights as exported, computed in
float32), prints its RoPE, and asks it held-out record questions through the tokenizer's chat
template (greedy); prints the share answered with the right value. Optionally, the mean
next-token loss of the first --eval-tokens tokens of an OOMBTOKS eval file.
"""

import argparse
import json
import random
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_small_model import chat_conversations  # noqa: E402  (the same generator, other seeds)


def read_tokens(path, n):
    with open(path, "rb") as f:
        head = f.read(32)
        magic, version, header, count = head[:8], *struct.unpack("<IIQ", head[8:24])
        assert magic == b"OOMBTOKS", path
        f.seek(header)
        n = min(n, count)
        return list(struct.unpack("<%dI" % n, f.read(4 * n)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--eval-file")
    ap.add_argument("--eval-tokens", type=int, default=8192)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(a.folder)
    model = AutoModelForCausalLM.from_pretrained(a.folder, dtype=torch.float32).to(device).eval()
    result = {"folder": a.folder, "rope_parameters": model.config.rope_parameters,
              "max_position_embeddings": model.config.max_position_embeddings}
    right = 0
    for conv in list(chat_conversations(a.questions, seed=987654))[: a.questions]:
        msgs = conv["messages"][:2]  # system + the records and the first question
        want = conv["messages"][2]["content"]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
        ids = (ids["input_ids"] if hasattr(ids, "keys") else ids).to(device)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False)
        got = tok.decode(out[0, ids.shape[1]:]).strip()
        right += got.startswith(want)
    result["answered_right"] = right
    result["questions"] = a.questions
    if a.eval_file:
        ids = torch.tensor([read_tokens(a.eval_file, a.eval_tokens)], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
        result["transformers_loss_first_tokens"] = {"tokens": ids.shape[1], "loss": loss.item()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
