#!/usr/bin/env python3
"""The split of one trainer step from split.sh's Nsight Systems reports.

    python3 split.py PREFIX      (PREFIX.bench.jsonl and PREFIX_<report>.csv from split.sh)

Parts: the GPU time projected from the CUDA backend's NVTX ranges, by the range's kind (the name
before the '/': gemm, attention, head, elementwise, embedding, pages, and with sparse attention the
selector's selection; attention split into forward and backward), every kernel outside those ranges ("other kernels": the stall clock, gradient
zeroing, copies between buffers), and the wall clock the compute stream ran no kernel ("no kernel
running": host work, waits for transfers, launch gaps). Transfers (the copy engines' time, on
their own streams, overlapping compute) are listed beside, not in the sum. Prints a table and
writes PREFIX.jsonl: one row in the results format with `split_s` (seconds per part).
SPDX-License-Identifier: Apache-2.0
"""
import csv
import json
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def column(row, *names):
    for n in names:
        if n in row and row[n] != "":
            return float(row[n])
    raise KeyError(f"none of {names} in {sorted(row)}")


def part_of(range_name):
    name = range_name.split(":")[-1].strip()  # nsys may prefix the domain
    kind, _, op = name.partition("/")
    if kind == "attention":
        return "attention forward" if op == "forward" else "attention backward"
    if kind in ("gemm", "head", "elementwise", "embedding", "pages", "selection"):
        return {"gemm": "GEMM (projections)", "head": "LM head + loss",
                "selection": "sparse selection"}.get(kind, kind)
    return None


def main(prefix):
    bench = [json.loads(l) for l in open(prefix + ".bench.jsonl") if l.strip()]
    row = bench[-1]
    step_s = row["step_s"]
    parts = defaultdict(float)
    unknown = defaultdict(float)
    for r in rows(prefix + "_nvtx_gpu_proj_sum.csv"):
        t = column(r, "Total Proj Time (ns)", "Projected Duration (ns)") * 1e-9
        p = part_of(r["Range"])
        if p is None:
            unknown[r["Range"]] += t
        else:
            parts[p] += t
    kernels = sum(column(r, "Total Time (ns)") for r in rows(prefix + "_cuda_gpu_kern_sum.csv")) * 1e-9
    copies = defaultdict(float)
    for r in rows(prefix + "_cuda_gpu_mem_time_sum.csv"):
        copies[r["Operation"].strip("[]")] += column(r, "Total Time (ns)") * 1e-9
    in_ranges = sum(parts.values())
    parts["other kernels"] = max(0.0, kernels - in_ranges)
    parts["no kernel running"] = max(0.0, step_s - max(kernels, in_ranges))
    total = sum(parts.values())
    print(f"{row['model']} {row['tokens']} tokens, chunk {row.get('chunk')}, offload {row.get('offload', False)}, "
          f"keep {row.get('keep_attention_outputs', False)}: step {step_s:.3f} s (profiled)")
    print(f"{'part':<24} {'seconds':>9} {'share':>7}")
    for p, t in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{p:<24} {t:9.3f} {t / step_s:7.1%}")
    print(f"{'sum':<24} {total:9.3f} {total / step_s:7.1%}  (projections may overlap by launch gaps)")
    for op, t in sorted(copies.items()):
        print(f"  transfers, {op}: {t:.3f} s of copy-engine time (overlapping the parts above)")
    for name, t in sorted(unknown.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  other range {name}: {t:.3f} s (not in the sum)")
    out = {k: row.get(k) for k in ("system", "model", "tokens", "attention", "phase", "chunk", "page", "offload",
                                   "keep_attention_outputs", "budget", "sink", "local", "tile", "scoring", "commit",
                                   "date") if k in row}
    out.update(step_s=step_s, split_s=dict(parts), transfer_s=dict(copies), kernel_s=kernels)
    with open(prefix + ".jsonl", "w") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
