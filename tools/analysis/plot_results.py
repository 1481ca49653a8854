#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the figures in docs/img/ from the raw JSON lines committed beside the benchmarks.

    python3 tools/analysis/plot_results.py            # needs matplotlib (pip install matplotlib)

attention_h200.png  bench/attention/results/<prefix>-{bench,sdpa}.jsonl: our paged forward and
                    backward against cuDNN (torch SDPA) at each shape and past, medians with the
                    min-max spread of the same call
lm_head_h200.png    bench/trainer_ops/results/lm_head_*_tiling_curve.jsonl: time against
                    workspace for the fused LM head + cross-entropy plans, materialised logits and
                    PyTorch
attention_documents_h100.png  bench/attention/results/<documents>.jsonl (bench_attention --documents):
                    time per attended key pair with per-document bounds over without, forward and
                    backward, per shape, past and document length; and the trimmed backward's time
                    at query splits 1-4 against split 4 (the plan's for bounded calls)
sparse_backward_h200.png  bench/attention/results/<trace>-trace.csv.gz (bench_attention --trace):
                    where the page-sparse backward's SM time goes, per shape and selection, in
                    hs1's launch order and in the default one (tools/analysis/sparse_trace.py splits it)
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def attention(prefix, out):
    ours = [r for r in rows(ROOT / f"bench/attention/results/{prefix}-bench.jsonl")
            if "bwd_public_paged" in r["tflops_median_min_max"]]
    sdpa = {(r["heads"], r["past"]): r for r in rows(ROOT / f"bench/attention/results/{prefix}-sdpa.jsonl")
            if r["backend"] == "cuDNN"}
    shapes = sorted({r["heads"] for r in ours}, reverse=True)
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), sharey=True)
    for ax, shape in zip(axes, shapes):
        mine = sorted((r for r in ours if r["heads"] == shape), key=lambda r: r["past"])
        labels = [f"{r['past'] // 1024}K" for r in mine]
        series = [
            ("ours fwd", [r["tflops_median_min_max"]["fwd_paged"] for r in mine]),
            ("cuDNN fwd", [sdpa[(shape, r["past"])]["tflops_median_min_max"]["fwd"] for r in mine]),
            ("ours bwd", [r["tflops_median_min_max"]["bwd_public_paged"] for r in mine]),
            ("cuDNN bwd", [sdpa[(shape, r["past"])]["tflops_median_min_max"]["bwd"] for r in mine]),
        ]
        width = 0.2
        for k, (name, vals) in enumerate(series):
            xs = [i + (k - 1.5) * width for i in range(len(labels))]
            med = [v[0] for v in vals]
            err = [[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]]
            ax.bar(xs, med, width, yerr=err, capsize=2, label=name)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(f"{shape}, 4,096-token chunk vs past")
        ax.set_xlabel("past keys")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (median of 5, min-max bars)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Paged attention on one H200 against cuDNN in the same call ({prefix})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def lm_head(out):
    src = sorted((ROOT / "bench/trainer_ops/results").glob("lm_head_*_tiling_curve.jsonl"))[-1]
    data = rows(src)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model, marker in (("Qwen2.5-0.5B", "o"), ("Qwen2.5-7B", "s")):
        ours = sorted((r for r in data if r["model"] == model and "workspace_bytes" in r),
                      key=lambda r: r["workspace_bytes"])
        ax.plot([r["workspace_bytes"] / 2**30 for r in ours], [r["median_ms"] for r in ours],
                marker=marker, label=f"oomb {model} (fused plans, then materialised)")
        torch = [r for r in data if r["model"] == model and r["variant"].startswith("torch")]
        for r in torch:
            ax.scatter([r["peak_above_inputs_bytes"] / 2**30], [r["median_ms"]], marker="x", s=60,
                       color="black")
            ax.annotate(f"PyTorch {model}", (r["peak_above_inputs_bytes"] / 2**30, r["median_ms"]),
                        textcoords="offset points", xytext=(-60, 6), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workspace / peak memory above inputs (GiB)")
    ax.set_ylabel("forward + backward, median ms")
    ax.set_title("LM head + cross-entropy, 4,096 tokens, vocab 151,936, H200")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def documents(name, out):
    data = rows(ROOT / f"bench/attention/results/{name}.jsonl")
    shapes = sorted({r["heads"] for r in data}, reverse=True)
    fig, axes = plt.subplots(2, len(shapes), figsize=(7 * len(shapes), 7.5))
    for col, shape in enumerate(shapes):
        mine = sorted((r for r in data if r["heads"] == shape), key=lambda r: (r["past"], r["documents"]))
        labels = [f"{r['past'] // 1024}K\n{r['documents'] // 1024}K" for r in mine]
        xs = range(len(mine))

        def per_pair(r, side):  # bounded trimmed over unbounded whole window, per attended pair
            m = r["ms_median_min_max"]
            ms = r["trimmed_bwd_ms_at_split_1_to_4"][3] if side == "bwd" else m[f"{side}_trimmed"][0]
            return (ms / r["pairs"]) / (m[f"{side}_plain"][0] / r["pairs_plain"])

        ax = axes[0][col]
        width = 0.38
        for k, side in enumerate(("fwd", "bwd")):
            ax.bar([x + (k - 0.5) * width for x in xs], [per_pair(r, side) for r in mine], width,
                   label={"fwd": "forward", "bwd": "backward (split 4)"}[side])
        ax.axhline(1.05, color="black", lw=0.8, ls="--", label="1.05 (the issue's target)")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_title(f"{shape}: time per attended pair, bounded / unbounded")
        ax.set_xlabel("past keys / document length")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax = axes[1][col]
        width = 0.2
        for k in range(4):
            vals = [r["trimmed_bwd_ms_at_split_1_to_4"][k] / r["trimmed_bwd_ms_at_split_1_to_4"][3] for r in mine]
            ax.bar([x + (k - 1.5) * width for x in xs], vals, width, label=f"split {k + 1}")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_title(f"{shape}: bounded backward time / time at split 4")
        ax.set_xlabel("past keys / document length")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Packed documents, a 4,096-query chunk, {data[0]['device']} ({name})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def sparse_backward(trace, out):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import sparse_trace  # noqa: E402 (tools/analysis/sparse_trace.py)

    launches = sparse_trace.read(ROOT / f"bench/attention/results/{trace}-trace.csv.gz")
    names = ["steps", "fixed", "empty", "gaps", "tail"]
    labels, splits = [], []
    for (label, order), rows in launches.items():
        labels.append(f"{label}, {'hs1 order' if order == 3 else 'default'}")
        splits.append(sparse_trace.split(rows)["parts"])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.4))
    left = [0.0] * len(labels)
    for name in names:
        vals = [100 * sp[name] for sp in splits]
        ax.barh(range(len(labels)), vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% of the SMs' time (SMs x the launch's span)")
    ax.set_xlim(0, 100)
    ax.legend(ncol=5, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax.set_title(f"Page-sparse backward, 256K past, one traced launch each ({trace})", pad=28, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention-prefix", default="2026-12-02-hs3-call5")
    p.add_argument("--sparse-trace", default="2026-12-02-hs3-call5")
    p.add_argument("--documents", default="2026-12-06-documents-split-sweep")
    args = p.parse_args()
    img = ROOT / "docs/img"
    img.mkdir(exist_ok=True)
    attention(args.attention_prefix, img / "attention_h200.png")
    lm_head(img / "lm_head_h200.png")
    sparse_backward(args.sparse_trace, img / "sparse_backward_h200.png")
    documents(args.documents, img / "attention_documents_h100.png")
    print("wrote", img / "attention_h200.png", img / "lm_head_h200.png", img / "sparse_backward_h200.png",
          img / "attention_documents_h100.png")


if __name__ == "__main__":
    main()
