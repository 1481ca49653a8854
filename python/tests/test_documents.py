# SPDX-License-Identifier: Apache-2.0
"""Packed documents (position_ids restarting at 0, as DataCollatorWithFlattening makes them): the
driver trains each document as if it were alone, equal to full-sequence backprop over each
document separately; the documents matter; bad positions are refused by name. (Page-sparse packed
documents: test_sparse.py.)"""
import pytest
import torch
import transformers

from conftest import FAMILIES, VOCAB, make_model, worst_error
from oomb.torch import ChunkRecurrent, Offload, RefusedError

TOL64 = 1e-10
# 170 tokens in chunks of 32 and pages of 16: documents start mid-page and mid-chunk (13, 140,
# 150), on a chunk boundary (64), span chunks (13..64, 64..140) and lie inside one (140..150).
STARTS = [0, 13, 64, 140, 150]
N = 170


def packed(seed=1):
    """The documents of STARTS as DataCollatorWithFlattening packs them: input_ids, labels (-100 at
    each document's first token) and position_ids (0, 1, ... per document), one row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (N,), generator=g)
    docs = [ids[a:b].tolist() for a, b in zip(STARTS, STARTS[1:] + [N])]
    batch = transformers.DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    assert batch["input_ids"][0].tolist() == ids.tolist()
    return batch, docs


def each_alone(model, docs):
    """Full-sequence backprop (the model's own attention) over each document separately, of the
    packed row's loss: every document's next-token cross-entropies summed, over all their targets."""
    model.zero_grad(set_to_none=True)
    count = sum(len(d) - 1 for d in docs)
    total = 0.0
    for d in docs:
        ids = torch.tensor(d)[None]
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum") / count
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return total, grads


@pytest.mark.parametrize("offload,keep", [(None, False), (Offload(kv_slots=3), False), (None, True)],
                         ids=["in-place", "offload", "kept-outputs"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_documents_equal_each_document_alone(family, offload, keep):
    model = make_model(family)
    batch, docs = packed()
    ref_loss, ref = each_alone(model, docs)
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=N, offload=offload, keep_attention_outputs=keep)
    loss = cr.forward_backward(batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"])
    worst, where = worst_error(model, ref)
    mode = "offload" if offload else "kept outputs" if keep else "in place"
    print(f"{family} {mode}: worst per-tensor gradient error {worst:.2e} ({where})")
    assert abs(float(loss) - ref_loss) <= 1e-12 * abs(ref_loss)
    assert worst <= TOL64, f"{family}: {where} off by {worst:.3e}"
    assert cr.memory()["kv_in_use"] == 0 and cr.memory()["grad_in_use"] == 0


def test_the_documents_matter_and_one_document_is_no_packing():
    model = make_model("qwen2")
    batch, _docs = packed()
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=N)
    packed_loss = float(cr.forward_backward(batch["input_ids"], labels=batch["labels"],
                                            position_ids=batch["position_ids"]))
    model.zero_grad(set_to_none=True)
    stream_loss = float(cr.forward_backward(batch["input_ids"], labels=batch["labels"]))
    assert abs(packed_loss - stream_loss) > 1e-3 * abs(stream_loss)  # across documents, other positions
    # position_ids 0, 1, ... are one document: the same bits as none.
    model.zero_grad(set_to_none=True)
    cr.forward_backward(batch["input_ids"], labels=batch["labels"])
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    cr.forward_backward(batch["input_ids"], labels=batch["labels"], position_ids=torch.arange(N)[None])
    assert all(torch.equal(p.grad, plain[n]) for n, p in model.named_parameters())


def test_bad_positions_are_refused():
    model = make_model("llama")
    batch, _docs = packed()
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=N)
    ids = batch["input_ids"]
    shifted = batch["position_ids"] + 1  # does not start at 0
    with pytest.raises(RefusedError, match=r"position_ids\[0, 0\] = 1"):
        cr.forward_backward(ids, position_ids=shifted)
    jump = batch["position_ids"].clone()
    jump[0, 20] += 3  # skips positions inside a document
    with pytest.raises(RefusedError, match=r"position_ids\[0, 20\]"):
        cr.forward_backward(ids, position_ids=jump)
    with pytest.raises(RefusedError, match="must be integer"):
        cr.forward_backward(ids, position_ids=batch["position_ids"][:, :10])
    assert cr.memory()["kv_in_use"] == 0


def test_trainer_with_data_collator_with_flattening_trains_each_document_alone(tmp_path):
    """ChunkRecurrentTrainer's training_step passes the flattened batch's position_ids on."""
    from oomb.hf import ChunkRecurrentTrainer

    model = make_model("qwen3").train()
    batch, docs = packed(seed=5)
    _ref_loss, ref = each_alone(model, docs)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=1,
                                          report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = ChunkRecurrentTrainer(model=model, args=args, data_collator=transformers.DataCollatorWithFlattening(),
                                    chunk=32, page=16, max_tokens=N)
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.current_gradient_accumulation_steps = 1  # as Trainer's loop sets it (no accumulation)
    trainer.training_step(model, dict(batch))
    worst, where = worst_error(model, ref)
    assert worst <= TOL64, f"{where} off by {worst:.3e}"


@pytest.mark.parametrize("offload", [None, Offload(kv_slots=3)], ids=["in-place", "offload"])
def test_pages_of_earlier_documents_get_no_gradient_page_and_do_not_move(offload):
    # A long first document, then a second one from token 150: chunks after it read nothing before
    # page 9 (150 // 16), so they touch no gradient page there and, with offload, bring none near.
    model = make_model("qwen3")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, VOCAB, (1, N), generator=g)
    pos = torch.cat([torch.arange(150), torch.arange(N - 150)])[None]
    labels = ids.clone()
    labels[0, [0, 150]] = -100
    use = {}
    for name, position_ids in (("packed", pos), ("stream", None)):
        cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=N, offload=offload)
        cr.forward_backward(ids, labels=labels, position_ids=position_ids)
        mem = cr.memory()
        use[name] = (mem["grad_high_water"], mem["near"]["kv"]["bytes_to_near"] if offload else 0)
        model.zero_grad(set_to_none=True)
    assert use["packed"][0] < use["stream"][0], use  # fewer gradient pages
    if offload is not None:
        assert use["packed"][1] < use["stream"][1], use  # fewer K/V pages moved
