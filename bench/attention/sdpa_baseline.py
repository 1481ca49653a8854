#!/usr/bin/env python3
# oomb bench — PyTorch SDPA (cuDNN and FlashAttention-2 backends) on the same work as
# bench_attention: a 4096-token chunk against a past of 16K / 64K / 256K tokens (non-causal) plus
# the chunk against itself (causal), forward and backward, TFLOP/s counted the same way
# (forward 4 Sq Sk D Hq with the causal square halved; backward 2.5x forward).
# SDPA has no paged KV and its is_causal aligns the mask top-left, so the work is two calls
# (past, then own keys causally); merging the two partial outputs is not timed (flattering SDPA).
# SPDX-License-Identifier: Apache-2.0
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts), max(ts)


def run(backend, hq, hkv, d, sq, past, reps):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda *s: (torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g)).requires_grad_(True)
    q = mk(1, hq, sq, d)
    kp, vp = mk(1, hkv, past, d), mk(1, hkv, past, d)
    ko, vo = mk(1, hkv, sq, d), mk(1, hkv, sq, d)
    gqa = {"enable_gqa": True}
    note = "native GQA"

    def attn(k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

    with sdpa_kernel([backend]):
        try:
            attn(kp, vp, False)
        except RuntimeError:
            # the backend has no GQA: expand K/V to every query head (same FLOPs, more bytes)
            rep = hq // hkv
            kp2, vp2 = kp.detach().repeat_interleave(rep, 1).requires_grad_(True), vp.detach().repeat_interleave(rep, 1).requires_grad_(True)
            ko2, vo2 = ko.detach().repeat_interleave(rep, 1).requires_grad_(True), vo.detach().repeat_interleave(rep, 1).requires_grad_(True)
            kp, vp, ko, vo = kp2, vp2, ko2, vo2
            gqa.clear()
            note = "K/V expanded"
        fwd = lambda: (attn(kp, vp, False), attn(ko, vo, True))
        t_f = timed(lambda: fwd(), 2, reps)
        o1, o2 = fwd()
        go1, go2 = torch.randn_like(o1), torch.randn_like(o2)

        def bwd():
            torch.autograd.backward([o1, o2], [go1, go2], retain_graph=True)

        t_b = timed(bwd, 2, reps)
    flops = 4.0 * sq * past * d * hq + 2.0 * sq * sq * d * hq
    tf = lambda fl, t: [fl / x / 1e9 for x in (t[0], t[2], t[1])]  # TFLOP/s: median, min, max
    return tf(flops, t_f)[0], tf(2.5 * flops, t_b)[0], t_f[0], t_b[0], note, tf(flops, t_f), tf(2.5 * flops, t_b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write one JSON line per backend, shape and past (TFLOP/s median, min, max)")
    args = ap.parse_args()
    jf = open(args.json, "w") if args.json else None
    pasts = [16384] if args.quick else [16384, 65536, 262144]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'backend':<8} {'heads':<10} {'past':>6} | {'fwd TF/s':>8} {'bwd TF/s':>8} | {'fwd ms':>8} {'bwd ms':>8} | note")
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)):
        for (label, hq, hkv, d) in (("28/4 d128", 28, 4, 128), ("14/2 d64", 14, 2, 64)):
            for past in pasts:
                try:
                    r = run(backend, hq, hkv, d, 4096, past, args.reps)
                    print(f"{name:<8} {label:<10} {past // 1024:>5}K | {r[0]:8.1f} {r[1]:8.1f} | {r[2]:8.3f} {r[3]:8.3f} | {r[4]}")
                    if jf:
                        jf.write(json.dumps({"backend": name, "heads": label, "past": past, "sq": 4096, "reps": args.reps,
                                             "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                                             "tflops_median_min_max": {"fwd": r[5], "bwd": r[6]}, "note": r[4]}) + "\n")
                        jf.flush()
                except Exception as e:  # report and go on: one backend failing must not hide the rest
                    print(f"{name:<8} {label:<10} {past // 1024:>5}K | failed: {type(e).__name__}: {str(e)[:120]}")
                sys.stdout.flush()
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
