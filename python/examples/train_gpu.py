# SPDX-License-Identifier: Apache-2.0
"""Trains a Hugging Face causal LM at a long context on one GPU (bf16, oomb's CUDA kernels).
python examples/train_gpu.py [MODEL] [tokens] [steps] [--offload]: MODEL is a model folder or hub name
(its weights), or a config.json (random weights; default: the repository's configs/qwen2.5-0.5b.json);
--offload keeps the pages in host memory (flat GPU memory)."""
import pathlib
import sys

import torch
import transformers

from oomb.torch import ChunkRecurrent, Offload

DEFAULT = pathlib.Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-0.5b.json"

# snippet-begin: train
args = [a for a in sys.argv[1:] if not a.startswith("--")]
source = args[0] if len(args) > 0 else str(DEFAULT)
tokens = int(args[1]) if len(args) > 1 else 131072
steps = int(args[2]) if len(args) > 2 else 3
if source.endswith(".json"):  # a config alone: random weights
    config = transformers.AutoConfig.from_pretrained(source)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
model = model.cuda().train()  # bf16 weights on the GPU; no dropout in these configs
# --offload: the pages live in pageable host memory and stream through fixed device slots, so the
# GPU's memory stays the same whatever `tokens` is; without it they are allocated on the GPU, up front.
offload = Offload(homes="pageable") if "--offload" in sys.argv else None
cr = ChunkRecurrent(model, chunk=8192, page=128, max_tokens=tokens, offload=offload)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
data = torch.randint(0, model.config.vocab_size, (1, tokens), device="cuda")  # your tokens here
for step in range(steps):
    loss = cr.forward_backward(data)  # both stages; .grad is full-sequence backprop's
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    free, total = torch.cuda.mem_get_info()
    print(f"step {step + 1}: loss {float(loss):.4f} | {tokens} tokens | GPU used {(total - free) / 2**30:.1f} GiB, "
          f"torch's peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
# snippet-end: train
