# SPDX-License-Identifier: Apache-2.0
"""PEFT LoRA over a frozen base through the driver: gradients only on the adapters, equal to full
backprop's through the PEFT model; lora_dropout in train mode is refused."""
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


def test_lora_dropout_in_train_mode_is_refused(ids_of):
    pm = lora_model("qwen2", dropout=0.1)
    with pytest.raises(RefusedError, match="lora_dropout"):
        ChunkRecurrent(pm, chunk=32, page=16, max_tokens=64)
    pm.eval()  # eval mode: dropout is the identity, stage 2 reproduces stage 1
    cr = ChunkRecurrent(pm, chunk=32, page=16, max_tokens=64)
    cr.forward_backward(ids_of(64))
    pm.train()
    with pytest.raises(RefusedError, match="lora_dropout"):  # checked again at every call
        cr.forward_backward(ids_of(64))
    assert cr.memory()["kv_in_use"] == 0


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
