#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The side-by-side table of one run_gpu.sh call, from its two logs (the JSON lines that
bench_trainer and strong_baseline.py print: measured points, and those skipped or out of memory).
Either log may be missing. Ratio = our tokens/s over PyTorch's; PyTorch's TFLOP/s is ours scaled
by the step times (same work per length, bench_trainer's definition).

  table.py OOMB_LOG PYTORCH_LOG"""
import json
import sys


def json_lines(path):
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        pass
    except FileNotFoundError:
        return


def main(oomb_log, torch_log):
    ours, ours_status = {}, {}
    for r in json_lines(oomb_log):
        key = (r["tokens"], r.get("chunk"))
        if "step_s" in r:
            ours[key] = r
        elif r.get("oom"):
            ours_status[key] = "OOM"
        elif "skipped" in r:
            ours_status[key] = "skipped"
    torch, torch_status = {}, {}
    for r in json_lines(torch_log):
        if "len" not in r:
            continue
        if "s" in r:
            torch[r["len"]] = r
        else:
            torch_status[r["len"]] = "OOM" if r.get("oom") else "skipped"
    ours_keys = set(ours) | set(ours_status)
    ours_lengths = {n for n, _ in ours_keys}
    keys = ours_keys | {(n, None) for n in set(torch) | set(torch_status) if n not in ours_lengths}
    keys = sorted(keys, key=lambda k: (k[0], k[1] or 0))
    phases = sorted({r.get("phase", "fwd_bwd") for r in ours.values()})
    print(f"oomb phase: {', '.join(phases) or '-'}; PyTorch: fwd_bwd")
    head = f"{'tokens':>8} {'chunk':>6} {'oomb s':>9} {'pytorch s':>9} {'ratio':>6} {'oomb GiB':>9} {'pytorch GiB':>11} {'oomb TF/s':>9} {'pt TF/s':>8} {'host GiB':>8} {'plan GiB':>8}"
    print(head)
    print("-" * len(head))
    for n, chunk in keys:
        o, t = ours.get((n, chunk)), torch.get(n)
        os_ = f"{o['step_s']:.2f}" if o else ours_status.get((n, chunk), "-")
        ts = f"{t['s']:.2f}" if t else torch_status.get(n, "-")
        ratio = f"{t['s'] / o['step_s']:.2f}" if o and t else "-"
        og = f"{o['peak_gpu_bytes'] / 2**30:.2f}" if o else "-"
        tg = f"{t['peak_bytes'] / 2**30:.2f}" if t else "-"
        otf = f"{o['tflops']:.0f}" if o else "-"
        ttf = f"{o['tflops'] * o['step_s'] / t['s']:.0f}" if o and t else "-"
        hg = f"{o['host_bytes'] / 2**30:.2f}" if o else "-"
        pg = f"{o['planned_gpu_bytes'] / 2**30:.2f}" if o and "planned_gpu_bytes" in o else "-"
        print(f"{n:>8} {chunk or '-':>6} {os_:>9} {ts:>9} {ratio:>6} {og:>9} {tg:>11} {otf:>9} {ttf:>8} {hg:>8} {pg:>8}")
    print("ratio: our tokens/s over PyTorch's (> 1: faster); GiB: peak device memory above the context "
          "(ours: cudaMemGetInfo; PyTorch: max_memory_allocated);\nplan GiB: what train/memory_plan.hpp expected on our GPU")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
