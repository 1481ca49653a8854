# SPDX-License-Identifier: Apache-2.0
"""oomb's torch.library ops: opcheck, and the attention against plain PyTorch."""
import math

import pytest
import torch

import oomb
import oomb.ops as ops
from oomb.pages import PagedStore

P, HQ, HKV, D = 16, 4, 2, 8


def naive(q, k, v, q_start):
    """Causal GQA attention of q (positions q_start..) over k, v (positions 0..): o, lse."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", q, kk) / math.sqrt(q.shape[2])
    qpos = torch.arange(q_start, q_start + q.shape[0])[:, None]
    s = s.masked_fill(torch.arange(k.shape[0])[None] > qpos, -math.inf)
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), vv), torch.logsumexp(s, -1)


@pytest.fixture(params=[torch.float64, torch.float32])
def problem(request):
    """A store whose sequence holds 52 tokens (chunks of 32: one full, one partial) with random
    K/V written through write_pages, the second chunk's queries, and its past page ids."""
    dt = request.param
    g = torch.Generator().manual_seed(3)
    st = PagedStore(layers=1, page_size=P, kv_heads=HKV, head_dim=D, chunk_size=32, max_pages=8, max_grad_pages=8,
                    dtype=dt)
    seq = st.add_sequence()
    n = 52
    k = torch.randn(n, HKV, D, generator=g, dtype=dt)
    v = torch.randn(n, HKV, D, generator=g, dtype=dt)
    q = torch.randn(n - 32, HQ, D, generator=g, dtype=dt)
    for s0, s1 in ((0, 32), (32, n)):
        st.append(seq, s1 - s0)
        ops.write_pages(st.kv_pool, k[s0:s1], v[s0:s1], st.page_ids(seq, 0, s0 // P, -(-s1 // P)))
    past = st.page_ids(seq, 0, 0, 2)
    st.touch_grads(past)
    yield dict(st=st, seq=seq, q=q, k=k, v=v, past=past, dt=dt)
    st.close()


def test_version():
    assert oomb.__version__.count(".") == 2


def test_forward_and_backward_equal_plain_pytorch(problem):
    p = problem
    st, dt = p["st"], p["dt"]
    tol = 1e-12 if dt == torch.float64 else 2e-5
    q = p["q"].clone().requires_grad_()
    k = p["k"][32:].clone().requires_grad_()
    v = p["v"][32:].clone().requires_grad_()
    o, lse = ops.attention(q, k, v, st.kv_pool, p["past"], st.grad_pool, st.grad_ids, 32, 1 / math.sqrt(D), None,
                           None, 128)
    kf = p["k"].clone().requires_grad_()
    vf = p["v"].clone().requires_grad_()
    qf = p["q"].clone().requires_grad_()
    ro, rl = naive(qf, kf, vf, 32)
    assert (o - ro).abs().max() <= tol and (lse - rl).abs().max() <= tol
    w = torch.randn_like(o)
    (o * w).sum().backward()
    (ro * w).sum().backward()
    assert (q.grad - qf.grad).abs().max() <= tol
    assert (k.grad - kf.grad[32:]).abs().max() <= tol and (v.grad - vf.grad[32:]).abs().max() <= tol
    # The past's dK/dV left through the gradient pages.
    gk, gv = ops.gather_pages(st.grad_pool, st.grad_ids[p["past"].long()], 32)
    assert (gk - kf.grad[:32]).abs().max() <= tol and (gv - vf.grad[:32]).abs().max() <= tol


def _attention_args(p, sparse):
    st = p["st"]
    q = p["q"].clone().requires_grad_()
    k = p["k"][32:].clone().requires_grad_()
    v = p["v"][32:].clone().requires_grad_()
    if sparse:  # tile 0 keeps past page 1, tile 1 page 0
        indptr, pages, tile = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32), 16
    else:
        indptr, pages, tile = None, None, 128
    return (q, k, v, st.kv_pool, p["past"], st.grad_pool, st.grad_ids, 32, 1 / math.sqrt(D), indptr, pages, tile)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_opcheck_attention(problem, sparse):
    torch.library.opcheck(ops.attention, _attention_args(problem, sparse))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_opcheck_attention_backward(problem, sparse):
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in _attention_args(problem, sparse)]
    o, lse = ops.attention(*args)
    q, k, v, pool, past, gpool, gids, q_start, scale, indptr, pages, tile = args
    torch.library.opcheck(ops.attention_backward, (torch.randn_like(o), q, k, v, o, lse, pool, past, gpool, gids,
                                                   q_start, scale, indptr, pages, tile))


def test_opcheck_with_deterministic(problem):
    # The flag rides through the op's schema and autograd to the backward (a no-op on the CPU).
    args = _attention_args(problem, False)
    torch.library.opcheck(ops.attention, (*args, None, None, True))
    det = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    o, lse = ops.attention(*det)
    q, k, v, pool, past, gpool, gids, q_start, scale, indptr, pages, tile = det
    torch.library.opcheck(ops.attention_backward, (torch.randn_like(o), q, k, v, o, lse, pool, past, gpool, gids,
                                                   q_start, scale, indptr, pages, tile, None, None, True))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_attention_kept_equals_attention_and_passes_opcheck(problem, sparse):
    # Stage 2 with kept outputs: the forward's o back (a copy), the same backward.
    args = list(_attention_args(problem, sparse))
    q, k, v = (args[i].detach().clone().requires_grad_(True) for i in range(3))
    o, lse = ops.attention(q, k, v, *args[3:])
    (o * torch.arange(o.numel(), dtype=o.dtype).view_as(o).sin()).sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    kept = ops.attention_kept(q2, k2, v2, o.detach(), lse, *args[3:])
    assert torch.equal(kept, o.detach())
    (kept * torch.arange(o.numel(), dtype=o.dtype).view_as(o).sin()).sum().backward()
    for g, t in zip(want, (q2, k2, v2)):
        assert torch.equal(g, t.grad)
    det = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(ops.attention_kept, (*det[:3], o.detach(), lse, *det[3:]))


def test_opcheck_page_ops(problem):
    p = problem
    st, seq = p["st"], p["seq"]
    own = st.page_ids(seq, 0, 2, 4)
    torch.library.opcheck(ops.write_pages, (st.kv_pool, p["k"][32:], p["v"][32:], own))
    torch.library.opcheck(ops.gather_pages, (st.kv_pool, own, 20))
    gids = st.grad_ids[p["past"].long()]
    torch.library.opcheck(ops.accumulate_pages, (st.grad_pool, gids, torch.ones(32, HKV, D, dtype=p["dt"]),
                                                 torch.ones(32, HKV, D, dtype=p["dt"])))


def test_page_ops_round_trip(problem):
    p = problem
    st, seq = p["st"], p["seq"]
    k, v = ops.gather_pages(st.kv_pool, st.page_ids(seq, 0, 0, 4), 52)
    assert torch.equal(k, p["k"]) and torch.equal(v, p["v"])
    gids = st.grad_ids[p["past"].long()]
    before_k, before_v = ops.gather_pages(st.grad_pool, gids, 32)
    ones = torch.ones(32, HKV, D, dtype=p["dt"])
    ops.accumulate_pages(st.grad_pool, gids, ones, 2 * ones)
    after_k, after_v = ops.gather_pages(st.grad_pool, gids, 32)
    assert torch.equal(after_k, before_k + 1) and torch.equal(after_v, before_v + 2)
    # An untouched gradient page (-1) reads as zeros.
    k0, _ = ops.gather_pages(st.grad_pool, torch.tensor([-1], dtype=torch.int32), 5)
    assert torch.count_nonzero(k0) == 0


def test_the_library_reports_errors_as_exceptions(problem):
    p = problem
    st = p["st"]
    with pytest.raises(oomb.OombError, match="chunk holds 1..32 tokens"):
        st.append(p["seq"], 100)
    with pytest.raises(oomb.OombError, match="not a multiple of chunk_size"):
        st.append(p["seq"], 4)  # the sequence's last chunk is partial
    args = list(_attention_args(p, False))
    args[5] = None  # no gradient pool: the backward must refuse, not write anywhere
    o, _ = ops.attention(*args)
    with pytest.raises(ValueError, match="need grad_pool"):
        o.sum().backward()
    with pytest.raises(ValueError, match="past_ids must be int32"):
        ops.attention(*[p["q"], p["k"][32:], p["v"][32:], st.kv_pool, p["past"].long(), None, None, 32, 0.3, None,
                        None, 128])


def test_store_pages_are_released_with_their_gradients(problem):
    p = problem
    st = p["st"]
    assert st.stats()["kv_in_use"] == 4 and st.stats()["grad_in_use"] == 2
    st.pop_chunk(p["seq"])
    st.pop_chunk(p["seq"])
    s = st.stats()
    assert s["kv_in_use"] == 0 and s["grad_in_use"] == 0
    assert s["bytes_reserved"] == s["kv_capacity"] * s["pair_bytes"] * 2  # both pools, up front


def test_torch_compile_fullgraph_keeps_the_gradient_pages(problem):
    # A compiled graph calls the op like any other: the pools are tensor arguments, the backward's
    # additions into the gradient pages happen as in eager mode (Inductor's C++ backend; ~30 s).
    p = problem
    st = p["st"]

    def f(q, k, v):
        o, _ = ops.attention(q * 2, k, v, st.kv_pool, p["past"], st.grad_pool, st.grad_ids, 32, 0.35, None, None, 128)
        return o.sin().sum()

    results = []
    for fn in (torch.compile(f, fullgraph=True), f):
        q = p["q"].clone().requires_grad_()
        k = p["k"][32:].clone().requires_grad_()
        v = p["v"][32:].clone().requires_grad_()
        touched = st.grad_ids[p["past"].long()].long()  # the rest of the pool is uninitialised
        before = st.grad_pool[touched].clone()
        loss = fn(q, k, v)
        loss.backward()
        results.append((loss.detach(), q.grad, k.grad, st.grad_pool[touched] - before))
    tol = 1e-12 if p["dt"] == torch.float64 else 1e-5
    for a, b in zip(*results):
        assert (a - b).abs().max() <= tol * max(1.0, float(b.abs().max()))


def test_a_dropped_store_frees_its_pools():
    import gc
    import weakref
    st = PagedStore(layers=1, page_size=P, kv_heads=HKV, head_dim=D, chunk_size=32, max_pages=4, max_grad_pages=4)
    ref = weakref.ref(st)
    del st
    gc.collect()
    assert ref() is None  # nothing (a registry, an op) keeps a store, and its pools, alive


def test_attention_with_document_bounds_equals_masked_pytorch_and_passes_opcheck(problem):
    # Documents start at 5 (past, mid-page), 40 and 45 (the chunk's queries 8 and 13): query i sees
    # keys from its document's start (key_lower) to itself.
    p = problem
    st, dt = p["st"], p["dt"]
    tol = 1e-12 if dt == torch.float64 else 2e-5
    pos = torch.arange(32, 52)
    key_lower = torch.where(pos >= 45, 45, torch.where(pos >= 40, 40, 5)).to(torch.int64)
    q = p["q"].clone().requires_grad_()
    k = p["k"][32:].clone().requires_grad_()
    v = p["v"][32:].clone().requires_grad_()
    args = (q, k, v, st.kv_pool, p["past"], st.grad_pool, st.grad_ids, 32, 1 / math.sqrt(D), None, None, 128, None,
            key_lower)
    o, lse = ops.attention(*args)
    g = HQ // HKV
    kk, vv = p["k"].repeat_interleave(g, 1), p["v"].repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", p["q"], kk) / math.sqrt(D)
    keys = torch.arange(52)[None]
    s = s.masked_fill((keys > pos[:, None]) | (keys < key_lower[:, None]), -math.inf)
    assert (o - torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), vv)).abs().max() <= tol
    assert (lse - torch.logsumexp(s, -1)).abs().max() <= tol
    torch.library.opcheck(ops.attention, args)
    with pytest.raises(ValueError, match="key_lower must be int64"):
        ops.attention(*args[:-1], key_lower.to(torch.int32))
