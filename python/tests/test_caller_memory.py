# SPDX-License-Identifier: Apache-2.0
"""A store in the caller's memory (OOMB_MEMORY_CALLER, what the GPU path runs on), exercised on the
CPU: its pools are blocks of the caller's allocator (here torch CPU tensors through the same
callbacks the GPU path gives torch's CUDA allocator), fresh gradient pages are reported for the
caller to zero and never twice, the host-only parts are refused, every block goes back at destroy."""
import ctypes

import pytest
import torch

from oomb import _lib
from oomb._lib import OombError, check, lib
from oomb.pages import _TorchBlocks

LAYERS, PAGE, HKV, D, CHUNK, PAGES = 2, 16, 2, 8, 32, 12


def caller_store(blocks, dtype=_lib.DTYPE_BF16):
    cfg = _lib.StoreConfig(dtype, LAYERS, PAGE, HKV, D, CHUNK, PAGES, PAGES,
                           _lib.MEMORY_CALLER, blocks.allocate, blocks.deallocate, None)
    handle = ctypes.c_void_p()
    check(lib.oomb_store_create(ctypes.byref(cfg), ctypes.byref(handle)))
    return handle


def test_pools_are_the_callers_blocks_and_go_back():
    blocks = _TorchBlocks(torch.device("cpu"))
    h = caller_store(blocks)
    try:
        assert len(blocks.blocks) == 2  # the K/V pool and the gradient pool, one block each
        base, cap = ctypes.c_void_p(), ctypes.c_int64()
        check(lib.oomb_store_kv_pool(h, ctypes.byref(base), ctypes.byref(cap)))
        kv = blocks.tensor(base.value, (cap.value, 2, PAGE, HKV, D), torch.bfloat16)
        assert cap.value == PAGES and kv.data_ptr() == base.value and kv.data_ptr() % 256 == 0
        gbase, gcap, ids, nids = ctypes.c_void_p(), ctypes.c_int64(), _lib.p_i32(), ctypes.c_int64()
        check(lib.oomb_store_grad_pool(h, ctypes.byref(gbase), ctypes.byref(gcap), ctypes.byref(ids), ctypes.byref(nids)))
        grads = blocks.tensor(gbase.value, (gcap.value, 2, PAGE, HKV, D), torch.float32)
        assert grads.data_ptr() == gbase.value and nids.value == PAGES
        stats = _lib.StoreStats()
        check(lib.oomb_store_stats_get(h, ctypes.byref(stats)))
        pair = 2 * PAGE * HKV * D
        assert stats.bytes_reserved == PAGES * pair * (2 + 4)  # counted like the host pools
        # Two chunks of a sequence; their page ids name pages of the caller's pool.
        seq = ctypes.c_int32()
        check(lib.oomb_store_add_sequence(h, ctypes.byref(seq)))
        first = ctypes.c_int64()
        for _ in range(2):
            check(lib.oomb_store_append(h, seq.value, CHUNK, ctypes.byref(first)))
        page_ids = torch.empty(4, dtype=torch.int32)
        check(lib.oomb_store_page_ids(h, seq.value, 1, 0, 4, page_ids.data_ptr()))
        assert len(set(page_ids.tolist())) == 4 and all(0 <= i < PAGES for i in page_ids.tolist())
        # Fresh gradient pages are reported once, for the caller to zero; the table names them.
        table = torch.frombuffer((ctypes.c_int32 * nids.value).from_address(ctypes.cast(ids, ctypes.c_void_p).value),
                                 dtype=torch.int32)
        want = page_ids[:3].clone()
        fresh, count = torch.empty(3, dtype=torch.int32), ctypes.c_int64()
        check(lib.oomb_store_touch_grads_fresh(h, want.data_ptr(), 3, fresh.data_ptr(), ctypes.byref(count)))
        assert count.value == 3 and sorted(fresh.tolist()) == sorted(table[want.long()].tolist())
        again = torch.cat([want[1:], page_ids[3:]])  # two touched, one new
        check(lib.oomb_store_touch_grads_fresh(h, again.data_ptr(), 3, fresh.data_ptr(), ctypes.byref(count)))
        assert count.value == 1 and fresh[0] == table[page_ids[3].long()]
        # What reads or writes the pages on the host is refused by name.
        with pytest.raises(OombError, match="the caller's memory"):
            check(lib.oomb_store_touch_grads(h, want.data_ptr(), 1))
        popped = ctypes.c_int64()
        check(lib.oomb_store_pop_chunk(h, seq.value, ctypes.byref(popped)))
        assert popped.value == CHUNK
    finally:
        lib.oomb_store_destroy(h)
    assert blocks.blocks == {}  # every block went back to the caller


def test_a_caller_store_refuses_what_it_cannot_do():
    blocks = _TorchBlocks(torch.device("cpu"))
    with pytest.raises(OombError, match="holds bf16 pages"):
        caller_store(blocks, dtype=_lib.DTYPE_F32)
    assert blocks.blocks == {}


def test_an_allocator_without_memory_is_out_of_memory():
    blocks = _TorchBlocks(torch.device("cpu"))
    blocks.allocate = _lib.ALLOCATE_FN(lambda ctx, nbytes, alignment: None)  # NULL: no memory
    with pytest.raises(OombError, match="has no .* bytes"):
        caller_store(blocks)
