#!/usr/bin/env python3
"""Summarises Nsight Compute's per-instruction warp-stall samples.

Input: the source page of one profiled kernel as CSV (`ncu --import R --page source --csv
--print-source sass`, what bench/attention/run_gpu.sh ncu writes). Prints the samples by stall
reason, the instructions with the most samples (their index in the SASS listing, share, text and
leading reasons) and, for each --range FIRST:LAST of instruction indices, that region's share, its
reasons and its opcodes. Only the standard library.

  python3 tools/analysis/ncu_stalls.py ncu-d128-source.csv --top 40 --range 909:1696 --range 1904:2140
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="instructions to list (default 30)")
    ap.add_argument("--range", action="append", default=[], help="FIRST:LAST instruction indices of a region")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "Address" in r), None)
    if head is None:
        sys.exit(f"{a.csv}: no source-page header (Address, Source, ...)")
    hdr, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and not h.endswith("(Not Issued)")]
    col = "Warp Stall Sampling (All Samples)"
    samples = lambda r: int(r[ix[col]] or 0)
    total = sum(samples(r) for r in data) or 1
    pct = lambda v: f"{100.0 * v / total:.1f}%"

    def by_reason(rs):
        c = collections.Counter()
        for r in rs:
            for h in reasons:
                c[h[6:]] += int(r[ix[h]] or 0)
        return c

    print(f"{len(data)} instructions, {total} samples")
    reason_totals = by_reason(data)
    # Samples no exported reason column counts (on Hopper mostly warps waiting to issue a wgmma).
    reason_totals["(no reason column)"] = total - sum(reason_totals.values())
    print("by reason: " + ", ".join(f"{k} {pct(v)}" for k, v in reason_totals.most_common(13)))
    print(f"\ntop {a.top} instructions:")
    for k in sorted(range(len(data)), key=lambda k: -samples(data[k]))[: a.top]:
        r = data[k]
        lead = sorted(((int(r[ix[h]] or 0), h[6:]) for h in reasons), reverse=True)[:3]
        print(f"{k:6d} {pct(samples(r)):>6s}  {r[ix['Source']].strip()[:64]:64s} " +
              " ".join(f"{n}:{v}" for v, n in lead if v))
    for spec in a.range:
        lo, hi = (int(x) for x in spec.split(":"))
        rs = data[lo:hi]
        ops, n = collections.Counter(), collections.Counter()
        for r in rs:
            words = r[ix["Source"]].split()
            op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "?")
            op = op.split(".")[0]
            ops[op] += samples(r)
            n[op] += 1
        print(f"\nregion {lo}:{hi}: {pct(sum(samples(r) for r in rs))} of the samples, {len(rs)} instructions")
        print("  reasons: " + ", ".join(f"{k} {pct(v)}" for k, v in by_reason(rs).most_common(7)))
        print("  opcodes: " + ", ".join(f"{k} {pct(v)} ({n[k]})" for k, v in ops.most_common(10)))


if __name__ == "__main__":
    main()
