#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Gradient error of a page-sparse run against the dense run of the same model and data: for every
parameter tensor of two `oomb-train --dump-grads` files (F32 safetensors, HF names), the cosine
similarity and the relative L2 error ||sparse - dense|| / ||dense||, both in double.

    compare.py DENSE.safetensors SPARSE.safetensors [--meta JSON] [--tensors FILE] [--summary FILE]

Writes one JSON line per tensor (the --meta fields, then tensor, elements, cosine, rel_l2,
dense_norm, sparse_norm) to --tensors and one summary line per pair (median and worst over the
tensors, which tensor is worst, and the same two measures over all tensors as one vector) to
--summary; each file is appended to, '-' (the default) is stdout. The standard library only (the
CPU check runs in CI, which has no numpy): the format is read by hand, and every sum is math.fsum
of products that are exact in double (float32 operands), so the measures are correctly rounded.
Two dumps that do not hold the same tensors with the same shapes are an error."""
import argparse
import array
import json
import math
import operator
import statistics
import struct
import sys

TYPECODES = {"F32": "f", "F64": "d"}


def read_safetensors(path):
    """({name: (shape, flat array of the stored floats)} in file order, metadata) of a safetensors
    file of F32 or F64 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: too short to be safetensors ({len(data)} bytes)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise SystemExit(f"{path}: header of {header_len} bytes runs past the file's {len(data)}")
    header = json.loads(data[8 : 8 + header_len])
    body = memoryview(data)[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in TYPECODES:
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}; --dump-grads writes F32")
        begin, end = info["data_offsets"]
        a = array.array(TYPECODES[info["dtype"]])
        if (end - begin) % a.itemsize or end > len(body):
            raise SystemExit(f"{path}: tensor {name}'s bytes [{begin}, {end}) are not whole values in the file")
        a.frombytes(body[begin:end])
        if sys.byteorder != "little":
            a.byteswap()
        if len(a) != math.prod(info["shape"]):
            raise SystemExit(f"{path}: tensor {name} holds {len(a)} values for shape {info['shape']}")
        tensors[name] = (tuple(info["shape"]), a)
    return tensors, header.get("__metadata__", {})


def measures(dense, sparse):
    """(cosine, rel_l2, dense_norm, sparse_norm); cosine None where a side is all zero (undefined),
    rel_l2 None where dense is all zero but sparse is not. sqrt(dd * ss) rather than
    sqrt(dd) * sqrt(ss): equal vectors then give a cosine of exactly 1."""
    dd = math.fsum(map(operator.mul, dense, dense))
    ss = math.fsum(map(operator.mul, sparse, sparse))
    ds = math.fsum(map(operator.mul, dense, sparse))
    err = math.sqrt(math.fsum(d * d for d in map(operator.sub, dense, sparse)))
    cosine = ds / math.sqrt(dd * ss) if dd > 0 and ss > 0 else (1.0 if dd == ss == 0 else None)
    rel = err / math.sqrt(dd) if dd > 0 else (0.0 if err == 0 else None)
    return cosine, rel, math.sqrt(dd), math.sqrt(ss)


def chained(arrays):
    out = array.array("d")
    for a in arrays:
        out.fromlist(a.tolist())
    return out


def compare(dense_path, sparse_path, meta):
    dense, dense_meta = read_safetensors(dense_path)
    sparse, sparse_meta = read_safetensors(sparse_path)
    if set(dense) != set(sparse):
        only = sorted(set(dense) ^ set(sparse))
        raise SystemExit(f"{dense_path} and {sparse_path} hold different tensors (in one only: {only[:5]})")
    rows = []
    for name, (shape, d) in dense.items():
        if sparse[name][0] != shape:
            raise SystemExit(f"tensor {name}: shape {list(shape)} in {dense_path}, {list(sparse[name][0])} in {sparse_path}")
        cosine, rel, dn, sn = measures(d, sparse[name][1])
        rows.append(dict(meta, tensor=name, elements=len(d), cosine=cosine, rel_l2=rel,
                         dense_norm=dn, sparse_norm=sn))
    every = measures(chained(d for _, d in dense.values()), chained(sparse[name][1] for name in dense))
    # Worst first: an undefined measure (None) counts as the worst of all.
    by_cos = sorted(rows, key=lambda r: -math.inf if r["cosine"] is None else r["cosine"])
    by_rel = sorted(rows, key=lambda r: math.inf if r["rel_l2"] is None else r["rel_l2"], reverse=True)
    defined_cos = [r["cosine"] for r in rows if r["cosine"] is not None]
    defined_rel = [r["rel_l2"] for r in rows if r["rel_l2"] is not None]
    summary = dict(meta, tensors=len(rows),
                   median_cosine=statistics.median(defined_cos) if defined_cos else None,
                   worst_cosine=by_cos[0]["cosine"], worst_cosine_tensor=by_cos[0]["tensor"],
                   median_rel_l2=statistics.median(defined_rel) if defined_rel else None,
                   worst_rel_l2=by_rel[0]["rel_l2"], worst_rel_l2_tensor=by_rel[0]["tensor"],
                   all_cosine=every[0], all_rel_l2=every[1],
                   dense_loss=float(dense_meta["loss"]) if "loss" in dense_meta else None,
                   sparse_loss=float(sparse_meta["loss"]) if "loss" in sparse_meta else None)
    return rows, summary


def append_lines(path, objects):
    out = sys.stdout if path == "-" else open(path, "a")
    try:
        for o in objects:
            out.write(json.dumps(o) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dense")
    p.add_argument("sparse")
    p.add_argument("--meta", default="{}", help="JSON object whose fields start every line (state, tokens, ...)")
    p.add_argument("--tensors", default="-", help="append the per-tensor lines here ('-': stdout)")
    p.add_argument("--summary", default="-", help="append the summary line here ('-': stdout)")
    a = p.parse_args()
    meta = json.loads(a.meta)
    if not isinstance(meta, dict):
        raise SystemExit("--meta must be a JSON object")
    rows, summary = compare(a.dense, a.sparse, meta)
    append_lines(a.tensors, rows)
    append_lines(a.summary, [summary])


if __name__ == "__main__":
    main()
