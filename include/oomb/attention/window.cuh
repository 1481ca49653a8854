// oomb — where the keys of one attention window live, as the kernels see them.
// SPDX-License-Identifier: Apache-2.0
//
// A window is a run of logical pages of one sequence (kv.table's sequence 0). The forward walks a
// *virtual* key sequence: dense, the window itself; sparse, the pages a query tile selected inside
// the window followed by the window's own pages (those not wholly before q_start). Both are sorted
// by position, so "position of virtual slot v" is monotonic and causal skipping works unchanged,
// and only the window's last page can be partial, so the valid slots are one prefix [0, vlen).
#pragma once

#include <cstdint>

#include "oomb/core/bf16.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/fast_divmod.hpp"
#include "oomb/attention/plan.hpp"
#include "oomb/attention/ptx.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {

/// The kernels' view of one call: the public args plus the numbers derived once on the host.
struct kernel_params {
  const std::uint16_t* q;  // bf16 bits, [sq][hq][d]
  std::int64_t q_start;
  std::int32_t sq, hq, hkv, group;  // group = hq / hkv
  fast_divmod group_div;            // packed row r -> (query r / group, head r % group)
  float scale;
  float scale_log2;  // scale * log2(e): scores go through exp2
  page_pool_view<const bf16> pool;
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_page_len;
  std::int32_t log_page;  // page_size = 1 << log_page
  std::int32_t first_page;
  const std::int32_t* tile_indptr;  // nullptr: dense
  const std::int32_t* tile_pages;
  std::int32_t tile;
  const std::int64_t* key_lower;  // per-document bounds, [sq] (attention_args::key_lower); nullptr: none
  fast_divmod tile_rows_div;  // packed row -> sparse query tile (tile * group rows each)
  bool stagger;               // backward: each block starts its query walk at its own tile
  bool heads_interleaved;     // Hopper backward: launch order takes the KV heads in turn (plan order 2; bench option)
  sparse_backward_plan plan;  // Hopper backward, sparse: which CTA takes which block and tiles (hs2)
  /// Hopper backward, traced instance only (the benchmark's --trace): where each CTA records its timeline.
  std::uint64_t* trace;
  /// Hopper backward, deterministic plans: per (KV head, query step) how many key blocks have added
  /// their dQ for the step (zeroed before the launch); nullptr: dQ is added in arrival order.
  std::int32_t* dq_turns;
  /// Hopper backward, deterministic sparse plans with cut blocks: per (KV head, cut block) how many of
  /// the block's pieces have added their dK/dV (zeroed; backward_plan::piece_turns); nullptr: the
  /// pieces add in arrival order.
  std::int32_t* piece_turns;
};

__device__ __forceinline__ std::int32_t lower_bound(const std::int32_t* a, std::int32_t n, std::int64_t x) {
  std::int32_t lo = 0, hi = n;
  while (lo < hi) {
    const std::int32_t mid = (lo + hi) >> 1;
    if (a[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// Per-document bounds (attention_args::key_lower): the first key position query q sees, relative
/// to q_start as the kernels count query indices (past keys are negative); no_key_lower without
/// bounds. Non-decreasing in q, so the bound of a block of queries is that of its first.
/// The sentinel is half the int64 range, so a key offset (< 2^31) moves it without overflow.
inline constexpr std::int64_t no_key_lower = INT64_MIN / 2;
__device__ __forceinline__ std::int64_t key_lower_rel(const kernel_params& p, int q) {
  return p.key_lower != nullptr ? __ldg(p.key_lower + q) - p.q_start : no_key_lower;
}

/// How many queries (from query 0) see some key at or before absolute position kmax: those before
/// the first whose document starts after kmax (a binary search of the bounds); all sq without bounds.
__device__ __forceinline__ int queries_reaching(const kernel_params& p, std::int64_t kmax) {
  if (p.key_lower == nullptr) return p.sq;
  int lo = 0, hi = p.sq;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(p.key_lower + mid) <= kmax)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// Number of pages in the window and its key count (only the last page may be partial).
struct window_extent {
  std::int32_t pages;
  std::int32_t len;
  const std::int32_t* ids;  // the window's page ids, logical order
  __device__ explicit window_extent(const kernel_params& p) {
    const std::int32_t b = p.indptr[0];
    pages = p.indptr[1] - b;
    ids = p.indices + b;
    len = pages == 0 ? 0 : ((pages - 1) << p.log_page) + p.last_page_len[0];
  }
};

/// First logical page that is not past. A page is past when it ends at or before q_start
/// (start + its length <= q_start, the CPU reference's rule); only the window's last page can be
/// partial, so the rule is "whole pages before q_start" except when that last page ends early.
__device__ __forceinline__ std::int64_t first_own_page(const kernel_params& p, const window_extent& w) {
  const std::int64_t full = p.q_start >> p.log_page;
  if (w.pages == 0) return full;
  const std::int64_t last = std::int64_t(p.first_page) + w.pages - 1;
  const std::int64_t last_end = (last << p.log_page) + (w.len - ((w.pages - 1) << p.log_page));
  return last_end <= p.q_start && last + 1 > full ? last + 1 : full;
}

/// The forward's virtual key sequence for one query tile (see the file comment).
struct virtual_keys {
  const std::int32_t* ids;  // window page ids
  const std::int32_t* sel;  // sparse: first selected page inside the window (logical indices)
  std::int32_t m;           // sparse: selected pages inside the window
  std::int32_t own0;        // sparse: window index of the first own page
  std::int32_t vlen;        // valid virtual slots
  std::int32_t log_page;
  std::int32_t first_page;
  bool sparse;

  __device__ virtual_keys(const kernel_params& p, std::int32_t tile_index) {
    const window_extent w(p);
    ids = w.ids;
    log_page = p.log_page;
    first_page = p.first_page;
    sparse = p.tile_indptr != nullptr;
    sel = nullptr;
    m = 0;
    own0 = 0;
    if (!sparse) {
      vlen = w.len;
      return;
    }
    const std::int64_t p_own = first_own_page(p, w);
    const std::int64_t past_end = p_own < std::int64_t(first_page) + w.pages ? p_own : std::int64_t(first_page) + w.pages;
    const std::int32_t* list = p.tile_pages + p.tile_indptr[tile_index];
    const std::int32_t cnt = p.tile_indptr[tile_index + 1] - p.tile_indptr[tile_index];
    const std::int32_t a = lower_bound(list, cnt, first_page);
    const std::int32_t b = past_end > first_page ? lower_bound(list, cnt, past_end) : a;
    sel = list + a;
    m = b - a;
    std::int64_t o = p_own - first_page;
    own0 = static_cast<std::int32_t>(o < 0 ? 0 : (o > w.pages ? w.pages : o));
    const std::int32_t nv = m + (w.pages - own0);
    if (nv == 0) {
      vlen = 0;
    } else {
      const std::int32_t last_j = window_page(nv - 1);
      vlen = ((nv - 1) << log_page) + (last_j == w.pages - 1 ? w.len - ((w.pages - 1) << log_page) : (1 << log_page));
    }
  }
  /// Window index of virtual page vp.
  __device__ __forceinline__ std::int32_t window_page(std::int32_t vp) const {
    if (!sparse) return vp;
    return vp < m ? sel[vp] - first_page : own0 + (vp - m);
  }
  /// Absolute position of virtual slot v (v < vlen, or any v < pages * page_size).
  __device__ __forceinline__ std::int64_t pos(std::int32_t v) const {
    const std::int64_t page = std::int64_t(first_page) + window_page(v >> log_page);
    return (page << log_page) + (v & ((1 << log_page) - 1));
  }
  /// Pool id of the page holding virtual slot v.
  __device__ __forceinline__ std::int32_t id(std::int32_t v) const { return ids[window_page(v >> log_page)]; }
  /// Tiles of `tile_keys` slots that some query at or before `qpos_hi` sees: positions grow along
  /// the virtual slots, so a binary search finds the first tile that starts past `qpos_hi`.
  __device__ __forceinline__ int visible_tiles(int tile_keys, std::int64_t qpos_hi) const {
    int lo = 0, hi = (vlen + tile_keys - 1) / tile_keys;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (pos(mid * tile_keys) > qpos_hi)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }
  /// The tiles [begin, end) of `tile_keys` slots that CTA `rank` of a `split`-CTA cluster takes of
  /// those some row of a block sees: from the first reaching the block's smallest document bound
  /// (that of its first query, q_lo) to the last the causal mask leaves its last query (qpos_hi).
  __device__ __forceinline__ void cluster_share(const kernel_params& p, int tile_keys, int q_lo, std::int64_t qpos_hi,
                                                int rank, int split, int& begin, int& end) const {
    const int first = p.key_lower != nullptr ? first_tile_reaching(tile_keys, __ldg(p.key_lower + q_lo)) : 0;
    const int last = visible_tiles(tile_keys, qpos_hi);
    const int span = last > first ? last - first : 0;
    begin = first + span * rank / split;
    end = first + span * (rank + 1) / split;
  }
  /// The first tile of `tile_keys` slots holding a key at or after absolute position `lower` (a row
  /// block's smallest per-document bound): the tiles before it are below every row's bound.
  __device__ __forceinline__ int first_tile_reaching(int tile_keys, std::int64_t lower) const {
    int lo = 0, hi = (vlen + tile_keys - 1) / tile_keys;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      const std::int32_t last = (mid + 1) * tile_keys < vlen ? (mid + 1) * tile_keys - 1 : vlen - 1;
      if (pos(last) >= lower)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }
};

}  // namespace attention::detail
OOMB_NAMESPACE_END
