// oomb — the POD views kernels (and the CPU reference) read pages through.
// SPDX-License-Identifier: Apache-2.0
//
// Every view here is trivially copyable, passed to kernels by value, and has __host__ __device__
// accessors. The same struct over host vectors feeds the CPU reference, so tests build one over
// host memory and compare. Views never own memory.
#pragma once

#include <cstdint>
#include <type_traits>

#include "oomb/core/config.hpp"
#include "oomb/paging/page_shape.hpp"

OOMB_NAMESPACE_BEGIN

/// Addresses pages of one pool: the K page of id `p` starts at `base + p * pair_stride`, its V page
/// `v_offset` elements later. E is the element type (bf16 / float / double for K/V; the gradient
/// pool has its own E).
template <class E>
struct page_pool_view {
  E* base = nullptr;
  std::int64_t pair_stride = 0;   ///< elements between consecutive ids
  std::int64_t v_offset = 0;      ///< elements from a pair's K page to its V page
  std::int64_t stride_token = 0;  ///< elements between tokens inside a page
  std::int64_t stride_head = 0;   ///< elements between heads inside a page
  std::int32_t page_size = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;

  /// A view of a contiguous pool whose blocks are K/V pairs of `shape`.
  OOMB_HOST_DEVICE static page_pool_view over(E* base, const page_shape& shape) noexcept {
    page_pool_view v;
    v.base = base;
    v.pair_stride = shape.pair_elements();
    v.v_offset = shape.page_elements();
    v.stride_token = shape.stride_token();
    v.stride_head = shape.stride_head();
    v.page_size = shape.page_size;
    v.kv_heads = shape.kv_heads;
    v.head_dim = shape.head_dim;
    return v;
  }

  /// Elements from `base` to (page id, token, head, dim 0) of the K page.
  OOMB_HOST_DEVICE std::int64_t offset(std::int32_t id, std::int32_t token, std::int32_t head) const noexcept {
    return std::int64_t(id) * pair_stride + std::int64_t(token) * stride_token +
           std::int64_t(head) * stride_head;
  }
  /// First of head_dim contiguous elements of K for (page id, token in page, kv head).
  OOMB_HOST_DEVICE E* k(std::int32_t id, std::int32_t token, std::int32_t head) const noexcept {
    return base + offset(id, token, head);
  }
  /// First of head_dim contiguous elements of V for (page id, token in page, kv head).
  OOMB_HOST_DEVICE E* v(std::int32_t id, std::int32_t token, std::int32_t head) const noexcept {
    return base + offset(id, token, head) + v_offset;
  }
};

/// One layer's page table in CSR form: sequence s owns `indices[indptr[s] .. indptr[s+1])` (ids in
/// whatever id space the holder uses: far pool ids, or near-tier slots), and its last page holds
/// `last_page_len[s]` tokens (1..page_size; any value when the sequence has no page).
struct page_table_view {
  const std::int32_t* indptr = nullptr;         ///< [num_seqs + 1]
  const std::int32_t* indices = nullptr;        ///< [indptr[num_seqs]]
  const std::int32_t* last_page_len = nullptr;  ///< [num_seqs]
  std::int32_t num_seqs = 0;
  std::int32_t page_size = 0;

  OOMB_HOST_DEVICE std::int32_t num_pages(std::int32_t seq) const noexcept {
    return indptr[seq + 1] - indptr[seq];
  }
  OOMB_HOST_DEVICE std::int64_t seq_len(std::int32_t seq) const noexcept {
    const std::int32_t n = num_pages(seq);
    return n == 0 ? 0 : std::int64_t(n - 1) * page_size + last_page_len[seq];
  }
  /// Tokens held by logical page `i` of sequence `seq`.
  OOMB_HOST_DEVICE std::int32_t page_len(std::int32_t seq, std::int32_t i) const noexcept {
    return i + 1 == num_pages(seq) ? last_page_len[seq] : page_size;
  }
  /// Id of logical page `i` of sequence `seq`.
  OOMB_HOST_DEVICE std::int32_t page(std::int32_t seq, std::int32_t i) const noexcept {
    return indices[indptr[seq] + i];
  }
};

/// K/V of one layer: the table that names pages and the pool that holds them.
template <class E>
struct paged_kv_view {
  page_pool_view<E> pool;
  page_table_view table;

  /// K of sequence `seq` at token position `pos` (from the sequence's start), head `head`.
  OOMB_HOST_DEVICE E* k_at(std::int32_t seq, std::int64_t pos, std::int32_t head) const noexcept {
    const auto i = static_cast<std::int32_t>(pos / table.page_size);
    return pool.k(table.page(seq, i), static_cast<std::int32_t>(pos % table.page_size), head);
  }
  OOMB_HOST_DEVICE E* v_at(std::int32_t seq, std::int64_t pos, std::int32_t head) const noexcept {
    const auto i = static_cast<std::int32_t>(pos / table.page_size);
    return pool.v(table.page(seq, i), static_cast<std::int32_t>(pos % table.page_size), head);
  }
};

/// The gradient pages of one attention window: `grad_page[j]` names the gradient pair in `pool`
/// of the page the window's table lists at entry j, -1 for entries that get none (the chunk's own
/// pages, pages the window does not read). Parallel to the table, so its size is the window's,
/// whatever the id space of the pages.
template <class G>
struct window_grad_view {
  page_pool_view<G> pool;
  const std::int32_t* grad_page = nullptr;  ///< [pages]
  std::int32_t pages = 0;                   ///< entries of grad_page: the window table's pages

  OOMB_HOST_DEVICE G* dk(std::int32_t entry, std::int32_t token, std::int32_t head) const noexcept {
    return pool.k(grad_page[entry], token, head);
  }
  OOMB_HOST_DEVICE G* dv(std::int32_t entry, std::int32_t token, std::int32_t head) const noexcept {
    return pool.v(grad_page[entry], token, head);
  }
};

/// Gradient pages that mirror KV pages: `grad_id[kv_id]` names the gradient pair of KV page
/// `kv_id` in `pool` (-1 while the KV page has no gradient yet). G is independent of the KV
/// element type (fp32 for bf16 KV by default).
template <class G>
struct grad_mirror_view {
  page_pool_view<G> pool;
  const std::int32_t* grad_id = nullptr;  ///< indexed by KV page id
  std::int32_t num_kv_ids = 0;            ///< length of grad_id

  OOMB_HOST_DEVICE G* dk(std::int32_t kv_id, std::int32_t token, std::int32_t head) const noexcept {
    return pool.k(grad_id[kv_id], token, head);
  }
  OOMB_HOST_DEVICE G* dv(std::int32_t kv_id, std::int32_t token, std::int32_t head) const noexcept {
    return pool.v(grad_id[kv_id], token, head);
  }
};

static_assert(std::is_trivially_copyable_v<page_pool_view<float>>);
static_assert(std::is_trivially_copyable_v<window_grad_view<float>>);
static_assert(std::is_trivially_copyable_v<page_table_view>);
static_assert(std::is_trivially_copyable_v<paged_kv_view<float>>);
static_assert(std::is_trivially_copyable_v<grad_mirror_view<float>>);

OOMB_NAMESPACE_END
