// oomb — how a pool of page pairs is laid out: its capacity and whether it is one range or slabs.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "oomb/core/error.hpp"
#include "oomb/memory/block_pool.hpp"

OOMB_NAMESPACE_BEGIN

/// contiguous: one range, allocated up front, that kernels index as base + id * pair bytes (what
/// view() needs). growing: slabs taken on demand (host tiers, copy engines only).
enum class pool_mode { contiguous, growing };

/// Capacity and layout of a pool whose blocks are K/V page pairs.
struct page_pool_config {
  std::int32_t max_pages = 1024;       ///< most page pairs the pool holds (all layers together)
  pool_mode mode = pool_mode::contiguous;
  std::int32_t pages_per_slab = 256;   ///< growing mode only
  std::size_t alignment = 256;         ///< of the range / each slab

  void validate(const char* who) const {
    OOMB_EXPECTS(max_pages > 0, who, ": max_pages must be positive, got ", max_pages);
    OOMB_EXPECTS(mode == pool_mode::contiguous || pages_per_slab > 0, who,
                 ": pages_per_slab must be positive, got ", pages_per_slab);
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0, who,
                 ": alignment must be a power of two, got ", alignment);
  }
};

namespace detail {
template <class Resource>
block_pool<Resource> make_page_pool(Resource& resource, std::size_t pair_bytes, const page_pool_config& c) {
  return c.mode == pool_mode::contiguous
             ? block_pool<Resource>::contiguous(resource, pair_bytes, c.max_pages, c.alignment)
             : block_pool<Resource>::growing(resource, pair_bytes, c.pages_per_slab, c.max_pages,
                                             c.alignment);
}
}  // namespace detail

OOMB_NAMESPACE_END
