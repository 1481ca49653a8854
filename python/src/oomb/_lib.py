# SPDX-License-Identifier: Apache-2.0
"""Loads liboomb_c (the C ABI of csrc/oomb_c.h) and, where it was built, liboomb_cuda (the GPU
path, csrc/oomb_cuda.h) through ctypes and declares their signatures.

Nothing here imports torch: tensors become pointers one level up (oomb.ops, oomb.pages).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

ABI_VERSION = 4
CUDA_ABI_VERSION = 4
DTYPE_F32 = 0
DTYPE_F64 = 1
DTYPE_BF16 = 2
MEMORY_HOST = 0
MEMORY_CALLER = 1

c_i32 = ctypes.c_int32
c_i64 = ctypes.c_int64
c_p = ctypes.c_void_p
p_i32 = ctypes.POINTER(ctypes.c_int32)
p_i64 = ctypes.POINTER(ctypes.c_int64)
#: oomb_allocate_fn / oomb_deallocate_fn (oomb_c.h): the caller's allocator for a CALLER store.
ALLOCATE_FN = ctypes.CFUNCTYPE(c_p, c_p, c_i64, c_i64)
DEALLOCATE_FN = ctypes.CFUNCTYPE(None, c_p, c_p, c_i64)


class StoreConfig(ctypes.Structure):
    _fields_ = [
        ("dtype", c_i32),
        ("layers", c_i32),
        ("page_size", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("chunk_size", c_i32),
        ("max_pages", c_i32),
        ("max_grad_pages", c_i32),
        ("memory", c_i32),
        ("allocate", ALLOCATE_FN),
        ("deallocate", DEALLOCATE_FN),
        ("ctx", c_p),
    ]


class ResidencyStats(ctypes.Structure):
    _fields_ = [
        ("bytes_to_near", c_i64),
        ("bytes_to_far", c_i64),
        ("hits", c_i64),
        ("misses", c_i64),
        ("evictions", c_i64),
        ("write_backs", c_i64),
        ("zero_fills", c_i64),
        ("slots", c_i32),
        ("slot_bytes", c_i64),
    ]


class StoreStats(ctypes.Structure):
    _fields_ = [
        ("kv_in_use", c_i32),
        ("kv_high_water", c_i32),
        ("kv_capacity", c_i32),
        ("grad_in_use", c_i32),
        ("grad_high_water", c_i32),
        ("grad_capacity", c_i32),
        ("pair_bytes", c_i64),
        ("bytes_reserved", c_i64),
        ("bytes_peak", c_i64),
    ]


class AttentionArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_i32),
        ("dtype", c_i32),
        ("q", c_p),
        ("sq", c_i64),
        ("hq", c_i32),
        ("hkv", c_i32),
        ("d", c_i32),
        ("q_start", c_i64),
        ("scale", ctypes.c_double),
        ("kv_own", c_p),
        ("pool", c_p),
        ("pool_pages", c_i64),
        ("page_size", c_i32),
        ("past_ids", c_p),
        ("tile_indptr", c_p),
        ("tile_pages", c_p),
        ("tile", c_i32),
        ("key_lower", c_p),
    ]


class CudaAttentionArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_i32),
        ("device", c_i32),
        ("q", c_p),
        ("sq", c_i64),
        ("hq", c_i32),
        ("hkv", c_i32),
        ("d", c_i32),
        ("q_start", c_i64),
        ("scale", ctypes.c_double),
        ("pool", c_p),
        ("page_size", c_i32),
        ("table", c_p),
        ("pages", c_i32),
        ("tile_indptr", c_p),
        ("tile_pages", c_p),
        ("tile", c_i32),
        ("portable", c_i32),
        ("key_lower", c_p),
        ("deterministic", c_i32),
    ]


class OombError(RuntimeError):
    """A failure reported by the C library (its message names what was asked and what was wrong)."""


def _candidates(stem: str, env: str):
    if os.environ.get(env):
        yield Path(os.environ[env])
    here = Path(__file__).resolve().parent
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        yield here / name


def _find(stem: str, env: str):
    tried = []
    for path in _candidates(stem, env):
        tried.append(str(path))
        if path.is_file():
            return path, tried
    return None, tried


def _load():
    path, tried = _find("oomb_c", "OOMB_C_LIBRARY")
    if path is not None:
        return ctypes.CDLL(str(path))
    raise ImportError(
        "oomb: the compiled part of the package (liboomb_c) was not found; looked at "
        + ", ".join(tried)
        + ". Install the package with `pip install ./python` from a clone of the repository, "
        "or point OOMB_C_LIBRARY at a liboomb_c.so built from python/CMakeLists.txt."
    )


class PagedConfig(ctypes.Structure):
    """oomb_paged_config (oomb_c.h, v4): the CPU's paged session."""
    _fields_ = [
        ("struct_size", c_i32), ("dtype", c_i32),
        ("layers", c_i32), ("hq", c_i32), ("hkv", c_i32), ("head_dim", c_i32),
        ("chunk", c_i32), ("page", c_i32),
        ("max_tokens", c_i64),
        ("offload", c_i32), ("near_pages", c_i32), ("window_pages", c_i32), ("grad_homes", c_i32),
        ("sparse", c_i32), ("budget", c_i32), ("sink", c_i32), ("local", c_i32), ("tile", c_i32),
        ("scoring", c_i32),
    ]


class PagedStats(ctypes.Structure):
    """oomb_paged_stats (oomb_c.h, v4): what a paged session (either library's) holds and moved."""
    _fields_ = [
        ("kv_in_use", c_i32), ("grad_in_use", c_i32),
        ("kv_high_water", c_i32), ("grad_high_water", c_i32),
        ("kv", ResidencyStats), ("grad", ResidencyStats),
        ("exposed_transfer_seconds", ctypes.c_double),
        ("near_bytes", c_i64), ("far_bytes", c_i64),
        ("sparse_pages_selected", c_i64), ("sparse_pages_candidate", c_i64),
    ]


lib = _load()

_signatures = {
    "oomb_abi_version": ([], c_i32),
    "oomb_version": ([], ctypes.c_char_p),
    "oomb_last_error": ([], ctypes.c_char_p),
    "oomb_store_create": ([ctypes.POINTER(StoreConfig), ctypes.POINTER(c_p)], ctypes.c_int),
    "oomb_store_destroy": ([c_p], None),
    "oomb_store_add_sequence": ([c_p, p_i32], ctypes.c_int),
    "oomb_store_append": ([c_p, c_i32, c_i64, p_i64], ctypes.c_int),
    "oomb_store_pop_chunk": ([c_p, c_i32, p_i64], ctypes.c_int),
    "oomb_store_seq_len": ([c_p, c_i32, p_i64], ctypes.c_int),
    "oomb_store_page_ids": ([c_p, c_i32, c_i32, c_i32, c_i32, c_p], ctypes.c_int),
    "oomb_store_kv_pool": ([c_p, ctypes.POINTER(c_p), p_i64], ctypes.c_int),
    "oomb_store_grad_pool": ([c_p, ctypes.POINTER(c_p), p_i64, ctypes.POINTER(p_i32), p_i64], ctypes.c_int),
    "oomb_store_touch_grads": ([c_p, c_p, c_i64], ctypes.c_int),
    "oomb_store_touch_grads_fresh": ([c_p, c_p, c_i64, c_p, p_i64], ctypes.c_int),
    "oomb_store_stats_get": ([c_p, ctypes.POINTER(StoreStats)], ctypes.c_int),
    "oomb_paged_create": ([ctypes.POINTER(PagedConfig), ctypes.POINTER(c_p)], ctypes.c_int),
    "oomb_paged_destroy": ([c_p], None),
    "oomb_paged_begin_step": ([c_p, c_i32, c_p, c_i32], ctypes.c_int),
    "oomb_paged_append": ([c_p, c_i64], ctypes.c_int),
    "oomb_paged_write": ([c_p, c_i32, c_i32, c_i64, c_p, c_p], ctypes.c_int),
    "oomb_paged_select": ([c_p, c_i32, c_i32, c_i64, c_p], ctypes.c_int),
    "oomb_paged_expect_recompute": ([c_p, c_i32], ctypes.c_int),
    "oomb_paged_forward": ([c_p, c_i32, c_i32, c_i64, c_p, c_p, c_p], ctypes.c_int),
    "oomb_paged_backward": ([c_p, c_i32, c_i32, c_i64, c_p, c_p, c_p, c_p, c_p, c_p, c_p], ctypes.c_int),
    "oomb_paged_release_chunk": ([c_p, c_i32], ctypes.c_int),
    "oomb_paged_selection": ([c_p, c_i32, c_i32, c_p, c_i64, c_p, c_i64, p_i64, p_i64], ctypes.c_int),
    "oomb_paged_end_step": ([c_p, ctypes.POINTER(PagedStats)], ctypes.c_int),
    "oomb_attention_forward": ([ctypes.POINTER(AttentionArgs), c_p, c_p], ctypes.c_int),
    "oomb_attention_backward": (
        [ctypes.POINTER(AttentionArgs), c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_i64, c_p, c_i64],
        ctypes.c_int,
    ),
}


def _declare(cdll, signatures) -> None:
    for name, (args, res) in signatures.items():
        f = getattr(cdll, name)
        f.argtypes = args
        f.restype = res


_declare(lib, _signatures)

if lib.oomb_abi_version() != ABI_VERSION:
    raise ImportError(
        f"oomb: liboomb_c speaks C ABI version {lib.oomb_abi_version()}, this Python layer "
        f"version {ABI_VERSION}: reinstall the package (pip install ./python)"
    )


def check(rc: int) -> None:
    """Raises OombError with the library's message when a call failed."""
    if rc != 0:
        raise OombError(lib.oomb_last_error().decode(errors="replace"))


def version() -> str:
    return lib.oomb_version().decode()


class CudaPagedConfig(ctypes.Structure):
    """oomb_cuda_paged_config (oomb_cuda.h, v4)."""
    _fields_ = [
        ("struct_size", c_i32), ("device", c_i32),
        ("layers", c_i32), ("hq", c_i32), ("hkv", c_i32), ("head_dim", c_i32),
        ("chunk", c_i32), ("page", c_i32),
        ("max_tokens", c_i64),
        ("offload", c_i32), ("near_pages", c_i32), ("window_pages", c_i32), ("home_memory", c_i32),
        ("grad_homes", c_i32),
        ("sparse", c_i32), ("budget", c_i32), ("sink", c_i32), ("local", c_i32), ("tile", c_i32),
        ("scoring", c_i32), ("deterministic", c_i32), ("portable", c_i32),
    ]


# ---- the GPU path (liboomb_cuda): loaded on first use, so a CPU-only install never needs it ------

_cuda = None


def cuda_lib():
    """liboomb_cuda, loaded once; a clear ImportError where this install has no GPU path."""
    global _cuda
    if _cuda is not None:
        return _cuda
    path, tried = _find("oomb_cuda", "OOMB_CUDA_LIBRARY")
    if path is None:
        raise ImportError(
            "oomb: this install has no GPU path (liboomb_cuda was not found; looked at " + ", ".join(tried)
            + "). It is built by `pip install ./python` where CMake finds nvcc (CUDA 12.8 or later), or point "
            "OOMB_CUDA_LIBRARY at a liboomb_cuda.so (docs/pytorch.md).")
    cl = ctypes.CDLL(str(path))
    paged = ctypes.POINTER(c_p)
    signatures = {
        "oomb_cuda_abi_version": ([], c_i32),
        "oomb_cuda_last_error": ([], ctypes.c_char_p),
        "oomb_cuda_attention_forward": ([ctypes.POINTER(CudaAttentionArgs), c_p, c_p, c_p], ctypes.c_int),
        "oomb_cuda_attention_backward_workspace": ([ctypes.POINTER(CudaAttentionArgs), p_i64], ctypes.c_int),
        "oomb_cuda_attention_backward": (
            [ctypes.POINTER(CudaAttentionArgs), c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_i64, c_p],
            ctypes.c_int,
        ),
        "oomb_cuda_paged_create": ([ctypes.POINTER(CudaPagedConfig), paged], ctypes.c_int),
        "oomb_cuda_paged_destroy": ([c_p], None),
        "oomb_cuda_paged_begin_step": ([c_p, c_i32, c_p, c_i32], ctypes.c_int),
        "oomb_cuda_paged_append": ([c_p, c_i64], ctypes.c_int),
        "oomb_cuda_paged_write": ([c_p, c_i32, c_i32, c_i64, c_p, c_p, c_p], ctypes.c_int),
        "oomb_cuda_paged_select": ([c_p, c_i32, c_i32, c_i64, c_p, c_p], ctypes.c_int),
        "oomb_cuda_paged_expect_recompute": ([c_p, c_i32], ctypes.c_int),
        "oomb_cuda_paged_forward": ([c_p, c_i32, c_i32, c_i64, c_p, c_p, c_p, c_p], ctypes.c_int),
        "oomb_cuda_paged_backward": ([c_p, c_i32, c_i32, c_i64, c_p, c_p, c_p, c_p, c_p, c_p, c_p, c_p], ctypes.c_int),
        "oomb_cuda_paged_release_chunk": ([c_p, c_i32, c_p], ctypes.c_int),
        "oomb_cuda_paged_selection": ([c_p, c_i32, c_i32, c_p, c_i64, c_p, c_i64, p_i64, p_i64], ctypes.c_int),
        "oomb_cuda_paged_end_step": ([c_p, ctypes.POINTER(PagedStats)], ctypes.c_int),
    }
    _declare(cl, signatures)
    if cl.oomb_cuda_abi_version() != CUDA_ABI_VERSION:
        raise ImportError(f"oomb: liboomb_cuda speaks ABI version {cl.oomb_cuda_abi_version()}, this Python layer "
                          f"version {CUDA_ABI_VERSION}: reinstall the package (pip install ./python)")
    _cuda = cl
    return cl


def has_cuda() -> bool:
    """Whether this install has the GPU path (liboomb_cuda can be found)."""
    return _cuda is not None or _find("oomb_cuda", "OOMB_CUDA_LIBRARY")[0] is not None


def check_cuda(rc: int) -> None:
    if rc != 0:
        raise OombError(cuda_lib().oomb_cuda_last_error().decode(errors="replace"))
