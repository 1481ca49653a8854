#!/usr/bin/env python3
"""Where a traced Hopper backward launch spends its SMs' time (bench_attention --trace CSV).

For each traced launch (label, launch order) it splits the SMs' time (SMs x the launch's span) into
  steps    the walks' query steps, at the per-step time fitted over the CTAs that walked
  fixed    the rest of those CTAs' time: prologue (selection, K/V load until the walk starts), the
           first stage's wait, the fitted per-walk constant and the epilogue (medians printed)
  empty    CTAs that found no step (from their start to the next CTA's start on the same SM)
  gaps     between one CTA's end and the next one's start on the same SM
  tail     after an SM's last CTA, until the launch's last CTA ends
and lists the CTAs that ended last. Deterministic launches (order -1; -2: one KV head after another) also say how much of the SMs'
time their CTAs spent waiting for turns (the dQ writer's steps; the pieces' dK/dV adds), which the
parts above count as steps or fixed time.
Usage: sparse_trace.py trace.csv[.gz] [--last N]
SPDX-License-Identifier: Apache-2.0
"""
import argparse
import collections
import csv
import gzip


def fit(xs, ys):
    """Least-squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def split(rows):
    """The launch's SM time split into the parts above (fractions), its fit and per-CTA medians."""
    work = [r for r in rows if r["end"] >= 0 and r["steps"] > 0]
    span = max(max(r["end"] for r in work), max(r["begin"] for r in rows))
    sms = sorted({r["sm"] for r in rows})
    a, b = fit([r["steps"] for r in work], [r["end"] - r["begin"] for r in work])
    steps = sum(r["steps"] for r in work) * b
    busy_work = sum(r["end"] - r["begin"] for r in work)
    by_sm = collections.defaultdict(list)
    for r in rows:
        by_sm[r["sm"]].append(r)
    empty = gaps = tail = 0.0
    for rs in by_sm.values():
        rs.sort(key=lambda r: r["begin"])
        for i, r in enumerate(rs):
            nxt = rs[i + 1]["begin"] if i + 1 < len(rs) else None
            if r["end"] < 0 or r["steps"] == 0:  # no step: until the next CTA starts here
                empty += (nxt if nxt is not None else r["begin"]) - r["begin"]
            elif nxt is not None:
                gaps += max(0, nxt - r["end"])
        ends = [r["end"] if r["end"] >= 0 else r["begin"] for r in rs]
        tail += span - max(ends)
    total = span * len(sms)
    parts = {"steps": steps, "fixed": busy_work - steps, "empty": empty, "gaps": gaps, "tail": tail}
    parts["other"] = total - sum(parts.values())

    def median(f):
        v = sorted(f(r) for r in work)
        return v[len(v) // 2] / 1e3

    wa, wb = fit([r["steps"] for r in work], [r["last"] - r["first"] for r in work])
    # The finer points (traces since hs3): the prologue and the epilogue in parts.
    parts_us = {}
    if "selected" in work[0]:
        parts_us = {
            "tiles known": median(lambda r: r["selected"] - r["begin"]),
            "K/V after": median(lambda r: r["walk"] - r["selected"]),
            "consumers synced": median(lambda r: r["synced"] - r["last"]),
            "dK/dV staged": median(lambda r: r["staged"] - r["synced"]),
            "reductions issued": median(lambda r: r["end"] - r["staged"]),
        }
    waits = {k: sum(r.get(k, 0) for r in work) / total for k in ("dq_wait", "piece_wait")}
    return {
        "waits": waits,
        "span_us": span / 1e3, "sms": len(sms), "ctas": len(rows), "working": len(work),
        "steps": sum(r["steps"] for r in work), "cta_fit_us": (a / 1e3, b / 1e3), "walk_fit_us": (wa / 1e3, wb / 1e3),
        "prologue_us": median(lambda r: r["walk"] - r["begin"]), "first_us": median(lambda r: r["first"] - r["walk"]),
        "epilogue_us": median(lambda r: r["end"] - r["last"]), "parts_us": parts_us,
        "parts": {k: v / total for k, v in parts.items()},
        "last": sorted(work, key=lambda r: -r["end"]),
    }


def read(path):
    """{(label, order): [CTA rows]} of a trace CSV (or .csv.gz)."""
    launches = collections.OrderedDict()
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        for r in csv.DictReader(f):
            for k in ("order", "begin", "selected", "walk", "first", "last", "synced", "staged", "end", "sm", "kvh",
                      "piece", "steps", "kb", "dq_wait", "piece_wait"):
                if k in r:  # selected, synced, staged: traces since hs3; the waits since issue 35
                    r[k] = int(r[k])
            launches.setdefault((r["label"], r["order"]), []).append(r)
    return launches


def report(rows, last):
    t = split(rows)
    print(f"  span {t['span_us']:.1f} us on {t['sms']} SMs; {t['ctas']} CTAs, {t['working']} with steps "
          f"({t['steps']} steps); CTA fit: {t['cta_fit_us'][0]:.2f} us + {t['cta_fit_us'][1]:.3f} us/step")
    print(f"  medians: prologue {t['prologue_us']:.2f} us, first stage {t['first_us']:.2f} us, walk fit "
          f"{t['walk_fit_us'][0]:.2f} us + {t['walk_fit_us'][1]:.3f} us/step, epilogue {t['epilogue_us']:.2f} us")
    if t["parts_us"]:
        print("  medians of the parts (us): " + ", ".join(f"{k} {v:.2f}" for k, v in t["parts_us"].items()))
    print("  " + " | ".join(f"{k} {100 * v:.1f}%" for k, v in t["parts"].items()))
    if any(t["waits"].values()):
        print(f"  waiting for turns: dQ steps {100 * t['waits']['dq_wait']:.1f}%, "
              f"pieces' dK/dV {100 * t['waits']['piece_wait']:.1f}% of the SMs' time")
    print(f"  the {last} CTAs that ended last (begin..end us, kvh, block, piece, steps):")
    for r in t["last"][:last]:
        print(f"    {r['begin'] / 1e3:8.1f} .. {r['end'] / 1e3:8.1f}  kvh {r['kvh']}  kb {r['kb']:5d}  "
              f"piece {r['piece']:2d}  steps {r['steps']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=6)
    args = ap.parse_args()
    for (label, order), rows in read(args.csv).items():
        name = {3: "hs1", -1: "deterministic", -2: "deterministic, one KV head after another"}.get(order, "default")
        print(f"{label}, launch order {order} ({name}):")
        report(rows, args.last)


if __name__ == "__main__":
    main()
