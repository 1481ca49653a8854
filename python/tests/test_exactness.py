# SPDX-License-Identifier: Apache-2.0
"""Dense chunk-recurrent training equals full-sequence backprop (HF, sdpa) for every family."""
import pytest
import torch

from conftest import FAMILIES, make_model, reference_grads, shift, worst_error
from oomb.torch import ChunkRecurrent, Offload

TOL64 = 1e-10


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=3)], ids=["in-place", "offload"])
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_float64_equals_full_backprop(family, offload, ids_of):
    # 150 tokens in chunks of 32: four full chunks and a partial one; pages of 16 (10 per layer).
    # Offload: the past streams through near tiers of 3 K/V and 3 gradient slots, 3 pages a window.
    model = make_model(family)
    ids = ids_of(150)
    ref_loss, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=160, offload=offload)
    loss = cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    print(f"{family} {'offload' if offload else 'in place'}: worst per-tensor gradient error {worst:.2e} ({where}); "
          f"loss {float(loss):.15f}")
    if offload is not None:
        near = cr.memory()["near"]
        assert near["kv"]["slots"] == 3 and near["grad"]["slots"] == 3
        assert near["kv"]["evictions"] > 0 and near["grad"]["write_backs"] > 0  # it really streamed
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    assert worst <= TOL64, f"{family}: {where} off by {worst:.3e}"
    # Every page went back; the model's own attention is restored.
    assert cr.memory()["kv_in_use"] == 0 and cr.memory()["grad_in_use"] == 0
    assert model.config._attn_implementation == "sdpa"


def test_labels_loss_mask_and_chunk_equal_to_page(ids_of):
    model = make_model("qwen3")
    ids = ids_of(96)
    labels = ids.clone()
    labels[0, 10:30] = -100
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 50:60] = False
    want = labels.clone()
    want[~mask] = -100
    _, ref = reference_grads(model, ids, shift(want))
    cr = ChunkRecurrent(model, chunk=16, page=16, max_tokens=96)  # 6 chunks of one page each
    cr.forward_backward(ids, labels=labels, loss_mask=mask)
    worst, where = worst_error(model, ref)
    assert worst <= TOL64, f"{where} off by {worst:.3e}"


def test_batch_is_accumulated_row_by_row(ids_of):
    model = make_model("llama")
    ids = ids_of(70, batch=2)
    _, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=80)
    cr.forward_backward(ids, attention_mask=torch.ones_like(ids))
    worst, where = worst_error(model, ref)
    assert worst <= TOL64, f"{where} off by {worst:.3e}"


def test_gradients_accumulate_like_backward(ids_of):
    # Two calls add up, as two loss.backward() would: optimizers and clipping see the usual .grad.
    model = make_model("qwen2")
    ids = ids_of(64)
    _, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    cr.forward_backward(ids)
    cr.forward_backward(ids)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, 2 * ref[n], rtol=1e-10, atol=0), n


def test_float32(ids_of):
    model = make_model("qwen2", dtype=torch.float32)
    ids = ids_of(100)
    _, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=100)
    cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    print(f"float32: worst per-tensor gradient error {worst:.2e} ({where})")
    assert worst <= 1e-4, f"{where} off by {worst:.3e}"


def test_a_single_chunk_and_a_model_trained_with_an_optimizer(ids_of):
    model = make_model("mistral")
    ids = ids_of(40)
    cr = ChunkRecurrent(model, chunk=64, page=16, max_tokens=64)
    model.train()  # no dropout anywhere in these configs: train mode is allowed
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        losses.append(float(cr.forward_backward(ids)))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    assert losses[-1] < losses[0]


def test_offload_keeps_the_near_tier_fixed_as_the_sequence_grows(ids_of):
    moved, near_bytes = [], set()
    for n in (64, 192):
        model = make_model("qwen2")
        ids = ids_of(n)
        _, ref = reference_grads(model, ids, shift(ids))
        cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=192, offload=Offload(kv_slots=4))
        cr.forward_backward(ids)
        worst, where = worst_error(model, ref)
        assert worst <= TOL64, f"{n} tokens: {where} off by {worst:.3e}"
        near = cr.memory()["near"]
        assert (near["kv"]["slots"], near["grad"]["slots"]) == (4, 4)
        moved.append(near["kv"]["bytes_to_near"])
        near_bytes.add(cr.memory()["near_bytes"])
    assert moved[1] > moved[0]
    assert len(near_bytes) == 1  # the slots are the same bytes whatever the length


def test_offload_default_slots_and_bf16_gradient_homes(ids_of):
    # Offload() without kv_slots: the C++ trainer's default tiers (the same rule on both devices).
    # grad_homes="bf16": the gradient homes round each write-back to bf16, the slots add in float64,
    # so the gradients are close to full backprop's but no longer exact.
    model = make_model("qwen2")
    ids = ids_of(150)
    _, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=160, offload=Offload())
    cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    assert worst <= TOL64, f"default slots: {where} off by {worst:.3e}"
    assert cr.memory()["near"]["kv"]["slots"] == 256  # two windows of max(2 * 2 pages, 128)
    model.zero_grad(set_to_none=True)
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=160, offload=Offload(kv_slots=4, grad_homes="bf16"))
    cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    print(f"bf16 gradient homes: worst per-tensor gradient error {worst:.2e} ({where})")
    assert 1e-6 < worst <= 2e-2, f"bf16 gradient homes: {where} off by {worst:.3e}"


def test_lm_head_in_pieces(ids_of, monkeypatch):
    # Stage 2 runs the LM head and loss HEAD_PIECE tokens at a time; pieces of 16 in chunks of 48
    # (three pieces a chunk; the last chunk of 4 tokens one partial piece): full backprop's gradients.
    import oomb.torch
    monkeypatch.setattr(oomb.torch, "HEAD_PIECE", 16)
    model = make_model("qwen2")
    ids = ids_of(100)
    ref_loss, ref = reference_grads(model, ids, shift(ids))
    cr = ChunkRecurrent(model, chunk=48, page=16, max_tokens=112)
    loss = cr.forward_backward(ids)
    worst, where = worst_error(model, ref)
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    assert worst <= TOL64, f"{where} off by {worst:.3e}"


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_kept_attention_outputs_change_nothing(family, ids_of):
    # keep_attention_outputs: stage 2 reuses stage 1's (o, lse) instead of recomputing them; the
    # same arithmetic, so the gradients are the recomputing driver's bit for bit.
    model = make_model(family)
    ids = ids_of(150)
    ChunkRecurrent(model, chunk=32, page=16, max_tokens=160).forward_backward(ids)
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=160, keep_attention_outputs=True)
    cr.forward_backward(ids)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, want[n]), n
    with pytest.raises(ValueError, match="keep_attention_outputs with offload is not supported"):
        ChunkRecurrent(model, chunk=32, page=16, max_tokens=160, keep_attention_outputs=True,
                       offload=Offload(kv_slots=3))


def test_deterministic_is_accepted_on_the_cpu_and_changes_no_bit(ids_of):
    # The CPU path sums in a fixed order already: deterministic=True gives the same bits.
    model = make_model("qwen2")
    ids = ids_of(100)
    grads = []
    for deterministic in (False, True):
        model.zero_grad(set_to_none=True)
        cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=128, deterministic=deterministic)
        assert cr.deterministic == deterministic
        cr.forward_backward(ids)
        grads.append([p.grad.clone() for p in model.parameters()])
        cr.close()
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=4)], ids=["in-place", "offload"])
def test_weight_grads_in_gemm_take_over_autograds_accumulation(offload, ids_of, monkeypatch):
    # Stage 2's nn.Linear weights get their gradient added by addmm_ inside _LinearIntoGrad (the
    # default) instead of by autograd's accumulation; the gradients are full backprop's either way.
    # A weight with a hook keeps autograd's way, so its hook still fires once per chunk; afterwards
    # no module keeps the forward the driver set on it.
    import oomb.torch as ot
    calls = {"fused": 0}
    plain_backward = ot._LinearIntoGrad.backward

    def counting_backward(ctx, dy):
        calls["fused"] += 1
        return plain_backward(ctx, dy)
    monkeypatch.setattr(ot._LinearIntoGrad, "backward", staticmethod(counting_backward))
    model = make_model("qwen2")
    ids = ids_of(100)  # 4 chunks of 32
    _, ref = reference_grads(model, ids, shift(ids))
    hooked = model.model.layers[0].mlp.down_proj.weight
    fired = []
    hooked.register_post_accumulate_grad_hook(lambda p: fired.append(1))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    grads = []
    for in_gemm in (True, False):
        model.zero_grad(set_to_none=True)
        calls["fused"], fired[:] = 0, []
        cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=128, offload=offload, weight_grads_in_gemm=in_gemm)
        cr.forward_backward(ids)
        worst, where = worst_error(model, ref)
        assert worst <= TOL64, f"weight_grads_in_gemm={in_gemm}: {where} off by {worst:.3e}"
        # The LM head runs in one piece per chunk here (HEAD_PIECE > 32 tokens).
        assert calls["fused"] == (4 * (linears - 1) if in_gemm else 0)
        assert len(fired) == 4  # the hooked weight: autograd's accumulation, once per chunk
        assert not any("forward" in m.__dict__ for m in model.modules())
        grads.append([p.grad.clone() for p in model.parameters()])
        cr.close()
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=4)], ids=["in-place", "offload"])
def test_progress_reports_every_chunk_of_both_stages(offload, ids_of):
    # 70 tokens in chunks of 32 (3 chunks), a batch of 2 rows: stage 1 forwards, stage 2 backwards,
    # row after row, seconds never going back.
    import io
    from oomb.torch import Progress, print_progress
    seen = []
    model = make_model("qwen2")
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=80, offload=offload, progress=seen.append)
    cr.forward_backward(ids_of(70, batch=2))
    want = [(row, stage, c) for row in range(2) for stage, cs in ((1, [0, 1, 2]), (2, [2, 1, 0])) for c in cs]
    assert [(p.row, p.stage, p.chunk) for p in seen] == want
    assert all(isinstance(p, Progress) and (p.chunks, p.rows, p.tokens) == (3, 2, 70) for p in seen)
    assert all(a.seconds <= b.seconds for a, b in zip(seen, seen[1:]))
    out = io.StringIO()
    every = print_progress(every=0.0, file=out)
    for p in seen:
        every(p)
    lines = out.getvalue().splitlines()
    assert len(lines) == 12 and lines[0].startswith("  row 1/2, forward chunk 1/3 |")
    assert lines[-1].startswith("  row 2/2, backward chunk 3/3 | 100% |") and "ETA 0.0 s" in lines[-1]
    out = io.StringIO()
    quiet = print_progress(every=1e9, file=out)
    for p in seen:
        quiet(p)
    assert len(out.getvalue().splitlines()) == 3  # the first report, and each row's end
    with pytest.raises(ValueError, match="progress must be a callable"):
        ChunkRecurrent(model, chunk=32, page=16, max_tokens=80, progress=True)
