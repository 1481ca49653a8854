// oomb — what the page kernels share: a chunk's tokens and the list naming its pages, and
// the checks every such kernel makes of them and of the page pool it addresses.
// SPDX-License-Identifier: Apache-2.0
//
// A chunk starts at a page boundary (the chunk size is a multiple of the page size), so its token
// t lives in entry t / page_size of its page list, at row t % page_size of that page; the last
// page is partial when the chunk's length is not a multiple of the page size. The list lives on
// the device (an upload_ring table, say): its entries cannot be checked on the host, so a kernel
// skips a page whose entry is out of range and records that page's index in a device int32 the
// caller sets to -1 first (as the embedding reports a bad token).
#pragma once

#include <cstdint>

#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/common.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention {

using stream_view = cuda_stream_view;

namespace detail {

/// The checks of a chunk of n tokens [n][heads][d] over the pages of `pool`, whose elements are
/// accessed `vector` at a time (16 bytes): sizes, the pool's shape and alignment.
template <class E>
void check_chunk(const char* what, std::int64_t n, std::int32_t heads, std::int32_t d, int vector,
                 const std::int32_t* page_list, const page_pool_view<E>& pool, const std::int32_t* bad_page) {
  OOMB_EXPECTS(n > 0 && heads > 0 && d > 0, what, ": n, heads and head_dim must be positive, got ", n, ", ", heads, ", ", d);
  OOMB_EXPECTS(n < (std::int64_t(1) << 40), what, ": too many tokens: ", n);
  OOMB_EXPECTS(page_list != nullptr && bad_page != nullptr && pool.base != nullptr, what, ": null pointer");
  OOMB_EXPECTS(pool.page_size >= 16 && (pool.page_size & (pool.page_size - 1)) == 0, what,
               ": page_size must be a power of two >= 16, got ", pool.page_size);
  OOMB_EXPECTS(pool.kv_heads == heads && pool.head_dim == d, what, ": the pool's pages hold ", pool.kv_heads,
               " heads of dimension ", pool.head_dim, ", the chunk ", heads, " of dimension ", d);
  OOMB_EXPECTS(aligned16(pool.base) && pool.pair_stride % vector == 0 && pool.v_offset % vector == 0 &&
                   pool.stride_token % vector == 0 && pool.stride_head % vector == 0,
               what, ": the pool must be 16-byte aligned with strides that are multiples of ", vector,
               " elements, got pair_stride ", pool.pair_stride, ", v_offset ", pool.v_offset, ", stride_token ",
               pool.stride_token, ", stride_head ", pool.stride_head);
}

/// Records `page` as the first bad page list entry seen (the caller set *bad_page to -1).
__device__ __forceinline__ void report_bad_page(std::int32_t* bad_page, std::int64_t page) {
  atomicCAS(bad_page, -1, static_cast<std::int32_t>(page));
}

}  // namespace detail

/// Entries of the page list of a chunk of n tokens: ceil(n / page_size).
inline std::int64_t chunk_page_count(std::int64_t n, std::int32_t page_size) { return (n + page_size - 1) / page_size; }

}  // namespace attention
OOMB_NAMESPACE_END
