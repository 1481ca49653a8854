#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The side-by-side table of one run_gpu.sh call, from its two logs (the JSON lines that
bench_trainer and strong_baseline.py print: measured points, and those skipped or out of memory).
Either log may be missing. Ratio = our tokens/s over PyTorch's; PyTorch's TFLOP/s is ours scaled
by the step times (same work per length, bench_trainer's definition; a sparse step does less). With
page-sparse rows, the columns of issue 13 follow: attention (dense, or sparse budget/scoring),
scoring time, distinct past pages per chunk-layer (mean / max), live gradient pages at the peak,
exposed transfer time.

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
    if any(r.get("attention") == "sparse" for r in ours.values()):
        sparse_table(ours)
    print("ratio: our tokens/s over PyTorch's (> 1: faster); GiB: peak device memory above the context "
          "(ours: cudaMemGetInfo; PyTorch: max_memory_allocated);\nplan GiB: what trainers/memory_plan.hpp expected on our GPU")


def attention_of(r):
    if r.get("attention") != "sparse":
        return "dense*" if "dense_because" in r else "dense"
    return f"B{r['budget']} S{r['sink']} L{r['local']} Q{r['tile']} {r['scoring']}"


def sparse_table(ours):
    head = (f"{'tokens':>8} {'chunk':>6} {'attention':<24} {'step s':>8} {'score s':>8} {'pages/chunk':>12} "
            f"{'max':>6} {'grad pages':>10} {'exposed s':>9}")
    print()
    print(head)
    print("-" * len(head))
    for (n, chunk), r in sorted(ours.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        score = f"{r['scoring_s']:.3f}" if "scoring_s" in r else "-"
        per_chunk = f"{r['pages_selected_per_chunk']:.1f}" if "pages_selected_per_chunk" in r else "-"
        most = r.get("pages_selected_per_chunk_max", "-")
        print(f"{n:>8} {chunk or '-':>6} {attention_of(r):<24} {r['step_s']:>8.2f} {score:>8} {per_chunk:>12} "
              f"{most:>6} {r.get('live_grad_pages_peak', '-'):>10} {r.get('exposed_transfer_s', 0):>9.3f}")
    print("dense*: the budget covers every past page at that length, so it ran dense (the row's dense_because); "
          "score s: the selector's GPU time (summaries, scoring, top-k; --split);\npages/chunk: distinct past pages a "
          "chunk's tiles select in one layer, mean over the chunks with a past; grad pages: gradient page pairs alive at "
          "the peak")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
