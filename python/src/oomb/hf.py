# SPDX-License-Identifier: Apache-2.0
"""oomb inside Hugging Face's ``Trainer``: a subclass whose ``training_step`` is the driver's.

    trainer = ChunkRecurrentTrainer(model=model, args=TrainingArguments(...), train_dataset=ds,
                                    chunk=4096, page=128, max_tokens=65536)
    trainer.train()

Why ``training_step`` and not ``compute_loss``: Trainer calls ``accelerator.backward`` on what
``compute_loss`` returns, and a chunk-recurrent step's backward is two stages over the chunks, not
one autograd graph. So ``training_step`` runs ``ChunkRecurrent.forward_backward``, which writes the
parameters' ``.grad`` itself, with the gradient scaled exactly as Trainer scales its loss before
``backward`` (``sum / num_items_in_batch`` when Trainer counts the accumulation window's targets,
else ``mean / gradient_accumulation_steps``), and returns the detached loss Trainer logs.
Everything after ``training_step`` is Trainer's own: gradient accumulation, clipping
(``max_grad_norm``), the optimizer and LR scheduler steps, ``zero_grad``, logging, checkpoints.
Evaluation and prediction run the model as usual (its own attention; the driver restores it).

Several processes (``torchrun``, ``accelerate launch``): Trainer wraps the model in
``DistributedDataParallel``, whose reducer only arms from its own ``forward``, which the driver
never calls (it runs the modules directly, a backward per chunk), so DDP would average nothing and
the ranks would drift apart silently. So at the accumulation window's last step (Trainer's
``sync_gradients``) ``training_step`` all-reduces ``.grad`` itself (``oomb.distributed``), as Trainer
with DDP would have it: summed over the ranks when Trainer counts the window's targets across
devices (``average_tokens_across_devices``, its default; each rank's gradient is then its share of
the global mean), averaged otherwise. The logged loss is scaled as Trainer scales its own.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
import transformers

from .distributed import all_reduce_gradients
from .torch import ChunkRecurrent, Offload, Progress, RefusedError, SparseConfig

__all__ = ["ChunkRecurrentTrainer"]


class ChunkRecurrentTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` that trains chunk-recurrently through ``oomb.torch.ChunkRecurrent``.

    chunk, max_tokens, page, sparse, offload, progress   as ``ChunkRecurrent`` takes them; the
    driver (and its pages, sized for ``max_tokens``) is made once, here, and kept as
    ``self.chunk_recurrent``. ``progress=oomb.torch.print_progress()`` reports within a long step,
    where Trainer's own bar moves once per step.

    Batches are dicts with ``input_ids`` and optionally ``labels`` (HF's convention: unshifted,
    -100 for no target), ``attention_mask`` (all ones: padding is refused), ``loss_mask`` and
    ``position_ids`` (packed documents, as ``DataCollatorWithFlattening`` makes them: each document
    attends only itself, at its own positions).
    Rows of a batch run one after another (one row's pages at a time).
    Several processes (DDP through ``torchrun`` or ``accelerate launch``) are data parallel: each
    rank trains its own batches and ``.grad`` is all-reduced at each optimizer step (see the module
    docstring). Not supported: several GPUs through ``n_gpu > 1`` (``DataParallel``), DeepSpeed,
    FSDP, Trainer's context parallelism; a custom ``compute_loss_func`` (the driver's loss is HF's
    causal-LM loss).
    """

    def __init__(self, *args, chunk: int, max_tokens: int, page: Optional[int] = None,
                 sparse: Optional[SparseConfig] = None, offload: Optional[Offload] = None,
                 progress: Optional[Callable[[Progress], None]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.compute_loss_func is not None:
            raise RefusedError("oomb: ChunkRecurrentTrainer computes HF's causal-LM loss chunk by chunk; a custom "
                               "compute_loss_func cannot be applied")
        if self.args.n_gpu > 1:
            raise RefusedError("oomb: n_gpu > 1 (DataParallel) is not supported; run one process per device")
        kind = str(getattr(self.accelerator, "distributed_type", "NO")).rsplit(".", 1)[-1]
        if kind not in ("NO", "MULTI_CPU", "MULTI_GPU"):
            raise RefusedError(f"oomb: Trainer's distributed type {kind} is not supported: the driver trains one "
                               "process per device, data parallel (DDP through torchrun or accelerate launch)")
        self.chunk_recurrent = ChunkRecurrent(self.model, chunk=chunk, max_tokens=max_tokens, page=page,
                                              sparse=sparse, offload=offload, progress=progress)

    def training_step(self, model: torch.nn.Module, inputs: Dict[str, Any],
                      num_items_in_batch: Optional[torch.Tensor | int] = None) -> torch.Tensor:
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        ids = inputs["input_ids"]
        labels = inputs.get("labels")
        if labels is None:
            labels = ids
        loss_mask = inputs.get("loss_mask")
        # The targets the driver normalises by (HF's shift: label i + 1 for token i).
        shifted = labels[..., 1:]
        if loss_mask is not None:
            shifted = torch.where(loss_mask[..., 1:].bool(), shifted, torch.full_like(shifted, -100))
        count = int(shifted.ne(-100).sum())
        # Trainer's scaling of the loss before backward (training_step in transformers 5.17):
        # with num_items_in_batch (the window's targets) the model's loss is sum / num_items, else
        # the mean over this batch divided by the accumulation steps.
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            scale = count / float(num_items_in_batch)
        else:
            scale = 1.0 / self.current_gradient_accumulation_steps
        loss = self.chunk_recurrent.forward_backward(ids, labels=labels, loss_mask=loss_mask,
                                                     attention_mask=inputs.get("attention_mask"), scale=scale,
                                                     position_ids=inputs.get("position_ids"))
        # Several processes: num_items_in_batch is then the targets of every rank's window
        # (average_tokens_across_devices), so Trainer multiplies its loss by the ranks and DDP
        # averages: the gradient is the sum over ranks of each one's share, and the logged loss
        # (averaged over ranks when logged) carries the same factor.
        ranks = self.accelerator.num_processes
        across = (ranks > 1 and self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs
                  and num_items_in_batch is not None)
        if ranks > 1 and self.accelerator.sync_gradients:
            all_reduce_gradients(self.model, average=not across)
        return (loss * scale * (ranks if across else 1)).detach().to(self.args.device)
