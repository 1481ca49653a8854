#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws docs/img/trainer_<model>.png from the trainer benchmark's committed JSON lines
(bench/trainer/results/*.jsonl, one object per measured step, oomb's and PyTorch's): peak GPU
memory and tokens/s against the context, per model, one line per system and configuration, H200 rows only
(ours: chunk, in place or offload with its near slots and its homes (pinned, or pageable; fp32 or bf16
gradient homes), attention recomputed or kept, and for page-sparse rows the
budget, sink, local, tile and scoring: one line each). Where a point was measured more than once,
the latest row (by date, then file name and line) is drawn. Prints each line's memory growth: the
least-squares slope of peak_gpu_bytes against tokens, in MB (10^6 bytes) per 10K tokens. A sparse
request whose budget covered every past page at a length ran dense there (dense_because) and is
drawn with the dense rows.

    python3 bench/trainer/plot.py            # needs matplotlib
"""
import json
import pathlib

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "bench/trainer/results"
GIB = 2**30


def load():
    rows = []
    for path in sorted(RESULTS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return [r for r in rows if r.get("phase") == "fwd_bwd" and r.get("step_s") and "H200" in device(r)]


def device(r):
    """The row's GPU. Rows before the field (2026-12-07) ran on the H200, except those of 2026-12-06,
    when only H100s came (docs/benchmarks.md says which)."""
    return r.get("device") or ("NVIDIA H100 80GB HBM3" if r.get("date") == "2026-12-06" else "NVIDIA H200")


def series_name(r):
    if r["system"] != "oomb":
        return r["system"]
    # The near tier's size changes the device bytes by a constant: a series holds one size.
    where = f"offload, {r['near_pages']} slots" if r.get("offload") else "in place"
    if r.get("offload") and r.get("home_memory") == "pageable":
        where += ", pageable homes"
    if r.get("offload") and r.get("grad_homes", "fp32") != "fp32":
        where += f", {r['grad_homes']} gradient homes"
    attention = "keep" if r.get("keep_attention_outputs") else "recompute"
    name = f"oomb, chunk {r['chunk']}, {where}, {attention}"
    if r.get("attention") == "sparse":
        name += f", sparse {r['budget']}+{r['sink']}+{r['local']} ({r['scoring']}, tile {r['tile']})"
    return name


def growth_mb_per_10k(pts):
    """Least-squares slope of peak_gpu_bytes against tokens (None below two lengths)."""
    if len(pts) < 2:
        return None
    xs = [r["tokens"] for r in pts]
    ys = [r["peak_gpu_bytes"] for r in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope * 1e4 / 1e6


def main():
    rows = load()
    if not rows:
        raise SystemExit(f"no fwd_bwd rows under {RESULTS}")
    for model in sorted({r["model"] for r in rows}):
        latest = {}
        for r in sorted((r for r in rows if r["model"] == model), key=lambda r: r.get("date", "")):
            latest[(series_name(r), r["tokens"])] = r
        names = sorted({name for name, _ in latest}, key=lambda n: (n != "pytorch", n))
        fig, (mem_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 5.2))
        for name in names:
            pts = sorted((r for (n, _), r in latest.items() if n == name), key=lambda r: r["tokens"])
            x = [r["tokens"] for r in pts]
            line = "--" if name == "pytorch" else ":" if "sparse" in name else "-"
            style = dict(marker="o", linestyle=line, label=name)
            mem_ax.plot(x, [r["peak_gpu_bytes"] / GIB for r in pts], **style)
            speed_ax.plot(x, [r["tok_per_s"] for r in pts], **style)
            g = growth_mb_per_10k(pts)
            if g is not None:
                print(f"{model}, {name}: memory growth {g:.2f} MB per 10K tokens ({x[0]}..{x[-1]} tokens)")
        for ax in (mem_ax, speed_ax):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1024:g}K"))
            ax.set_xlabel("context (tokens)")
            ax.grid(alpha=0.3)
        mem_ax.set_ylabel("peak GPU memory (GiB)")
        mem_ax.set_ylim(bottom=0)
        speed_ax.set_ylabel("tokens/s (fwd_bwd step)")
        speed_ax.set_ylim(bottom=0)
        # Below both axes, so no series is hidden behind it.
        fig.legend(*mem_ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7, frameon=False)
        fig.suptitle(f"{model}: one forward + backward step on one H200")
        fig.tight_layout(rect=(0, 0.2, 1, 1))
        out = ROOT / f"docs/img/trainer_{model.replace('qwen2.5-', '')}.png"
        fig.savefig(out, dpi=110)
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
