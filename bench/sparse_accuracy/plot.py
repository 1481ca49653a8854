#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The sparse accuracy study's table and figures, from one run_gpu.sh call's JSON lines
(train.jsonl, runs.jsonl, summary.jsonl). RESULTS is the call's $OUT folder, or the prefix that
its copies' names share: by default bench/sparse_accuracy/results/2026-12-01-h200- (the committed
H200 call, so results/2026-12-01-h200-train.jsonl and so on):

- prints the Markdown table of docs/sparse.md: per model state, tokens, scoring and budget, the
  share of past pages attended, the step's loss sparse against dense, and the gradient error
  (cosine and relative L2) of the whole gradient as one vector, of the median tensor and of the
  worst, named; the dense repeat gives the run-to-run floor; runs not made are listed with why;
- draws docs/img/sparse_accuracy_loss.png (the kv-recall loss curves: the short warm-start run,
  then the dense, sparse and no-cross-chunk long runs; ln(values) marked) and docs/img/sparse_accuracy_grads.png
  (relative L2 against the budget, median and worst tensor, per state, tokens and scoring).

    python3 bench/sparse_accuracy/plot.py [RESULTS [IMG]]      # needs matplotlib; IMG: docs/img
"""
import json
import math
import pathlib
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
STATES = ("trained", "random")
KV_VALUES = 6  # run_gpu.sh trains kv-recall with its default values per key: ln 6 is chance


def lines(path):
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def tokens_name(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def table(summaries, runs):
    out = ["| model | tokens | attention | past pages attended | loss: sparse / dense | whole gradient: cosine / rel. L2 | "
           "per tensor, median: cosine / rel. L2 | worst tensor: cosine / rel. L2 |",
           "|---|---:|---|---:|---|---|---|---|"]
    order = lambda r: (STATES.index(r["state"]), r["tokens"], r["attention"] != "dense-repeat", r["scoring"] or "",
                       r["budget"] or 0)
    for s in sorted(summaries, key=order):
        if s["attention"] == "dense-repeat":
            what, attended = "dense again (run-to-run floor)", "all"
        else:
            what = f"{s['scoring']}, budget {s['budget']}"
            sel, cand = s.get("sparse_pages_selected"), s.get("sparse_pages_candidate")
            attended = f"{100 * sel / cand:.1f}%" if sel is not None and cand else "—"
        name = lambda t: f"`{t.removeprefix('model.')}`"
        if s["worst_cosine_tensor"] == s["worst_rel_l2_tensor"]:
            worst = f"{fmt(s['worst_cosine'], '.4f')} / {fmt(s['worst_rel_l2'], '.2e')} ({name(s['worst_rel_l2_tensor'])})"
        else:
            worst = (f"{fmt(s['worst_cosine'], '.4f')} ({name(s['worst_cosine_tensor'])}) / "
                     f"{fmt(s['worst_rel_l2'], '.2e')} ({name(s['worst_rel_l2_tensor'])})")
        out.append(f"| {s['state']} | {tokens_name(s['tokens'])} | {what} | {attended} | "
                   f"{fmt(s['sparse_loss'], '.4f')} / {fmt(s['dense_loss'], '.4f')} | "
                   f"{fmt(s['all_cosine'], '.6f')} / {fmt(s['all_rel_l2'], '.2e')} | "
                   f"{fmt(s['median_cosine'], '.6f')} / {fmt(s['median_rel_l2'], '.2e')} | "
                   f"{worst} |")
    for r in sorted(runs, key=order):
        if not r["note"].startswith("rc "):
            out.append(f"| {r['state']} | {tokens_name(r['tokens'])} | {r['scoring']}, budget {r['budget']} | "
                       f"{r['note']} | | | | |")
        elif r["note"] != "rc 0":
            out.append(f"| {r['state']} | {tokens_name(r['tokens'])} | {r['attention']} "
                       f"{r['scoring'] or ''} {r['budget'] or ''} | failed: {r['note']} | | | | |")
    return "\n".join(out)


def training_table(train):
    out = ["| training run | steps | answer loss: first / mean of the last 20 | seconds a step | exit |",
           "|---|---:|---|---:|---|"]
    for run, what in (("short", "short (the warm start)"), ("dense", "dense"), ("sparse", "page-sparse"),
                      ("control", "no past pages (control)")):
        steps = sorted((r["step"], r["loss"], r["seconds"]) for r in train if r.get("run") == run and "loss" in r)
        ends = [r for r in train if r.get("run") == run and "rc" in r]
        rc = ends[-1]["rc"] if ends else None
        exit_ = {0: "all steps", 143: "stopped by TRAIN_S (checkpoint)"}.get(rc, f"rc {rc}")
        if not steps:
            out.append(f"| {what} | 0 | — | — | {exit_} |")
            continue
        last = [l for _, l, _ in steps[-20:]]
        per_step = sum(t for _, _, t in steps[1:]) / max(1, len(steps) - 1)
        out.append(f"| {what} | {steps[-1][0]} | {steps[0][1]:.4f} / {sum(last) / len(last):.4f} | {per_step:.3f} | {exit_} |")
    return "\n".join(out)


def plot_losses(train, values, path):
    fig, (short, long) = plt.subplots(1, 2, figsize=(11, 4), sharey=True, gridspec_kw={"width_ratios": [1, 2]})
    runs = (("short", "C2", "dense, short chunks", short), ("dense", "C0", "dense", long),
            ("sparse", "C1", "page-sparse", long), ("control", "C7", "no past pages (control)", long))
    for run, colour, label, ax in runs:
        steps = [(r["step"], r["loss"]) for r in train if r.get("run") == run and "loss" in r]
        if not steps:
            continue
        x, y = zip(*sorted(steps))
        ax.plot(x, y, color=colour, alpha=0.3, linewidth=0.8)
        k = 20  # running mean: one sequence's answers make a noisy loss
        mean = [sum(y[max(0, i - k + 1) : i + 1]) / len(y[max(0, i - k + 1) : i + 1]) for i in range(len(y))]
        ax.plot(x, mean, color=colour, label=f"{label} (last 20: {mean[-1]:.3f})")
    for ax, title in ((short, "short run (warm start)"), (long, "long runs from its checkpoint")):
        ax.axhline(math.log(values), color="k", linestyle=":", linewidth=1, label=f"ln {values}: no recall")
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend(fontsize=8)
    short.set_ylabel("kv-recall answer loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_grads(summaries, path):
    fig, axes = plt.subplots(1, len(STATES), figsize=(13, 4), sharey=True)
    for ax, state in zip(axes, STATES):
        mine = [s for s in summaries if s["state"] == state]
        for i, tokens in enumerate(sorted({s["tokens"] for s in mine})):
            floor = [s["median_rel_l2"] for s in mine if s["tokens"] == tokens and s["attention"] == "dense-repeat"]
            if floor and floor[0]:
                ax.axhline(floor[0], color=f"C{i}", linestyle=":", linewidth=1,
                           label=f"{tokens_name(tokens)} dense again (median)")
            for scoring, marker in (("quest", "o"), ("mean", "s")):
                pts = sorted((s["budget"], s["median_rel_l2"], s["worst_rel_l2"]) for s in mine
                             if s["tokens"] == tokens and s["scoring"] == scoring)
                if not pts:
                    continue
                b, med, worst = zip(*pts)
                ax.plot(b, med, color=f"C{i}", marker=marker, label=f"{tokens_name(tokens)} {scoring}: median")
                ax.plot(b, worst, color=f"C{i}", marker=marker, linestyle="--", alpha=0.6,
                        label=f"{tokens_name(tokens)} {scoring}: worst tensor")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({s["budget"] for s in mine if s["budget"]}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_yscale("log")
        ax.set_xlabel("budget (scored pages per tile)")
        ax.set_title(f"{state} model")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("relative L2 error of the gradient vs dense")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the data, not over it
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "bench/sparse_accuracy/results/2026-12-01-h200-")
    if pathlib.Path(results).is_dir():
        results = str(pathlib.Path(results)) + "/"
    train, runs, summaries = (lines(pathlib.Path(results + f)) for f in ("train.jsonl", "runs.jsonl", "summary.jsonl"))
    if not summaries and not train:
        raise SystemExit(f"{results}: no train.jsonl or summary.jsonl (a run_gpu.sh call's $OUT, or its files' common prefix)")
    img = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs/img"
    print(training_table(train), end="\n\n")
    print(table(summaries, runs))
    img.mkdir(parents=True, exist_ok=True)
    if train:
        plot_losses(train, KV_VALUES, img / "sparse_accuracy_loss.png")
    if summaries:
        plot_grads(summaries, img / "sparse_accuracy_grads.png")


if __name__ == "__main__":
    main()
