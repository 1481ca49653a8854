# SPDX-License-Identifier: Apache-2.0
"""oomb.hf.ChunkRecurrentTrainer: a few Trainer steps (gradient accumulation 2, clipping, an LR
schedule) equal the same steps through a plain loop over the driver, and stock Trainer's steps
over the model's own full-sequence backprop; checkpoints are written and resume."""
import os

import pytest
import torch
import transformers

from conftest import VOCAB, make_model
from oomb.hf import ChunkRecurrentTrainer
from oomb.torch import ChunkRecurrent

STEPS, ACCUM, LR = 3, 2, 1e-2


class Rows(torch.utils.data.IterableDataset):
    """Fixed rows of different lengths and label masks, in order (no sampler: no shuffling)."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def make_rows(count=STEPS * ACCUM, seed=3):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        n = 40 + 13 * (i % 3)  # 40, 53, 66 tokens: the accumulation window's targets differ per row
        ids = torch.randint(0, VOCAB, (n,), generator=g)
        labels = ids.clone()
        labels[: 5 + 3 * i] = -100  # a prompt that is no target
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    return rows


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=ACCUM,
                max_steps=STEPS, learning_rate=LR, lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.5,
                weight_decay=0.01, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                dataloader_num_workers=0, seed=0, data_seed=0, disable_tqdm=True)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def optimizer_and_schedule(model):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return opt, transformers.get_linear_schedule_with_warmup(opt, 1, STEPS)


def worst_weight_error(a, b):
    pa = dict(a.named_parameters())
    return max(float((p.detach() - pa[n].detach()).abs().max()) for n, p in b.named_parameters())


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)], ids=["float64", "float32"])
def test_trainer_equals_plain_loop_over_the_driver(tmp_path, dtype, tol):
    rows = make_rows()
    # Plain loop: per optimizer step, two rows; each row's gradient scaled by its targets over the
    # window's (HF's sum / num_items_in_batch), clipping, AdamW, the linear schedule.
    ref = make_model("qwen2", dtype=dtype).train()
    opt, sched = optimizer_and_schedule(ref)
    cr = ChunkRecurrent(ref, chunk=32, page=16, max_tokens=80)
    for s in range(STEPS):
        window = rows[s * ACCUM:(s + 1) * ACCUM]
        total = sum(int(r["labels"][1:].ne(-100).sum()) for r in window)
        for r in window:
            cr.forward_backward(r["input_ids"][None], labels=r["labels"][None],
                                scale=int(r["labels"][1:].ne(-100).sum()) / total)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        sched.step()
        opt.zero_grad()

    model = make_model("qwen2", dtype=dtype)
    trainer = ChunkRecurrentTrainer(model=model, args=args(tmp_path), train_dataset=Rows(rows),
                                    optimizers=optimizer_and_schedule(model), chunk=32, page=16, max_tokens=80)
    out = trainer.train()
    assert out.global_step == STEPS
    err = worst_weight_error(ref, model)
    print(f"{dtype}: trainer vs plain loop: worst weight difference {err:.2e}")
    assert err <= tol
    assert model.config._attn_implementation == "sdpa"


def test_trainer_equals_stock_trainer(tmp_path, dtype=torch.float64, tol=1e-10):
    # float64 only: in float32 the gradients agree to ~1e-6 (test_float32 in test_exactness.py),
    # but Adam's first steps (lr * g / |g|) amplify that on near-zero components to ~5e-5 in weights.
    # Trainer's own optimizer (AdamW, weight decay groups) and linear schedule, made from the args in
    # both; stock Trainer backprops the model's full-sequence loss (sdpa).
    rows = make_rows()
    ref = make_model("llama", dtype=dtype)
    # HF's own loss upcasts logits to float32 even for a float64 model (7e-7 apart after 3 steps);
    # the same loss in the model's dtype: sum over the window's targets / num_items_in_batch.
    def loss_in_model_dtype(outputs, labels, num_items_in_batch):
        logits, targets = outputs.logits[:, :-1], labels[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100, reduction="sum") / num_items_in_batch

    stock = transformers.Trainer(model=ref, args=args(tmp_path / "stock"), train_dataset=Rows(rows),
                                 compute_loss_func=loss_in_model_dtype if dtype == torch.float64 else None)
    stock.train()
    model = make_model("llama", dtype=dtype)
    trainer = ChunkRecurrentTrainer(model=model, args=args(tmp_path / "oomb"), train_dataset=Rows(rows),
                                    chunk=32, page=16, max_tokens=80)
    trainer.train()
    err = worst_weight_error(ref, model)
    print(f"{dtype}: ChunkRecurrentTrainer vs stock Trainer: worst weight difference {err:.2e}")
    assert err <= tol
    # The logged losses (what training_step returned, summed over the window) are the same numbers.
    a = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    b = [h["loss"] for h in stock.state.log_history if "loss" in h]
    assert len(a) == STEPS and a == pytest.approx(b, rel=1e-5)


def test_trainer_checkpoint_and_resume(tmp_path):
    rows = make_rows(count=4 * ACCUM)
    straight = make_model("qwen3")
    ChunkRecurrentTrainer(model=straight, args=args(tmp_path / "a", max_steps=4), train_dataset=Rows(rows),
                          chunk=32, page=16, max_tokens=80).train()

    first = make_model("qwen3")
    ChunkRecurrentTrainer(model=first, args=args(tmp_path / "b", max_steps=4, save_strategy="steps", save_steps=2),
                          train_dataset=Rows(rows), chunk=32, page=16, max_tokens=80).train()
    ckpt = tmp_path / "b" / "checkpoint-2"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
        assert (ckpt / name).exists(), name
    resumed = make_model("qwen3", seed=5)  # other weights: the checkpoint's must replace them
    ChunkRecurrentTrainer(model=resumed, args=args(tmp_path / "c", max_steps=4), train_dataset=Rows(rows),
                          chunk=32, page=16, max_tokens=80).train(resume_from_checkpoint=str(ckpt))
    err = worst_weight_error(straight, resumed)
    print(f"resumed from step 2 vs straight to 4: worst weight difference {err:.2e}")
    assert err <= 1e-12


WORLD = 2


def pair_rows(count):
    """Rows whose global batches (WORLD of them at a time) have one length, as a batch's collation
    needs, with label masks that differ per row: every rank's window has other target counts."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for i in range(count):
        n = 40 + 13 * ((i // WORLD) % 3)
        ids = torch.randint(0, VOCAB, (n,), generator=g)
        labels = ids.clone()
        labels[: 3 + 4 * i] = -100
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    return rows


def trainer_rank(rank, port, out_dir, across):
    import datetime  # noqa: F401 -- the process group's timeout below
    import faulthandler
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    faulthandler.dump_traceback_later(150, exit=True)  # a hung rank fails with its stack, not CI's clock
    torch.set_num_threads(1)
    model = make_model("qwen2")  # the same seed on every rank; DDP broadcasts rank 0's anyway
    trainer = ChunkRecurrentTrainer(model=model, args=args(out_dir, ddp_backend="gloo", max_grad_norm=0.0,
                                                           average_tokens_across_devices=across),
                                    train_dataset=Rows(pair_rows(STEPS * ACCUM * WORLD)),
                                    optimizers=sgd(model), chunk=32, page=16, max_tokens=80)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    torch.save({"weights": {n: p.detach() for n, p in model.named_parameters()}, "losses": losses},
               os.path.join(out_dir, f"rank{rank}.pt"))
    # Out without teardown: destroying gloo's process group while Trainer's DDP wrapper (its
    # reducer) still holds it deadlocked at exit here once (the group's destructor waiting on a
    # runloop thread that waits for the GIL; torch 2.x); the results are saved, nothing else is owed.
    os._exit(0)


def sgd(model):
    # SGD without clipping: unlike Adam's normalised steps and clipping, it moves by the gradient's
    # scale, so a sum over ranks taken for a mean (or the reverse) shows in the weights.
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


@pytest.mark.parametrize("across", [True, False], ids=["tokens-across-devices", "per-rank-means"])
def test_two_gloo_ranks_of_the_trainer_equal_one_process(tmp_path, across):
    # torchrun-style: 2 CPU processes over gloo, Trainer's DDP wrapper around the model, one row per
    # rank per micro-step, accumulation 2. The ranks' gradients are all-reduced at each optimizer step
    # (DDP's own reducer never arms: the driver runs the modules), so every rank holds the weights of
    # one process stepping on all the window's rows, each scaled by its targets over the window's
    # (Trainer's default, average_tokens_across_devices), or on the mean of the ranks' own windows,
    # each normalised by its own targets (without it). Rank r gets rows 2i + r (Trainer's sharding).
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(trainer_rank, args=(port, str(tmp_path), across), nprocs=WORLD, join=True)
    rows = pair_rows(STEPS * ACCUM * WORLD)
    ref = make_model("qwen2").train()
    opt, sched = sgd(ref)
    cr = ChunkRecurrent(ref, chunk=32, page=16, max_tokens=80)
    per = ACCUM * WORLD
    want_losses = []
    targets = [int(r["labels"][1:].ne(-100).sum()) for r in rows]
    for s in range(STEPS):
        window = list(range(s * per, (s + 1) * per))
        # The rows each share is normalised over, and the weight of that group: the whole window
        # (the global mean), or each rank's rows (r, r + WORLD, ...) averaged over the ranks.
        groups = [window] if across else [window[r::WORLD] for r in range(WORLD)]
        loss = 0.0
        for group in groups:
            total = sum(targets[i] for i in group)
            for i in group:
                share = targets[i] / total / len(groups)
                loss += share * float(cr.forward_backward(rows[i]["input_ids"][None], labels=rows[i]["labels"][None],
                                                          scale=share))
        want_losses.append(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    worst = 0.0
    for n, p in ref.named_parameters():
        assert torch.equal(ranks[0]["weights"][n], ranks[1]["weights"][n]), n  # the ranks did not drift
        worst = max(worst, float((ranks[0]["weights"][n] - p.detach()).abs().max()))
    print(f"2 gloo ranks of ChunkRecurrentTrainer vs one process: worst weight difference {worst:.2e}")
    assert worst <= 1e-10
    assert ranks[0]["losses"] == pytest.approx(want_losses, rel=1e-3)  # Trainer logs 4 significant digits
