# SPDX-License-Identifier: Apache-2.0
"""PEFT LoRA over a frozen base through the driver: gradients only on the adapters, equal to full
backprop's through the PEFT model; lora_dropout in train mode draws the same masks in both stages."""
import pytest
import torch

peft = pytest.importorskip("peft")

from conftest import make_model, shift, worst_error  # noqa: E402
from oomb.torch import ChunkRecurrent, Offload, RefusedError  # noqa: E402

TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]  # k_proj left frozen: layer 0's keys have no gradient


def lora_model(family, dropout=0.0, seed=0):
    model = make_model(family)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS,
                                                    lora_dropout=dropout))
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():  # B starts at zero in PEFT: make it nonzero so A gets a gradient too
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return pm.train()


def full_backprop(pm, ids):
    pm.zero_grad(set_to_none=True)
    logits = pm(input_ids=ids, use_cache=False).logits
    targets = shift(ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum") / int((targets != -100).sum())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in pm.named_parameters() if p.grad is not None}
    pm.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=3)], ids=["in-place", "offload"])
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_lora_gradients_equal_full_backprop(family, offload, ids_of):
    pm = lora_model(family)
    ids = ids_of(150)
    ref_loss, ref = full_backprop(pm, ids)
    adapters = {n for n, p in pm.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters) and set(ref) == adapters
    cr = ChunkRecurrent(pm, chunk=32, page=16, max_tokens=160, offload=offload)  # the PeftModel itself
    loss = cr.forward_backward(ids)
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    for n, p in pm.named_parameters():
        if n in adapters:
            assert p.grad is not None, n
        else:
            assert p.grad is None, f"frozen {n} got a gradient"
    worst, where = 0.0, None
    for n, p in pm.named_parameters():
        if n in adapters:
            e = float((p.grad - ref[n]).norm() / ref[n].norm())
            if e >= worst:
                worst, where = e, n
    print(f"{family} LoRA {'offload' if offload else 'in place'}: worst adapter gradient error {worst:.2e} ({where})")
    assert worst <= 1e-10, f"{where} off by {worst:.3e}"


def chunked_through_hf_cache(pm, ids, chunk):
    """The driver's step another way: the chunks in order through the PeftModel with HF's own KV
    cache under autograd (each chunk attends the cached past, sdpa), one backward of HF's loss;
    dropout draws chunk by chunk in the order the driver's stage 1 does. Returns the loss, the
    adapters' gradients and the generator state after the forward."""
    from transformers import DynamicCache
    pm.zero_grad(set_to_none=True)
    targets = shift(ids)
    count = int((targets != -100).sum())
    cache, loss, n = DynamicCache(), 0.0, ids.shape[1]
    for s0 in range(0, n, chunk):
        s1 = min(n, s0 + chunk)
        out = pm(input_ids=ids[:, s0:s1], position_ids=torch.arange(s0, s1)[None], past_key_values=cache,
                 use_cache=True)
        loss = loss + torch.nn.functional.cross_entropy(out.logits[0], targets[0, s0:s1], ignore_index=-100,
                                                        reduction="sum") / count
    after = torch.get_rng_state()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in pm.named_parameters() if p.grad is not None}
    pm.zero_grad(set_to_none=True)
    return loss.detach(), grads, after


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=3)], ids=["in-place", "offload"])
def test_lora_dropout_draws_the_same_masks_in_both_stages(offload, ids_of):
    # lora_dropout 0.3 in train mode: the driver saves the generators before each chunk's stage-1
    # forward and restores them before stage 2 recomputes it, so the gradient is that of the loss
    # stage 1 computed, with its masks; the reference draws the same masks chunk by chunk.
    pm = lora_model("qwen2", dropout=0.3)
    ids = ids_of(150)
    torch.manual_seed(123)
    ref_loss, ref, ref_after = chunked_through_hf_cache(pm, ids, 32)
    cr = ChunkRecurrent(pm, chunk=32, page=16, max_tokens=160, offload=offload)
    torch.manual_seed(123)
    loss = cr.forward_backward(ids)
    assert torch.equal(torch.get_rng_state(), ref_after)  # the step drew like one forward
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    worst = max(float((p.grad - ref[n]).norm() / ref[n].norm()) for n, p in pm.named_parameters() if n in ref)
    assert worst <= 1e-10, worst
    # The masks mattered: in eval mode (no dropout) the gradient is another one.
    pm.zero_grad(set_to_none=True)
    pm.eval()
    ChunkRecurrent(pm, chunk=32, page=16, max_tokens=160).forward_backward(ids)
    apart = max(float((p.grad - ref[n]).norm() / ref[n].norm()) for n, p in pm.named_parameters() if n in ref)
    assert apart > 1e-2, apart


def test_lora_through_the_trainer_equals_stock_trainer(tmp_path):
    # Two steps of accumulation 2 through ChunkRecurrentTrainer on the PeftModel equal stock Trainer
    # on an identical one (float64 loss); the base is unchanged, the optimizer holds adapter state only.
    import transformers
    from oomb.hf import ChunkRecurrentTrainer
    from test_hf_trainer import Rows, args, make_rows

    rows = make_rows(count=4)

    def loss64(outputs, labels, num_items_in_batch):
        logits, targets = outputs.logits[:, :-1], labels[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100, reduction="sum") / num_items_in_batch

    ref = lora_model("qwen2")
    transformers.Trainer(model=ref, args=args(tmp_path / "stock", max_steps=2), train_dataset=Rows(rows),
                         compute_loss_func=loss64).train()
    pm = lora_model("qwen2")
    base_before = {n: p.detach().clone() for n, p in pm.named_parameters() if not p.requires_grad}
    trainer = ChunkRecurrentTrainer(model=pm, args=args(tmp_path / "oomb", max_steps=2), train_dataset=Rows(rows),
                                    chunk=32, page=16, max_tokens=80)
    trainer.train()
    got, want = dict(pm.named_parameters()), dict(ref.named_parameters())
    err = max(float((got[n].detach() - want[n].detach()).abs().max()) for n in got)
    print(f"LoRA through the trainer vs stock Trainer: worst weight difference {err:.2e}")
    assert err <= 1e-10
    assert all(torch.equal(got[n], base_before[n]) for n in base_before)
    state_params = {id(p) for p in trainer.optimizer.state}
    assert state_params == {id(p) for p in pm.parameters() if p.requires_grad}
