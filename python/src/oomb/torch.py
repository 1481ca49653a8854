# SPDX-License-Identifier: Apache-2.0
"""The chunk-recurrent driver: OOMB's two stages over a Hugging Face causal LM's own modules.

    cr = ChunkRecurrent(model, chunk=4096, page=128, max_tokens=65536)
    loss = cr.forward_backward(input_ids)      # every parameter's .grad: full backprop's
    optimizer.step(); optimizer.zero_grad()

The model's attention is routed to ``oomb::attention`` through transformers' attention registry
(``AttentionInterface``, name ``"oomb"``) for the duration of the call, so RoPE, q/k norms, biases
and MLPs stay the model's code. Stage 1 (no autograd) walks the chunks forwards and writes each
layer's K/V into oomb's pages; stage 2 walks them backwards, recomputes each chunk under autograd
over the stored past, lets the attention backward add the past pages' dK/dV into their gradient
pages, and feeds each chunk's own K/V the gradient that later chunks left there.
"""
from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, TextIO, Tuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from . import ops
from .distributed import all_reduce_gradients
from .paged import PagedSession
from .pages import PagedStore

__all__ = ["ChunkRecurrent", "SparseConfig", "Offload", "Progress", "print_progress", "ATTENTION_NAME", "RefusedError"]

#: The name oomb's attention is registered under in transformers' AttentionInterface.
ATTENTION_NAME = "oomb"

#: Tokens of one piece of the LM head and loss (stage 2): the logits of one piece exist at a time.
HEAD_PIECE = 4096


class RefusedError(ValueError):
    """A model, call or input the driver cannot train exactly; the message says what and why."""


@dataclass(frozen=True)
class SparseConfig:
    """Page-sparse attention over the past: each tile of ``tile`` queries attends ``sink`` first
    pages, ``local`` last past pages and the ``budget`` past pages scoring best (``"quest"``: the
    Quest upper bound from per-page key min/max; ``"mean"``: the mean key), selected in stage 1 by
    the library's tile selector and reused in stage 2. The chunk's own pages are always attended."""

    budget: int
    sink: int = 1
    local: int = 1
    tile: int = 128
    scoring: str = "quest"


@dataclass(frozen=True)
class Offload:
    """Stream the past through near tiers of fixed size: ``kv_slots`` K/V page slots and as many
    gradient page slots, the attention reading the past ``window`` needed pages at a time (default
    ``kv_slots // 2``, at most that: one window computing while the next streams in), forward
    windows merged by log-sum-exp. What is near is fixed whatever the sequence's length. The tiers
    must hold a chunk's pages of one layer; ``kv_slots`` left out is the C++ trainer's default (two
    windows of twice a chunk's pages, at least 128 pages each; sparse: a chunk's pages and 16
    (budget + sink + local) each). It is the C++ trainer's paged attention on both devices (its
    windows, prefetch and Belady eviction).

    On CUDA the homes are host memory and the slots device memory, moved by oomb's CUDA residency
    scheduler on copy streams behind the compute: ``homes`` ``"pinned"`` (the copy engines reach them
    directly; the driver keeps 8 bytes of device memory per pinned 4 KiB) or ``"pageable"`` (through
    a pinned staging ring: nothing on the GPU grows with the context). On the CPU homes and slots are
    host memory, moved by the library's residency schedulers on its host streams (``homes`` stays
    ``"pinned"``, which there means nothing more). ``grad_homes`` ``"fp32"`` keeps the gradient homes
    in the gradient pages' type (fp32 on CUDA, the model's dtype on the CPU); ``"bf16"`` or
    ``"bf16-stochastic"`` halve their bytes, each write-back rounded once."""

    kv_slots: Optional[int] = None
    window: Optional[int] = None
    homes: str = "pinned"
    grad_homes: str = "fp32"


@dataclass(frozen=True)
class Progress:
    """Where a ``forward_backward`` call is, after each chunk of each stage (``progress=``).
    Stage 1 runs chunks 0 .. chunks-1 forwards, stage 2 chunks-1 .. 0 (recomputation and
    backward); a batch runs its rows one after another. On a GPU it is the host's view: the host
    enqueues ahead of the device, by at most what the launch queue holds."""

    stage: int       #: 1 (forwards) or 2 (recompute and backward)
    chunk: int       #: the chunk just finished
    chunks: int      #: chunks of the row
    row: int         #: the batch row at hand (0-based)
    rows: int        #: rows of the batch
    tokens: int      #: tokens of a row
    seconds: float   #: since the call began


def print_progress(every: float = 2.0, file: Optional[TextIO] = None) -> Callable[[Progress], None]:
    """A ``progress=`` callback that prints a line at most every ``every`` seconds, and at the end
    of each row, to ``file`` (default stderr), as ``oomb-train`` does within long steps: the stage
    and chunk, the share of the call done, tokens per second and the time left. The share counts a
    stage-2 chunk as 3 stage-1 chunks (it recomputes the forward, then runs the backward, about
    twice the forward), so early estimates are rough."""
    last = [-math.inf]

    def report(p: Progress) -> None:
        row_done = p.stage == 2 and p.chunk == 0
        if not row_done and p.seconds - last[0] < every:
            return
        last[0] = p.seconds
        units = p.chunk + 1 if p.stage == 1 else p.chunks + 3 * (p.chunks - p.chunk)
        rows_done = p.row + units / (4 * p.chunks)
        share = rows_done / p.rows
        rate = p.tokens * rows_done / p.seconds if p.seconds > 0 else 0.0
        eta = p.seconds * (1 - share) / share
        where = "forward" if p.stage == 1 else "backward"
        chunk = p.chunk + 1 if p.stage == 1 else p.chunks - p.chunk
        row = f"row {p.row + 1}/{p.rows}, " if p.rows > 1 else ""
        print(f"  {row}{where} chunk {chunk}/{p.chunks} | {100 * share:.0f}% | {rate:.0f} tok/s | ETA {eta:.1f} s",
              file=file if file is not None else sys.stderr, flush=True)

    return report


# ---- the registered attention function --------------------------------------------------------

_active: Optional["_Run"] = None

# kwargs that would change what attention computes, which oomb's attention does not do.
_REFUSED_KWARGS = ("softcap", "s_aux", "sinks", "alibi", "alibi_slopes", "attention_bias", "position_bias",
                   "cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")


def _oomb_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    run = _active
    if run is None:
        raise RuntimeError(
            f"oomb: the model's attention is set to {ATTENTION_NAME!r}, which only runs inside "
            "ChunkRecurrent.forward_backward (set model.set_attn_implementation('sdpa') for other uses)")
    return run.attend(module, query, key, value, attention_mask, scaling, dropout, kwargs)


AttentionInterface.register(ATTENTION_NAME, _oomb_attention)


# ---- the driver ---------------------------------------------------------------------------------

def _config_dims(config) -> Tuple[int, int, int, int]:
    layers = config.num_hidden_layers
    hq = config.num_attention_heads
    hkv = getattr(config, "num_key_value_heads", None) or hq
    d = getattr(config, "head_dim", None) or config.hidden_size // hq
    return layers, hq, hkv, d


class ChunkRecurrent:
    """Trains ``model`` (a transformers causal LM whose attention goes through AttentionInterface)
    chunk-recurrently over oomb's pages.

    chunk       tokens per chunk (activation memory is O(chunk)); a multiple of ``page``
    page        tokens per page: a power of two >= 16 dividing ``chunk`` (default: 128, or ``chunk``
                if smaller)
    max_tokens  the plan: the longest sequence a call may bring. Dense in place, K/V and gradient
                pages for it are allocated here, up front (on the CPU from oomb's host resource; on a
                CUDA device from torch's caching allocator: bf16 pages, fp32 gradient pages); nothing
                grows later. With offload or sparse the C++ trainer's paged attention owns the pages
                (oomb.paged): in place its pools are sized for it up front, with offload the homes
                grow by slabs as the sequence does and only the near slots are fixed
    sparse      a SparseConfig for page-sparse attention, or None (dense: exact)
    offload     an Offload (near tiers of fixed size the past streams through), or None: every page
                is read where it lives
    keep_attention_outputs
                keep stage 1's attention outputs (o, lse) for stage 2, which then skips the attention
                forward of its recomputation: faster (the past's attention is the longest op at long
                contexts), at O(sequence) memory (o and lse of every layer, chunk by chunk, freed as
                stage 2 passes them). Not with offload or sparse
    progress    a callable given an oomb.torch.Progress after each chunk of each stage (a long step's
                whereabouts), or None; ``oomb.torch.print_progress()`` prints them as oomb-train does
    deterministic
                the same gradient bits on every run: on CUDA the attention backward adds dQ in a fixed
                order (pages of >= 128 tokens: oomb's Hopper kernels; docs/attention.md says what it
                costs); the CPU path always is. The model's own ops must be deterministic too
                (``torch.use_deterministic_algorithms``)
    weight_grads_in_gemm
                stage 2's nn.Linear layers add their weight gradients into ``.grad`` inside the GEMM
                (``addmm_``) instead of through autograd's accumulation, which reads and writes every
                weight gradient once more per chunk. A weight with gradient hooks, a non-contiguous
                weight, autocast or an nn.Linear subclass with its own forward keep autograd's way
    """

    def __init__(self, model, *, chunk: int, max_tokens: int, page: Optional[int] = None,
                 sparse: Optional[SparseConfig] = None, offload: Optional[Offload] = None,
                 keep_attention_outputs: bool = False, deterministic: bool = False,
                 progress: Optional[Callable[[Progress], None]] = None, weight_grads_in_gemm: bool = True):
        if offload is not None and not isinstance(offload, Offload):
            raise RefusedError(f"oomb: offload must be an oomb.torch.Offload or None, got {offload!r}")
        if offload is not None:
            if offload.homes not in ("pinned", "pageable") or offload.grad_homes not in ("fp32", "bf16",
                                                                                        "bf16-stochastic"):
                raise RefusedError(f"oomb: {offload}: homes is 'pinned' or 'pageable', grad_homes 'fp32', 'bf16' or "
                                   "'bf16-stochastic'")
            o = offload
            if o.kv_slots is not None and o.kv_slots < 2:
                raise RefusedError(f"oomb: {o}: the near tiers need at least 2 slots")
            if o.window is not None and (o.window <= 0 or (o.kv_slots is not None and 2 * o.window > o.kv_slots)):
                raise RefusedError(f"oomb: {o}: a window takes 1 to kv_slots // 2 pages (one window computing while "
                                   "the next streams in)")
        if keep_attention_outputs and offload is not None:
            raise RefusedError("oomb: keep_attention_outputs with offload is not supported (the kept outputs would "
                               "hold O(sequence) memory where offload keeps it flat)")
        if keep_attention_outputs and sparse is not None:
            raise RefusedError("oomb: keep_attention_outputs with sparse is not supported (the paged session "
                               "recomputes stage 2's attention)")
        self.keep_attention_outputs = bool(keep_attention_outputs)
        self.deterministic = bool(deterministic)
        self.weight_grads_in_gemm = bool(weight_grads_in_gemm)
        if progress is not None and not callable(progress):
            raise RefusedError(f"oomb: progress must be a callable taking an oomb.torch.Progress, got {progress!r}")
        #: Called with a Progress after each chunk of each stage (None: silent); print_progress() prints.
        self.progress = progress
        if page is None:
            page = min(128, chunk)
        if page < 16 or page & (page - 1):
            raise RefusedError(f"oomb: page {page} must be a power of two >= 16")
        if chunk <= 0 or chunk % page:
            raise RefusedError(f"oomb: chunk {chunk} must be a positive multiple of the page size {page}")
        if max_tokens <= 0:
            raise RefusedError(f"oomb: max_tokens must be positive, got {max_tokens}")
        if sparse is not None:
            if sparse.scoring not in ("quest", "mean"):
                raise RefusedError(f"oomb: sparse scoring {sparse.scoring!r} is not 'quest' or 'mean'")
            if min(sparse.budget, sparse.sink, sparse.local) < 0 or sparse.tile <= 0:
                raise RefusedError(f"oomb: bad sparse config {sparse}")
        #: A DistributedDataParallel wrapper the model came in (None: not wrapped): the step then
        #: all-reduces the gradients itself, as DDP would (its reducer arms only from its own
        #: forward, which the driver never calls: it runs the modules, a backward per chunk).
        self.ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
        if self.ddp is not None:
            model = model.module
        if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
            # A PEFT model (LoRA): the transformers model under it, whose layers PEFT has replaced in
            # place (the adapters are its parameters too). Stage 1 then runs its base model alone,
            # not PEFT's wrapper of the whole LM (which would compute the LM head's logits).
            model = model.get_base_model()
        self.model = model
        self.chunk, self.page, self.max_tokens, self.sparse, self.offload = chunk, page, max_tokens, sparse, offload
        self._check_model()
        layers, hq, hkv, d = _config_dims(model.config)
        self.layers, self.hq, self.hkv, self.head_dim = layers, hq, hkv, d
        self.device = self._device()
        #: What attention computes in and the pages hold: the model's dtype on the CPU, bf16 on CUDA.
        self.dtype = self._param_dtype() if self.device.type == "cpu" else torch.bfloat16
        if offload is not None and offload.kv_slots is not None and offload.kv_slots < chunk // page:
            raise RefusedError(f"oomb: {offload}: the near tiers must hold a chunk's {chunk // page} pages of one "
                               "layer")
        if self.device.type == "cuda":
            self._check_cuda(d)
        else:
            self._check_cpu()
        #: After a call: per (layer, chunk) the sparse selection stage 1 made, (indptr, pages) with
        #: logical past-page indices per tile; empty when dense.
        self.selections: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        #: With offload or sparse: the C++ trainer's paged attention owns the pages (oomb.paged, on
        #: either device); dense in place, the store below and the attention op (oomb.ops).
        self.session: Optional[PagedSession] = None
        #: The session's figures after the last step (what moved, what is held); None before one.
        self.last_step: Optional[dict] = None
        self.store, self.seq = None, None
        if sparse is not None or offload is not None:
            self.session = self._make_session()
            return
        pages = layers * -(-max_tokens // page)
        self.store = PagedStore(layers=layers, page_size=page, kv_heads=hkv, head_dim=d, chunk_size=chunk,
                                max_pages=pages, max_grad_pages=pages, dtype=self.dtype, device=self.device)
        self.seq = self.store.add_sequence()

    # -- checks that need no allocation --------------------------------------------------------
    def _device(self) -> torch.device:
        devices = {p.device for p in self.model.parameters()}
        if len(devices) != 1:
            raise RefusedError(f"oomb: the model's parameters are on several devices {sorted(map(str, devices))}; "
                               "the driver runs a model on one device")
        (dev,) = devices
        if dev.type not in ("cpu", "cuda"):
            raise RefusedError(f"oomb: the model is on {dev}; the CPU and CUDA devices are supported")
        return dev

    def _check_cuda(self, head_dim: int):
        from . import _lib
        if not _lib.has_cuda():
            raise RefusedError("oomb: the model is on a CUDA device, but this install of the package has no GPU path "
                               "(liboomb_cuda): reinstall with `pip install ./python` where nvcc is found "
                               "(docs/pytorch.md)")
        if head_dim not in (64, 128):
            raise RefusedError(f"oomb: head_dim {head_dim}: oomb's CUDA kernels take 64 or 128")
        if self.sparse is not None and (self.sparse.tile * (self.hq // self.hkv)) % 128:
            raise RefusedError(f"oomb: sparse tile {self.sparse.tile} x {self.hq // self.hkv} queries per KV "
                               "head must be a multiple of 128 on CUDA (the kernels' row blocks)")
        if self.deterministic and self.page < 128:
            raise RefusedError(f"oomb: deterministic on CUDA needs pages of >= 128 tokens (oomb's Hopper kernels order "
                               f"their dQ sums; the portable ones do not), got page {self.page}")
        dtypes = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        if not dtypes <= {torch.bfloat16, torch.float32}:
            raise RefusedError(f"oomb: the model's parameters are {sorted(map(str, dtypes))}; on CUDA oomb's attention "
                               "is bf16: a bf16 model, or a float32 one under torch.autocast('cuda', torch.bfloat16)")

    def _check_cpu(self):
        o = self.offload
        if o is not None and o.homes != "pinned":
            raise RefusedError(f"oomb: {o}: homes is the GPU path's (on the CPU the homes are host memory either way)")

    def _make_session(self) -> PagedSession:
        o = self.offload
        return PagedSession(self.device, dtype=self.dtype, layers=self.layers, hq=self.hq, hkv=self.hkv,
                            head_dim=self.head_dim, chunk=self.chunk, page=self.page, max_tokens=self.max_tokens,
                            offload=o is not None, near_pages=(o.kv_slots or 0) if o else 0,
                            window_pages=(o.window or 0) if o else 0, homes=o.homes if o else "pinned",
                            grad_homes=o.grad_homes if o else "fp32", sparse=self.sparse,
                            deterministic=self.deterministic and self.device.type == "cuda")

    def _param_dtype(self) -> torch.dtype:
        dtypes = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        if len(dtypes) != 1:
            raise RefusedError(f"oomb: the model's parameters have several dtypes {sorted(map(str, dtypes))}; "
                               "the CPU path computes in one of float32 or float64")
        (dt,) = dtypes
        if dt not in (torch.float32, torch.float64):
            raise RefusedError(f"oomb: the model is {dt}; the CPU path computes in float32 or float64 (bf16 "
                               "is the GPU path's: put the model on a CUDA device)")
        return dt

    def _check_model(self):
        m = self.model
        if getattr(m, "is_gradient_checkpointing", False):
            raise RefusedError("oomb: gradient checkpointing is enabled (gradient_checkpointing_enable()); it "
                               "conflicts with the driver's own recomputation: call "
                               "model.gradient_checkpointing_disable()")
        cfg = m.config
        if not getattr(cfg, "is_causal", True) or getattr(cfg, "is_encoder_decoder", False):
            raise RefusedError("oomb: only decoder-only causal models are supported")
        if getattr(cfg, "alibi", False) or getattr(cfg, "position_embedding_type", None) == "alibi":
            raise RefusedError("oomb: ALiBi position biases are not supported")
        head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
        if head is None:
            raise RefusedError(f"oomb: {type(m).__name__} has no LM head (get_output_embeddings()); the driver "
                               "trains causal LMs (AutoModelForCausalLM)")
        if getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
            raise RefusedError(f"oomb: logit_scale={cfg.logit_scale} is not supported (the head's loss is "
                               "lm_head's logits)")
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(cfg, name, None):
                raise RefusedError(f"oomb: soft-capping ({name}={getattr(cfg, name)}) is not supported")
        if m.training:
            if getattr(cfg, "attention_dropout", 0.0):
                raise RefusedError(f"oomb: attention_dropout={cfg.attention_dropout} in train mode: oomb's attention "
                                   "has no dropout on its probabilities (set it to 0 or call model.eval()); "
                                   "nn.Dropout modules, PEFT's lora_dropout among them, are supported")

    def _draws_dropout(self) -> bool:
        """Whether a step draws dropout masks (an nn.Dropout with p > 0 in train mode: PEFT's
        lora_dropout, a model's hidden dropout). The step then replays the random generators, so
        stage 2's recomputation of each chunk draws stage 1's masks."""
        m = self.model
        return m.training and any(isinstance(mod, torch.nn.Dropout) and mod.p > 0 for mod in m.modules())

    # -- the step ------------------------------------------------------------------------------
    def forward_backward(self, input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None,
                         loss_mask: Optional[torch.Tensor] = None,
                         attention_mask: Optional[torch.Tensor] = None, scale: float = 1.0,
                         position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Runs both stages; adds full-sequence backprop's gradient of the loss to every parameter's
        ``.grad`` (as ``loss.backward()`` would) and returns the loss (detached).

        ``scale`` multiplies the gradient (not the returned loss), as ``(scale * loss).backward()``
        would: what gradient accumulation's ``loss / steps`` or ``sum / num_items_in_batch`` needs.

        A model given wrapped in ``DistributedDataParallel`` is trained as DDP trains it: after
        stage 2 the call averages ``.grad`` over the wrapper's process group (oomb.distributed),
        except inside the wrapper's ``no_sync()``, where it accumulates locally as DDP does.

        The loss is HF's causal-LM loss: next-token cross-entropy summed over the targets and divided
        by their number; ``labels`` (default ``input_ids``) use -100 for tokens that are no target,
        ``loss_mask`` (same shape, bool) keeps only the labels where it is true. A batch of several
        rows is accumulated row by row (one row's pages at a time), with the batch's loss.

        ``position_ids`` (same shape) packs documents into a row as HF's packed rows do
        (``DataCollatorWithFlattening``): positions restart at 0 at each document and count up by
        one. Each document is then trained as if alone: its RoPE positions are those, and its
        queries attend only its own keys (the attention's per-document bounds). The labels say
        which targets count (the collator puts -100 at each document's first token, so no token
        predicts across a boundary). Without them, a row is one document at positions 0, 1, ...
        """
        global _active
        ids = input_ids
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise RefusedError(f"oomb: input_ids must be integer [batch, tokens], got {ids.dtype} {tuple(ids.shape)}")
        if ids.device.type != "cpu" and ids.device != self.device:
            raise RefusedError(f"oomb: input_ids are on {ids.device}, the model on {self.device}")
        batch, n = ids.shape
        if n > self.max_tokens:
            raise RefusedError(f"oomb: a sequence of {n} tokens is beyond the plan of max_tokens={self.max_tokens} "
                               "(make a ChunkRecurrent with a larger max_tokens)")
        if n < 2:
            raise RefusedError(f"oomb: a sequence of {n} token(s) has no next-token target")
        if attention_mask is not None:
            if attention_mask.shape != ids.shape:
                raise RefusedError(f"oomb: attention_mask {tuple(attention_mask.shape)} does not match input_ids "
                                   f"{tuple(ids.shape)}")
            if not bool(attention_mask.bool().all()):
                raise RefusedError("oomb: attention_mask has zeros (padding); oomb attends every token of the "
                                   "sequence, and transformers drops masks for attention it does not know, so a "
                                   "padded batch would be trained silently wrong: pass unpadded rows")
        bounds = self._document_bounds(position_ids, ids.shape)
        if labels is None:
            labels = ids
        labels = labels[None] if labels.dim() == 1 else labels
        if labels.shape != ids.shape:
            raise RefusedError(f"oomb: labels {tuple(labels.shape)} do not match input_ids {tuple(ids.shape)}")
        labels = labels.to(torch.int64)
        if loss_mask is not None:
            loss_mask = loss_mask[None] if loss_mask.dim() == 1 else loss_mask
            if loss_mask.shape != ids.shape:
                raise RefusedError(f"oomb: loss_mask {tuple(loss_mask.shape)} does not match input_ids "
                                   f"{tuple(ids.shape)}")
            labels = torch.where(loss_mask.bool(), labels, torch.full_like(labels, -100))
        # HF's shift: token i predicts label i + 1; the last token predicts nothing.
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        count = int((targets != -100).sum())
        if count == 0:
            raise RefusedError("oomb: no token has a target (every label is -100 or masked)")
        self._check_model()
        if self._device() != self.device:
            raise RefusedError(f"oomb: the model is now on {self._device()}, the pages were planned on {self.device}")
        if self.device.type == "cpu" and self._param_dtype() != self.dtype:
            raise RefusedError(f"oomb: the model is now {self._param_dtype()}, the pages were planned for {self.dtype}")
        if _active is not None:
            raise RuntimeError("oomb: forward_backward is already running (one at a time per process)")

        model = self.model
        previous = model.config._attn_implementation
        started = time.perf_counter()
        self.selections = {}
        ids, targets = ids.to(self.device), targets.to(self.device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        model.set_attn_implementation(ATTENTION_NAME)
        try:
            if model.config._attn_implementation != ATTENTION_NAME:
                raise RefusedError(
                    f"oomb: {type(model).__name__} did not take the attention implementation {ATTENTION_NAME!r} "
                    f"(it stays {model.config._attn_implementation!r}): its attention does not go through "
                    "transformers' AttentionInterface")
            for b in range(batch):
                run = _Run(self, n, *(bounds[b] if bounds is not None else (None, None)))
                run.row, run.rows, run.started = b, batch, started
                _active = run
                try:
                    total += run.step(ids[b], targets[b], count, float(scale))
                finally:
                    _active = None
                    if self.session is not None:  # after an error: give every page back
                        for c in reversed(range(run.live_chunks)):
                            self.session.release_chunk(c)
                    else:
                        while self.store.seq_len(self.seq) > 0:
                            self.store.pop_chunk(self.seq)
        finally:
            model.set_attn_implementation(previous)
        if self.ddp is not None and self.ddp.require_backward_grad_sync:  # False inside no_sync()
            all_reduce_gradients(self.ddp.module, group=self.ddp.process_group)
        return total.to(torch.float64 if self.dtype == torch.float64 else torch.float32)

    def _document_bounds(self, position_ids: Optional[torch.Tensor], shape):
        """Per row of a packed batch: its positions (on the model's device) and each token's
        document start (key_lower, on the host), or None for a row that is one document at 0, 1,
        ...; None for no position_ids."""
        if position_ids is None:
            return None
        pos = position_ids[None] if position_ids.dim() == 1 else position_ids
        if tuple(pos.shape) != tuple(shape) or pos.dtype not in (torch.int64, torch.int32):
            raise RefusedError(f"oomb: position_ids must be integer {tuple(shape)} like input_ids, got {pos.dtype} "
                               f"{tuple(pos.shape)}")
        pos = pos.to("cpu", torch.int64)
        packed = torch.cat([pos[:, :1] == 0, (pos[:, 1:] == 0) | (pos[:, 1:] == pos[:, :-1] + 1)], dim=1)
        if not bool(packed.all()):
            row, i = (~packed).nonzero()[0].tolist()
            raise RefusedError(f"oomb: position_ids[{row}, {i}] = {int(pos[row, i])}: positions must start at 0 "
                               "and either count up by one or restart at 0 where a document starts (HF's packed "
                               "rows, DataCollatorWithFlattening); other positions are not supported")
        lower = torch.arange(pos.shape[1], dtype=torch.int64)[None] - pos
        out = []
        for b in range(pos.shape[0]):
            if int(lower[b, -1]) == 0:  # one document
                out.append((None, None))
                continue
            out.append((pos[b].to(self.device), lower[b]))
        return out

    def memory(self) -> dict:
        """Where the pages are and what moved. Dense in place: the store's pools (host memory from the
        library's host resource, or on CUDA blocks of torch's caching allocator, reserved at
        construction for ``max_tokens``): pages in use and their peaks, bytes reserved. With offload
        or sparse: the session's figures after the last step (empty before one): pages in use and
        their peaks, ``far_bytes`` the pools hold, and with offload ``near``, per near tier its slots
        and what moved through it (cumulative)."""
        if self.session is not None:
            return dict(self.last_step or {})
        return self.store.stats()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        else:
            self.store.close()


class _Generators:
    """The random generators a forward on `device` draws from (the CPU's, and the CUDA device's),
    saved and restored together."""

    def __init__(self, device: torch.device):
        self.cuda = device if device.type == "cuda" else None

    def get(self):
        return torch.get_rng_state(), (torch.cuda.get_rng_state(self.cuda) if self.cuda is not None else None)

    def set(self, state) -> None:
        torch.set_rng_state(state[0])
        if self.cuda is not None:
            torch.cuda.set_rng_state(state[1], self.cuda)


class _SessionAttention(torch.autograd.Function):
    """Stage 2's attention of one layer through the paged session: forward over the pages (the chunk's
    own among them, written in stage 1), backward adding the past's dK/dV into their gradient pages."""

    @staticmethod
    def forward(ctx, q, k, v, session, layer: int, chunk: int):
        o, lse = session.forward(layer, chunk, q)
        ctx.save_for_backward(q, o, lse)
        ctx.session, ctx.layer, ctx.chunk = session, layer, chunk
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, o, lse = ctx.saved_tensors
        dq, dk, dv = ctx.session.backward(ctx.layer, ctx.chunk, q, o, lse, d_o.contiguous())
        return dq, dk, dv, None, None, None


class _LinearIntoGrad(torch.autograd.Function):
    """F.linear whose backward adds the weight's gradient into ``weight.grad`` with the GEMM itself
    (``addmm_``: beta = 1) and gives autograd none for it. Through autograd, each chunk of stage 2
    would compute the weight gradient into a fresh tensor and then add it into ``.grad``: one more
    read and write of every weight gradient per chunk (docs/pytorch.md, "Where the time goes"). The
    input's and the bias's gradients are autograd's as usual."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = dy @ weight if ctx.needs_input_grad[0] else None
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        if weight.grad is None:
            weight.grad = dy2.t() @ x2
        else:
            weight.grad.addmm_(dy2.t(), x2)
        db = dy2.sum(0) if ctx.needs_input_grad[2] else None
        return dx, None, db


def _linear_into_grad(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = module.weight
    if (not torch.is_grad_enabled() or x.dtype != w.dtype or torch.is_autocast_enabled(x.device.type)
            or getattr(w, "_backward_hooks", None) or getattr(w, "_post_accumulate_grad_hooks", None)):
        return F.linear(x, w, module.bias)
    return _LinearIntoGrad.apply(x, w, module.bias)


class _WeightGradsInGemm:
    """For stage 2 (``ChunkRecurrent(weight_grads_in_gemm=True)``): the model's nn.Linear modules
    whose weights train run _LinearIntoGrad, through a forward set on the instance and removed on
    exit. Left to autograd: frozen or non-contiguous weights, subclasses with a forward of their own
    and modules that already carry an instance forward; per call, weights with gradient hooks and
    calls under autocast."""

    def __init__(self, model: Optional[torch.nn.Module]):
        self.modules = [] if model is None else [
            m for m in model.modules()
            if isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward
            and "forward" not in m.__dict__ and m.weight.requires_grad and m.weight.is_contiguous()]

    def __enter__(self):
        for m in self.modules:
            m.forward = functools.partial(_linear_into_grad, m)
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            m.__dict__.pop("forward", None)
        return False


class _Run:
    """One sequence's two stages; what the registered attention function consults."""

    def __init__(self, driver: ChunkRecurrent, n: int, positions: Optional[torch.Tensor] = None,
                 key_lower: Optional[torch.Tensor] = None):
        self.d = driver
        self.n = n
        #: packed documents: each token's RoPE position and document start (None: one document); the
        #: starts on the host for the driver's page arithmetic, on the device for the attention
        self.positions = positions
        self.key_lower_host = key_lower
        self.key_lower = None if key_lower is None else ops.to_device(key_lower, driver.device)
        self.stage = 0
        self.row, self.rows, self.started = 0, 1, time.perf_counter()  # for Progress
        self.live_chunks = 0  # session: chunks appended and not yet released
        self.chunk_index = 0
        self.q_start = 0
        self.captured: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.called = set()  # layers whose attention came through oomb in this chunk
        #: keep_attention_outputs: stage 1's (o, lse) per (layer, chunk), until stage 2 uses them.
        self.kept: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}

    # -- attention, called by every layer --------------------------------------------------------
    def attend(self, module, query, key, value, attention_mask, scaling, dropout, kwargs):
        d = self.d
        layer = getattr(module, "layer_idx", None)
        if layer is None or not 0 <= layer < d.layers:
            raise RefusedError(f"oomb: the attention module {type(module).__name__} has layer_idx {layer}, not one "
                               f"of the model's {d.layers} layers")
        if attention_mask is not None:
            raise RefusedError(f"oomb: layer {layer} called attention with a mask; oomb's attention is causal over "
                               "the whole sequence and applies no other mask")
        if dropout:
            raise RefusedError(f"oomb: layer {layer} called attention with dropout={dropout} (train mode): oomb's "
                               "attention has no dropout on its probabilities")
        window = kwargs.get("sliding_window")
        if window is not None and window < self.n:
            raise RefusedError(f"oomb: layer {layer} attends a sliding window of {window} tokens, shorter than the "
                               f"sequence's {self.n}; oomb's attention is full causal (a window at least as long "
                               "as the sequence is the same thing and is accepted)")
        for name in _REFUSED_KWARGS:
            if kwargs.get(name) is not None:
                raise RefusedError(f"oomb: layer {layer} called attention with {name}; not supported")
        if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
            raise RefusedError(f"oomb: layer {layer} is not causal (cross- or bidirectional attention)")
        self.called.add(layer)
        b, hq, sq, hd = query.shape
        if key.shape[2] != sq:
            raise RefusedError(f"oomb: layer {layer} attends {key.shape[2]} keys for {sq} queries (cross-attention "
                               "or a KV cache); the driver passes exactly the chunk")
        if b != 1:
            raise RefusedError(f"oomb: attention called with batch {b}; the driver runs one row at a time")
        if (key.shape[1], key.shape[3], hq) != (d.hkv, d.head_dim, d.hq):
            raise RefusedError(f"oomb: layer {layer} has {hq} query / {key.shape[1]} KV heads of dim {key.shape[3]}, "
                               f"the plan {d.hq} / {d.hkv} of dim {d.head_dim}")
        if (d.device.type == "cuda" and query.dtype == torch.float32 and torch.is_autocast_enabled("cuda")
                and torch.get_autocast_dtype("cuda") == torch.bfloat16):
            query, key, value = query.to(d.dtype), key.to(d.dtype), value.to(d.dtype)  # as autocast's SDPA would
        if query.dtype != d.dtype or query.device != d.device:
            hint = (" (on CUDA: a bf16 model, or a float32 one under torch.autocast('cuda', torch.bfloat16))"
                    if d.device.type == "cuda" else "")
            raise RefusedError(f"oomb: layer {layer} attends in {query.dtype} on {query.device}; the pages hold "
                               f"{d.dtype} on {d.device}{hint}")
        scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(hd)
        q = query[0].transpose(0, 1)
        k = key[0].transpose(0, 1)
        v = value[0].transpose(0, 1)
        if d.session is not None:
            return self._attend_session(layer, q, k, v, scale).unsqueeze(0), None
        # Dense in place: the store holds the pages, the attention op reads them.
        store, page, seq = d.store, d.page, d.seq
        first = self.q_start // page
        past_ids = store.page_ids(seq, layer, 0, first)
        key_ = (layer, self.chunk_index)
        own_ids = store.page_ids(seq, layer, first, first + -(-sq // page))
        on_cuda = d.device.type == "cuda"
        own = own_ids if on_cuda else None  # CUDA's kernels read the chunk itself through its pages
        kl = None if self.key_lower is None else self.key_lower[self.q_start:self.q_start + sq]  # documents
        if self.stage == 1 or on_cuda:
            ops.write_pages(store.kv_pool, k.detach(), v.detach(), own_ids)
        if self.stage == 2:
            self.captured[layer] = (key, value)
        if self.stage == 1:
            o, lse = ops.attention(q, k, v, store.kv_pool, past_ids, None, None, self.q_start, scale, None, None,
                                   128, own, kl, d.deterministic)
            if d.keep_attention_outputs:
                self.kept[key_] = (o, lse)
        elif key_ in self.kept:  # stage 2 with stage 1's outputs: only the backward runs
            o_kept, lse_kept = self.kept.pop(key_)
            o = ops.attention_kept(q, k, v, o_kept, lse_kept, store.kv_pool, past_ids, store.grad_pool,
                                   store.grad_ids, self.q_start, scale, None, None, 128, own, kl, d.deterministic)
        else:
            o, _lse = ops.attention(q, k, v, store.kv_pool, past_ids, store.grad_pool, store.grad_ids, self.q_start,
                                    scale, None, None, 128, own, kl, d.deterministic)
        return o.unsqueeze(0), None

    def _attend_session(self, layer: int, q, k, v, scale: float):
        """Offload or sparse: the session holds the pages. Stage 1 writes the chunk's K/V into them,
        selects (sparse) and attends; stage 2's recomputation attends through _SessionAttention,
        whose backward adds the past pages' dK/dV into their gradient pages and returns the chunk's
        own dk, dv with what later chunks left for them."""
        d = self.d
        if abs(scale * math.sqrt(d.head_dim) - 1.0) > 1e-6:
            raise RefusedError(f"oomb: layer {layer} scales attention scores by {scale}, not 1/sqrt(head_dim); "
                               "oomb's paged attention (offload, sparse) takes 1/sqrt(head_dim) only")
        q = q.contiguous()
        c = self.chunk_index
        if self.stage == 1:
            d.session.write(layer, c, k.contiguous(), v.contiguous())
            if d.sparse is not None:
                d.session.select(layer, c, q)
            return d.session.forward(layer, c, q)[0]
        # Stage 2 reads K/V from the pages stage 1 wrote: k and v are inputs only for their gradients.
        return _SessionAttention.apply(q, k, v, d.session, layer, c)

    def _report(self, chunk: int, chunks: int) -> None:
        if self.d.progress is not None:
            self.d.progress(Progress(self.stage, chunk, chunks, self.row, self.rows, self.n,
                                     time.perf_counter() - self.started))

    def _positions(self, s0: int, s1: int, device: torch.device) -> torch.Tensor:
        """The RoPE positions of tokens [s0, s1) as [1, s1 - s0]: the packed row's, or s0, s0 + 1, ..."""
        if self.positions is not None:
            return self.positions[None, s0:s1]
        return torch.arange(s0, s1, device=device)[None]

    # -- the two stages ----------------------------------------------------------------------------
    def _head_backward(self, hidden: torch.Tensor, targets: torch.Tensor, count: int, scale: float,
                       loss_dtype: torch.dtype):
        """The LM head and HF's loss over one chunk's final hidden states, backwards at once, a piece of
        HEAD_PIECE tokens at a time: the head's parameters get their gradient, and the returned
        d_hidden is the loss's gradient for `hidden` (what the CausalLM's forward, lm_head on the base
        model's output, would pass it), so at most one piece's logits exist. Returns the chunk's
        loss (detached) and d_hidden."""
        head = self.d.model.get_output_embeddings()
        h = hidden.detach().requires_grad_(True)
        loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for a in range(0, h.shape[1], HEAD_PIECE):
            b = min(h.shape[1], a + HEAD_PIECE)
            logits = head(h[:, a:b])[0]
            piece = F.cross_entropy(logits.to(loss_dtype), targets[a:b], ignore_index=-100, reduction="sum") / count
            piece.backward(torch.full_like(piece, scale))
            loss += piece.detach().to(torch.float64)
        return loss, h.grad


    def step(self, ids: torch.Tensor, targets: torch.Tensor, count: int, scale: float = 1.0) -> torch.Tensor:
        d = self.d
        model, store, seq, chunk, page = d.model, d.store, d.seq, d.chunk, d.page
        base = model.base_model
        n = self.n
        bounds = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
        loss_dtype = d.dtype if d.dtype == torch.float64 else torch.float32

        # Dropout: each chunk's generator states before stage 1 runs it, restored before stage 2
        # recomputes it (the same modules draw in the same order, so the same masks), and the
        # states after stage 1 restored at the end, as after one forward.
        rng = _Generators(ids.device) if d._draws_dropout() else None
        chunk_states = []

        session = d.session
        if session is not None:
            starts = [] if self.key_lower_host is None else torch.unique(self.key_lower_host).tolist()
            session.begin_step(len(bounds), starts)

        # Stage 1: forwards, no autograd; every layer's K/V goes into its pages.
        self.stage = 1
        with torch.no_grad():
            for c, (s0, s1) in enumerate(bounds):
                if rng is not None:
                    chunk_states.append(rng.get())
                if session is not None:
                    session.append(s1 - s0)
                    self.live_chunks += 1
                else:
                    store.append(seq, s1 - s0)
                self.chunk_index, self.q_start = c, s0
                self.called = set()
                base(input_ids=ids[None, s0:s1], position_ids=self._positions(s0, s1, ids.device), use_cache=False)
                if len(self.called) != d.layers:  # a layer attended on its own: it would miss the past
                    missing = sorted(set(range(d.layers)) - self.called)
                    raise RefusedError(f"oomb: layers {missing} did not call attention through transformers' "
                                       "AttentionInterface, so they would not see the past chunks")
                self._report(c, len(bounds))

        # Stage 2: backwards over the chunks, recomputing each under autograd.
        self.stage = 2
        total = torch.zeros((), dtype=torch.float64, device=ids.device)
        after_stage1 = rng.get() if rng is not None else None
        with torch.enable_grad(), _WeightGradsInGemm(d.model if d.weight_grads_in_gemm else None):
            for c in reversed(range(len(bounds))):
                s0, s1 = bounds[c]
                if rng is not None:
                    rng.set(chunk_states[c])
                self.chunk_index, self.q_start = c, s0
                if session is not None:
                    session.expect_recompute(c)
                    hidden = base(input_ids=ids[None, s0:s1], position_ids=self._positions(s0, s1, ids.device),
                                  use_cache=False).last_hidden_state
                    loss, d_hidden = self._head_backward(hidden, targets[s0:s1], count, scale, loss_dtype)
                    torch.autograd.backward([hidden], [d_hidden])  # the session's dk, dv carry later chunks'
                    total += loss.to(torch.float64)
                    session.release_chunk(c)
                    self.live_chunks -= 1
                    self._report(c, len(bounds))
                    continue
                first = s0 // page
                # Packed documents: no page wholly before this chunk's first document is read.
                visible = 0 if self.key_lower_host is None else min(first, int(self.key_lower_host[s0]) // page)
                for layer in range(d.layers):  # gradient pages for the past this chunk attends
                    past = store.page_ids(seq, layer, visible, first)
                    if past.numel():
                        store.touch_grads(past)
                self.captured = {}
                hidden = base(input_ids=ids[None, s0:s1], position_ids=self._positions(s0, s1, ids.device),
                              use_cache=False).last_hidden_state
                loss, d_hidden = self._head_backward(hidden, targets[s0:s1], count, scale, loss_dtype)
                roots, grads = [hidden], [d_hidden]  # linear: later chunks' gk/gv carry the rest
                for layer, (key, value) in self.captured.items():
                    own = store.page_ids(seq, layer, first, first + -(-(s1 - s0) // page))
                    gids = store.grad_ids[own.long()]
                    if bool((gids >= 0).any()):  # what later chunks left for this chunk's own K/V
                        gk, gv = ops.gather_pages(store.grad_pool, gids, s1 - s0)
                        # A frozen path (a LoRA base: layer 0's k_proj over frozen embeddings) has
                        # no parameter behind it; its gradient goes nowhere.
                        for t, g in ((key, gk), (value, gv)):
                            if t.requires_grad:
                                roots.append(t)
                                grads.append(g.transpose(0, 1).unsqueeze(0).to(t.dtype))
                torch.autograd.backward(roots, grads)
                total += loss.to(torch.float64)
                self.captured = {}
                store.pop_chunk(seq)
                self._report(c, len(bounds))
        if rng is not None:
            rng.set(after_stage1)
        if session is not None:
            d.last_step = session.end_step()
            if d.sparse is not None:  # as the CPU path keeps them: chunks with a past
                for c in range(1, len(bounds)):
                    for layer in range(d.layers):
                        d.selections[(layer, c)] = session.selection(layer, c)
        return total
