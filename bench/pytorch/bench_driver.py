#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch package's step on the GPU: oomb.torch.ChunkRecurrent over an HF model built from one
of configs/*.json (random init, bf16, on the GPU), one forward + backward per length (no optimizer
update, as strong_baseline.py measures), after one warm-up step (at the smallest length unless
--warmup-tokens says).

Prints one JSON object per length in strong_baseline.py's shape ("len", "s", "tok_per_s",
"peak_bytes") plus the device's own view ("device_used_bytes": cudaMemGetInfo's total - free at the
end of the step, CUDA context and torch's cache included) and the pools' bytes; with --jsonl appends
rows in the results format (system "oomb-torch", phase "fwd_bwd"). The pools come from torch's
caching allocator, so max_memory_allocated counts everything oomb allocates on the device; with
--offload or --sparse-budget the pages are the session's (oomb.paged: device slots from
cudaMalloc, homes in host memory), so device_used_bytes is the figure that tells flatness.

  python bench_driver.py --config configs/qwen2.5-7b.json --lengths 32768 131072 --chunk 4096 --jsonl out.jsonl
  python bench_driver.py ... --offload pageable [--near-pages N] [--sparse-budget 64]
"""
import argparse
import datetime
import json
import sys
import time

import torch
import transformers

from oomb.torch import ChunkRecurrent, Offload, SparseConfig


def build(config_path: str):
    with open(config_path) as f:
        raw = json.load(f)
    cls = transformers.CONFIG_MAPPING[raw["model_type"]]
    raw = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "dtype", "transformers_version")}
    cfg = cls(**raw)
    cfg.max_position_embeddings = 1 << 23
    cfg.use_cache = False
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    return model, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="an HF config.json (configs/*.json)")
    ap.add_argument("--name", default="", help="the model's name in the rows (default: the config's file name)")
    ap.add_argument("--lengths", type=int, nargs="+", required=True)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--keep", action="store_true", help="keep stage 1's attention outputs for stage 2 "
                    "(ChunkRecurrent(keep_attention_outputs=True))")
    ap.add_argument("--offload", choices=["pinned", "pageable"], default=None,
                    help="stream the pages through device slots from homes in this host memory")
    ap.add_argument("--near-pages", type=int, default=0,
                    help="offload: K/V slots (as many gradient slots); 0: the C++ trainer's default")
    ap.add_argument("--sparse-budget", type=int, default=None,
                    help="page-sparse attention: scored past pages per 128-query tile (sink 1, local 1)")
    ap.add_argument("--autograd-weight-grads", action="store_true",
                    help="stage 2's weight gradients through autograd's accumulation "
                    "(ChunkRecurrent(weight_grads_in_gemm=False)), for an A/B")
    ap.add_argument("--warmup-tokens", type=int, default=0,
                    help="the warm-up step's length (default: the smallest of --lengths)")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--deadline-s", type=float, default=500, help="skip lengths once this much time has passed")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    name = a.name or a.config.rsplit("/", 1)[-1].removesuffix(".json")
    t_start = time.time()
    model, cfg = build(a.config)
    sparse = SparseConfig(budget=a.sparse_budget) if a.sparse_budget is not None else None
    # --near-pages 0: the C++ trainer's default slots (Offload's kv_slots left out)
    offload = Offload(kv_slots=a.near_pages or None, homes=a.offload) if a.offload else None
    cr = ChunkRecurrent(model, chunk=a.chunk, page=a.page, max_tokens=max(a.lengths), keep_attention_outputs=a.keep,
                        sparse=sparse, offload=offload, weight_grads_in_gemm=not a.autograd_weight_grads)
    pools = cr.store.kv_pool.numel() * 2 + cr.store.grad_pool.numel() * 4 if cr.store is not None else 0
    print(json.dumps({"model": name, "built_s": round(time.time() - t_start, 1), "pool_bytes": pools,
                      "keep_attention_outputs": a.keep, "offload": str(offload), "sparse": str(sparse)}), flush=True)

    def step(n):
        ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
        torch.cuda.synchronize()
        t0 = time.time()
        loss = cr.forward_backward(ids)
        torch.cuda.synchronize()
        return time.time() - t0, float(loss)

    step(a.warmup_tokens or min(a.lengths))  # warm-up: kernels' first launches, the allocator's cache
    model.zero_grad(set_to_none=True)
    rows = []
    for n in a.lengths:
        if time.time() - t_start > a.deadline_s:
            row = {"len": n, "skipped": "deadline"}
        else:
            torch.cuda.reset_peak_memory_stats()
            try:
                dt, loss = step(n)
                free, total = torch.cuda.mem_get_info()
                row = {"len": n, "s": round(dt, 3), "tok_per_s": round(n / dt), "loss": round(loss, 4),
                       "peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                       "peak_bytes": torch.cuda.max_memory_allocated(), "device_used_bytes": total - free,
                       "pool_bytes": pools}
                if cr.session is not None:  # what the session moved and holds (oomb_cuda_paged_stats)
                    row["session"] = cr.memory()
            except torch.OutOfMemoryError:
                row = {"len": n, "oom": True}
            model.zero_grad(set_to_none=True)
        print(json.dumps({"model": name, "keep": a.keep, "weight_grads_in_gemm": not a.autograd_weight_grads, **row}),
              flush=True)
        rows.append(row)
        if row.get("oom"):
            break
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            for r in rows:
                if "s" not in r:
                    continue
                f.write(json.dumps({"system": "oomb-torch", "model": name, "tokens": r["len"], "chunk": a.chunk,
                                    "page": a.page, "attention": "sparse" if sparse else "dense",
                                    "sparse_budget": a.sparse_budget, "offload": offload is not None,
                                    "home_memory": a.offload,
                                    "near_pages": (r.get("session") or {}).get("near_kv_slots", 0),
                                    "session": r.get("session"),
                                    "keep_attention_outputs": a.keep, "weight_grads_in_gemm": not a.autograd_weight_grads,
                                    "phase": "fwd_bwd",
                                    "step_s": r["s"], "tok_per_s": r["tok_per_s"], "loss": r["loss"],
                                    "peak_gpu_bytes": r["peak_bytes"], "device_used_bytes": r["device_used_bytes"],
                                    "pool_bytes": r["pool_bytes"], "device": torch.cuda.get_device_name(),
                                    "torch": torch.__version__,
                                    "transformers": transformers.__version__, "commit": a.commit,
                                    "date": datetime.date.today().isoformat()}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
