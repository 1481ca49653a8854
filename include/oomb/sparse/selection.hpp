// oomb — choosing a query tile's pages: sink + local pages always, plus the top `budget` by score.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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
      scratch_.resize(static_cast<std::size_t>(mid_end - mid_begin));
      for (std::int32_t i = mid_begin; i < mid_end; ++i) scratch_[static_cast<std::size_t>(i - mid_begin)] = i;
      const auto key = [scores](std::int32_t i) {
        const float s = scores[i];
        return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
      };
      // A strict total order: higher key first, then lower index. NaN shares -inf's key, so
      // the order stays a strict weak ordering.
      const auto better = [&](std::int32_t a, std::int32_t b) {
        const float ka = key(a), kb = key(b);
        if (ka != kb) return ka > kb;
        if (std::isnan(scores[a]) != std::isnan(scores[b])) return !std::isnan(scores[a]);
        return a < b;
      };
      const auto top = scratch_.begin() + config_.budget;
      std::nth_element(scratch_.begin(), top - 1, scratch_.end(), better);
      std::sort(scratch_.begin(), top);
      out.insert(out.end(), scratch_.begin(), top);
    }
    for (std::int32_t i = mid_end; i < num_past; ++i) out.push_back(i);
  }

  const selection_config& config() const noexcept { return config_; }

 private:
  selection_config config_;
  std::vector<std::int32_t> scratch_;
};

/// One-shot form of page_selector::select.
inline std::vector<std::int32_t> select_pages(const float* scores, std::int32_t num_past,
                                              const selection_config& config) {
  std::vector<std::int32_t> out;
  page_selector(config).select(scores, num_past, out);
  return out;
}

OOMB_NAMESPACE_END
