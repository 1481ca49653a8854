// oomb — scoring pages for a query tile from their key summaries (Quest bound or mean key).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/sparse/page_summary_view.hpp"

OOMB_NAMESPACE_BEGIN

/// How a page is scored for one query vector q (head_dim channels d):
///  - quest: the upper bound sum_d max(q_d * min_d, q_d * max_d) of q·k over every key k of the
///    page (Quest, Tang et al. 2024): no key of the page can score higher;
///  - mean:  q · mean, the dot product with the page's mean key (cheaper to reason about, no bound).
enum class score_kind { quest, mean };

constexpr const char* to_string(score_kind k) noexcept {
  return k == score_kind::quest ? "quest" : "mean";
}

// Both scores below and dot() sum their head_dim terms in the same fixed tree (8 interleaved
// lanes, then pairwise), so with products rounded before they are added (no FMA contraction, the
// default of g++ without -mfma) quest_bound(q, min, max) >= dot(q, k) holds exactly for every key
// k of the page, rounding included: each term is >= its counterpart and rounding is monotonic.
// The 8 independent lanes also let the compiler vectorise without reassociating.

/// q · k in float, summed in the library's fixed order.
OOMB_HOST_DEVICE inline float dot(const float* q, const float* k, std::int32_t n) noexcept {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  std::int32_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] += q[d + j] * k[d + j];
  for (int j = 0; d + j < n; ++j) acc[j] += q[d + j] * k[d + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Quest's bound sum_d max(q_d * lo_d, q_d * hi_d), summed in the same order as dot().
OOMB_HOST_DEVICE inline float quest_bound(const float* q, const float* lo, const float* hi,
                                          std::int32_t n) noexcept {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  std::int32_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int j = 0; j < 8; ++j) {
      const float a = q[d + j] * lo[d + j], b = q[d + j] * hi[d + j];
      acc[j] += a > b ? a : b;
    }
  for (int j = 0; d + j < n; ++j) {
    const float a = q[d + j] * lo[d + j], b = q[d + j] * hi[d + j];
    acc[j] += a > b ? a : b;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Score of one query vector against KV head `head` of page `id` (-infinity for an empty page).
OOMB_HOST_DEVICE inline float page_score(score_kind kind, const float* q, const page_summary_view& s,
                                         std::int32_t id, std::int32_t head) noexcept {
  if (s.token_count(id) == 0) return -HUGE_VALF;  // not numeric_limits: constexpr host-only under nvcc
  return kind == score_kind::quest ? quest_bound(q, s.min_of(id, head), s.max_of(id, head), s.head_dim)
                                   : dot(q, s.mean_of(id, head), s.head_dim);
}

/// Scores pages for one query tile.
///
/// A tile's score of a page is the maximum of page_score over the tile's queries, over every
/// query head and over every KV head, each query head read against the KV head of its GQA group:
/// query head j uses KV head j / (q_heads / kv_heads) (consecutive query heads share a KV head,
/// as in Hugging Face's repeat_kv). One score per page per tile, so one selection serves all
/// heads and a selected page is fetched (and its K/V read) once for the whole GQA group.
///
/// load() packs the tile's queries as float (any strides, bf16/float/double); score() then scores
/// any list of page ids. Not thread-safe; one scorer per thread.
class tile_scorer {
 public:
  tile_scorer(score_kind kind, std::int32_t q_heads, std::int32_t kv_heads, std::int32_t head_dim)
      : kind_(kind), q_heads_(q_heads), kv_heads_(kv_heads), head_dim_(head_dim) {
    OOMB_EXPECTS(kv_heads > 0, "tile_scorer: kv_heads must be positive, got ", kv_heads);
    OOMB_EXPECTS(q_heads > 0 && q_heads % kv_heads == 0, "tile_scorer: q_heads (", q_heads,
                 ") must be a positive multiple of kv_heads (", kv_heads, ")");
    OOMB_EXPECTS(head_dim > 0, "tile_scorer: head_dim must be positive, got ", head_dim);
  }

  /// Packs a tile of queries [n][q_heads][head_dim] (n >= 1). Throws invalid_argument (scorer
  /// unchanged) for queries in device memory (read here, on the host), an empty tile, mismatched heads or head_dim, or a non-finite query.
  template <class E>
  void load(const tensor_view<E, 3>& queries) {
    const std::int64_t n = queries.extent(0);
    OOMB_EXPECTS(host_accessible(queries.kind()), "tile_scorer: queries are in ",
                 to_string(queries.kind()), " memory, which the host cannot read (copy them to host "
                 "or pinned memory first)");
    OOMB_EXPECTS(n > 0, "tile_scorer: a tile needs at least one query, got ", n);
    OOMB_EXPECTS(queries.extent(1) == q_heads_, "tile_scorer: queries have ", queries.extent(1),
                 " heads, the scorer expects q_heads ", q_heads_);
    OOMB_EXPECTS(queries.extent(2) == head_dim_, "tile_scorer: queries have head_dim ",
                 queries.extent(2), ", the scorer expects ", head_dim_);
    const std::int32_t group = q_heads_ / kv_heads_;
    std::vector<float> packed(static_cast<std::size_t>(n * q_heads_ * head_dim_));
    const auto& st = queries.strides();
    // Layout [kv head][group member g][query t][d]: a KV head's vectors are contiguous.
    for (std::int64_t h = 0; h < kv_heads_; ++h)
      for (std::int64_t g = 0; g < group; ++g)
        for (std::int64_t t = 0; t < n; ++t) {
          const std::int64_t qh = h * group + g;
          float* dst = packed.data() + ((h * group + g) * n + t) * head_dim_;
          for (std::int64_t d = 0; d < head_dim_; ++d) {
            const float x = static_cast<float>(queries.data()[t * st[0] + qh * st[1] + d * st[2]]);
            OOMB_EXPECTS(std::isfinite(x), "tile_scorer: non-finite query ", x, " at token ", t,
                         ", head ", qh, ", channel ", d);
            dst[d] = x;
          }
        }
    packed_.swap(packed);
    queries_ = static_cast<std::int32_t>(n);
  }

  /// out[i] = this tile's score of page ids[i], for i in [0, n). Throws invalid_argument for a
  /// summary of other head counts, no tile loaded, or an id outside the summaries.
  void score(const page_summary_view& s, const std::int32_t* ids, std::int32_t n, float* out) const {
    OOMB_EXPECTS(queries_ > 0, "tile_scorer: score() before load()");
    OOMB_EXPECTS(s.kv_heads == kv_heads_ && s.head_dim == head_dim_, "tile_scorer: summaries have ",
                 s.kv_heads, " KV heads of head_dim ", s.head_dim, ", the scorer ", kv_heads_, " of ",
                 head_dim_);
    OOMB_EXPECTS(n >= 0, "tile_scorer: negative page count ", n);
    const std::int64_t per_head = std::int64_t(q_heads_ / kv_heads_) * queries_;
    for (std::int32_t i = 0; i < n; ++i) {
      const std::int32_t id = ids[i];
      OOMB_EXPECTS(id >= 0 && id < s.num_ids, "tile_scorer: page ", i, " has id ", id,
                   ", outside the summaries' ids [0, ", s.num_ids, ")");
      float best = -std::numeric_limits<float>::infinity();
      if (s.token_count(id) > 0) {
        for (std::int32_t h = 0; h < kv_heads_; ++h) {
          // Measured: blocking four queries per page load gains nothing here; the loop is bound
          // by arithmetic at SSE width (build with -march=native for AVX).
          const float* q = packed_.data() + std::int64_t(h) * per_head * head_dim_;
          for (std::int64_t v = 0; v < per_head; ++v, q += head_dim_) {
            const float x = page_score(kind_, q, s, id, h);
            best = x > best ? x : best;
          }
        }
      }
      out[i] = best;
    }
  }

  score_kind kind() const noexcept { return kind_; }
  std::int32_t q_heads() const noexcept { return q_heads_; }
  std::int32_t kv_heads() const noexcept { return kv_heads_; }
  std::int32_t head_dim() const noexcept { return head_dim_; }
  /// Queries of the tile loaded last (0 before the first load()).
  std::int32_t queries() const noexcept { return queries_; }

 private:
  score_kind kind_;
  std::int32_t q_heads_, kv_heads_, head_dim_;
  std::int32_t queries_ = 0;
  std::vector<float> packed_;
};

OOMB_NAMESPACE_END
