#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws docs/img/pytorch-<model>[-<setting>-<device>].png from the committed JSON lines of
bench/pytorch/run_gpu.sh (bench/pytorch/results/*.jsonl): tokens/s and peak GPU memory against the
context, one line per system (the PyTorch package "oomb-torch", the C++ trainer "oomb", the
competitor "pytorch"), one figure per model, device and setting: dense in place (docs' main figures,
the H200's without a suffix) or dense with offload, beside PyTorch done well in place on the same
device. Rows of other settings (sparse, kept outputs) are tables only. Where a point was measured
more than once, the latest row is drawn. Standard library only: the rasteriser and PNG encoder of
tools/plot_run.py.

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


# Rows before 2026-12-06 carry no device field: they all ran on the H200 (docs/pytorch.md).
DEFAULT_DEVICE = "NVIDIA H200"


def setting(r):
    """'in place' or 'offload' for the dense rows drawn (PyTorch's: in place, drawn in both), else None."""
    if r.get("attention", "dense") != "dense" or r.get("keep_attention_outputs"):
        return None
    return "offload" if r.get("offload") else "in place"


def load():
    """{(model, device, setting, system, tokens): the latest row}."""
    latest = {}
    for path in sorted((ROOT / "bench/pytorch/results").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "step_s" not in r or r.get("system") not in SYSTEMS or setting(r) is None:
                continue
            key = (r["model"], r.get("device") or DEFAULT_DEVICE, setting(r), r["system"], r["tokens"])
            when = (r.get("date", ""), r.get("run", ""))
            if key not in latest or when >= latest[key][0]:
                latest[key] = (when, r)
    return {k: r for k, (_, r) in latest.items()}


def figure(rows, model, device, mode):
    """The figure of `mode` rows of `model` on `device` (PyTorch's in-place rows beside offload ones)."""
    series_t, series_m = [], []
    for system, (label, colour) in SYSTEMS.items():
        want = "in place" if system == "pytorch" else mode
        label = label if want == mode else f"{label}, {want}"
        pts = sorted((n / 1024, r) for (m, d, s, sy, n), r in rows.items()
                     if (m, d, s, sy) == (model, device, want, system))
        if not pts:
            continue
        series_t.append(plot_run.Series(label, colour, [(x, r["tok_per_s"]) for x, r in pts], True))
        series_m.append(plot_run.Series(label, colour, [(x, r["peak_gpu_bytes"] / 2**30) for x, r in pts], True))
    return series_t, series_m


def main():
    rows = load()
    short = {d: d.replace("NVIDIA ", "").split()[0] for _, d, _, _, _ in rows}
    for model, device, mode in sorted({(m, d, s) for m, d, s, _, _ in rows}):
        series_t, series_m = figure(rows, model, device, mode)
        if not any(s.label.startswith(("package", "C++")) for s in series_t) or len(series_t) < 2:
            continue  # nothing of oomb's to compare
        ps = [plot_run.Panel("tokens/s (forward + backward)", series_t),
              plot_run.Panel("peak GPU memory, GiB", series_m)]
        size = plot_run.layout(ps)
        xs = [x for s in series_t for x, _ in s.points]
        lo, hi = min(xs), max(xs)
        lo, hi = (lo - 8, hi + 8) if lo == hi else (lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05)
        main_figure = mode == "in place" and device == DEFAULT_DEVICE
        title = f"{model}: one step, {short[device]}" + ("" if mode == "in place" else f", {mode}")
        canvas = plot_run.draw(ps, size, title, (lo, hi), xlabel="context, K tokens")
        suffix = "" if main_figure else f"-{mode.replace(' ', '-')}-{short[device].lower()}"
        out = ROOT / f"docs/img/pytorch-{model}{suffix}.png"
        out.write_bytes(plot_run.png(canvas))
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
