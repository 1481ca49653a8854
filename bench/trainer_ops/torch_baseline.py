#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's plain LM head + cross-entropy (bf16 GEMM into full logits, fp32 softmax
cross-entropy, autograd backward) on bench_lm_head's shapes: median time over CUDA events and the
peak device memory above the inputs. One JSON line per shape, as bench_lm_head prints."""
import json
import sys

import torch
import torch.nn.functional as F

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
dev = torch.device("cuda")
for model, H, V, n in (("Qwen2.5-0.5B", 896, 151936, 4096), ("Qwen2.5-7B", 3584, 151936, 4096)):
    g = torch.Generator(device=dev).manual_seed(1)
    x = (torch.rand(n, H, device=dev, generator=g) * 2 - 1).to(torch.bfloat16).requires_grad_()
    W = ((torch.rand(V, H, device=dev, generator=g) * 2 - 1) * 0.05).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (n,), device=dev, generator=g)

    def step():
        x.grad = None
        W.grad = None
        loss = F.cross_entropy((x @ W.t()).float(), t)
        loss.backward()
        return loss

    step()
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({
        "bench": "lm_head_ce", "device": torch.cuda.get_device_name(), "model": model, "tokens": n,
        "hidden": H, "vocab": V, "variant": "torch_matmul_cross_entropy", "torch": torch.__version__,
        "reps": reps, "median_ms": round(med, 3), "min_ms": round(times[0], 3), "max_ms": round(times[-1], 3),
        "tflops_useful": round(6.0 * n * V * H / (med * 1e-3) / 1e12, 1),
        "peak_above_inputs_bytes": torch.cuda.max_memory_allocated() - base,
        "grad_dtype": "bf16", "mean_loss": float(loss)}), flush=True)
    del x, W, t
    torch.cuda.empty_cache()
