# SPDX-License-Identifier: Apache-2.0
"""oomb's paged memory for PyTorch: the library's paged KV cache and gradient mirror (C++), with
their pools seen as torch tensors without a copy: the pages dense attention reads in place (the
driver's offload and page-sparse attention are the paged session's, oomb.paged). On the CPU the pools are
host memory from oomb's own host resource; on a CUDA device they are blocks of torch's caching
allocator, which the library's page tables hand out (bf16 K/V pages, fp32 gradient pages).

Pools are token-major page pairs: ``kv_pool[id, 0]`` is the K page of id ``id``, ``[page][kv_heads]
[head_dim]``, ``kv_pool[id, 1]`` its V page; the gradient pool has the same layout, and
``grad_ids[kv_id]`` names the gradient pair of a KV page (-1 while it has none).
"""
from __future__ import annotations

import ctypes

import torch

from . import _lib
from ._lib import check, lib

_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.float64: _lib.DTYPE_F64}


def dtype_code(dtype: torch.dtype) -> int:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(
            f"oomb: the CPU path computes in float32 or float64, not {dtype} (bf16 is the GPU path's: "
            "put the model on a CUDA device)"
        ) from None


class _TorchBlocks:
    """The allocator a device store's pools come from: torch's caching allocator, one uint8 tensor
    per block the library asks for (so torch.cuda.memory_allocated counts the pools), kept here by
    address until the library gives the block back."""

    def __init__(self, device: torch.device):
        self.device = device
        self.blocks = {}
        self.failure = None
        self.allocate = _lib.ALLOCATE_FN(self._allocate)
        self.deallocate = _lib.DEALLOCATE_FN(self._deallocate)

    def _allocate(self, _ctx, nbytes, alignment):
        try:
            t = torch.empty(int(nbytes) + int(alignment), dtype=torch.uint8, device=self.device)
            ptr = t.data_ptr()
            aligned = (ptr + alignment - 1) // alignment * alignment
            self.blocks[aligned] = t[aligned - ptr: aligned - ptr + nbytes]
            return aligned
        except Exception as e:  # noqa: BLE001 -- reported as "no memory" by the library, kept for the message
            self.failure = e
            return None

    def _deallocate(self, _ctx, ptr, _nbytes):
        self.blocks.pop(int(ptr), None)

    def tensor(self, address: int, shape, dtype: torch.dtype) -> torch.Tensor:
        """The block at `address` as a tensor of `shape` and `dtype`."""
        block = self.blocks[int(address)]
        count = 1
        for s in shape:
            count *= int(s)
        return block.view(dtype)[:count].view(*shape)


def _tensor_at(address: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over memory the C library owns (no copy; valid while the owner lives)."""
    count = 1
    for s in shape:
        count *= int(s)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_byte * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=dtype, count=count).view(*shape)


class PagedStore:
    """K/V pages of every layer in one pool and their gradient pages.

    Everything is allocated here, up front, for the capacities given (the plan): ``max_pages`` K/V
    page pairs and ``max_grad_pages`` gradient pairs; nothing grows later. Sequences grow a chunk at
    a time (``append``), and stage 2 releases them a chunk at a time (``pop_chunk``, which also
    releases the chunk's gradient pages).

    On a CUDA ``device`` the pages are bf16 and the gradient pages fp32 (what oomb's kernels read and
    add into), in blocks from torch's caching allocator; ``dtype`` must then be torch.bfloat16.
    """

    def __init__(self, *, layers: int, page_size: int, kv_heads: int, head_dim: int, chunk_size: int,
                 max_pages: int, max_grad_pages: int, dtype: torch.dtype = torch.float64, device="cpu"):
        device = torch.device(device)
        self.device = device
        self._blocks = None
        if device.type == "cuda":
            if dtype != torch.bfloat16:
                raise TypeError(f"oomb: a store on {device} holds bf16 pages (the kernels'), not {dtype}")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
                self.device = device
            self._blocks = _TorchBlocks(device)
            cfg = _lib.StoreConfig(_lib.DTYPE_BF16, layers, page_size, kv_heads, head_dim, chunk_size, max_pages,
                                   max_grad_pages, _lib.MEMORY_CALLER, self._blocks.allocate,
                                   self._blocks.deallocate, None)
        elif device.type == "cpu":
            cfg = _lib.StoreConfig(dtype_code(dtype), layers, page_size, kv_heads, head_dim, chunk_size,
                                   max_pages, max_grad_pages, _lib.MEMORY_HOST)
        else:
            raise NotImplementedError(f"oomb: pages on {device} (the CPU and CUDA devices are supported)")
        handle = ctypes.c_void_p()
        rc = lib.oomb_store_create(ctypes.byref(cfg), ctypes.byref(handle))
        if rc != 0 and self._blocks is not None and self._blocks.failure is not None:
            raise torch.OutOfMemoryError(f"oomb: the pages' device memory: {self._blocks.failure}")
        check(rc)
        self._h = handle
        self.layers, self.page_size, self.kv_heads, self.head_dim = layers, page_size, kv_heads, head_dim
        self.chunk_size, self.dtype = chunk_size, dtype
        pair = (2, page_size, kv_heads, head_dim)
        grad_dtype = torch.float32 if self._blocks is not None else dtype
        base, cap = ctypes.c_void_p(), ctypes.c_int64()
        check(lib.oomb_store_kv_pool(self._h, ctypes.byref(base), ctypes.byref(cap)))
        self.kv_pool = self._pool_at(base.value, (cap.value, *pair), dtype)
        gbase, gcap, ids, nids = ctypes.c_void_p(), ctypes.c_int64(), _lib.p_i32(), ctypes.c_int64()
        check(lib.oomb_store_grad_pool(self._h, ctypes.byref(gbase), ctypes.byref(gcap), ctypes.byref(ids),
                                       ctypes.byref(nids)))
        self.grad_pool = self._pool_at(gbase.value, (gcap.value, *pair), grad_dtype)
        self.grad_ids = _tensor_at(ctypes.cast(ids, ctypes.c_void_p).value, (nids.value,), torch.int32)

    def _pool_at(self, address: int, shape, dtype: torch.dtype) -> torch.Tensor:
        if self._blocks is not None:
            return self._blocks.tensor(address, shape, dtype)
        return _tensor_at(address, shape, dtype)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the pools now (the tensors above must not be used after)."""
        if getattr(self, "_h", None):
            self.kv_pool = self.grad_pool = self.grad_ids = None
            lib.oomb_store_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._h:
            raise RuntimeError("oomb: PagedStore used after close()")
        return self._h

    # -- sequences --------------------------------------------------------------------------
    def add_sequence(self) -> int:
        seq = ctypes.c_int32()
        check(lib.oomb_store_add_sequence(self._handle(), ctypes.byref(seq)))
        return seq.value

    def append(self, seq: int, tokens: int) -> int:
        """Takes the pages of `tokens` more tokens in every layer; returns the first new position."""
        first = ctypes.c_int64()
        check(lib.oomb_store_append(self._handle(), seq, tokens, ctypes.byref(first)))
        return first.value

    def pop_chunk(self, seq: int) -> int:
        n = ctypes.c_int64()
        check(lib.oomb_store_pop_chunk(self._handle(), seq, ctypes.byref(n)))
        return n.value

    def seq_len(self, seq: int) -> int:
        n = ctypes.c_int64()
        check(lib.oomb_store_seq_len(self._handle(), seq, ctypes.byref(n)))
        return n.value

    def page_ids(self, seq: int, layer: int, first: int, last: int) -> torch.Tensor:
        """Pool ids (int32) of logical pages [first, last) of (seq, layer)."""
        out = torch.empty(max(0, last - first), dtype=torch.int32)
        check(lib.oomb_store_page_ids(self._handle(), seq, layer, first, last, out.data_ptr()))
        return out

    # -- gradient pages ---------------------------------------------------------------------
    def touch_grads(self, kv_ids: torch.Tensor) -> None:
        """Gives every listed KV page a zero-filled gradient page if it has none."""
        ids = kv_ids.to(torch.int32).contiguous()
        if self._blocks is None:
            check(lib.oomb_store_touch_grads(self._handle(), ids.data_ptr(), ids.numel()))
            return
        # Device pages: the library hands out the ids, torch zero-fills them on the current stream.
        fresh = torch.empty(ids.numel(), dtype=torch.int32)
        count = ctypes.c_int64()
        check(lib.oomb_store_touch_grads_fresh(self._handle(), ids.data_ptr(), ids.numel(), fresh.data_ptr(),
                                               ctypes.byref(count)))
        if count.value:
            fresh = fresh[: count.value].to(torch.int64).pin_memory().to(self.device, non_blocking=True)
            self.grad_pool.index_fill_(0, fresh, 0.0)

    # -- accounting -------------------------------------------------------------------------
    def stats(self) -> dict:
        s = _lib.StoreStats()
        check(lib.oomb_store_stats_get(self._handle(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _lib.StoreStats._fields_}
