# SPDX-License-Identifier: Apache-2.0
"""The GPU path's offload and page-sparse attention: one sequence's pages as the C++ trainer keeps
them (liboomb_cuda's paged session, ``oomb_cuda.h`` v4, over ``examples/trainer/algo/paged_attention.hpp``).

The session owns the K/V pages (bf16) and their gradient pages (fp32): in device memory, or with
offload their homes in host memory (pinned, or pageable so that nothing on the GPU grows with the
context), streamed through fixed sets of device slots by oomb's CUDA residency scheduler; with
sparse, the device page summaries and the tile selection. Every call enqueues on the session's own
streams, ordered after the caller's current stream and before what it enqueues next.
ChunkRecurrent uses it on CUDA when ``offload`` or ``sparse`` is given (oomb.torch).
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import torch

from . import _lib

_HOMES = {"pinned": 0, "pageable": 1}
_GRAD_HOMES = {"fp32": 0, "bf16": 1, "bf16-stochastic": 2}
_SCORING = {"quest": 0, "mean": 1}


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class CudaPagedSession:
    """One sequence's paged attention on a CUDA device (see the module docstring). The calls follow
    the trainer's order: per step ``begin_step``; stage 1 per chunk ``append`` then per layer
    ``write``, ``select`` (sparse), ``forward``; stage 2 per chunk (last first) ``expect_recompute``,
    ``forward`` for every layer, ``backward`` from the last layer down, ``release_chunk``; then
    ``end_step``. Tensors: q [n, hq, d], k, v [n, hkv, d], o, d_o, dq [n, hq, d] bf16 contiguous;
    lse [hq, n] float32; dk, dv [n, hkv, d] bf16."""

    def __init__(self, device: torch.device, *, layers: int, hq: int, hkv: int, head_dim: int, chunk: int,
                 page: int, max_tokens: int, offload: bool, near_pages: int = 0, window_pages: int = 0,
                 homes: str = "pinned", grad_homes: str = "fp32", sparse=None, deterministic: bool = False,
                 portable: bool = False):
        if homes not in _HOMES:
            raise ValueError(f"oomb: homes {homes!r} is not one of {sorted(_HOMES)}")
        if grad_homes not in _GRAD_HOMES:
            raise ValueError(f"oomb: grad_homes {grad_homes!r} is not one of {sorted(_GRAD_HOMES)}")
        self.device = device
        self.hq, self.hkv, self.head_dim = hq, hkv, head_dim
        self._lib = _lib.cuda_lib()
        c = _lib.CudaPagedConfig()
        c.struct_size = ctypes.sizeof(_lib.CudaPagedConfig)
        c.device = device.index if device.index is not None else torch.cuda.current_device()
        c.layers, c.hq, c.hkv, c.head_dim = layers, hq, hkv, head_dim
        c.chunk, c.page, c.max_tokens = chunk, page, max_tokens
        c.offload, c.near_pages, c.window_pages = int(offload), near_pages, window_pages
        c.home_memory, c.grad_homes = _HOMES[homes], _GRAD_HOMES[grad_homes]
        if sparse is not None:
            c.sparse, c.budget, c.sink, c.local, c.tile = 1, sparse.budget, sparse.sink, sparse.local, sparse.tile
            c.scoring = _SCORING[sparse.scoring]
        c.deterministic, c.portable = int(deterministic), int(portable)
        handle = ctypes.c_void_p()
        self._check(self._lib.oomb_cuda_paged_create(ctypes.byref(c), ctypes.byref(handle)))
        self._handle = handle

    def _check(self, rc: int) -> None:
        _lib.check_cuda(rc)

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def begin_step(self, chunks: int, doc_starts: Optional[Sequence[int]] = None) -> None:
        starts = (ctypes.c_int32 * len(doc_starts))(*doc_starts) if doc_starts else None
        self._check(self._lib.oomb_cuda_paged_begin_step(self._handle, chunks, starts, len(doc_starts or ())))

    def append(self, tokens: int) -> None:
        self._check(self._lib.oomb_cuda_paged_append(self._handle, tokens))

    def write(self, layer: int, chunk: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._check(self._lib.oomb_cuda_paged_write(self._handle, layer, chunk, k.shape[0], _ptr(k), _ptr(v),
                                                    self._stream()))

    def select(self, layer: int, chunk: int, q: torch.Tensor) -> None:
        self._check(self._lib.oomb_cuda_paged_select(self._handle, layer, chunk, q.shape[0], _ptr(q), self._stream()))

    def expect_recompute(self, chunk: int) -> None:
        self._check(self._lib.oomb_cuda_paged_expect_recompute(self._handle, chunk))

    def forward(self, layer: int, chunk: int, q: torch.Tensor):
        n = q.shape[0]
        o = torch.empty_like(q)
        lse = torch.empty((self.hq, n), dtype=torch.float32, device=q.device)
        self._check(self._lib.oomb_cuda_paged_forward(self._handle, layer, chunk, n, _ptr(q), _ptr(o), _ptr(lse),
                                                      self._stream()))
        return o, lse

    def backward(self, layer: int, chunk: int, q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 d_o: torch.Tensor):
        n = q.shape[0]
        dq = torch.zeros_like(q)
        dk = torch.zeros((n, self.hkv, self.head_dim), dtype=q.dtype, device=q.device)
        dv = torch.zeros_like(dk)
        self._check(self._lib.oomb_cuda_paged_backward(self._handle, layer, chunk, n, _ptr(q), _ptr(o), _ptr(lse),
                                                       _ptr(d_o), _ptr(dq), _ptr(dk), _ptr(dv), self._stream()))
        return dq, dk, dv

    def release_chunk(self, chunk: int) -> None:
        self._check(self._lib.oomb_cuda_paged_release_chunk(self._handle, chunk, self._stream()))

    def selection(self, layer: int, chunk: int):
        """Sparse: the last step's selection for (layer, chunk): (indptr [tiles + 1], pages), int32
        CPU tensors of logical past pages per tile, as stage 1 chose and both stages attended."""
        tiles, entries = ctypes.c_int64(), ctypes.c_int64()
        self._check(self._lib.oomb_cuda_paged_selection(self._handle, layer, chunk, None, 0, None, 0,
                                                        ctypes.byref(tiles), ctypes.byref(entries)))
        indptr = torch.empty(tiles.value + 1, dtype=torch.int32)
        pages = torch.empty(entries.value, dtype=torch.int32)
        self._check(self._lib.oomb_cuda_paged_selection(self._handle, layer, chunk, indptr.data_ptr(), indptr.numel(),
                                                        pages.data_ptr(), pages.numel(), ctypes.byref(tiles),
                                                        ctypes.byref(entries)))
        return indptr, pages

    def end_step(self) -> dict:
        """Waits for the step's copies and kernels; what is held and what moved, in a store's shape
        (PagedStore.stats and residency_stats): pages in use and their high water marks, ``near``
        per tier (with offload), and this step's exposed transfer time and sparse page counts."""
        s = _lib.CudaPagedStats()
        self._check(self._lib.oomb_cuda_paged_end_step(self._handle, ctypes.byref(s)))
        out = {}
        for name, _ in _lib.CudaPagedStats._fields_:
            if name in ("kv", "grad"):
                r = getattr(s, name)
                out.setdefault("near", {})[name] = {f: getattr(r, f) for f, _ in _lib.ResidencyStats._fields_}
            else:
                out[name] = getattr(s, name)
        if out["near"]["kv"]["slots"] == 0:
            del out["near"]  # in place, as a store without near tiers
        return out

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.oomb_cuda_paged_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass
