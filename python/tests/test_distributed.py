# SPDX-License-Identifier: Apache-2.0
"""Two CPU processes over gloo, each running its own sequence through the driver, gradients
all-reduced after stage 2: equal to one process that accumulates both sequences (their mean)."""
import datetime
import faulthandler
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import make_model
from oomb.torch import ChunkRecurrent

WORLD = 2
LENGTHS = (70, 96)  # one sequence per rank, of different lengths (and chunk counts)


def sequences():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 101, (1, n), generator=g) for n in LENGTHS]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank))
    faulthandler.dump_traceback_later(90, exit=True)  # a hung rank fails the test with its stack, not CI's clock
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    try:
        from oomb.distributed import all_reduce_gradients

        model = make_model("qwen2").train()  # the same seed on every rank: the same weights
        # Not wrapped in DistributedDataParallel: the driver runs the modules directly, so DDP's
        # forward (which arms its reducer's hooks) never runs and DDP would average nothing; one
        # all-reduce after stage 2 is what averages the gradients.
        cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=max(LENGTHS))
        loss = cr.forward_backward(sequences()[rank])
        all_reduce_gradients(model)
        torch.save({"loss": loss, "grads": {n: p.grad for n, p in model.named_parameters()}},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def test_two_gloo_ranks_equal_one_process_accumulating(tmp_path):
    mp.spawn(rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    # One process: both sequences, each loss weighted 1/2 (the mean over ranks).
    model = make_model("qwen2").train()
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=max(LENGTHS))
    for ids in sequences():
        cr.forward_backward(ids, scale=1.0 / WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    worst = 0.0
    for n, p in model.named_parameters():
        for r in ranks:
            worst = max(worst, float((r["grads"][n] - p.grad).norm() / p.grad.norm()))
        assert torch.equal(ranks[0]["grads"][n], ranks[1]["grads"][n]), n  # every rank holds the same
    print(f"2 gloo ranks vs one process: worst per-tensor gradient error {worst:.2e}")
    assert worst <= 1e-12


def ddp_rank_main(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank))
    faulthandler.dump_traceback_later(90, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    model = make_model("qwen2").train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    cr = ChunkRecurrent(ddp, chunk=32, page=16, max_tokens=max(LENGTHS))  # the wrapper, as users hold it
    ids = sequences()[rank]
    cr.forward_backward(ids)  # synced: the mean over ranks
    synced = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with ddp.no_sync():  # accumulates locally, as DDP does
        cr.forward_backward(ids)
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    cr.forward_backward(ids, scale=0.5)  # the window's last call: synced
    torch.save({"synced": synced, "local": local, "accumulated": {n: p.grad for n, p in model.named_parameters()}},
               os.path.join(out_dir, f"ddp{rank}.pt"))
    # Out without teardown: destroying the gloo group while the DDP wrapper holds it can deadlock
    # at exit in torch's teardown (docs/pytorch.md); the results are saved.
    os._exit(0)


def test_a_ddp_wrapped_model_trains_as_ddp_would(tmp_path):
    # ChunkRecurrent(DistributedDataParallel(model)): each call all-reduces (the mean) after stage 2,
    # except inside no_sync(); 2 gloo ranks against one process computing each sequence's gradient.
    mp.spawn(ddp_rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    grads = []
    for ids in sequences():
        model = make_model("qwen2").train()
        ChunkRecurrent(model, chunk=32, page=16, max_tokens=max(LENGTHS)).forward_backward(ids)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    ranks = [torch.load(tmp_path / f"ddp{r}.pt") for r in range(WORLD)]
    worst = 0.0
    for n in grads[0]:
        mean = (grads[0][n] + grads[1][n]) / WORLD
        for r, got in enumerate(ranks):
            for key, want in (("synced", mean), ("local", grads[r][n]), ("accumulated", 1.5 * mean)):
                worst = max(worst, float((got[key][n] - want).norm() / want.norm()))
    print(f"DDP-wrapped, 2 gloo ranks: worst per-tensor gradient error {worst:.2e}")
    assert worst <= 1e-12
