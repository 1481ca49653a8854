// oomb — the POD view kernels read per-page key summaries through.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <type_traits>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN

/// Per-page key summaries indexed by page id (the pool's id space), for every KV head:
/// per-channel minimum, maximum and mean of K over the tokens the page holds so far.
/// Each array is [num_ids][kv_heads][head_dim] floats; `tokens[id]` is how many tokens the summary
/// of page `id` covers (0: empty, its min/max/mean are meaningless and scorers give it -infinity).
/// Trivially copyable: pass it to kernels by value. It never owns memory.
struct page_summary_view {
  const float* min = nullptr;
  const float* max = nullptr;
  const float* mean = nullptr;
  const std::int32_t* tokens = nullptr;
  std::int32_t num_ids = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;

  /// Elements from the start of each array to (page id, kv head, channel 0); 64-bit.
  OOMB_HOST_DEVICE std::int64_t offset(std::int32_t id, std::int32_t head) const noexcept {
    return (std::int64_t(id) * kv_heads + head) * head_dim;
  }
  /// First of head_dim channel minima of page `id`, KV head `head`.
  OOMB_HOST_DEVICE const float* min_of(std::int32_t id, std::int32_t head) const noexcept {
    return min + offset(id, head);
  }
  /// First of head_dim channel maxima of page `id`, KV head `head`.
  OOMB_HOST_DEVICE const float* max_of(std::int32_t id, std::int32_t head) const noexcept {
    return max + offset(id, head);
  }
  /// First of head_dim channel means of page `id`, KV head `head`.
  OOMB_HOST_DEVICE const float* mean_of(std::int32_t id, std::int32_t head) const noexcept {
    return mean + offset(id, head);
  }
  /// Tokens summarised for page `id`.
  OOMB_HOST_DEVICE std::int32_t token_count(std::int32_t id) const noexcept { return tokens[id]; }
};

static_assert(std::is_trivially_copyable_v<page_summary_view>, "views must be PODs for kernels");

OOMB_NAMESPACE_END
