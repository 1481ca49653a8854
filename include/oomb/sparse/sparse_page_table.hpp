// oomb — the pages each query tile attends, as CSR over tiles, and its POD view for kernels.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/config.hpp"
#include "oomb/core/error.hpp"

OOMB_NAMESPACE_BEGIN

/// Tile t attends logical pages indices[indptr[t] .. indptr[t+1]), ascending. Logical pages index
/// the sequence's page table (page_table_view::page(seq, i) gives the pool id), so a selection
/// made in stage 1 stays valid in stage 2 and for any id space (far pool or near-tier slots).
struct sparse_page_table_view {
  const std::int32_t* indptr = nullptr;   ///< [num_tiles + 1], indptr[0] == 0
  const std::int32_t* indices = nullptr;  ///< [indptr[num_tiles]]
  std::int32_t num_tiles = 0;

  OOMB_HOST_DEVICE std::int32_t num_pages(std::int32_t tile) const noexcept {
    return indptr[tile + 1] - indptr[tile];
  }
  /// The i-th selected logical page of `tile`.
  OOMB_HOST_DEVICE std::int32_t page(std::int32_t tile, std::int32_t i) const noexcept {
    return indices[indptr[tile] + i];
  }
};

static_assert(std::is_trivially_copyable_v<sparse_page_table_view>, "views must be PODs for kernels");

/// Owner of a sparse page table: tiles are appended in order, each a strictly ascending list of
/// non-negative logical page indices. Not thread-safe. A view() is valid until the next append,
/// clear() or destruction.
class sparse_page_table {
 public:
  sparse_page_table() : indptr_{0} {}

  /// Appends the next tile. Throws invalid_argument (table unchanged) unless pages[0..n) are
  /// non-negative and strictly ascending.
  void add_tile(const std::int32_t* pages, std::int32_t n) {
    OOMB_EXPECTS(n >= 0, "sparse_page_table: negative page count ", n, " for tile ", num_tiles());
    for (std::int32_t i = 0; i < n; ++i) {
      OOMB_EXPECTS(pages[i] >= 0, "sparse_page_table: tile ", num_tiles(), " has negative page ",
                   pages[i], " at position ", i);
      OOMB_EXPECTS(i == 0 || pages[i - 1] < pages[i], "sparse_page_table: tile ", num_tiles(),
                   " pages not strictly ascending: ", pages[i - 1], " then ", pages[i],
                   " at position ", i);
    }
    const std::int64_t total = std::int64_t(indices_.size()) + n;
    OOMB_EXPECTS(total <= std::numeric_limits<std::int32_t>::max(), "sparse_page_table: ", total, " entries overflow int32 indptr");
    indptr_.reserve(indptr_.size() + 1);
    indices_.insert(indices_.end(), pages, pages + n);
    indptr_.push_back(static_cast<std::int32_t>(total));
  }
  void add_tile(const std::vector<std::int32_t>& pages) {
    add_tile(pages.data(), static_cast<std::int32_t>(pages.size()));
  }

  /// Drops every tile.
  void clear() noexcept { truncate(0); }

  /// Keeps the first `tiles` tiles (no-op when there are no more than that).
  void truncate(std::int32_t tiles) noexcept {
    if (tiles < 0) tiles = 0;
    if (tiles >= num_tiles()) return;
    indices_.resize(static_cast<std::size_t>(indptr_[static_cast<std::size_t>(tiles)]));
    indptr_.resize(static_cast<std::size_t>(tiles) + 1);
  }

  std::int32_t num_tiles() const noexcept { return static_cast<std::int32_t>(indptr_.size() - 1); }
  /// Selected pages of all tiles together.
  std::int32_t num_entries() const noexcept { return indptr_.back(); }
  const std::vector<std::int32_t>& indptr() const noexcept { return indptr_; }
  const std::vector<std::int32_t>& indices() const noexcept { return indices_; }

  /// Pages of `tile` as [begin, end) pointers; throws invalid_argument for a tile out of range.
  std::pair<const std::int32_t*, const std::int32_t*> tile(std::int32_t t) const {
    OOMB_EXPECTS(t >= 0 && t < num_tiles(), "sparse_page_table: tile ", t, " out of range [0, ",
                 num_tiles(), ")");
    return {indices_.data() + indptr_[static_cast<std::size_t>(t)],
            indices_.data() + indptr_[static_cast<std::size_t>(t) + 1]};
  }

  sparse_page_table_view view() const noexcept {
    sparse_page_table_view v;
    v.indptr = indptr_.data();
    v.indices = indices_.data();
    v.num_tiles = num_tiles();
    return v;
  }

 private:
  std::vector<std::int32_t> indptr_;
  std::vector<std::int32_t> indices_;
};

OOMB_NAMESPACE_END
