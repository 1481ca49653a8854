// oomb — the geometry of one KV page and of a K/V page pair.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "oomb/core/config.hpp"
#include "oomb/core/error.hpp"

OOMB_NAMESPACE_BEGIN

/// Order of a page's elements. Both are described by strides alone, so kernels need no second
/// instance per layout.
enum class kv_layout {
  head_major,   ///< [kv_heads][page_size][head_dim]   (HND)
  token_major,  ///< [page_size][kv_heads][head_dim]   (NHD)
};

/// What one page holds: `page_size` consecutive tokens of one sequence and one layer, all KV heads,
/// for K or for V. A page *pair* (K then V, adjacent) is the unit a pool block holds, so one id
/// names both and one copy moves both.
struct page_shape {
  std::int32_t page_size = 128;  ///< tokens per page: a power of two >= 16
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 128;
  kv_layout layout = kv_layout::head_major;

  /// Elements of one K (or V) page.
  OOMB_HOST_DEVICE constexpr std::int64_t page_elements() const noexcept {
    return std::int64_t(page_size) * kv_heads * head_dim;
  }
  /// Elements of a K/V pair: the distance between consecutive page ids in a pool.
  OOMB_HOST_DEVICE constexpr std::int64_t pair_elements() const noexcept { return 2 * page_elements(); }
  OOMB_HOST_DEVICE constexpr std::int64_t stride_token() const noexcept {
    return layout == kv_layout::head_major ? head_dim : std::int64_t(kv_heads) * head_dim;
  }
  OOMB_HOST_DEVICE constexpr std::int64_t stride_head() const noexcept {
    return layout == kv_layout::head_major ? std::int64_t(page_size) * head_dim : head_dim;
  }

  /// Throws invalid_argument naming the bad value.
  void validate() const {
    OOMB_EXPECTS(page_size >= 16 && (page_size & (page_size - 1)) == 0,
                 "page_size must be a power of two >= 16, got ", page_size);
    OOMB_EXPECTS(kv_heads > 0, "kv_heads must be positive, got ", kv_heads);
    OOMB_EXPECTS(head_dim > 0, "head_dim must be positive, got ", head_dim);
  }

  friend constexpr bool operator==(const page_shape& a, const page_shape& b) noexcept {
    return a.page_size == b.page_size && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim &&
           a.layout == b.layout;
  }
  friend constexpr bool operator!=(const page_shape& a, const page_shape& b) noexcept { return !(a == b); }
};

OOMB_NAMESPACE_END
