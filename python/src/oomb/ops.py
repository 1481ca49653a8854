# SPDX-License-Identifier: Apache-2.0
"""oomb's ops, registered with torch.library (namespace ``oomb``).

``oomb::attention(q, k, v, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr,
tile_pages, tile, own_ids=None) -> (o, lse)``
    Causal attention of one chunk's queries ``q`` [sq, hq, d] (positions q_start.., RoPE applied)
    over the past pages ``past_ids`` of ``kv_pool`` plus the chunk's own ``k``, ``v`` [sq, hkv, d];
    GQA as HF's repeat_kv. With ``tile_indptr``/``tile_pages`` the past is page-sparse: tile t of
    ``tile`` queries attends only the logical past pages ``tile_pages[tile_indptr[t]:tile_indptr[t+1]]``.
    Returns o [sq, hq, d] and lse [hq, sq] (natural log; not differentiable). Its backward gives
    dq, dk, dv and ADDS the past pages' dK/dV into their gradient pages (``grad_pool``, addressed by
    ``grad_ids``): the gradient of the past leaves through oomb's pages, not through autograd.
    ``own_ids`` (int32, one per page of the chunk) name the pages that hold the chunk's K/V. On CUDA
    they are required: the kernels read the chunk's own keys through its pages, so the caller writes
    ``k``, ``v`` there first (``write_pages``; the op stays functional, as autograd needs, and does not
    check the pages' contents). The CPU path reads ``k``, ``v`` themselves and ignores them.
    ``key_lower`` (int64 [sq], optional): packed documents; query i attends only keys at positions
    ``>= key_lower[i]``, the start of its document (non-decreasing, at most ``q_start + i``):
    block-diagonal causal attention. Every attention op below takes it, then ``deterministic``
    (default False): on CUDA the backward adds dQ in a fixed order (the Hopper kernels, pages of >= 128
    tokens; ``oomb::attention::plan_options::deterministic``), so its gradients are the same bits on
    every run; the CPU path always is.
``oomb::attention_backward(...) -> (dq, dk, dv)``, mutates ``grad_pool``: that backward as an op.
``oomb::attention_kept(q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale,
tile_indptr, tile_pages, tile, own_ids=None) -> o``: ``oomb::attention`` whose forward was already
    computed (stage 1's kept ``o``, ``lse``): returns a copy of ``o``, and its backward is
    ``oomb::attention_backward`` given them; what stage 2 runs with kept attention outputs.
``oomb::write_pages(kv_pool!, k, v, page_ids)``: writes a chunk's K/V [sq, hkv, d] into its pages.
``oomb::gather_pages(pool, page_ids, tokens) -> (k, v)``: reads [tokens, hkv, d] back from pages
    (an id of -1 reads zeros: a gradient page never touched).
``oomb::accumulate_pages(pool!, page_ids, dk, dv)``: adds [sq, hkv, d] into pages.

The attention ops run on the CPU through the library's reference (float32, float64) and on CUDA
devices through oomb's kernels (liboomb_cuda: bf16 q/k/v and pages, lse and gradient pages fp32, on
torch's current stream); the page ops are plain tensor indexing and run on any device. Each op has a
fake (meta) implementation, so ``torch.library.opcheck`` and tracing see shapes without running it.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._lib import check, lib
from .pages import dtype_code

__all__ = ["attention", "attention_backward", "attention_kept", "write_pages", "gather_pages", "accumulate_pages"]


def to_device(t: Tensor, device: torch.device, dtype: Optional[torch.dtype] = None) -> Tensor:
    """`t` on `device`. A small host tensor (page ids, tables) goes through pinned memory: a copy
    from pageable memory would synchronise the stream first, stalling the queue of kernels the host
    keeps ahead of the GPU; torch's pinned cache keeps the buffer until the copy has run."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if t.device == device or t.device.type != "cpu" or device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _check_common(q: Tensor, k: Tensor, v: Tensor, kv_pool: Tensor, past_ids: Tensor, q_start: int,
                  tile_indptr: Optional[Tensor], tile_pages: Optional[Tensor], own_ids: Optional[Tensor] = None,
                  key_lower: Optional[Tensor] = None):
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"oomb.attention: q must be [sq, hq, d] and k, v [sq, hkv, d]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    sq, hq, d = q.shape
    if k.shape[0] != sq or k.shape[2] != d or hq % k.shape[1] != 0:
        raise ValueError(f"oomb.attention: k {tuple(k.shape)} does not fit q {tuple(q.shape)} (same tokens and "
                         "head_dim, query heads a multiple of KV heads)")
    if kv_pool.dim() != 5 or kv_pool.shape[1] != 2 or kv_pool.shape[3] != k.shape[1] or kv_pool.shape[4] != d:
        raise ValueError(f"oomb.attention: kv_pool {tuple(kv_pool.shape)} is not [pages, 2, page, {k.shape[1]}, {d}]")
    for name, t in (("q", q), ("k", k), ("v", v), ("kv_pool", kv_pool)):
        if t.dtype != q.dtype:
            raise TypeError(f"oomb.attention: {name} is {t.dtype}, q is {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"oomb.attention: {name} is on {t.device}, q on {q.device}")
    if q.device.type == "cuda":
        if q.dtype != torch.bfloat16:
            raise TypeError(f"oomb.attention: on CUDA q, k, v and the pages are bf16 (the kernels'), not {q.dtype}")
        if d not in (64, 128):
            raise ValueError(f"oomb.attention: on CUDA head_dim must be 64 or 128 (the kernels'), got {d}")
    elif q.device.type != "cpu":
        raise NotImplementedError(f"oomb.attention: tensors on {q.device} (the CPU and CUDA devices are supported)")
    if not kv_pool.is_contiguous():
        raise ValueError("oomb.attention: kv_pool must be contiguous (it is the pool's own memory)")
    page = kv_pool.shape[2]
    if q_start < 0 or q_start % page != 0:
        raise ValueError(f"oomb.attention: q_start {q_start} is not a multiple of the page size {page}")
    if past_ids.dtype != torch.int32 or past_ids.dim() != 1 or past_ids.numel() != q_start // page:
        raise ValueError(f"oomb.attention: past_ids must be int32 [{q_start // page}] (one id per past page), got "
                         f"{past_ids.dtype} {tuple(past_ids.shape)}")
    if (tile_indptr is None) != (tile_pages is None):
        raise ValueError("oomb.attention: tile_indptr and tile_pages go together")
    for name, t in (("tile_indptr", tile_indptr), ("tile_pages", tile_pages)):
        if t is not None and t.dtype != torch.int32:
            raise TypeError(f"oomb.attention: {name} must be int32, got {t.dtype}")
    own = -(-sq // page)
    if own_ids is None and q.device.type == "cuda":
        raise ValueError("oomb.attention: on CUDA own_ids is required (the kernels read the chunk's K/V through "
                         "its pages)")
    if own_ids is not None and (own_ids.dtype != torch.int32 or own_ids.dim() != 1 or own_ids.numel() != own):
        raise ValueError(f"oomb.attention: own_ids must be int32 [{own}] (one id per page of the chunk), got "
                         f"{own_ids.dtype} {tuple(own_ids.shape)}")
    if key_lower is not None and (key_lower.dtype != torch.int64 or key_lower.dim() != 1 or key_lower.numel() != sq):
        raise ValueError(f"oomb.attention: key_lower must be int64 [{sq}] (one bound per query), got "
                         f"{key_lower.dtype} {tuple(key_lower.shape)}")


def _args(q: Tensor, kv_own: Tensor, kv_pool: Tensor, past_ids: Tensor, q_start: int, scale: float,
          tile_indptr: Optional[Tensor], tile_pages: Optional[Tensor], tile: int,
          key_lower: Optional[Tensor] = None) -> _lib.AttentionArgs:
    """The C call's arguments; every tensor given must be contiguous host memory the caller keeps alive."""
    sq, hq, d = q.shape
    a = _lib.AttentionArgs()
    a.struct_size = ctypes.sizeof(_lib.AttentionArgs)
    a.dtype = dtype_code(q.dtype)
    a.q = q.data_ptr()
    a.sq, a.hq, a.hkv, a.d = sq, hq, kv_own.shape[2], d
    a.q_start = q_start
    a.scale = float(scale)
    a.kv_own = kv_own.data_ptr()
    a.pool = kv_pool.data_ptr()
    a.pool_pages = kv_pool.shape[0]
    a.page_size = kv_pool.shape[2]
    a.past_ids = past_ids.data_ptr() if past_ids.numel() else None
    a.tile_indptr = _ptr(tile_indptr)
    a.tile_pages = _ptr(tile_pages) if tile_pages is not None and tile_pages.numel() else None
    a.tile = tile
    a.key_lower = _ptr(key_lower)
    return a


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float32 if q.dtype == torch.bfloat16 else q.dtype


# ---- the CUDA path: oomb's kernels through liboomb_cuda -----------------------------------------

def _ints_on(device: torch.device, *parts: Tensor) -> Tensor:
    """int32 parts concatenated, on `device` (built on the host when they are there)."""
    host = all(p.device.type == "cpu" for p in parts)
    out = torch.cat([p.to(torch.int32) if host else p.to(device, torch.int32) for p in parts])
    return to_device(out, device) if host else out


def _cuda_args(q: Tensor, kv_pool: Tensor, past_ids: Tensor, own_ids: Tensor, q_start: int, scale: float,
               tile_indptr: Optional[Tensor], tile_pages: Optional[Tensor], tile: int, key_lower: Optional[Tensor],
               deterministic: bool = False):
    """The call's arguments and the tensors they point into (kept alive by the caller until the
    launch has been enqueued; torch's allocator orders any reuse after it on the stream)."""
    sq, hq, d = q.shape
    page = kv_pool.shape[2]
    own = own_ids.numel()
    head = torch.tensor([0, past_ids.numel() + own, sq - (own - 1) * page], dtype=torch.int32)
    table = _ints_on(q.device, head, past_ids, own_ids)
    keep = [table]
    a = _lib.CudaAttentionArgs()
    a.struct_size = ctypes.sizeof(_lib.CudaAttentionArgs)
    a.device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    a.q = q.data_ptr()
    a.sq, a.hq, a.hkv, a.d = sq, hq, kv_pool.shape[3], d
    a.q_start = q_start
    a.scale = float(scale)
    a.pool = kv_pool.data_ptr()
    a.page_size = page
    a.table = table.data_ptr()
    a.pages = past_ids.numel() + own
    a.deterministic = 1 if deterministic else 0
    if tile_indptr is not None:
        ti = to_device(tile_indptr, q.device, torch.int32).contiguous()
        tp = to_device(tile_pages, q.device, torch.int32).contiguous()
        if tp.numel() == 0:  # no tile selects a past page; the kernels still want an address
            tp = torch.zeros(1, dtype=torch.int32, device=q.device)
        keep += [ti, tp]
        a.tile_indptr, a.tile_pages, a.tile = ti.data_ptr(), tp.data_ptr(), tile
    if key_lower is not None:
        kl = to_device(key_lower, q.device, torch.int64).contiguous()
        keep.append(kl)
        a.key_lower = kl.data_ptr()
    return a, keep


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _cuda_forward(q, k, v, kv_pool, past_ids, own_ids, q_start, scale, tile_indptr, tile_pages, tile, key_lower):
    cl = _lib.cuda_lib()
    q = q.contiguous()
    sq, hq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((hq, sq), dtype=torch.float32, device=q.device)
    a, _keep = _cuda_args(q, kv_pool, past_ids, own_ids, q_start, scale, tile_indptr, tile_pages, tile, key_lower)
    _lib.check_cuda(cl.oomb_cuda_attention_forward(ctypes.byref(a), o.data_ptr(), lse.data_ptr(), _stream(q.device)))
    return o, lse


def _cuda_backward(d_o, q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, own_ids, q_start, scale,
                   tile_indptr, tile_pages, tile, key_lower, deterministic):
    cl = _lib.cuda_lib()
    q, o, d_o, lse = q.contiguous(), o.contiguous(), d_o.contiguous(), lse.contiguous()
    if lse.dtype != torch.float32 or o.dtype != torch.bfloat16 or d_o.dtype != torch.bfloat16:
        raise TypeError(f"oomb.attention_backward: on CUDA o and d_o are bf16 and lse fp32, got {o.dtype}, "
                        f"{d_o.dtype}, {lse.dtype}")
    sq, hq, d = q.shape
    hkv = k.shape[1]
    a, keep = _cuda_args(q, kv_pool, past_ids, own_ids, q_start, scale, tile_indptr, tile_pages, tile, key_lower,
                         deterministic)
    grad_base, grad_pages = None, None
    if past_ids.numel():
        if grad_pool.dtype != torch.float32 or grad_pool.device != q.device:
            raise TypeError(f"oomb.attention_backward: on CUDA the gradient pages are fp32 on {q.device}, got "
                            f"{grad_pool.dtype} on {grad_pool.device}")
        past = grad_ids.index_select(0, past_ids.to(grad_ids.device, torch.int64))
        grad_pages = _ints_on(q.device, past, torch.full((own_ids.numel(),), -1, dtype=torch.int32))
        keep.append(grad_pages)
        grad_base = grad_pool.data_ptr()
    dq = torch.zeros((sq, hq, d), dtype=torch.float32, device=q.device)
    dk = torch.zeros((sq, hkv, d), dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    delta = torch.empty((hq, sq), dtype=torch.float32, device=q.device)
    ints = ctypes.c_int64()
    _lib.check_cuda(cl.oomb_cuda_attention_backward_workspace(ctypes.byref(a), ctypes.byref(ints)))
    ws = torch.empty(max(1, ints.value), dtype=torch.int32, device=q.device)
    _lib.check_cuda(cl.oomb_cuda_attention_backward(
        ctypes.byref(a), o.data_ptr(), lse.data_ptr(), d_o.data_ptr(), delta.data_ptr(), dq.data_ptr(), dk.data_ptr(),
        dv.data_ptr(), grad_base, None if grad_pages is None else grad_pages.data_ptr(), ws.data_ptr(), ints.value,
        _stream(q.device)))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---- the attention ops ----------------------------------------------------------------------------

@torch.library.custom_op("oomb::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, kv_pool: Tensor, past_ids: Tensor, grad_pool: Optional[Tensor],
              grad_ids: Optional[Tensor], q_start: int, scale: float, tile_indptr: Optional[Tensor],
              tile_pages: Optional[Tensor], tile: int, own_ids: Optional[Tensor] = None,
              key_lower: Optional[Tensor] = None, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    _check_common(q, k, v, kv_pool, past_ids, q_start, tile_indptr, tile_pages, own_ids, key_lower)
    if q.device.type == "cuda":
        return _cuda_forward(q, k, v, kv_pool, past_ids, own_ids, q_start, scale, tile_indptr, tile_pages, tile,
                             key_lower)
    q = q.contiguous()
    kv_own = torch.stack([k, v]).contiguous()
    ids = past_ids.contiguous()
    ti = None if tile_indptr is None else tile_indptr.contiguous()
    tp = None if tile_pages is None else tile_pages.contiguous()
    sq, hq, d = q.shape
    kl = None if key_lower is None else key_lower.contiguous()
    o = torch.empty_like(q)
    lse = q.new_empty((hq, sq))
    a = _args(q, kv_own, kv_pool, ids, q_start, scale, ti, tp, tile, kl)
    check(lib.oomb_attention_forward(ctypes.byref(a), o.data_ptr(), lse.data_ptr()))
    return o, lse


@attention.register_fake
def _(q, k, v, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr, tile_pages, tile, own_ids=None,
      key_lower=None, deterministic=False):
    sq, hq, _d = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((hq, sq), dtype=_lse_dtype(q))


@torch.library.custom_op("oomb::attention_backward", mutates_args=("grad_pool",))
def attention_backward(d_o: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, kv_pool: Tensor,
                       past_ids: Tensor, grad_pool: Optional[Tensor], grad_ids: Optional[Tensor], q_start: int,
                       scale: float, tile_indptr: Optional[Tensor], tile_pages: Optional[Tensor],
                       tile: int, own_ids: Optional[Tensor] = None,
                       key_lower: Optional[Tensor] = None, deterministic: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    _check_common(q, k, v, kv_pool, past_ids, q_start, tile_indptr, tile_pages, own_ids, key_lower)
    past = past_ids.numel()
    if past and (grad_pool is None or grad_ids is None):
        raise ValueError(f"oomb.attention_backward: {past} past pages need grad_pool and grad_ids")
    grad_dtype = torch.float32 if q.device.type == "cuda" else q.dtype
    if grad_pool is not None and (not grad_pool.is_contiguous() or grad_pool.dtype != grad_dtype
                                  or grad_pool.shape[1:] != kv_pool.shape[1:]):
        raise ValueError(f"oomb.attention_backward: grad_pool {grad_pool.dtype} {tuple(grad_pool.shape)} must be a "
                         f"contiguous {grad_dtype} pool of pages shaped like kv_pool's {tuple(kv_pool.shape[1:])}")
    if grad_ids is not None and (grad_ids.dtype != torch.int32 or not grad_ids.is_contiguous()
                                 or grad_ids.numel() < kv_pool.shape[0]):
        raise ValueError(f"oomb.attention_backward: grad_ids must be a contiguous int32 table of at least "
                         f"{kv_pool.shape[0]} entries (one per KV page id)")
    if q.device.type == "cuda":
        return _cuda_backward(d_o, q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, own_ids, q_start, scale,
                              tile_indptr, tile_pages, tile, key_lower, deterministic)
    q, o, lse, d_o = q.contiguous(), o.contiguous(), lse.contiguous(), d_o.contiguous()
    kv_own = torch.stack([k, v]).contiguous()
    ids = past_ids.contiguous()
    ti = None if tile_indptr is None else tile_indptr.contiguous()
    tp = None if tile_pages is None else tile_pages.contiguous()
    kl = None if key_lower is None else key_lower.contiguous()
    dq = torch.empty_like(q)
    dk = torch.empty_like(kv_own[0])
    dv = torch.empty_like(kv_own[1])
    a = _args(q, kv_own, kv_pool, ids, q_start, scale, ti, tp, tile, kl)
    check(lib.oomb_attention_backward(ctypes.byref(a), o.data_ptr(), lse.data_ptr(), d_o.data_ptr(),
                                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), _ptr(grad_pool),
                                      0 if grad_pool is None else grad_pool.shape[0], _ptr(grad_ids),
                                      0 if grad_ids is None else grad_ids.numel()))
    return dq, dk, dv


@attention_backward.register_fake
def _(d_o, q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr, tile_pages, tile,
      own_ids=None, key_lower=None, deterministic=False):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    q, k, v, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr, tile_pages, tile, own_ids, \
        key_lower, deterministic = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse, past_ids)
    # Not saved as tensors for backward: the pools and the gradient table are oomb's state, which
    # later calls write (the next layer's K/V pages, the backward's gradient pages), and the sparse
    # selection, own pages and document bounds, which never change within the step.
    ctx.state = (kv_pool, grad_pool, grad_ids, tile_indptr, tile_pages, own_ids, key_lower)
    ctx.q_start, ctx.scale, ctx.tile, ctx.deterministic = q_start, scale, tile, deterministic


def _backward(ctx, d_o, _d_lse):
    q, k, v, o, lse, past_ids = ctx.saved_tensors
    kv_pool, grad_pool, grad_ids, tile_indptr, tile_pages, own_ids, key_lower = ctx.state
    dq, dk, dv = attention_backward(d_o, q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, ctx.q_start,
                                    ctx.scale, tile_indptr, tile_pages, ctx.tile, own_ids, key_lower,
                                    ctx.deterministic)
    return (dq, dk, dv) + (None,) * 12


attention.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("oomb::attention_kept", mutates_args=())
def attention_kept(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, kv_pool: Tensor, past_ids: Tensor,
                   grad_pool: Optional[Tensor], grad_ids: Optional[Tensor], q_start: int, scale: float,
                   tile_indptr: Optional[Tensor], tile_pages: Optional[Tensor], tile: int,
                   own_ids: Optional[Tensor] = None, key_lower: Optional[Tensor] = None,
                   deterministic: bool = False) -> Tensor:
    _check_common(q, k, v, kv_pool, past_ids, q_start, tile_indptr, tile_pages, own_ids, key_lower)
    sq, hq, d = q.shape
    if o.shape != q.shape or o.dtype != q.dtype or lse.shape != (hq, sq) or lse.dtype != _lse_dtype(q):
        raise ValueError(f"oomb.attention_kept: o {o.dtype} {tuple(o.shape)} and lse {lse.dtype} {tuple(lse.shape)} "
                         f"are not oomb.attention's outputs for q {q.dtype} {tuple(q.shape)}")
    return o.clone()  # an op's output may not alias its input


@attention_kept.register_fake
def _(q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr, tile_pages, tile,
      own_ids=None, key_lower=None, deterministic=False):
    return torch.empty_like(o, memory_format=torch.contiguous_format)


def _kept_setup_context(ctx, inputs, output):
    q, k, v, o, lse, kv_pool, past_ids, grad_pool, grad_ids, q_start, scale, tile_indptr, tile_pages, tile, own_ids, \
        key_lower, deterministic = inputs
    ctx.save_for_backward(q, k, v, o, lse, past_ids)
    ctx.state = (kv_pool, grad_pool, grad_ids, tile_indptr, tile_pages, own_ids, key_lower)
    ctx.q_start, ctx.scale, ctx.tile, ctx.deterministic = q_start, scale, tile, deterministic


def _kept_backward(ctx, d_o):
    dq, dk, dv = _backward(ctx, d_o, None)[:3]
    return (dq, dk, dv) + (None,) * 14


attention_kept.register_autograd(_kept_backward, setup_context=_kept_setup_context)


# ---- page ops: plain tensor indexing, any device ----------------------------------------------

def _pages_of(x: Tensor, n_pages: int, page: int) -> Tensor:
    """[sq, hkv, d] -> [n_pages, page, hkv, d], zero-padded."""
    sq = x.shape[0]
    if sq == n_pages * page:
        return x.reshape(n_pages, page, *x.shape[1:])
    padded = x.new_zeros((n_pages * page, *x.shape[1:]))
    padded[:sq] = x
    return padded.view(n_pages, page, *x.shape[1:])


def _check_pages(op: str, pool: Tensor, page_ids: Tensor, tokens: int):
    if pool.dim() != 5 or pool.shape[1] != 2:
        raise ValueError(f"oomb.{op}: pool {tuple(pool.shape)} is not [pages, 2, page, hkv, d]")
    page = pool.shape[2]
    need = (tokens + page - 1) // page
    if page_ids.dim() != 1 or page_ids.numel() != need:
        raise ValueError(f"oomb.{op}: {tokens} tokens in pages of {page} need {need} page ids, got "
                         f"{tuple(page_ids.shape)}")
    if page_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"oomb.{op}: page ids must be int32 or int64, got {page_ids.dtype}")


@torch.library.custom_op("oomb::write_pages", mutates_args=("kv_pool",))
def write_pages(kv_pool: Tensor, k: Tensor, v: Tensor, page_ids: Tensor) -> None:
    _check_pages("write_pages", kv_pool, page_ids, k.shape[0])
    if k.shape != v.shape or tuple(k.shape[1:]) != tuple(kv_pool.shape[3:]):
        raise ValueError(f"oomb.write_pages: k {tuple(k.shape)}, v {tuple(v.shape)} do not fit pages "
                         f"{tuple(kv_pool.shape[2:])}")
    if page_ids.numel() and (int(page_ids.min()) < 0 or int(page_ids.max()) >= kv_pool.shape[0]):
        raise ValueError(f"oomb.write_pages: a page id is outside the pool's {kv_pool.shape[0]} pages")
    n, page = page_ids.numel(), kv_pool.shape[2]
    ids = to_device(page_ids, kv_pool.device, torch.int64)
    pairs = torch.stack([_pages_of(k, n, page), _pages_of(v, n, page)], dim=1).to(kv_pool.dtype)
    kv_pool.index_copy_(0, ids, pairs)


@write_pages.register_fake
def _(kv_pool, k, v, page_ids):
    return None


@torch.library.custom_op("oomb::gather_pages", mutates_args=())
def gather_pages(pool: Tensor, page_ids: Tensor, tokens: int) -> Tuple[Tensor, Tensor]:
    _check_pages("gather_pages", pool, page_ids, tokens)
    missing = page_ids < 0  # where the ids are (the host, in the driver): no device round trip
    pairs = pool.index_select(0, to_device(page_ids.clamp(min=0), pool.device, torch.int64))
    if bool(missing.any()):
        pairs[to_device(missing, pool.device)] = 0
    k = pairs[:, 0].reshape(-1, *pool.shape[3:])[:tokens].clone()  # pairs: [n, 2, page, hkv, d]
    v = pairs[:, 1].reshape(-1, *pool.shape[3:])[:tokens].clone()
    return k, v


@gather_pages.register_fake
def _(pool, page_ids, tokens):
    shape = (tokens, *pool.shape[3:])
    return pool.new_empty(shape), pool.new_empty(shape)


@torch.library.custom_op("oomb::accumulate_pages", mutates_args=("pool",))
def accumulate_pages(pool: Tensor, page_ids: Tensor, dk: Tensor, dv: Tensor) -> None:
    _check_pages("accumulate_pages", pool, page_ids, dk.shape[0])
    if dk.shape != dv.shape or tuple(dk.shape[1:]) != tuple(pool.shape[3:]):
        raise ValueError(f"oomb.accumulate_pages: dk {tuple(dk.shape)}, dv {tuple(dv.shape)} do not fit pages "
                         f"{tuple(pool.shape[2:])}")
    if page_ids.numel() and (int(page_ids.min()) < 0 or int(page_ids.max()) >= pool.shape[0]):
        raise ValueError(f"oomb.accumulate_pages: a page id is outside the pool's {pool.shape[0]} pages "
                         "(touch the gradient pages first)")
    n, page = page_ids.numel(), pool.shape[2]
    ids = to_device(page_ids, pool.device, torch.int64)
    pairs = torch.stack([_pages_of(dk, n, page), _pages_of(dv, n, page)], dim=1).to(pool.dtype)
    pool.index_add_(0, ids, pairs)


@accumulate_pages.register_fake
def _(pool, page_ids, dk, dv):
    return None
