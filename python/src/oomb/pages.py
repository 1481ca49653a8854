# SPDX-License-Identifier: Apache-2.0
"""oomb's paged memory for PyTorch: the library's paged KV cache, gradient mirror and page
summaries (C++), with their pools seen as torch tensors without a copy. On the CPU the pools are
host memory from oomb's own host resource; on a CUDA device they are blocks of torch's caching
allocator, which the library's page tables hand out (bf16 K/V pages, fp32 gradient pages).

Pools are token-major page pairs: ``kv_pool[id, 0]`` is the K page of id ``id``, ``[page][kv_heads]
[head_dim]``, ``kv_pool[id, 1]`` its V page; the gradient pool has the same layout, and
``grad_ids[kv_id]`` names the gradient pair of a KV page (-1 while it has none).
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Optional

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


# address -> PagedStore, so an op given an address can check it names a live store (weak: the
# registry must not keep a store, and its pools, alive).
_live_stores: "weakref.WeakValueDictionary[int, PagedStore]" = weakref.WeakValueDictionary()


def store_at(address: int) -> "PagedStore":
    """The live store whose handle is `address` (what the store ops take), or a clear error."""
    store = _live_stores.get(int(address))
    if store is None:
        raise ValueError(f"oomb: no live PagedStore at address {address:#x} (closed, or not a store)")
    return store


class PagedStore:
    """K/V pages of every layer in one pool, their gradient pages, optional page summaries.

    Everything is allocated here, up front, for the capacities given (the plan): ``max_pages`` K/V
    page pairs and ``max_grad_pages`` gradient pairs; nothing grows later. Sequences grow a chunk at
    a time (``append``), and stage 2 releases them a chunk at a time (``pop_chunk``, which also
    releases the chunk's gradient pages and summaries).

    On a CUDA ``device`` the pages are bf16 and the gradient pages fp32 (what oomb's kernels read and
    add into), in blocks from torch's caching allocator; ``dtype`` must then be torch.bfloat16, and
    page summaries and near tiers are the CPU path's only (for now).
    """

    def __init__(self, *, layers: int, page_size: int, kv_heads: int, head_dim: int, chunk_size: int,
                 max_pages: int, max_grad_pages: int, dtype: torch.dtype = torch.float64,
                 summaries: bool = False, near_kv_slots: int = 0, near_grad_slots: int = 0,
                 window_pages: int = 0, device="cpu"):
        device = torch.device(device)
        self.device = device
        self._blocks = None
        if device.type == "cuda":
            if dtype != torch.bfloat16:
                raise TypeError(f"oomb: a store on {device} holds bf16 pages (the kernels'), not {dtype}")
            if summaries or near_kv_slots:
                raise NotImplementedError("oomb: page summaries and near tiers are the CPU path's only so far; a "
                                          "store on a CUDA device reads every page in place (docs/pytorch.md)")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
                self.device = device
            self._blocks = _TorchBlocks(device)
            cfg = _lib.StoreConfig(_lib.DTYPE_BF16, layers, page_size, kv_heads, head_dim, chunk_size, max_pages,
                                   max_grad_pages, 0, 0, 0, 0, _lib.MEMORY_CALLER, self._blocks.allocate,
                                   self._blocks.deallocate, None)
        elif device.type == "cpu":
            cfg = _lib.StoreConfig(dtype_code(dtype), layers, page_size, kv_heads, head_dim, chunk_size,
                                   max_pages, max_grad_pages, 1 if summaries else 0, near_kv_slots, near_grad_slots,
                                   window_pages, _lib.MEMORY_HOST)
        else:
            raise NotImplementedError(f"oomb: pages on {device} (the CPU and CUDA devices are supported)")
        handle = ctypes.c_void_p()
        rc = lib.oomb_store_create(ctypes.byref(cfg), ctypes.byref(handle))
        if rc != 0 and self._blocks is not None and self._blocks.failure is not None:
            raise torch.OutOfMemoryError(f"oomb: the pages' device memory: {self._blocks.failure}")
        check(rc)
        self._h = handle
        self.layers, self.page_size, self.kv_heads, self.head_dim = layers, page_size, kv_heads, head_dim
        self.chunk_size, self.dtype, self.has_summaries = chunk_size, dtype, summaries
        self.offload = near_kv_slots > 0
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
        _live_stores[self._h.value] = self

    def _pool_at(self, address: int, shape, dtype: torch.dtype) -> torch.Tensor:
        if self._blocks is not None:
            return self._blocks.tensor(address, shape, dtype)
        return _tensor_at(address, shape, dtype)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the pools now (the tensors above must not be used after)."""
        if getattr(self, "_h", None):
            self.kv_pool = self.grad_pool = self.grad_ids = None
            _live_stores.pop(self._h.value, None)
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

    # -- page-sparse selection --------------------------------------------------------------
    def summarize(self, seq: int, layer: int, first: int, last: int) -> None:
        check(lib.oomb_store_summarize(self._handle(), seq, layer, first, last))

    def select(self, seq: int, layer: int, q: torch.Tensor, q_start: int, *, tile: int, budget: int,
               sink: int, local: int, scoring: str = "quest", tile_first: Optional[torch.Tensor] = None):
        """Per tile of `tile` queries of q ([sq, hq, head_dim]), the past pages it attends: (indptr,
        pages), int32, logical page indices ascending per tile. ``tile_first`` (int32, one per tile;
        packed documents): tile t selects among logical pages from tile_first[t] on, its sink first."""
        q = q.detach().contiguous()
        if q.dtype != self.dtype:
            raise TypeError(f"oomb: select: queries are {q.dtype}, the store holds {self.dtype}")
        sq, hq = q.shape[0], q.shape[1]
        tiles = (sq + tile - 1) // tile
        past = q_start // self.page_size
        cap = max(1, tiles * min(past, budget + sink + local))
        indptr = torch.empty(tiles + 1, dtype=torch.int32)
        pages = torch.empty(cap, dtype=torch.int32)
        code = {"quest": 0, "mean": 1}[scoring]
        if tile_first is not None:
            tile_first = tile_first.to("cpu", torch.int32).contiguous()
            if tile_first.numel() != tiles:
                raise ValueError(f"oomb: select: tile_first has {tile_first.numel()} entries for {tiles} tiles")
        check(lib.oomb_store_select(self._handle(), seq, layer, q.data_ptr(), sq, hq, q_start, tile, budget,
                                    sink, local, code, None if tile_first is None else tile_first.data_ptr(),
                                    indptr.data_ptr(), pages.data_ptr(), cap))
        return indptr, pages[: int(indptr[-1])].clone()

    # -- offload ------------------------------------------------------------------------------
    def kv_written(self, seq: int, layer: int, first: int, last: int) -> None:
        """The homes of logical pages [first, last) of (seq, layer) were written (by write_pages)."""
        check(lib.oomb_store_kv_written(self._handle(), seq, layer, first, last))

    def flush_grads(self) -> None:
        """Writes the gradient pages near slots changed back home and waits (before reading homes)."""
        check(lib.oomb_store_flush_grads(self._handle()))

    def residency_stats(self) -> dict:
        """Per near tier ('kv', 'grad'): bytes moved each way, hits, misses, evictions, write-backs."""
        out = {}
        for which, name in ((0, "kv"), (1, "grad")):
            r = _lib.ResidencyStats()
            check(lib.oomb_store_residency_stats_get(self._handle(), which, ctypes.byref(r)))
            out[name] = {f: getattr(r, f) for f, _ in _lib.ResidencyStats._fields_}
        return out

    @property
    def address(self) -> int:
        """The store's handle as an integer (what oomb::store_attention takes)."""
        return self._handle().value

    # -- accounting -------------------------------------------------------------------------
    def stats(self) -> dict:
        s = _lib.StoreStats()
        check(lib.oomb_store_stats_get(self._handle(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _lib.StoreStats._fields_}
