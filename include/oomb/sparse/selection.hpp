// oomb — choosing a query tile's pages: sink + local pages always, plus the top `budget` by score.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "oomb/core/error.hpp"

OOMB_NAMESPACE_BEGIN

/// How many past pages a query tile attends: the first `sink` pages and the `local` most recent
/// ones always, plus the `budget` best-scoring pages among the rest (on top of sink and local).
struct selection_config {
  std::int32_t budget = 0;
  std::int32_t sink = 0;
  std::int32_t local = 0;

  /// Throws invalid_argument naming the negative value.
  void validate() const {
    OOMB_EXPECTS(budget >= 0, "selection: budget must not be negative, got ", budget);
    OOMB_EXPECTS(sink >= 0, "selection: sink must not be negative, got ", sink);
    OOMB_EXPECTS(local >= 0, "selection: local must not be negative, got ", local);
  }
  /// Most pages one tile can select.
  std::int64_t max_pages() const noexcept { return std::int64_t(budget) + sink + local; }
};

/// Selects among a tile's `num_past` candidate pages (logical pages [0, num_past): the past,
/// strictly before the tile's causal boundary). The result, written to `out` (replaced):
///  - every page when num_past <= budget + sink + local;
///  - otherwise pages [0, sink), [num_past - local, num_past), and the `budget` pages of
///    [sink, num_past - local) with the highest scores[i]; equal scores go to the lower index,
///    and a NaN score ranks below every number (-infinity included).
/// Always sorted by page index, without duplicates, of size min(num_past, budget + sink + local).
/// `scores` has num_past entries; those of sink and local pages are never read (they may be
/// left unscored). O(num_past + budget log budget). Not thread-safe (keeps scratch); one per thread.
class page_selector {
 public:
  explicit page_selector(const selection_config& config) : config_(config) { config.validate(); }

  void select(const float* scores, std::int32_t num_past, std::vector<std::int32_t>& out) {
    OOMB_EXPECTS(num_past >= 0, "selection: num_past must not be negative, got ", num_past);
    out.clear();
    if (num_past <= config_.max_pages()) {
      out.resize(static_cast<std::size_t>(num_past));
      for (std::int32_t i = 0; i < num_past; ++i) out[static_cast<std::size_t>(i)] = i;
      return;
    }
    // Here num_past > budget + sink + local, so sink < num_past - local and the middle has more
    // than `budget` pages.
    const std::int32_t mid_begin = config_.sink, mid_end = num_past - config_.local;
    out.reserve(static_cast<std::size_t>(config_.max_pages()));
    for (std::int32_t i = 0; i < mid_begin; ++i) out.push_back(i);
    if (config_.budget > 0) {
      // One integer per candidate orders them exactly as documented (higher score, then lower
      // index), so nth_element compares plain integers: no NaN special cases in the comparator.
      keys_.resize(static_cast<std::size_t>(mid_end - mid_begin));
      for (std::int32_t i = mid_begin; i < mid_end; ++i)
        keys_[static_cast<std::size_t>(i - mid_begin)] = rank_key(scores[i], i);
      const auto top = keys_.begin() + config_.budget;
      std::nth_element(keys_.begin(), top - 1, keys_.end(), std::greater<std::uint64_t>());
      const std::size_t first = out.size();
      for (auto it = keys_.begin(); it != top; ++it)
        out.push_back(static_cast<std::int32_t>(~static_cast<std::uint32_t>(*it)));
      std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    }
    for (std::int32_t i = mid_end; i < num_past; ++i) out.push_back(i);
  }

  const selection_config& config() const noexcept { return config_; }

  /// The order select() ranks by, as one integer (larger is better): the score mapped to an
  /// order-preserving uint32 (NaN lowest, -0 == +0) in the high half, ~index in the low half.
  static std::uint64_t rank_key(float score, std::int32_t index) noexcept {
    score += 0.0f;  // -0 + 0 == +0: -0 ties with +0
    std::uint32_t bits;
    std::memcpy(&bits, &score, sizeof bits);
    // Negative: flip all bits; positive: set the sign bit. Branch-free (random signs would
    // mispredict). -inf maps to 0x007fffff, above 0, which NaN takes.
    const std::uint32_t flip = static_cast<std::uint32_t>(-static_cast<std::int32_t>(bits >> 31)) | 0x80000000u;
    const std::uint32_t order = std::isnan(score) ? 0u : bits ^ flip;
    return (std::uint64_t(order) << 32) | std::uint64_t(~static_cast<std::uint32_t>(index));
  }

 private:
  selection_config config_;
  std::vector<std::uint64_t> keys_;
};

/// One-shot form of page_selector::select.
inline std::vector<std::int32_t> select_pages(const float* scores, std::int32_t num_past,
                                              const selection_config& config) {
  std::vector<std::int32_t> out;
  page_selector(config).select(scores, num_past, out);
  return out;
}

OOMB_NAMESPACE_END
