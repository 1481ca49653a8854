#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests of tools/plot_run.py, standard library only: python3 tools/plot_run_test.py (ctest plot_run).

Each case writes a synthetic log.jsonl, runs the tool as a user would (a subprocess), decodes the
PNG with a decoder of its own (signature, chunk CRCs, IHDR, the zlib stream's size, the five row
filters) and counts the pixels of each series' colour in each panel's plot area, taken from the
tool's layout(): a series' colour must be in its own panel and in no other.
"""
import json
import math
import pathlib
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = pathlib.Path(__file__).resolve().parent
TOOL = HERE / "plot_run.py"
sys.path.insert(0, str(HERE))
import plot_run  # noqa: E402


def decode_png(data):
    """Returns (width, height, rows of (r, g, b) tuples); asserts everything it reads."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert len(body) == n and crc == zlib.crc32(kind + body), f"chunk {kind!r}: length or CRC"
        chunks.append((kind, body))
        pos += 12 + n
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds, kinds
    w, h, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0), "8-bit RGB, not interlaced"
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = 3 * w
    assert len(raw) == h * (1 + stride), f"zlib stream holds {len(raw)} bytes, {h * (1 + stride)} expected"
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (1 + stride)], bytearray(raw[y * (1 + stride) + 1:(y + 1) * (1 + stride)])
        assert f <= 4, f"row {y}: filter {f}"
        for i in range(stride):
            a, b, c = (line[i - 3] if i >= 3 else 0), prev[i], (prev[i - 3] if i >= 3 else 0)
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)  # Paeth: |p - a|, |p - b|, |p - c|
            paeth = a if pa <= pb and pa <= pc else b if pb <= pc else c
            pred = (0, a, b, (a + b) // 2, paeth)[f]
            line[i] = (line[i] + pred) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, 3)])
        prev = line
    return w, h, rows


def count(rows, rect, colour):
    x0, y0, x1, y1 = rect
    return sum(row[x0:x1].count(colour) for row in rows[y0:y1])


def run(log, *args):
    return subprocess.run([sys.executable, str(TOOL), str(log), *args], capture_output=True, text=True)


def write(path, objects):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects))


def full_log():
    out = []
    for s in range(1, 121):
        out.append({"step": s, "loss": 2 + 6 * math.exp(-s / 30) + 0.3 * math.sin(s), "loss_kind": "answer",
                    "lr": 1e-3, "tokens_per_second": 30000 + 2000 * math.sin(s / 7), "tokens": 4096,
                    "gpu_bytes_in_use": 20 * 2**30, "gpu_bytes_in_use_peak": (20 + s / 20) * 2**30,
                    "gpu_bytes_total": 140 * 2**30})
        if s == 5:
            out[-1]["loss"] = None  # nlohmann's NaN: a gap, not a crash
        if s % 20 == 0:
            by = {"0-4K": 2 + 5 * math.exp(-s / 40), "4K-32K": 2.5 + 5 * math.exp(-s / 50),
                  "32K-128K": 3 + 5 * math.exp(-s / 60), "128K-1M": 3.5 + 5 * math.exp(-s / 70)}
            out.append({"step": s, "eval_loss": 2.8 + 5 * math.exp(-s / 50), "eval_loss_by_position": by,
                        "eval_predictions_by_position": {k: 100 for k in by}, "eval_answer_accuracy": s / 150,
                        "eval_sequences": 4, "eval_seconds": 1.5})
    return out


def panel_rects(log):
    ps = plot_run.panels(*plot_run.read_log(log))
    size = plot_run.layout(ps)
    return ps, size


def check_panels(png_path, ps, size):
    w, h, rows = decode_png(png_path.read_bytes())
    assert (w, h) == size, f"{(w, h)} != {size}"
    everything = {s.colour for p in ps for s in p.series}
    for p in ps:
        mine = {s.colour for s in p.series if any(y is not None for _, y in s.points)}
        for colour in mine:
            assert count(rows, p.rect, colour) >= 20, f"{p.title}: too few pixels of {colour}"
        for colour in everything - {s.colour for s in p.series}:
            assert count(rows, p.rect, colour) == 0, f"{p.title}: pixels of another panel's {colour}"
        if not mine:  # "no data": the grey text, no series
            assert count(rows, p.rect, plot_run.NO_DATA) > 50, f"{p.title}: no 'no data'"
    return rows


def test_full_log(tmp):
    log = tmp / "log.jsonl"
    write(log, full_log())
    r = run(log, "--out", str(tmp / "full.png"), "--title", "synthetic run")
    assert r.returncode == 0, r.stderr
    ps, size = panel_rects(log)
    titles = [p.title.split(" (")[0] for p in ps]
    assert titles == ["training loss, answer tokens", "eval loss by position in the document",
                      "eval answer accuracy, %", "tokens/s", "GPU memory peak, GiB"], titles
    eval_labels = [s.label for s in ps[1].series]
    assert eval_labels == ["all", "0-4K", "4K-32K", "32K-128K", "128K-1M"], eval_labels
    expected = [["loss", "loss_mean"], ["eval_loss", "0-4K", "4K-32K", "32K-128K", "128K-1M"], ["accuracy"],
                ["tokens_per_second"], ["gpu_peak"]]  # the raw loss and its mean over 120 steps first
    for p, keys in zip(ps, expected):
        assert [s.colour for s in p.series] == [plot_run.COLORS[k] for k in keys], (p.title, keys)
    others = {plot_run.WHITE, plot_run.TEXT, plot_run.AXIS, plot_run.GRID, plot_run.NO_DATA}
    assert len(set(plot_run.COLORS.values()) | others) == len(plot_run.COLORS) + len(others), "colours repeat"
    check_panels(tmp / "full.png", ps, size)


def test_no_eval_no_gpu(tmp):
    log = tmp / "run" / "log.jsonl"
    log.parent.mkdir()
    write(log, [{k: v for k, v in o.items() if not k.startswith("gpu")} for o in full_log() if "loss" in o])
    r = run(log)  # default --out: plot.png beside the log
    assert r.returncode == 0, r.stderr
    ps, size = panel_rects(log)
    assert [p.title.split(" (")[0] for p in ps] == ["training loss, answer tokens",
                                                    "eval loss by position in the document", "tokens/s"]
    assert not ps[1].has_data()
    check_panels(log.parent / "plot.png", ps, size)


def test_empty_and_single(tmp):
    for name, objects in (("empty", []), ("single", [{"step": 1, "loss": 3.0, "tokens_per_second": 10.0}]),
                          ("eval_only", [{"step": 0, "eval_loss": 4.0, "eval_loss_by_position": {"0-4K": 3.5}}]),
                          # one bucket: its line is "all"'s, drawn wider beneath it, and both show
                          ("one_bucket", [{"step": s, "eval_loss": 4.0 / s, "eval_loss_by_position": {"0-4K": 4.0 / s}}
                                          for s in (1, 2, 3)])):
        log = tmp / f"{name}.jsonl"
        write(log, objects)
        r = run(log, "--out", str(tmp / f"{name}.png"))
        assert r.returncode == 0, f"{name}: {r.stderr}"
        check_panels(tmp / f"{name}.png", *panel_rects(log))


def test_malformed(tmp):
    good = full_log()[:3]
    for bad, what in (('{"step": 4, "loss": ', "not JSON"), ("[1, 2]", "not a JSON object"),
                      ('{"loss": 1.0}', 'no integer "step"'), ('{"step": 4, "loss": "low"}', '"loss" is "low"'),
                      ('{"step": 4, "eval_loss": 1, "eval_loss_by_position": {"0-4K": true}}', '"0-4K" is true')):
        log = tmp / "bad.jsonl"
        write(log, good + ["", bad, good[0]])  # the blank line counts: the bad one is line 5
        out = tmp / "bad.png"
        r = run(log, "--out", str(out))
        assert r.returncode == 1, (bad, r.returncode, r.stderr)
        assert f"{log} line 5: " in r.stderr and what in r.stderr, (bad, r.stderr)
        assert not out.exists()


def test_png_encoder_roundtrip(tmp):
    c = plot_run.Canvas(7, 3)
    c.fill(1, 1, 3, 2, (1, 2, 3))
    c.line(0, 0, 6, 2, (9, 8, 7), t=1)
    w, h, rows = decode_png(plot_run.png(c))
    assert (w, h) == (7, 3)
    assert rows[1][1] == (1, 2, 3) and rows[0][0] == (9, 8, 7) and rows[2][6] == (9, 8, 7)
    assert [bytes(p) for row in rows for p in row] == [bytes(c.px[i:i + 3]) for i in range(0, len(c.px), 3)]


def main():
    tests = [v for k, v in globals().items() if k.startswith("test_")]
    with tempfile.TemporaryDirectory() as d:
        for t in tests:
            tmp = pathlib.Path(d) / t.__name__
            tmp.mkdir()
            t(tmp)
            print(f"ok  {t.__name__}")
    print(f"{len(tests)} tests passed")


if __name__ == "__main__":
    main()
