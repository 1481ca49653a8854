# SPDX-License-Identifier: Apache-2.0
"""Offload and page-sparse attention: one sequence's pages as the C++ trainer keeps them (its
``examples/trainer/algo/paged_attention.hpp``), behind a C ABI: liboomb_c's paged session on the CPU
(``oomb_c.h`` v4, over the trainer's CPU backend) and liboomb_cuda's on a GPU (``oomb_cuda.h`` v4,
over its CUDA attention backend). One algorithm on both devices: the same windows, prefetch, Belady
eviction, selection and document bounds.

The session owns the K/V pages and their gradient pages. On the CPU they are host pools of the
model's dtype (float32 or float64), with offload streamed through fixed sets of near slots by oomb's
residency schedulers on host streams. On a GPU the pages are bf16 and the gradient pages fp32: in
device memory, or with offload their homes in host memory (pinned, or pageable so that nothing on
the GPU grows with the context) streamed through fixed sets of device slots; every call enqueues on
the session's own streams, ordered after the caller's current stream and before what it enqueues
next. With sparse, the session keeps the page summaries and makes the tile selection.
ChunkRecurrent uses it when ``offload`` or ``sparse`` is given (oomb.torch).
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import torch

from . import _lib
from .pages import dtype_code

_HOMES = {"pinned": 0, "pageable": 1}
_GRAD_HOMES = {"fp32": 0, "bf16": 1, "bf16-stochastic": 2}
_SCORING = {"quest": 0, "mean": 1}


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class PagedSession:
    """One sequence's paged attention on ``device`` (see the module docstring). The calls follow the
    trainer's order: per step ``begin_step``; stage 1 per chunk ``append`` then per layer ``write``,
    ``select`` (sparse), ``forward``; stage 2 per chunk (last first) ``expect_recompute``, ``forward``
    for every layer, ``backward`` from the last layer down, ``release_chunk``; then ``end_step``.
    Tensors are contiguous, of the session's ``dtype`` (the CPU: the model's float32 or float64; CUDA:
    bf16): q [n, hq, d], k, v [n, hkv, d], o, d_o, dq [n, hq, d]; dk, dv [n, hkv, d]; lse [hq, n] of
    ``lse_dtype`` (the CPU: the dtype; CUDA: float32). Scores are scaled by 1/sqrt(head_dim).

    ``grad_homes`` (offload): ``"fp32"`` keeps the gradient homes in the gradient pages' own type
    (the CPU: the dtype), ``"bf16"``/``"bf16-stochastic"`` halve them. ``homes``, ``deterministic``
    and ``portable`` are the GPU's (the CPU's homes are host memory and its sums always in one order)."""

    def __init__(self, device: torch.device, *, dtype: torch.dtype, layers: int, hq: int, hkv: int, head_dim: int,
                 chunk: int, page: int, max_tokens: int, offload: bool, near_pages: int = 0, window_pages: int = 0,
                 homes: str = "pinned", grad_homes: str = "fp32", sparse=None, deterministic: bool = False,
                 portable: bool = False):
        if homes not in _HOMES:
            raise ValueError(f"oomb: homes {homes!r} is not one of {sorted(_HOMES)}")
        if grad_homes not in _GRAD_HOMES:
            raise ValueError(f"oomb: grad_homes {grad_homes!r} is not one of {sorted(_GRAD_HOMES)}")
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self.hq, self.hkv, self.head_dim = hq, hkv, head_dim
        if self.on_cuda:
            if dtype != torch.bfloat16:
                raise TypeError(f"oomb: a session on {self.device} attends in bf16, not {dtype}")
            self.dtype, self.lse_dtype = torch.bfloat16, torch.float32
            self._lib, self._prefix, self._check = _lib.cuda_lib(), "oomb_cuda_paged_", _lib.check_cuda
            c = _lib.CudaPagedConfig()
            c.struct_size = ctypes.sizeof(_lib.CudaPagedConfig)
            c.device = self.device.index if self.device.index is not None else torch.cuda.current_device()
            c.home_memory = _HOMES[homes]
            c.deterministic, c.portable = int(deterministic), int(portable)
        elif self.device.type == "cpu":
            code = dtype_code(dtype)  # float32 or float64, else a TypeError that says so
            if homes != "pinned" or deterministic or portable:
                raise ValueError("oomb: homes, deterministic and portable are the GPU session's (the CPU's homes are "
                                 "host memory, its sums always in one order)")
            self.dtype = self.lse_dtype = dtype
            self._lib, self._prefix, self._check = _lib.lib, "oomb_paged_", _lib.check
            c = _lib.PagedConfig()
            c.struct_size = ctypes.sizeof(_lib.PagedConfig)
            c.dtype = code
        else:
            raise NotImplementedError(f"oomb: a paged session on {self.device} (the CPU and CUDA devices are supported)")
        c.layers, c.hq, c.hkv, c.head_dim = layers, hq, hkv, head_dim
        c.chunk, c.page, c.max_tokens = chunk, page, max_tokens
        c.offload, c.near_pages, c.window_pages = int(offload), near_pages, window_pages
        c.grad_homes = _GRAD_HOMES[grad_homes]
        if sparse is not None:
            c.sparse, c.budget, c.sink, c.local, c.tile = 1, sparse.budget, sparse.sink, sparse.local, sparse.tile
            c.scoring = _SCORING[sparse.scoring]
        handle = ctypes.c_void_p()
        self._check(self._call("create")(ctypes.byref(c), ctypes.byref(handle)))
        self._handle = handle

    def _call(self, name: str):
        return getattr(self._lib, self._prefix + name)

    def _run(self, name: str, *args) -> None:
        """One call on the session; on CUDA with the caller's current stream last."""
        if not self._handle:
            raise RuntimeError("oomb: PagedSession used after close()")
        if self.on_cuda and name not in ("begin_step", "append", "expect_recompute", "selection", "end_step"):
            args = (*args, torch.cuda.current_stream(self.device).cuda_stream)
        self._check(self._call(name)(self._handle, *args))

    def _tensor(self, t: torch.Tensor, name: str, shape, dtype=None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if t.dtype != dtype or t.device.type != self.device.type or tuple(t.shape) != tuple(shape):
            raise ValueError(f"oomb: {name} is {t.dtype} {tuple(t.shape)} on {t.device}; the session needs {dtype} "
                             f"{tuple(shape)} on {self.device}")
        return t.contiguous()

    def begin_step(self, chunks: int, doc_starts: Optional[Sequence[int]] = None) -> None:
        starts = (ctypes.c_int32 * len(doc_starts))(*doc_starts) if doc_starts else None
        self._run("begin_step", chunks, starts, len(doc_starts or ()))

    def append(self, tokens: int) -> None:
        self._run("append", tokens)

    def write(self, layer: int, chunk: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[0]
        k = self._tensor(k, "k", (n, self.hkv, self.head_dim))
        v = self._tensor(v, "v", (n, self.hkv, self.head_dim))
        self._run("write", layer, chunk, n, _ptr(k), _ptr(v))

    def select(self, layer: int, chunk: int, q: torch.Tensor) -> None:
        q = self._tensor(q, "q", (q.shape[0], self.hq, self.head_dim))
        self._run("select", layer, chunk, q.shape[0], _ptr(q))

    def expect_recompute(self, chunk: int) -> None:
        self._run("expect_recompute", chunk)

    def forward(self, layer: int, chunk: int, q: torch.Tensor):
        n = q.shape[0]
        q = self._tensor(q, "q", (n, self.hq, self.head_dim))
        o = torch.empty_like(q)
        lse = torch.empty((self.hq, n), dtype=self.lse_dtype, device=q.device)
        self._run("forward", layer, chunk, n, _ptr(q), _ptr(o), _ptr(lse))
        return o, lse

    def backward(self, layer: int, chunk: int, q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 d_o: torch.Tensor):
        n = q.shape[0]
        q = self._tensor(q, "q", (n, self.hq, self.head_dim))
        o = self._tensor(o, "o", (n, self.hq, self.head_dim))
        d_o = self._tensor(d_o, "d_o", (n, self.hq, self.head_dim))
        lse = self._tensor(lse, "lse", (self.hq, n), self.lse_dtype)
        dq = torch.zeros_like(q)
        dk = torch.zeros((n, self.hkv, self.head_dim), dtype=q.dtype, device=q.device)
        dv = torch.zeros_like(dk)
        self._run("backward", layer, chunk, n, _ptr(q), _ptr(o), _ptr(lse), _ptr(d_o), _ptr(dq), _ptr(dk), _ptr(dv))
        return dq, dk, dv

    def release_chunk(self, chunk: int) -> None:
        self._run("release_chunk", chunk)

    def selection(self, layer: int, chunk: int):
        """Sparse: the last step's selection for (layer, chunk): (indptr [tiles + 1], pages), int32
        CPU tensors of logical past pages per tile, as stage 1 chose and both stages attended."""
        tiles, entries = ctypes.c_int64(), ctypes.c_int64()
        self._run("selection", layer, chunk, None, 0, None, 0, ctypes.byref(tiles), ctypes.byref(entries))
        indptr = torch.empty(tiles.value + 1, dtype=torch.int32)
        pages = torch.empty(entries.value, dtype=torch.int32)
        self._run("selection", layer, chunk, indptr.data_ptr(), indptr.numel(), pages.data_ptr(), pages.numel(),
                  ctypes.byref(tiles), ctypes.byref(entries))
        return indptr, pages

    def end_step(self) -> dict:
        """Waits for the step's copies (and kernels); what is held and what moved: pages in use and
        their high water marks, ``near`` per tier (with offload: slots and what moved, since the
        session was made), this step's exposed transfer time (the GPU's; 0 on the CPU) and sparse
        page counts."""
        s = _lib.PagedStats()
        self._run("end_step", ctypes.byref(s))
        out = {}
        for name, _ in _lib.PagedStats._fields_:
            if name in ("kv", "grad"):
                r = getattr(s, name)
                out.setdefault("near", {})[name] = {f: getattr(r, f) for f, _ in _lib.ResidencyStats._fields_}
            else:
                out[name] = getattr(s, name)
        if out["near"]["kv"]["slots"] == 0:
            del out["near"]  # in place: no near tiers
        return out

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._call("destroy")(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass
