# SPDX-License-Identifier: Apache-2.0
"""Trains a Hugging Face causal LM chunk-recurrently on 4,096-token sequences (CPU, a few seconds a step).
python examples/train_long.py [tokens] [steps]; a model of your own: AutoModelForCausalLM.from_pretrained(...)."""
import sys

import torch
import transformers

from oomb.torch import ChunkRecurrent, print_progress

# snippet-begin: train
tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
config = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens)
model = transformers.Qwen2ForCausalLM(config).train()  # float32 on the CPU; no dropout in this config
cr = ChunkRecurrent(model, chunk=512, page=128, max_tokens=tokens,  # the plan: pages for `tokens`, up front
                    progress=print_progress(every=2.0))  # a line on stderr every 2 s within a step
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
data = torch.randint(0, config.vocab_size, (1, tokens))
for step in range(steps):
    loss = cr.forward_backward(data)  # both stages; .grad is full-sequence backprop's
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    mem = cr.memory()
    print(f"step {step + 1}: loss {float(loss):.4f} | pages at most {mem['kv_high_water']} K/V + "
          f"{mem['grad_high_water']} gradient of {mem['kv_capacity']} | {mem['bytes_reserved'] / 2**20:.1f} MiB")
# snippet-end: train
