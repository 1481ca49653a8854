// oomb — page selection for every query tile of a chunk on the GPU: summarise, score, top-k, CSR.
// SPDX-License-Identifier: Apache-2.0
//
// The device counterpart of tile_selector (oomb/sparse/tile_selector.hpp), with one difference in
// scoring: a tile is first reduced to a summary of its queries, per KV head and channel, over the
// tile's queries and the KV head's GQA group, and pages are scored against that summary, so
// scoring costs O(tiles x pages), not O(queries x pages):
//  - quest: the box [qlo_d, qhi_d] (channel min / max of the queries); a page scores
//    sum_d max(qlo_d lo_d, qlo_d hi_d, qhi_d lo_d, qhi_d hi_d), an upper bound of every query's
//    Quest bound (so of every q·k): at least tile_scorer's score, equal to it for a one-query tile
//    without GQA;
//  - mean:  the tile's mean query q̄; a page scores q̄ · mean (the mean over the tile of the
//    per-query mean-key scores), exactly tile_scorer's score of q̄ loaded as a one-query tile.
// The score of a page is the maximum over KV heads. Selection is page_selector's, bit for bit:
// sink and local pages always, the `budget` best of the middle by the same ranking key (higher
// score, then lower page index; NaN lowest), sorted by index.
//
// Candidates are tile_selector's: logical pages [0, past) for every tile, or per document (packed
// sequences) [first_t, past) for tile t, from a device array of first pages: its sink pages from
// first_t, its local pages up to past - 1, the budget over the middle, every candidate when there
// are at most budget + sink + local. Pages below first_t never enter tile t's top-k (a page that
// no tile of a scoring block has among its candidates is not read); rows then differ in length,
// each starting after the rows before it.
//
// The past is scored in slices of at most plan.slice_pages pages with a running top-k: each slice's
// summaries are gathered from the caller's store (which may be a far-tier home in mapped pinned
// memory, read once over the bus) into a compact store in the workspace, scored, and sorted
// together with the best `budget` keys so far; the best of the last slice are then sorted by page
// index. So the workspace is fixed by the slice, not by the context, and the device memory of
// selection stays flat as the past grows.
//
// Everything is stream-ordered on one cuda_stream_view: no host synchronisation, no allocation.
// plan_tile_selection() sizes the workspace for the largest call up front; select_tiles() only
// launches kernels (and CUB's segmented radix sorts) into it.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/cuda/page_summary_kernels.cuh"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/sparse/page_summary_view.hpp"
#include "oomb/sparse/scoring.hpp"
#include "oomb/sparse/tile_selector.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// a * b rounded, never fused into an add: nvcc contracts a * b + c into an FMA by default, which
/// would make device sums differ from the host's.
OOMB_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// The last step of scoring.hpp's fixed tree: its 8 lanes summed pairwise.
OOMB_HOST_DEVICE inline float tree_combine(const float* acc) noexcept {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// sum_d term(d) in scoring.hpp's fixed tree: lane j sums the terms of channels d = j (mod 8) in
/// ascending order, then tree_combine.
template <class Term>
OOMB_HOST_DEVICE float tree_sum(std::int32_t n, Term term) noexcept {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (std::int32_t d = 0; d < n; ++d) acc[d & 7] += term(d);
  return tree_combine(acc);
}

OOMB_HOST_DEVICE inline float max2(float a, float b) noexcept { return a > b ? a : b; }

/// One channel's term of the box bound: max over q in {qlo, qhi}, k in {lo, hi} of q k.
OOMB_HOST_DEVICE inline float box_term(float qlo, float qhi, float lo, float hi) noexcept {
  return max2(max2(mul_rn(qlo, lo), mul_rn(qlo, hi)), max2(mul_rn(qhi, lo), mul_rn(qhi, hi)));
}

}  // namespace detail

/// Quest's bound for a box of queries: sum_d max over q_d in {qlo_d, qhi_d}, k_d in {lo_d, hi_d}
/// of q_d k_d; no query of the box scores any key of the page higher. Same on host and device.
OOMB_HOST_DEVICE inline float quest_box_bound(const float* qlo, const float* qhi, const float* lo,
                                              const float* hi, std::int32_t n) noexcept {
  return detail::tree_sum(n, [&](std::int32_t d) { return detail::box_term(qlo[d], qhi[d], lo[d], hi[d]); });
}

/// q · mean in scoring.hpp's order, without contraction: equals its dot() (compiled without FMA
/// contraction) bit for bit, on host and device.
OOMB_HOST_DEVICE inline float mean_key_score(const float* q, const float* mean, std::int32_t n) noexcept {
  return detail::tree_sum(n, [&](std::int32_t d) { return detail::mul_rn(q[d], mean[d]); });
}

/// page_selector::rank_key, on host and device: the score as an order-preserving uint32 (NaN
/// lowest, -0 == +0) above ~index.
OOMB_HOST_DEVICE inline std::uint64_t page_rank_key(float score, std::int32_t index) noexcept {
  score += 0.0f;
#if defined(__CUDA_ARCH__)
  const std::uint32_t bits = __float_as_uint(score);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
#endif
  const std::uint32_t flip = static_cast<std::uint32_t>(-static_cast<std::int32_t>(bits >> 31)) | 0x80000000u;
  const std::uint32_t order = score != score ? 0u : bits ^ flip;
  return (std::uint64_t(order) << 32) | std::uint64_t(~static_cast<std::uint32_t>(index));
}

/// Sizes of one GPU selection setup, fixed up front: the largest call it serves (max_tiles tiles of
/// config.tile_queries queries, at most max_past_pages candidate pages), the slice of middle pages
/// scored per pass, and where each piece of the caller's workspace goes. Made by
/// plan_tile_selection(); a plain value.
struct tile_selection_plan {
  tile_selection_config config{};
  std::int32_t q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int32_t max_tiles = 0, max_past_pages = 0;
  std::int32_t slice_pages = 0;  ///< middle pages scored per pass: min(asked, max_past - sink - local)
  std::int64_t row_keys = 0;     ///< keys per tile and pass: a slice's, then the best `budget` so far
  std::size_t query_summary_offset = 0, slice_summaries_offset = 0, keys_offset = 0, sorted_offset = 0,
              segment_begins_offset = 0, segment_ends_offset = 0, picks_offset = 0, picked_offset = 0,
              pick_begins_offset = 0, pick_ends_offset = 0, sort_offset = 0;
  std::size_t sort_bytes = 0;
  std::size_t workspace_bytes = 0;  ///< device memory select_tiles() needs, 256-byte aligned

  /// Pages one tile selects for a past of `past_pages`: min(past, budget + sink + local).
  std::int32_t pages_per_tile(std::int32_t past_pages) const noexcept {
    const std::int64_t m = config.pages.max_pages();
    return static_cast<std::int32_t>(past_pages < m ? past_pages : m);
  }
  /// Capacity tile_pages needs for the largest call: max_tiles * pages_per_tile(max_past_pages)
  /// (rows with first pages are no longer).
  std::int64_t max_entries() const noexcept { return std::int64_t(max_tiles) * pages_per_tile(max_past_pages); }
};

/// Plans GPU selection for queries [n][q_heads][head_dim] in tiles of config.tile_queries, at most
/// max_tiles tiles and max_past_pages candidate pages per call, scoring at most slice_pages middle
/// pages per pass. Throws invalid_argument for a bad config or shape, or sizes whose keys
/// overflow CUB's int item count.
inline tile_selection_plan plan_tile_selection(const tile_selection_config& config, std::int32_t q_heads,
                                               std::int32_t kv_heads, std::int32_t head_dim,
                                               std::int32_t max_tiles, std::int32_t max_past_pages,
                                               std::int32_t slice_pages = default_selection_slice_pages) {
  config.validate();
  OOMB_EXPECTS(kv_heads > 0 && q_heads > 0 && q_heads % kv_heads == 0, "plan_tile_selection: q_heads (", q_heads,
               ") must be a positive multiple of kv_heads (", kv_heads, ")");
  OOMB_EXPECTS(head_dim > 0 && std::int64_t(head_dim) * kv_heads <= 4096, "plan_tile_selection: kv_heads * head_dim must be in [1, 4096], got ",
               kv_heads, " * ", head_dim);
  OOMB_EXPECTS(max_tiles > 0, "plan_tile_selection: max_tiles must be positive, got ", max_tiles);
  OOMB_EXPECTS(max_past_pages >= 0, "plan_tile_selection: max_past_pages must not be negative, got ", max_past_pages);
  OOMB_EXPECTS(slice_pages > 0, "plan_tile_selection: slice_pages must be positive, got ", slice_pages);
  tile_selection_plan p;
  p.config = config;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.max_tiles = max_tiles;
  p.max_past_pages = max_past_pages;
  const std::int32_t budget = config.pages.budget;
  const std::int64_t mid = std::int64_t(max_past_pages) - config.pages.sink - config.pages.local;
  // Nothing is ever scored without a budget, or when every past fits budget + sink + local.
  const bool scores = budget > 0 && max_past_pages > config.pages.max_pages();
  p.slice_pages = scores ? static_cast<std::int32_t>(mid < slice_pages ? mid : slice_pages) : 0;
  p.row_keys = scores ? std::int64_t(p.slice_pages) + budget : 0;
  const std::int64_t keys = std::int64_t(max_tiles) * p.row_keys;
  const std::int64_t picks = scores ? std::int64_t(max_tiles) * budget : 0;
  OOMB_EXPECTS(keys < (std::int64_t(1) << 31), "plan_tile_selection: ", max_tiles, " tiles of ", p.row_keys,
               " keys per pass exceed 2^31 keys");
  if (scores) {  // size queries: nothing runs on the stream they name
    std::size_t by_score = 0, by_index = 0;
    OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
                        nullptr, by_score, static_cast<const std::uint64_t*>(nullptr),
                        static_cast<std::uint64_t*>(nullptr), static_cast<int>(keys), max_tiles,
                        static_cast<const int*>(nullptr), static_cast<const int*>(nullptr), 0, 64, cudaStream_t{}),
                    "plan_tile_selection: sizing CUB's segmented sort of ", keys, " keys");
    OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(
                        nullptr, by_index, static_cast<const std::uint32_t*>(nullptr),
                        static_cast<std::uint32_t*>(nullptr), static_cast<int>(picks), max_tiles,
                        static_cast<const int*>(nullptr), static_cast<const int*>(nullptr), 0, 32, cudaStream_t{}),
                    "plan_tile_selection: sizing CUB's segmented sort of ", picks, " selected pages");
    p.sort_bytes = by_score > by_index ? by_score : by_index;
  }
  const auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  std::size_t at = 0;
  const auto take = [&](std::size_t& offset, std::size_t bytes) {
    offset = at;
    at = align(at + bytes);
  };
  take(p.query_summary_offset, 2 * std::size_t(max_tiles) * kv_heads * head_dim * sizeof(float));
  take(p.slice_summaries_offset,
       device_page_summaries::bytes(p.slice_pages, kv_heads, head_dim, summary_stats_for(config.kind)));
  take(p.keys_offset, std::size_t(keys) * sizeof(std::uint64_t));    // per tile: [slice | best so far]
  take(p.sorted_offset, std::size_t(keys) * sizeof(std::uint64_t));  // the same rows, segments sorted
  take(p.segment_begins_offset, std::size_t(max_tiles) * sizeof(int));
  take(p.segment_ends_offset, std::size_t(max_tiles) * sizeof(int));
  take(p.picks_offset, std::size_t(picks) * sizeof(std::uint32_t));   // the best pages, by score
  take(p.picked_offset, std::size_t(picks) * sizeof(std::uint32_t));  // the same, by page index
  take(p.pick_begins_offset, std::size_t(max_tiles) * sizeof(int));
  take(p.pick_ends_offset, std::size_t(max_tiles) * sizeof(int));
  take(p.sort_offset, p.sort_bytes);
  p.workspace_bytes = at;
  return p;
}

/// What select_tiles() wrote, known on the host without reading the device: `tiles` CSR rows of
/// `pages_per_tile` pages each (tile_indptr[t] = t * pages_per_tile); with first pages, of at most
/// that many (tile t's: min(past - first_t, pages_per_tile), as tile_indptr says).
struct tile_selection_result {
  std::int32_t tiles = 0;
  std::int32_t pages_per_tile = 0;
};

namespace detail {

inline constexpr int tile_selection_threads = 128;

/// Tile t's candidates [first, past) and the length of its CSR row: every candidate when there are
/// at most max_pages (budget + sink + local), else max_pages.
struct tile_candidates {
  std::int32_t first, count, length;
  bool all;
};

/// Tile t's candidates: from tile_first[t] (at most past; 0 when tile_first is null) to past.
OOMB_HOST_DEVICE inline tile_candidates candidates_of(const std::int32_t* tile_first, std::int32_t t,
                                                      std::int32_t past, std::int32_t max_pages) noexcept {
  const std::int32_t first = tile_first == nullptr ? 0 : tile_first[t] < past ? tile_first[t] : past;
  const std::int32_t count = past - first;
  return {first, count, count <= max_pages ? count : max_pages, count <= max_pages};
}

/// Where tile t's scored keys start in its row (key j is logical page sink + j): at its first page,
/// or at the row's end (none) when it takes every candidate unscored.
OOMB_HOST_DEVICE inline std::int32_t scored_from(const std::int32_t* tile_first, std::int32_t t, std::int32_t past,
                                                 std::int32_t max_pages, std::int32_t scored) noexcept {
  const tile_candidates c = candidates_of(tile_first, t, past, max_pages);
  return c.all ? scored : c.first;
}

OOMB_KERNEL_NAMESPACE_BEGIN

/// Block (tile, kv head); thread x owns channels x, x + blockDim.x, ... Quest: channel min into
/// lo, max into hi; mean: the mean into lo, summed in double over group member g (outer) and
/// query t (inner). Layout [tile][kv head][channel].
template <class E>
OOMB_KERNEL void __launch_bounds__(tile_selection_threads)
    summarize_query_tiles_kernel(const E* __restrict__ q, std::int64_t s0, std::int64_t s1, std::int64_t s2,
                                 std::int32_t n, std::int32_t tile_queries, std::int32_t group,
                                 std::int32_t head_dim, score_kind kind, float* __restrict__ lo,
                                 float* __restrict__ hi) {
  const std::int32_t tile = blockIdx.x, h = blockIdx.y, kv_heads = gridDim.y;
  const std::int32_t t0 = tile * tile_queries;
  const std::int32_t t1 = t0 + tile_queries < n ? t0 + tile_queries : n;
  const std::int64_t at = (std::int64_t(tile) * kv_heads + h) * head_dim;
  for (std::int32_t c = threadIdx.x; c < head_dim; c += blockDim.x) {
    float mn = HUGE_VALF, mx = -HUGE_VALF;
    double sum = 0.0;
    for (std::int32_t g = 0; g < group; ++g) {
      const E* row = q + std::int64_t(h * group + g) * s1 + c * s2;
      for (std::int32_t t = t0; t < t1; ++t) {
        const float x = static_cast<float>(row[t * s0]);
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
        sum += static_cast<double>(x);
      }
    }
    if (kind == score_kind::quest) {
      lo[at + c] = mn;
      hi[at + c] = mx;
    } else {
      lo[at + c] = static_cast<float>(sum / (double(group) * (t1 - t0)));
    }
  }
}

/// One pass over a slice of the middle pages, j0 .. j0 + len (middle page j is logical page sink + j;
/// its summary is entry j - j0 of `s`, the gathered slice). Block (page block, tile group); thread
/// x scores middle page j0 + blockIdx.x * blockDim.x + x for the kTiles tiles kTiles * blockIdx.y,
/// ... (their query summaries staged in shared memory), so each page summary is read once per
/// kTiles tiles. Per (tile, KV head) it evaluates quest_box_bound / mean_key_score term for term in
/// their order (lane d % 8, then tree_combine), so the scores are theirs bit for bit. Tile t's row
/// of keys is [slice area | best so far]: the pass's keys end where the best start (key of j at
/// slice - len + j - j0), so tile t's segment, from its first candidate on through its best, is
/// contiguous; block (0, 0) writes the segments (empty for a tile that scores nothing). A page no
/// tile of the block has among its candidates is not read.
template <int kTiles>
OOMB_KERNEL void __launch_bounds__(tile_selection_threads)
    score_tile_pages_kernel(page_summary_view s, const float* __restrict__ q_lo, const float* __restrict__ q_hi,
                            score_kind kind, const std::int32_t* __restrict__ tile_first, std::int32_t tiles,
                            std::int32_t past, std::int32_t max_pages, std::int32_t sink, std::int32_t scored,
                            std::int32_t j0, std::int32_t len, std::int32_t slice, std::int32_t row_keys,
                            std::uint64_t* __restrict__ keys, int* __restrict__ segment_begins,
                            int* __restrict__ segment_ends) {
  extern __shared__ float tile_summary[];  // [kTiles][2][kv_heads][head_dim]
  const std::int32_t first = blockIdx.y * kTiles;
  const std::int32_t count = tiles - first < kTiles ? tiles - first : kTiles;
  const std::int32_t row = s.kv_heads * s.head_dim;
  const bool quest = kind == score_kind::quest;
  for (std::int32_t i = threadIdx.x; i < count * 2 * row; i += blockDim.x) {
    const std::int32_t t = i / (2 * row), r = i - t * 2 * row;
    const std::int64_t at = std::int64_t(first + t) * row + (r < row ? r : r - row);
    tile_summary[i] = r < row ? q_lo[at] : quest ? q_hi[at] : 0.0f;
  }
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (std::int32_t t = threadIdx.x; t < tiles; t += blockDim.x) {
      const std::int32_t from = scored_from(tile_first, t, past, max_pages, scored) - j0;
      const int end = t * row_keys + row_keys;
      segment_ends[t] = end;
      segment_begins[t] = from >= scored - j0 ? end  // takes every candidate: nothing to sort
                                              : t * row_keys + slice - len + (from < 0 ? 0 : from < len ? from : len);
    }
  __syncthreads();
  const std::int32_t i = blockIdx.x * blockDim.x + threadIdx.x, j = j0 + i;
  bool needed = false;
  for (int t = 0; t < count; ++t) needed |= j >= scored_from(tile_first, first + t, past, max_pages, scored);
  if (i >= len || !needed) return;
  const std::int32_t logical = sink + j;
  float best[kTiles];
  for (int t = 0; t < kTiles; ++t) best[t] = -HUGE_VALF;
  if (s.token_count(i) > 0)
    for (std::int32_t h = 0; h < s.kv_heads; ++h) {
      const float* lo = quest ? s.min_of(i, h) : s.mean_of(i, h);
      const float* hi = quest ? s.max_of(i, h) : nullptr;
      float acc[kTiles][8];
      for (int t = 0; t < kTiles; ++t)
        for (int l = 0; l < 8; ++l) acc[t][l] = 0.0f;
      for (std::int32_t d0 = 0; d0 < s.head_dim; d0 += 8) {
        float klo[8], khi[8];
        const int lanes = s.head_dim - d0 < 8 ? s.head_dim - d0 : 8;
#pragma unroll
        for (int l = 0; l < 8; ++l) {
          klo[l] = l < lanes ? lo[d0 + l] : 0.0f;
          khi[l] = l < lanes && quest ? hi[d0 + l] : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const float* a = tile_summary + (t * 2 * s.kv_heads + h) * s.head_dim + d0;  // lo (or mean)
          const float* b = a + row;                                                     // hi
#pragma unroll
          for (int l = 0; l < 8; ++l)
            if (l < lanes) acc[t][l] += quest ? box_term(a[l], b[l], klo[l], khi[l]) : mul_rn(a[l], klo[l]);
        }
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const float x = tree_combine(acc[t]);
        best[t] = x > best[t] ? x : best[t];  // as tile_scorer: a NaN never replaces a number
      }
    }
  // Every tile's key, also before its segment (neither sorted nor read): a test here costs ~20 registers.
  for (int t = 0; t < count; ++t) keys[std::int64_t(first + t) * row_keys + slice - len + i] = page_rank_key(best[t], logical);
}

/// Block per tile, after a pass's sort: the best `budget` keys of its sorted segment (the best of
/// every slice so far) become the best region of its row for the next pass; after the last pass,
/// their pages (by score) go to `picks` with the segments that sort them by index. A tile that
/// scores nothing keeps an empty segment.
template <int = 0>
OOMB_KERNEL void __launch_bounds__(tile_selection_threads)
    carry_best_kernel(const std::uint64_t* __restrict__ sorted, const int* __restrict__ segment_begins,
                      const int* __restrict__ segment_ends, std::int32_t slice, std::int32_t row_keys,
                      std::int32_t budget, bool last, std::uint64_t* __restrict__ keys,
                      std::uint32_t* __restrict__ picks, int* __restrict__ pick_begins, int* __restrict__ pick_ends) {
  const std::int32_t t = blockIdx.x;
  const int begin = segment_begins[t];
  const bool scores = begin < segment_ends[t];
  if (last && threadIdx.x == 0) {
    pick_begins[t] = t * budget;
    pick_ends[t] = t * budget + (scores ? budget : 0);
  }
  if (!scores) return;
  for (std::int32_t i = threadIdx.x; i < budget; i += blockDim.x) {
    const std::uint64_t key = sorted[begin + i];
    if (last) picks[std::int64_t(t) * budget + i] = ~static_cast<std::uint32_t>(key);  // the key's page
    else keys[std::int64_t(t) * row_keys + slice + i] = key;
  }
}

/// Block per tile: writes its CSR row (sink pages, its `budget` picked middle pages in index
/// order, then local pages; or every candidate when none is scored) after the rows of the tiles
/// before it, and its indptr entry.
template <int kThreads>
OOMB_KERNEL void __launch_bounds__(kThreads)
    emit_tile_pages_kernel(const std::uint32_t* __restrict__ picked, const std::int32_t* __restrict__ tile_first,
                           std::int32_t past, std::int32_t sink, std::int32_t local, std::int32_t budget,
                           std::int32_t* __restrict__ indptr, std::int32_t* __restrict__ pages) {
  using scan = cub::BlockScan<int, kThreads>;
  __shared__ typename scan::TempStorage scan_storage;
  const std::int32_t tile = blockIdx.x, max_pages = sink + budget + local;
  // The row's start: the earlier tiles' lengths summed (the scan's aggregate reaches every thread).
  int earlier = 0, unused = 0, start = 0;
  for (std::int32_t t = threadIdx.x; t < tile; t += kThreads) earlier += candidates_of(tile_first, t, past, max_pages).length;
  scan(scan_storage).ExclusiveSum(earlier, unused, start);
  const tile_candidates c = candidates_of(tile_first, tile, past, max_pages);
  std::int32_t* out = pages + start;
  if (threadIdx.x == 0) {
    indptr[tile + 1] = start + c.length;
    if (tile == 0) indptr[0] = 0;
  }
  if (c.all) {
    for (std::int32_t i = threadIdx.x; i < c.count; i += kThreads) out[i] = c.first + i;
    return;
  }
  for (std::int32_t i = threadIdx.x; i < sink; i += kThreads) out[i] = c.first + i;
  for (std::int32_t i = threadIdx.x; i < budget; i += kThreads)
    out[sink + i] = static_cast<std::int32_t>(picked[std::int64_t(tile) * budget + i]);
  for (std::int32_t i = threadIdx.x; i < local; i += kThreads) out[sink + budget + i] = past - local + i;
}

OOMB_KERNEL_NAMESPACE_END

}  // namespace detail

/// Enqueues on `stream` the selection of every tile of `queries` ([n][q_heads][head_dim], device
/// memory, bf16 or float, any strides; tile t holds queries [t * tile_queries, min(n, (t + 1) *
/// tile_queries))), all with the causal past `past_pages`, tile t's candidates logical pages
/// [min(tile_first_pages[t], past_pages), past_pages) (tile_first_pages: device, one non-negative
/// entry per tile; null: 0 for every tile), as tile_selector::select does with the scoring
/// described at the top of this file. page_ids (device, past_pages entries) maps a logical page to
/// its id in `summaries` (memory kernels address: device memory, or a far-tier home in mapped
/// pinned memory; each scored entry is read once per call, a slice at a time). Writes tile_indptr (device, tiles + 1) and tile_pages
/// (device, at least tiles * pages_per_tile entries): the page-sparse table the paged attention
/// kernels take, and sparse_page_table's CSR layout. `workspace` is device memory of
/// plan.workspace_bytes, 256-byte aligned, used by this call until it has run on the stream.
/// Queries must be finite, page ids in range and first pages non-negative (none is checked on the
/// device). Throws invalid_argument (nothing enqueued) when the call exceeds the plan or shapes
/// differ, cuda_error if a launch fails.
template <class E>
tile_selection_result select_tiles(const tile_selection_plan& plan, const page_summary_view& summaries,
                                   const tensor_view<E, 3>& queries, const std::int32_t* page_ids,
                                   std::int32_t past_pages, const std::int32_t* tile_first_pages,
                                   std::int32_t* tile_indptr, std::int32_t* tile_pages, void* workspace,
                                   std::size_t workspace_bytes, cuda_stream_view stream) {
  using element = std::remove_const_t<E>;
  const tile_selection_config& cfg = plan.config;
  const std::int64_t n = queries.extent(0);
  OOMB_EXPECTS(device_accessible(queries.kind()), "select_tiles: queries are in ", to_string(queries.kind()),
               " memory, which kernels cannot read");
  OOMB_EXPECTS(n > 0, "select_tiles: no queries to select pages for (", n, ")");
  OOMB_EXPECTS(queries.extent(1) == plan.q_heads && queries.extent(2) == plan.head_dim, "select_tiles: queries have ",
               queries.extent(1), " heads of head_dim ", queries.extent(2), ", the plan ", plan.q_heads, " of ",
               plan.head_dim);
  OOMB_EXPECTS(summaries.kv_heads == plan.kv_heads && summaries.head_dim == plan.head_dim,
               "select_tiles: summaries have ", summaries.kv_heads, " KV heads of head_dim ", summaries.head_dim,
               ", the plan ", plan.kv_heads, " of ", plan.head_dim);
  const std::int64_t tiles64 = (n + cfg.tile_queries - 1) / cfg.tile_queries;
  OOMB_EXPECTS(tiles64 <= plan.max_tiles, "select_tiles: ", n, " queries make ", tiles64, " tiles of ",
               cfg.tile_queries, ", the plan holds at most ", plan.max_tiles);
  OOMB_EXPECTS(past_pages >= 0 && past_pages <= plan.max_past_pages, "select_tiles: past_pages ", past_pages,
               " outside the plan's [0, ", plan.max_past_pages, "]");
  OOMB_EXPECTS(workspace_bytes >= plan.workspace_bytes && (reinterpret_cast<std::uintptr_t>(workspace) & 255) == 0,
               "select_tiles: the workspace needs ", plan.workspace_bytes, " bytes, 256-byte aligned; got ",
               workspace_bytes, " at ", workspace);
  OOMB_EXPECTS(tile_indptr != nullptr && (tile_pages != nullptr || plan.pages_per_tile(past_pages) == 0),
               "select_tiles: null output table");
  const auto tiles = static_cast<std::int32_t>(tiles64);
  const selection_config& pc = cfg.pages;
  const bool all = past_pages <= pc.max_pages();
  const std::int32_t scored = all ? 0 : past_pages - pc.sink - pc.local;
  auto* ws = static_cast<unsigned char*>(workspace);
  auto* picked = reinterpret_cast<std::uint32_t*>(ws + plan.picked_offset);
  if (!all && pc.budget > 0) {  // else no tile scores: every candidate, or sink and local only
    OOMB_EXPECTS(page_ids != nullptr && summaries.tokens != nullptr, "select_tiles: null page_ids or summaries");
    OOMB_EXPECTS(cfg.kind == score_kind::quest ? summaries.min != nullptr && summaries.max != nullptr
                                               : summaries.mean != nullptr,
                 "select_tiles: ", to_string(cfg.kind), " scoring reads the summaries' ",
                 cfg.kind == score_kind::quest ? "min and max" : "mean", ", which this store does not keep");
    const auto st = queries.strides();
    const std::int64_t row = std::int64_t(plan.kv_heads) * plan.head_dim;
    auto* q_lo = reinterpret_cast<float*>(ws + plan.query_summary_offset);
    float* q_hi = q_lo + std::int64_t(plan.max_tiles) * row;
    auto* keys = reinterpret_cast<std::uint64_t*>(ws + plan.keys_offset);
    auto* sorted = reinterpret_cast<std::uint64_t*>(ws + plan.sorted_offset);
    auto* begins = reinterpret_cast<int*>(ws + plan.segment_begins_offset);
    auto* ends = reinterpret_cast<int*>(ws + plan.segment_ends_offset);
    auto* picks = reinterpret_cast<std::uint32_t*>(ws + plan.picks_offset);
    auto* pick_begins = reinterpret_cast<int*>(ws + plan.pick_begins_offset);
    auto* pick_ends = reinterpret_cast<int*>(ws + plan.pick_ends_offset);
    const device_page_summaries slice_store = device_page_summaries::over(
        ws + plan.slice_summaries_offset, plan.slice_pages, plan.kv_heads, plan.head_dim, summary_stats_for(cfg.kind));
    const std::int32_t slice = plan.slice_pages, row_keys = static_cast<std::int32_t>(plan.row_keys);
    const int items = tiles * row_keys, picks_n = tiles * pc.budget;
    // CUB's storage for this call's sorts (sized by item counts): within the plan's, or refused here.
    std::size_t by_score = 0, by_index = 0;
    OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, by_score, keys, sorted, items, tiles,
                                                                     begins, ends, 0, 64, stream.get()),
                    "select_tiles: sizing CUB's segmented sort");
    OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, by_index, picks, static_cast<std::uint32_t*>(nullptr),
                                                           picks_n, tiles, pick_begins, pick_ends, 0, 32, stream.get()),
                    "select_tiles: sizing CUB's segmented sort of the picks");
    OOMB_EXPECTS(by_score <= plan.sort_bytes && by_index <= plan.sort_bytes, "select_tiles: CUB asks ",
                 by_score > by_index ? by_score : by_index, " bytes, more than the ", plan.sort_bytes,
                 " planned for the largest call");
    detail::summarize_query_tiles_kernel<element>
        <<<dim3(tiles, plan.kv_heads), detail::tile_selection_threads, 0, stream>>>(
            queries.data(), st[0], st[1], st[2], static_cast<std::int32_t>(n), cfg.tile_queries,
            plan.q_heads / plan.kv_heads, plan.head_dim, cfg.kind, q_lo, q_hi);
    OOMB_CUDA_CHECK_LAUNCH("select_tiles: summarising ", tiles, " query tiles");
    // The best so far start as keys below every page's (page_rank_key's low half, ~index, is never 0).
    OOMB_CUDA_CHECK(cudaMemsetAsync(keys, 0, std::size_t(items) * sizeof(std::uint64_t), stream.get()),
                    "select_tiles: clearing the keys");
    // Eight tiles per block share each page read where their summaries fit 48 KiB of shared memory.
    const std::size_t per_tile = 2 * std::size_t(row) * sizeof(float);
    const bool eight = 8 * per_tile <= 48 * 1024;
    for (std::int32_t j0 = 0; j0 < scored; j0 += slice) {
      const std::int32_t len = scored - j0 < slice ? scored - j0 : slice;
      gather_page_summaries(summaries, page_ids + pc.sink + j0, len, slice_store, stream);
      const unsigned blocks = static_cast<unsigned>((len + detail::tile_selection_threads - 1) / detail::tile_selection_threads);
      if (eight) {
        detail::score_tile_pages_kernel<8><<<dim3(blocks, unsigned(tiles + 7) / 8), detail::tile_selection_threads,
                                             8 * per_tile, stream>>>(
            slice_store.view(), q_lo, q_hi, cfg.kind, tile_first_pages, tiles, past_pages, pc.max_pages(), pc.sink,
            scored, j0, len, slice, row_keys, keys, begins, ends);
      } else {
        detail::score_tile_pages_kernel<1><<<dim3(blocks, unsigned(tiles)), detail::tile_selection_threads, per_tile,
                                             stream>>>(
            slice_store.view(), q_lo, q_hi, cfg.kind, tile_first_pages, tiles, past_pages, pc.max_pages(), pc.sink,
            scored, j0, len, slice, row_keys, keys, begins, ends);
      }
      OOMB_CUDA_CHECK_LAUNCH("select_tiles: scoring pages ", j0, " to ", j0 + len, " of ", scored, " for ", tiles,
                             " tiles");
      OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(ws + plan.sort_offset, by_score, keys, sorted,
                                                                       items, tiles, begins, ends, 0, 64, stream.get()),
                      "select_tiles: CUB's segmented sort of ", items, " keys");
      const bool last = j0 + len >= scored;
      detail::carry_best_kernel<0><<<tiles, detail::tile_selection_threads, 0, stream>>>(
          sorted, begins, ends, slice, row_keys, pc.budget, last, keys, picks, pick_begins, pick_ends);
      OOMB_CUDA_CHECK_LAUNCH("select_tiles: keeping the best ", pc.budget, " pages of ", tiles, " tiles");
    }
    // The picks by page index (logical pages are below 2^31: 31 bits are enough, fewer for a short past).
    int index_bits = 1;
    while (index_bits < 31 && (std::int64_t(1) << index_bits) < past_pages) ++index_bits;
    OOMB_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeys(ws + plan.sort_offset, by_index, picks,
                                                           picked, picks_n, tiles,
                                                           pick_begins, pick_ends, 0, index_bits, stream.get()),
                    "select_tiles: CUB's segmented sort of ", picks_n, " selected pages");
  }
  constexpr int emit_threads = 256;
  detail::emit_tile_pages_kernel<emit_threads><<<tiles, emit_threads, 0, stream>>>(
      picked, tile_first_pages, past_pages, pc.sink, pc.local, pc.budget, tile_indptr, tile_pages);
  OOMB_CUDA_CHECK_LAUNCH("select_tiles: writing ", tiles, " tiles' pages");
  return {tiles, plan.pages_per_tile(past_pages)};
}

/// As above with every tile's candidates [0, past_pages): rows of pages_per_tile pages each.
template <class E>
tile_selection_result select_tiles(const tile_selection_plan& plan, const page_summary_view& summaries,
                                   const tensor_view<E, 3>& queries, const std::int32_t* page_ids,
                                   std::int32_t past_pages, std::int32_t* tile_indptr, std::int32_t* tile_pages,
                                   void* workspace, std::size_t workspace_bytes, cuda_stream_view stream) {
  return select_tiles(plan, summaries, queries, page_ids, past_pages, nullptr, tile_indptr, tile_pages, workspace,
                      workspace_bytes, stream);
}

OOMB_NAMESPACE_END
