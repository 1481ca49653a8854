# SPDX-License-Identifier: Apache-2.0
"""Page-sparse training equals a full-sequence run masked by the selections stage 1 stored."""
import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from conftest import make_model, reference_grads, shift, worst_error
from oomb.torch import ChunkRecurrent, Offload, SparseConfig

_masks = {}


def _masked_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """sdpa over the whole sequence with this layer's mask from the test's table."""
    mask = _masks[module.layer_idx]
    o = F.scaled_dot_product_attention(query, key, value, attn_mask=mask[None, None], scale=scaling,
                                       enable_gqa=True)
    return o.transpose(1, 2).contiguous(), None


AttentionInterface.register("oomb_test_masked", _masked_sdpa)


def selection_masks(selections, layers, n, chunk, page, tile):
    """[n, n] bool per layer: causal, and a query of chunk c, tile t sees a past page only if the
    selection of (layer, c) lists it for t; its own chunk it sees causally."""
    pos = torch.arange(n)
    causal = pos[None, :] <= pos[:, None]
    masks = {}
    for layer in range(layers):
        m = causal.clone()
        for c, s0 in enumerate(range(0, n, chunk)):
            s1 = min(n, s0 + chunk)
            if s0 == 0:
                continue
            indptr, pages = selections[(layer, c)]
            for t in range(len(indptr) - 1):
                q0, q1 = s0 + t * tile, min(s1, s0 + (t + 1) * tile)
                keep = torch.zeros(n, dtype=torch.bool)
                for p in pages[indptr[t]:indptr[t + 1]].tolist():
                    keep[p * page:(p + 1) * page] = True
                keep[s0:] = True
                m[q0:q1] &= keep[None, :]
        masks[layer] = m
    return masks


@pytest.mark.parametrize("family,scoring,tile,offload", [("qwen2", "quest", 16, None), ("qwen3", "mean", 32, None),
                                                         ("llama", "quest", 16, Offload(kv_slots=2))])
def test_sparse_equals_masked_full_sequence(family, scoring, tile, offload, ids_of):
    n, chunk, page = 160, 32, 16  # up to 8 past pages; budget 1 + sink 1 + local 1 keeps 3
    model = make_model(family)
    ids = ids_of(n)
    sparse = SparseConfig(budget=1, sink=1, local=1, tile=tile, scoring=scoring)
    cr = ChunkRecurrent(model, chunk=chunk, page=page, max_tokens=n, sparse=sparse, offload=offload)
    loss = cr.forward_backward(ids)
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    # The selection really leaves pages out, differently per layer and tile.
    dropped = sum(int(((c * chunk) // page) * (len(ip) - 1) - len(pg)) for (l, c), (ip, pg) in cr.selections.items())
    assert dropped > 0
    _masks.clear()
    _masks.update(selection_masks(cr.selections, model.config.num_hidden_layers, n, chunk, page, tile))
    model.set_attn_implementation("oomb_test_masked")
    try:
        ref_loss, ref = reference_grads(model, ids, shift(ids))
    finally:
        model.set_attn_implementation("sdpa")
    for name, p in model.named_parameters():
        p.grad = got[name]
    worst, where = worst_error(model, ref)
    print(f"sparse {family}/{scoring}{' offload' if offload else ''}: worst per-tensor gradient error {worst:.2e} ({where}), {dropped} page-tiles left out")
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    assert worst <= 1e-10, f"{where} off by {worst:.3e}"
    # And it differs from dense: the mask mattered.
    _, dense = reference_grads(model, ids, shift(ids))
    assert max(float((dense[k] - ref[k]).norm() / ref[k].norm()) for k in ref) > 1e-6


def test_sparse_with_a_budget_covering_the_past_is_dense(ids_of):
    model = make_model("llama")
    ids = ids_of(96)
    _, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=96, sparse=SparseConfig(budget=8, tile=32))
    cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    assert worst <= 1e-10, f"{where} off by {worst:.3e}"


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=2)], ids=["in-place", "offload"])
def test_sparse_packed_documents_select_per_document_and_equal_the_masked_full_sequence(offload):
    # 256 tokens, chunks of 32, pages of 16, tiles of 16; documents at 37 (mid-page) and 200 (mid-
    # chunk): the long middle document's tiles choose 3 of up to 8 of its own past pages, never one
    # wholly before 37; tiles whose document starts in their chunk select nothing.
    n, chunk, page, tile = 256, 32, 16, 16
    starts = [0, 37, 200]
    model = make_model("qwen2")
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
    pos = torch.cat([torch.arange(b - a) for a, b in zip(starts, starts[1:] + [n])])[None]
    labels = ids.clone()
    labels[0, starts] = -100
    sparse = SparseConfig(budget=1, sink=1, local=1, tile=tile)
    cr = ChunkRecurrent(model, chunk=chunk, page=page, max_tokens=n, sparse=sparse, offload=offload)
    loss = cr.forward_backward(ids, labels=labels, position_ids=pos)
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    doc_start = torch.arange(n) - pos[0]
    partial = 0
    for (layer, c), (indptr, pages) in cr.selections.items():
        for t in range(len(indptr) - 1):
            q0 = c * chunk + t * tile
            chosen = pages[indptr[t]:indptr[t + 1]].tolist()
            first = int(doc_start[q0]) // page
            assert all(first <= p < c * chunk // page for p in chosen), (layer, c, t, chosen)
            candidates = max(0, c * chunk // page - first)
            assert len(chosen) == min(candidates, 3)
            partial += candidates > 3
    assert partial > 0  # the budget really left pages out
    # The reference: the model's own attention at the packed positions, masked causally, per
    # document and by the selections stage 1 stored.
    masks = selection_masks(cr.selections, model.config.num_hidden_layers, n, chunk, page, tile)
    same_doc = doc_start[None, :] == doc_start[:, None]
    _masks.clear()
    _masks.update({layer: m & same_doc for layer, m in masks.items()})
    model.set_attn_implementation("oomb_test_masked")
    try:
        ref_loss, ref = reference_grads(model, ids, shift(labels), position_ids=pos)
    finally:
        model.set_attn_implementation("sdpa")
    for name, p in model.named_parameters():
        p.grad = got[name]
    worst, where = worst_error(model, ref)
    print(f"sparse packed documents{' offload' if offload else ''}: worst per-tensor gradient error {worst:.2e} ({where})")
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    assert worst <= 1e-10, f"{where} off by {worst:.3e}"
