# SPDX-License-Identifier: Apache-2.0
"""Data parallelism over torch.distributed: each rank runs its own sequences through the driver,
then the gradients are averaged across ranks before the optimizer step.

    loss = cr.forward_backward(my_sequence)   # this rank's .grad
    oomb.distributed.all_reduce_gradients(model)   # every rank: the mean over ranks
    optimizer.step(); optimizer.zero_grad()

``DistributedDataParallel`` alone would average nothing: it all-reduces from autograd hooks that
only its own ``forward`` arms, and the driver runs the model's modules directly and calls
``backward`` once per chunk. So ``ChunkRecurrent`` given a DDP wrapper calls
``all_reduce_gradients`` itself after each step (not inside the wrapper's ``no_sync()``), and
``oomb.hf.ChunkRecurrentTrainer`` at each optimizer step; this function is for loops that keep the
model unwrapped. The same code runs over NCCL on GPUs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["all_reduce_gradients"]


def all_reduce_gradients(model: torch.nn.Module, group: Optional[dist.ProcessGroup] = None,
                         average: bool = True, bucket_bytes: int = 25 * 2**20) -> None:
    """All-reduces every parameter's ``.grad`` over ``group`` (default: the world), in place, and
    divides by the group's size when ``average``. Parameters with no gradient (a frozen base) are
    skipped; every rank must have the same set with gradients (as after ``forward_backward`` on
    the same model). Gradients are flattened into buckets of about ``bucket_bytes`` per dtype, so
    a model of many small tensors costs few collectives."""
    size = dist.get_world_size(group)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    for bucket_list in by_dtype.values():
        bucket, nbytes = [], 0
        for g in bucket_list + [None]:
            if g is not None:
                bucket.append(g)
                nbytes += g.numel() * g.element_size()
            if bucket and (g is None or nbytes >= bucket_bytes):
                flat = torch.cat([t.reshape(-1) for t in bucket])
                dist.all_reduce(flat, group=group)
                if average:
                    flat /= size
                offset = 0
                for t in bucket:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
                bucket, nbytes = [], 0
