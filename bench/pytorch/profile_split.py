#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where one training step's time goes on the GPU: the package's step (bench_driver.py's
ChunkRecurrent) or PyTorch done well's (strong_baseline.py's), one warm-up step, then one step
under torch.profiler recording only the GPU's activity (CUPTI: kernels, copies, memsets; no CPU
events, so the host runs as unprofiled as it can).

Prints and appends (--jsonl) one row: the step's wall time under the profiler, the GPU's busy time
(the union of its kernel and copy intervals; the rest is the GPU idle, waiting for the host), and
the kernels' time by kind: GEMM (cuBLAS/cuBLASLt), attention (oomb's, cuDNN's, flash), other
(norms, RoPE, SwiGLU, the loss, conversions, copies inside torch) and copies (memcpy, memset), with
the ten costliest kernels. So a gap between two systems splits into kernels that differ and time
the GPU waits.

  python profile_split.py --system torch --config configs/qwen2.5-7b.json --length 32768 [--keep]
  python profile_split.py --system pytorch --config configs/qwen2.5-7b.json --length 32768
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

KINDS = (("attention", ("attention", "flash", "fmha", "sdpa", "cudnn")),
         ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas")))


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, needles in KINDS:
        if any(n in low for n in needles):
            return kind
    return "other"


def package_step(a):
    from bench_driver import build
    from oomb.torch import ChunkRecurrent
    model, cfg = build(a.config)
    cr = ChunkRecurrent(model, chunk=a.chunk, page=128, max_tokens=a.length, keep_attention_outputs=a.keep,
                        weight_grads_in_gemm=not a.autograd_weight_grads)

    def step():
        ids = torch.randint(0, cfg.vocab_size, (1, a.length), device="cuda")
        cr.forward_backward(ids)
        model.zero_grad(set_to_none=True)
    return step


def pytorch_step(a):
    import strong_baseline as sb
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Qwen2Config, Qwen2ForCausalLM
    key = os.path.basename(a.config).removesuffix(".json").removeprefix("qwen2.5-")
    if key not in sb.MODELS:
        sys.exit(f"profile_split.py: strong_baseline.py knows {sorted(sb.MODELS)}, not {key}")
    cfg = Qwen2Config(**sb.MODELS[key], attn_implementation="sdpa", use_cache=False,
                      max_position_embeddings=1 << 23, rope_theta=1e6)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()

    def step():  # strong_baseline.py's step
        ids = torch.randint(0, cfg.vocab_size, (1, a.length + 1), device="cuda")
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            h = model.model(input_ids=ids[:, :a.length]).last_hidden_state[0]
            sb.chunked_loss(h, model.lm_head.weight, ids[0, 1:]).backward()
        model.zero_grad(set_to_none=True)
    return step


def busy_seconds(intervals):
    """The length of the union of [start, end) intervals in microseconds, in seconds."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=["torch", "pytorch"], required=True,
                    help="torch: the package (oomb.torch); pytorch: strong_baseline.py's step")
    ap.add_argument("--config", required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--keep", action="store_true", help="the package keeps stage 1's attention outputs")
    ap.add_argument("--autograd-weight-grads", action="store_true",
                    help="the package's weight gradients through autograd's accumulation (weight_grads_in_gemm=False)")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    step = package_step(a) if a.system == "torch" else pytorch_step(a)
    step()  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.time()
        step()
        torch.cuda.synchronize()
        wall = time.time() - t0
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            events = json.load(g)["traceEvents"]
    by_kind = {"gemm": 0.0, "attention": 0.0, "other": 0.0, "copies": 0.0}
    by_name, intervals = {}, []
    for e in events:
        cat = e.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in e:
            continue
        intervals.append((e["ts"], e["ts"] + e["dur"]))
        kind = kind_of(e["name"]) if cat == "kernel" else "copies"
        by_kind[kind] += e["dur"] / 1e6
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"] / 1e6
    busy = busy_seconds(intervals)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    row = {"system": "oomb-torch" if a.system == "torch" else "pytorch",
           "model": os.path.basename(a.config).removesuffix(".json"), "tokens": a.length, "chunk": a.chunk,
           "keep_attention_outputs": a.keep,
           "weight_grads_in_gemm": a.system == "torch" and not a.autograd_weight_grads, "phase": "fwd_bwd_profile", "wall_s": round(wall, 3),
           "gpu_busy_s": round(busy, 3), "gpu_idle_s": round(wall - busy, 3),
           "kernel_s": {k: round(v, 3) for k, v in by_kind.items()},
           "top": [[n[:120], round(s, 3)] for n, s in top], "kernels": len(intervals),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": a.commit,
           "date": datetime.date.today().isoformat()}
    print(json.dumps(row), flush=True)
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
