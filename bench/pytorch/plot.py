#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws docs/img/pytorch-<model>.png from the committed JSON lines of bench/pytorch/run_gpu.sh
(bench/pytorch/results/*.jsonl): tokens/s and peak GPU memory against the context, one line per
system (the PyTorch package "oomb-torch", the C++ trainer "oomb", the competitor "pytorch"). Where a
point was measured more than once, the latest run's row is drawn. Standard library only: the
rasteriser and PNG encoder of tools/plot_run.py.

    python3 bench/pytorch/plot.py
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import plot_run  # noqa: E402

SYSTEMS = {"oomb-torch": ("package", (214, 39, 40)), "oomb": ("C++ trainer", (31, 119, 180)),
           "pytorch": ("PyTorch", (90, 90, 90))}


def load():
    latest = {}
    for path in sorted((ROOT / "bench/pytorch/results").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "step_s" not in r or r.get("system") not in SYSTEMS:
                continue
            key = (r["model"], r["system"], r["tokens"])
            if key not in latest or r["run"] >= latest[key]["run"]:
                latest[key] = r
    return latest


def main():
    rows = load()
    for model in sorted({m for m, _, _ in rows}):
        series_t, series_m = [], []
        for system, (label, colour) in SYSTEMS.items():
            pts = sorted((n / 1024, r) for (m, s, n), r in rows.items() if m == model and s == system)
            if not pts:
                continue
            series_t.append(plot_run.Series(label, colour, [(x, r["tok_per_s"]) for x, r in pts], True))
            series_m.append(plot_run.Series(label, colour, [(x, r["peak_gpu_bytes"] / 2**30) for x, r in pts], True))
        ps = [plot_run.Panel("tokens/s (forward + backward)", series_t),
              plot_run.Panel("peak GPU memory, GiB", series_m)]
        size = plot_run.layout(ps)
        xs = [x for s in series_t for x, _ in s.points]
        lo, hi = min(xs), max(xs)
        lo, hi = (lo - 8, hi + 8) if lo == hi else (lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05)
        canvas = plot_run.draw(ps, size, f"{model}: one step, H200", (lo, hi), xlabel="context, K tokens")
        out = ROOT / f"docs/img/pytorch-{model}.png"
        out.write_bytes(plot_run.png(canvas))
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
