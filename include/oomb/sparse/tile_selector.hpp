// oomb — page selection for every query tile of a chunk: score, select, export as CSR.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/sparse/page_summary_view.hpp"
#include "oomb/sparse/scoring.hpp"
#include "oomb/sparse/selection.hpp"
#include "oomb/sparse/sparse_page_table.hpp"

OOMB_NAMESPACE_BEGIN

/// Middle pages the GPU's select_tiles() (oomb/cuda/tile_selection.cuh) scores per pass unless its
/// plan says otherwise: one slice's gathered summaries are 2,048 x bytes_per_id (Qwen2.5-7B,
/// Quest: 8.4 MB, 256K tokens of 128-token pages), its keys 16 B per (tile, page); past that, the
/// device memory of selection stays flat, and each further slice costs a pass (docs/sparse.md).
inline constexpr std::int32_t default_selection_slice_pages = 2048;

/// What a tile_selector does: tiles of `tile_queries` consecutive queries, each scoring pages by
/// `kind` and keeping `pages` (budget + sink + local).
struct tile_selection_config {
  std::int32_t tile_queries = 128;
  score_kind kind = score_kind::quest;
  selection_config pages{};

  /// Throws invalid_argument naming the bad value.
  void validate() const {
    OOMB_EXPECTS(tile_queries > 0, "tile_selection: tile_queries must be positive, got ", tile_queries);
    pages.validate();
  }
};

/// Runs scoring and selection for all tiles of a block of queries (typically one chunk of one
/// layer in stage 1) and appends one CSR row per tile to a sparse_page_table, to be reused in
/// stage 2 and by prefetch. Only pages that compete for the budget are scored: sink and local
/// pages are kept without scoring, and a tile with at most budget + sink + local past pages keeps
/// them all without scoring anything. Not thread-safe (keeps scratch); one per thread.
class tile_selector {
 public:
  tile_selector(const tile_selection_config& config, std::int32_t q_heads, std::int32_t kv_heads,
                std::int32_t head_dim)
      : config_((config.validate(), config)),
        scorer_(config.kind, q_heads, kv_heads, head_dim),
        selector_(config.pages) {}

  /// Tiles of `queries` ([n][q_heads][head_dim], n >= 1; tile t holds queries
  /// [t * tile_queries, min(n, (t + 1) * tile_queries))) all share the causal past boundary
  /// `past_pages`: candidates are logical pages [0, past_pages) (typically the first page of the
  /// chunk the queries belong to; pages from there on are the chunk's own, attended causally and
  /// densely). `page_ids[i]` is the pool id of logical page i, for i < past_pages (the
  /// sequence's row of its page table), which indexes `summaries`.
  /// On error nothing is appended to `out`.
  template <class E>
  void select(const page_summary_view& summaries, const tensor_view<E, 3>& queries,
              const std::int32_t* page_ids, std::int32_t past_pages, sparse_page_table& out) {
    OOMB_EXPECTS(past_pages >= 0, "tile_selector: past_pages must not be negative, got ", past_pages);
    run(summaries, queries, page_ids, [past_pages](std::int32_t) { return candidates{0, past_pages}; }, out);
  }

  /// As above with a boundary per tile: tile t's candidates are logical pages
  /// [0, tile_past_pages[t]); tile_past_pages has num_tiles(queries.extent(0)) entries.
  template <class E>
  void select(const page_summary_view& summaries, const tensor_view<E, 3>& queries,
              const std::int32_t* page_ids, const std::int32_t* tile_past_pages,
              sparse_page_table& out) {
    run(summaries, queries, page_ids, [tile_past_pages](std::int32_t t) { return candidates{0, tile_past_pages[t]}; },
        out);
  }

  /// As the first, per document (packed sequences): tile t's candidates are logical pages
  /// [tile_first_pages[t], past_pages), from the page holding the start of its first query's
  /// document (none when that is at or past past_pages). Sink pages count from there; pages wholly
  /// in earlier documents are neither scored nor kept. A page holding the end of one document and
  /// the start of the next is a candidate, scored by its summary of both; a tile whose queries span
  /// documents selects for its first query's (the attention's per-query bound masks the rest).
  /// tile_first_pages has num_tiles(queries.extent(0)) entries.
  template <class E>
  void select(const page_summary_view& summaries, const tensor_view<E, 3>& queries,
              const std::int32_t* page_ids, std::int32_t past_pages, const std::int32_t* tile_first_pages,
              sparse_page_table& out) {
    OOMB_EXPECTS(past_pages >= 0, "tile_selector: past_pages must not be negative, got ", past_pages);
    run(summaries, queries, page_ids,
        [past_pages, tile_first_pages](std::int32_t t) {
          OOMB_EXPECTS(tile_first_pages[t] >= 0, "tile_selector: tile ", t, " has a negative first page ",
                       tile_first_pages[t]);
          return candidates{std::min(tile_first_pages[t], past_pages), past_pages};
        },
        out);
  }

  /// Tiles a block of n queries makes: ceil(n / tile_queries).
  std::int32_t num_tiles(std::int64_t n) const noexcept {
    return static_cast<std::int32_t>((n + config_.tile_queries - 1) / config_.tile_queries);
  }

  const tile_selection_config& config() const noexcept { return config_; }
  const tile_scorer& scorer() const noexcept { return scorer_; }

 private:
  /// A tile's candidate pages: logical pages [first, past).
  struct candidates {
    std::int32_t first, past;
  };

  template <class E, class CandidatesOf>
  void run(const page_summary_view& summaries, const tensor_view<E, 3>& queries,
           const std::int32_t* page_ids, CandidatesOf candidates_of, sparse_page_table& out) {
    const std::int64_t n = queries.extent(0);
    OOMB_EXPECTS(host_accessible(queries.kind()), "tile_selector: queries are in ",
                 to_string(queries.kind()), " memory, which the host cannot read (copy them to host "
                 "or pinned memory first)");
    OOMB_EXPECTS(n > 0, "tile_selector: no queries to select pages for (", n, ")");
    // Checked up front, not only when a tile needs scoring, so a mismatch shows on the first call.
    OOMB_EXPECTS(queries.extent(1) == scorer_.q_heads() && queries.extent(2) == scorer_.head_dim(),
                 "tile_selector: queries have ", queries.extent(1), " heads of head_dim ",
                 queries.extent(2), ", the selector expects ", scorer_.q_heads(), " of ",
                 scorer_.head_dim());
    OOMB_EXPECTS(summaries.kv_heads == scorer_.kv_heads() && summaries.head_dim == scorer_.head_dim(),
                 "tile_selector: summaries have ", summaries.kv_heads, " KV heads of head_dim ",
                 summaries.head_dim, ", the selector ", scorer_.kv_heads(), " of ", scorer_.head_dim());
    const std::int32_t tiles = num_tiles(n);
    const std::int32_t first_tile = out.num_tiles();
    const selection_config& pc = config_.pages;
    try {
      for (std::int32_t t = 0; t < tiles; ++t) {
        const auto [first, past] = candidates_of(t);
        OOMB_EXPECTS(past >= 0, "tile_selector: tile ", t, " has a negative past boundary ", past);
        const std::int32_t count = past - first;
        if (count > pc.max_pages()) {
          const std::int64_t q0 = std::int64_t(t) * config_.tile_queries;
          const std::int64_t q1 = std::min<std::int64_t>(n, q0 + config_.tile_queries);
          const auto& st = queries.strides();
          const tensor_view<E, 3> tile(queries.data() + q0 * st[0],
                                       {q1 - q0, queries.extent(1), queries.extent(2)}, st,
                                       queries.kind());
          scorer_.load(tile);
          scores_.resize(static_cast<std::size_t>(past));
          const std::int32_t mid_begin = first + pc.sink, mid_end = past - pc.local;
          scorer_.score(summaries, page_ids + mid_begin, mid_end - mid_begin, scores_.data() + mid_begin);
        }
        // The selector counts candidates from 0 (its scores are read only when it scores).
        selector_.select(count > pc.max_pages() ? scores_.data() + first : nullptr, count, chosen_);
        for (auto& pg : chosen_) pg += first;
        out.add_tile(chosen_);
      }
    } catch (...) {
      out.truncate(first_tile);
      throw;
    }
  }

  tile_selection_config config_;
  tile_scorer scorer_;
  page_selector selector_;
  std::vector<float> scores_;
  std::vector<std::int32_t> chosen_;
};

OOMB_NAMESPACE_END
