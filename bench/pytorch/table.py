#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The side-by-side table of one bench/pytorch/run_gpu.sh call, from its three logs (JSON lines of
bench_driver.py, bench_trainer and strong_baseline.py; any may be missing): per length the step
time of the PyTorch package, of the C++ trainer and of the competitor, the package's tokens/s over
each of the others', and each one's peak device memory.

  table.py TORCH_LOG TRAINER_LOG PYTORCH_LOG"""
import json
import sys


def rows(path, length_key, time_key):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if length_key not in r:
                    continue
                if time_key in r:
                    out[r[length_key]] = r
                elif r.get("oom"):
                    out.setdefault(r[length_key], "OOM")
                elif "skipped" in r:
                    out.setdefault(r[length_key], "skipped")
    except FileNotFoundError:
        pass
    return out


def main(torch_log, trainer_log, pytorch_log):
    ours = rows(torch_log, "len", "s")
    cpp = rows(trainer_log, "tokens", "step_s")
    base = rows(pytorch_log, "len", "s")
    head = (f"{'tokens':>8} {'package s':>9} {'C++ s':>8} {'pytorch s':>9} {'vs pytorch':>10} {'vs C++':>7} "
            f"{'package GiB':>11} {'C++ GiB':>8} {'pytorch GiB':>11}")
    print(head)
    print("-" * len(head))

    def sec(r, key):
        return f"{r[key]:.2f}" if isinstance(r, dict) else (r or "-")

    def gib(r, key):
        return f"{r[key] / 2**30:.2f}" if isinstance(r, dict) else "-"

    for n in sorted(set(ours) | set(cpp) | set(base)):
        o, c, b = ours.get(n), cpp.get(n), base.get(n)
        vs_b = f"{b['s'] / o['s']:.2f}" if isinstance(o, dict) and isinstance(b, dict) else "-"
        vs_c = f"{c['step_s'] / o['s']:.2f}" if isinstance(o, dict) and isinstance(c, dict) else "-"
        print(f"{n:>8} {sec(o, 's'):>9} {sec(c, 'step_s'):>8} {sec(b, 's'):>9} {vs_b:>10} {vs_c:>7} "
              f"{gib(o, 'peak_bytes'):>11} {gib(c, 'peak_gpu_bytes'):>8} {gib(b, 'peak_bytes'):>11}")
    print("vs: the package's tokens/s over the other's (> 1: faster). GiB: the package's and PyTorch's "
          "max_memory_allocated (the package's pools come from torch's allocator), the C++ trainer's cudaMemGetInfo")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
