#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws an oomb-train run's log.jsonl as one PNG: loss, eval loss by position, tokens/s, GPU memory.

    python3 tools/plot_run.py RUN/log.jsonl [--out FILE] [--title TEXT]   # default --out RUN/plot.png

Panels, stacked over one shared step axis (docs/trainer.md, "Plotting a run"):
  training loss   the step lines' "loss", and from 40 steps on their mean over a centred window
  eval loss       the evaluation lines' "eval_loss" (all predictions) and one line per bucket of
                  "eval_loss_by_position" (0-4K, 4K-32K, 32K-128K, 128K-1M, 1M+; a bucket is drawn
                  where it had predictions)
  answer accuracy "eval_answer_accuracy" in %, only when the log has it (kv-recall)
  tokens/s        "tokens_per_second"
  GPU memory      "gpu_bytes_in_use_peak" in GiB, only when the log has it (--device cuda)
A panel without data says "no data". A line that is not a JSON object with an integer "step", or
a field that is neither a number nor null, is refused with its line number (exit status 1).
Step lines are the objects with "loss" (examples/trainer/app/run.cpp writes them), evaluation
lines the objects with "eval_loss"; nlohmann writes a NaN as null, which leaves a gap.

Why hand-written: the project's dependencies are fixed and matplotlib (or numpy) is not among
them, and a run's curves should be one command away on any machine that has python3 -- the GPU
host a run finished on included. So this file is its own rasteriser (lines, rectangles, text with
the classic 5x7 bitmap font), axes with 1-2-2.5-5 ticks, and a PNG encoder (zlib + struct, 8-bit
RGB), in the standard library only. Nothing is anti-aliased: every series is drawn in its own
exact colour (COLORS), which tools/plot_run_test.py counts panel by panel.
"""
import argparse
import collections
import json
import math
import pathlib
import struct
import sys
import zlib

# The classic 5x7 font, printable ASCII from " " to "~": five column bytes per glyph, bit 0 the top
# row; g, j, p, q and y use bit 7, an eighth row, for their descenders.
_FONT_HEX = (
    "0000000000" "00005f0000" "0007000700" "147f147f14" "242a7f2a12" "2313086462" "3649552250" "0005030000"  # !"#$%&'
    "001c224100" "0041221c00" "082a1c2a08" "08083e0808" "0050300000" "0808080808" "0060600000" "2010080402"  # ()*+,-./
    "3e5149453e" "00427f4000" "4261514946" "2141454b31" "1814127f10" "2745454539" "3c4a494930" "0171090503"  # 01234567
    "3649494936" "064949291e" "0036360000" "0056360000" "0008142241" "1414141414" "4122140800" "0201510906"  # 89:;<=>?
    "324979413e" "7e1111117e" "7f49494936" "3e41414122" "7f4141221c" "7f49494941" "7f09090101" "3e41415132"  # @ABCDEFG
    "7f0808087f" "00417f4100" "2040413f01" "7f08142241" "7f40404040" "7f0204027f" "7f0408107f" "3e4141413e"  # HIJKLMNO
    "7f09090906" "3e4151215e" "7f09192946" "4649494931" "01017f0101" "3f4040403f" "1f2040201f" "7f2018207f"  # PQRSTUVW
    "6314081463" "0304780403" "6151494543" "00007f4141" "0204081020" "41417f0000" "0402010204" "4040404040"  # XYZ[\]^_
    "0001020400" "2054545478" "7f48444438" "3844444420" "384444487f" "3854545418" "087e090102" "089494947c"  # `abcdefg
    "7f08040478" "00447d4000" "4080807d00" "007f102844" "00417f4000" "7c04180478" "7c08040478" "3844444438"  # hijklmno
    "fc14141408" "08141414fc" "7c08040408" "4854545420" "043f444020" "3c4040207c" "1c2040201c" "3c4030403c"  # pqrstuvw
    "4428102844" "1ca0a0a07c" "4464544c44" "0008364100" "00007f0000" "0041360800" "08082a1c08"  # xyz{|}~
)
FONT = {chr(32 + i): bytes.fromhex(_FONT_HEX[10 * i:10 * i + 10]) for i in range(len(_FONT_HEX) // 10)}

WHITE, TEXT, AXIS, GRID, NO_DATA = (255, 255, 255), (34, 34, 34), (110, 110, 110), (228, 228, 228), (150, 150, 150)
BUCKETS = ("0-4K", "4K-32K", "32K-128K", "128K-1M", "1M+")  # examples/trainer/app/evaluation.hpp
COLORS = {
    "loss": (160, 190, 228), "loss_mean": (24, 92, 170), "eval_loss": (0, 0, 0),
    "0-4K": (31, 119, 180), "4K-32K": (255, 127, 14), "32K-128K": (44, 160, 44), "128K-1M": (214, 39, 40),
    "1M+": (148, 103, 189), "accuracy": (140, 86, 75), "tokens_per_second": (23, 160, 150),
    "gpu_peak": (200, 40, 120),
}
_SPARE = [(188, 189, 34), (227, 119, 194), (127, 127, 127), (90, 60, 200)]  # buckets this file does not know

WIDTH, PANEL_H, TOP, LEFT, RIGHT = 1240, 280, 56, 110, 220  # pixels; RIGHT holds the legends
PLOT_TOP, PLOT_BOTTOM = 30, 44  # a panel's title above its plot area, tick labels below it


class LogError(Exception):
    pass


# ---------------------------------------------------------------- reading the log

def _number(obj, key, where, within=""):
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LogError(f"{where}: {within}\"{key}\" is {json.dumps(v)[:40]}, not a number")
    return float(v) if math.isfinite(v) else None


def read_log(path):
    """Returns (steps, evals): lists of dicts with float-or-None values, in step order."""
    steps, evals = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {n}"
            try:
                obj = json.loads(line.strip())
            except json.JSONDecodeError as e:
                raise LogError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise LogError(f"{where}: not a JSON object")
            step = obj.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise LogError(f"{where}: no integer \"step\"")
            if "eval_loss" in obj:
                by = obj.get("eval_loss_by_position", {})
                if not isinstance(by, dict):
                    raise LogError(f"{where}: \"eval_loss_by_position\" is not an object")
                evals.append({"step": step, "eval_loss": _number(obj, "eval_loss", where),
                              "accuracy": _number(obj, "eval_answer_accuracy", where),
                              "by": {k: _number(by, k, where, "eval_loss_by_position's ") for k in by}})
            elif "loss" in obj:
                steps.append({"step": step, "loss": _number(obj, "loss", where),
                              "loss_kind": obj.get("loss_kind"),
                              "tokens_per_second": _number(obj, "tokens_per_second", where),
                              "gpu_peak": _number(obj, "gpu_bytes_in_use_peak", where),
                              "gpu_total": _number(obj, "gpu_bytes_total", where)})
    steps.sort(key=lambda r: r["step"])
    evals.sort(key=lambda r: r["step"])
    return steps, evals


# ---------------------------------------------------------------- what to draw

# points: [(step, value or None)]; markers: a square at each point; width: the line's, in pixels.
# Wider series are drawn first, so that a thinner one on the same values stays visible inside.
Series = collections.namedtuple("Series", "label colour points markers width", defaults=(False, 2))


class Panel:
    def __init__(self, title, series, percent=False):
        self.title, self.series, self.percent = title, series, percent
        self.rect = None  # the plot area (x0, y0, x1, y1), exclusive ends; set by layout()

    def has_data(self):
        return any(y is not None for s in self.series for _, y in s.points)


def _centred_mean(points, w):
    """The mean of the finite values among the w points centred on each (fewer at the ends)."""
    sums, counts = [0.0], [0]
    for _, y in points:
        sums.append(sums[-1] + (y or 0.0))
        counts.append(counts[-1] + (y is not None))
    out = []
    for i, (x, _) in enumerate(points):
        a, b = max(0, i - w // 2), min(len(points), i + w // 2 + 1)
        n = counts[b] - counts[a]
        out.append((x, (sums[b] - sums[a]) / n if n else None))
    return out


def _fmt(v):
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v / 1e3:.1f}K" if abs(v) < 1e7 else f"{v / 1e6:.2f}M"


def _last(points):
    return next(((x, y) for x, y in reversed(points) if y is not None), None)


def panels(steps, evals):
    """The panels for a log, top to bottom (rects not yet set)."""
    out = []
    loss = [(r["step"], r["loss"]) for r in steps]
    kinds = {r["loss_kind"] for r in steps if r["loss_kind"]}
    kind = {"answer": ", answer tokens", "mask": ", masked tokens"}.get(kinds.pop(), "") if len(kinds) == 1 else ""
    last = _last(loss)
    title = f"training loss{kind}" + (f" (last {_fmt(last[1])} at step {last[0]})" if last else "")
    if len(loss) >= 40:  # the raw loss pale, its mean over 1% of the steps (odd, at least 5) dark
        w = max(5, len(loss) // 100) | 1
        series = [Series("loss", COLORS["loss"], loss),
                  Series(f"mean of {w}", COLORS["loss_mean"], _centred_mean(loss, w))]
    else:
        series = [Series("loss", COLORS["loss_mean"], loss, True)]
    out.append(Panel(title, series))

    names = sorted({k for e in evals for k in e["by"]}, key=lambda k: (BUCKETS.index(k) if k in BUCKETS else 99, k))
    spare = iter(_SPARE * 4)
    series = [Series("all", COLORS["eval_loss"], [(e["step"], e["eval_loss"]) for e in evals], True)]
    for k in names:  # wider than "all": with one bucket the two lines are the same
        series.append(Series(k, COLORS.get(k) or next(spare), [(e["step"], e["by"].get(k)) for e in evals], True, 4))
    last = _last(series[0].points)
    out.append(Panel("eval loss by position in the document" +
                     (f" (all: {_fmt(last[1])} at step {last[0]})" if last else ""), series))

    acc = [(e["step"], None if e["accuracy"] is None else 100 * e["accuracy"]) for e in evals]
    if any(y is not None for _, y in acc):
        last = _last(acc)
        out.append(Panel(f"eval answer accuracy, % (last {last[1]:.1f}% at step {last[0]})",
                         [Series("accuracy", COLORS["accuracy"], acc, True)], percent=True))

    tps = [(r["step"], r["tokens_per_second"]) for r in steps]
    finite = sorted(y for _, y in tps if y is not None)
    out.append(Panel("tokens/s" + (f" (median {_fmt(finite[len(finite) // 2])})" if finite else ""),
                     [Series("tokens/s", COLORS["tokens_per_second"], tps, len(tps) <= 60)]))

    gib = [(r["step"], None if r["gpu_peak"] is None else r["gpu_peak"] / 2**30) for r in steps]
    if any(y is not None for _, y in gib):
        total = max((r["gpu_total"] for r in steps if r["gpu_total"]), default=None)
        top = max(y for _, y in gib if y is not None)
        out.append(Panel(f"GPU memory peak, GiB (max {top:.2f}" + (f" of {total / 2**30:.1f})" if total else ")"),
                         [Series("GPU peak", COLORS["gpu_peak"], gib, len(gib) <= 60)]))
    return out


def layout(ps):
    """Sets each panel's plot area; returns the image's (width, height)."""
    for i, p in enumerate(ps):
        y = TOP + i * PANEL_H
        p.rect = (LEFT, y + PLOT_TOP, WIDTH - RIGHT, y + PANEL_H - PLOT_BOTTOM)
    return WIDTH, TOP + len(ps) * PANEL_H + 24


# ---------------------------------------------------------------- rasterising

class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(bytes(WHITE) * (w * h))
        self.clip = (0, 0, w, h)

    def fill(self, x0, y0, x1, y1, c):
        cx0, cy0, cx1, cy1 = self.clip
        x0, y0, x1, y1 = max(x0, cx0), max(y0, cy0), min(x1, cx1), min(y1, cy1)
        if x0 >= x1:
            return
        row = bytes(c) * (x1 - x0)
        for y in range(y0, y1):
            i = 3 * (y * self.w + x0)
            self.px[i:i + len(row)] = row

    def line(self, x0, y0, x1, y1, c, t=2):
        """Bresenham's line with a t x t brush."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, o = dx + dy, t // 2
        while True:
            self.fill(x0 - o, y0 - o, x0 - o + t, y0 - o + t, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x, y, s, c, scale=2, align="left"):
        """Draws s with its top at y; align left, right or center about x. Returns its width."""
        w = 6 * scale * len(s) - scale
        x = x - w if align == "right" else x - w // 2 if align == "center" else x
        for ch in s:
            for col, bits in enumerate(FONT.get(ch, FONT["?"])):
                for row in range(8):
                    if bits >> row & 1:
                        self.fill(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale, c)
            x += 6 * scale
        return w


def ticks(lo, hi, n=5):
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9)
    return step, [k * step for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def tick_label(v, step, top):
    div, suffix = next(((d, s) for d, s in ((1e9, "G"), (1e6, "M"), (1e3, "K")) if top >= 10 * d), (1, ""))
    s, v = step / div, v / div
    decimals = next(d for d in range(8) if abs(s * 10**d - round(s * 10**d)) < 1e-6 * max(1, s * 10**d))
    return f"{0.0 if abs(v) < 1e-9 * s else v:.{decimals}f}{suffix}"


def _path(canvas, pts, c, t):
    """Draws connected points, at most a vertical span per pixel column; None breaks the line."""
    prev, col = None, None  # col: [x, first_y, min_y, max_y, last_y]

    def flush():
        nonlocal prev
        x, first, lo, hi, last = col
        if prev is not None:
            canvas.line(prev[0], prev[1], x, first, c, t)
        canvas.line(x, lo, x, hi, c, t)
        prev = (x, last)
    for p in pts:
        if p is None:
            if col:
                flush()
            prev, col = None, None
            continue
        x, y = p
        if col and col[0] == x:
            col[2], col[3], col[4] = min(col[2], y), max(col[3], y), y
            continue
        if col:
            flush()
        col = [x, y, y, y, y]
    if col:
        flush()


def draw(ps, size, title, xrange, xlabel="step"):
    c = Canvas(*size)
    c.text(LEFT, 16, title, TEXT, scale=3)
    xlo, xhi = xrange
    xstep, xt = ticks(xlo, xhi, 8)
    xstep = max(1, xstep)
    xt = [v for v in xt if float(v).is_integer()]
    for i, p in enumerate(ps):
        x0, y0, x1, y1 = p.rect
        c.text(x0, y0 - 22, p.title, TEXT)
        ys = [y for s in p.series for _, y in s.points if y is not None]
        if not ys:
            c.fill(x0, y0, x1, y1, (250, 250, 250))
            c.text((x0 + x1) // 2, (y0 + y1) // 2 - 7, "no data", NO_DATA, align="center")
        else:
            lo, hi = min(ys), max(ys)
            if p.percent:
                lo, hi = min(lo, 0.0), max(hi, 100.0)
            pad = (hi - lo) * 0.06 or max(abs(hi) * 0.05, 1e-3)
            lo, hi = lo - pad, hi + pad
            ystep, yt = ticks(lo, hi, 5)
            top = max(abs(lo), abs(hi))
            px = lambda x: round(x0 + 6 + (x - xlo) / (xhi - xlo) * (x1 - x0 - 12))  # noqa: E731
            py = lambda y: round(y1 - 1 - (y - lo) / (hi - lo) * (y1 - y0 - 2))  # noqa: E731
            for v in yt:
                c.fill(x0, py(v), x1, py(v) + 1, GRID)
                c.fill(x0 - 6, py(v), x0, py(v) + 1, AXIS)
                c.text(x0 - 10, py(v) - 7, tick_label(v, ystep, top), TEXT, align="right")
            for v in xt:
                c.fill(px(v), y0, px(v) + 1, y1, GRID)
                c.fill(px(v), y1, px(v) + 1, y1 + 6, AXIS)
                c.text(px(v), y1 + 10, tick_label(v, xstep, max(abs(xlo), abs(xhi))), TEXT, align="center")
            c.clip = (x0 + 1, y0 + 1, x1 - 1, y1 - 1)
            for s in sorted(p.series, key=lambda s: -s.width):
                mapped = [None if y is None else (px(x), py(y)) for x, y in s.points]
                _path(c, mapped, s.colour, s.width)
                if s.markers or sum(m is not None for m in mapped) == 1:
                    r = s.width + 1
                    for m in mapped:
                        if m is not None:
                            c.fill(m[0] - r, m[1] - r, m[0] + r + 1, m[1] + r + 1, s.colour)
            c.clip = (0, 0, c.w, c.h)
            if len(p.series) > 1:
                for k, s in enumerate(p.series):
                    ly = y0 + 8 + 22 * k
                    c.fill(x1 + 16, ly + 5, x1 + 44, ly + 9, s.colour)
                    c.text(x1 + 52, ly, s.label, TEXT)
        for a, b, e, f in ((x0, y0, x1, y0 + 1), (x0, y1 - 1, x1, y1), (x0, y0, x0 + 1, y1), (x1 - 1, y0, x1, y1)):
            c.fill(a, b, e, f, AXIS)
        if i == len(ps) - 1:
            c.text((x0 + x1) // 2, y1 + 30, xlabel, TEXT, align="center")
    return c


# ---------------------------------------------------------------- PNG

def png(canvas):
    """8-bit RGB, every row filter 0 (none), one IDAT."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    stride = 3 * canvas.w
    raw = b"".join(b"\0" + bytes(canvas.px[y * stride:(y + 1) * stride]) for y in range(canvas.h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", canvas.w, canvas.h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(log, out, title=None):
    steps, evals = read_log(log)
    ps = panels(steps, evals)
    size = layout(ps)
    xs = [r["step"] for r in steps] + [e["step"] for e in evals]
    xlo, xhi = (min(xs), max(xs)) if xs else (0, 1)
    if xlo == xhi:
        xlo, xhi = xlo - 1, xhi + 1
    canvas = draw(ps, size, title if title is not None else str(log), (xlo, xhi))
    pathlib.Path(out).write_bytes(png(canvas))
    return ps, size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=pathlib.Path, help="a run's log.jsonl")
    ap.add_argument("--out", type=pathlib.Path, help="the PNG to write (default: plot.png beside the log)")
    ap.add_argument("--title", help="the image's title (default: the log's path)")
    a = ap.parse_args(argv)
    out = a.out or a.log.parent / "plot.png"
    try:
        plot(a.log, out, a.title)
    except (LogError, OSError) as e:
        print(f"plot_run.py: error: {e}", file=sys.stderr)
        return 1
    print(f"plot_run.py: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
