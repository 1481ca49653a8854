// oomb — per-page key summaries (channel min / max / mean per KV head), kept up to date as pages fill.
// SPDX-License-Identifier: Apache-2.0
//
// Thread safety: not internally synchronised; update()/clear()/reserve() need external
// synchronisation against every other call; const calls may run concurrently with each other.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/paging/views.hpp"
#include "oomb/sparse/page_summary_view.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {
// Keys may be bf16, float or double; min/max are kept as float (rounding is monotonic, so the
// float of the minimum is the minimum of the floats) and sums as double.
template <class E>
float key_to_float(const E& x) noexcept {
  return static_cast<float>(x);
}
template <class E>
double key_to_double(const E& x) noexcept {
  if constexpr (std::is_same_v<std::remove_cv_t<E>, double>) {
    return x;
  } else {
    return static_cast<double>(static_cast<float>(x));
  }
}
}  // namespace detail

/// Summaries of the keys of every page, indexed by page id: per KV head and channel d, the
/// minimum, the maximum and the mean of K[t][d] over the tokens t the page holds so far.
///
/// Pages fill in token order: update(id, first_token, keys) appends tokens
/// [first_token, first_token + n) and first_token must equal the tokens already summarised, or 0,
/// which starts the page afresh (a released id handed out again). Channel sums are accumulated in
/// double in token order whatever the chunking, so a page filled token by token, chunk by chunk
/// or at once has bit-identical min, max and mean.
///
/// Storage grows to the largest id seen (floats: 3 * kv_heads * head_dim per id, plus a double
/// sum), geometrically, so ascending ids cost amortised constant time each. A view() stays valid until a call that grows the store (an id >= num_ids(); reserve()
/// up front to avoid that) or the store's destruction.
class page_summaries {
 public:
  page_summaries(std::int32_t kv_heads, std::int32_t head_dim, std::int32_t reserve_ids = 0)
      : kv_heads_(kv_heads), head_dim_(head_dim) {
    OOMB_EXPECTS(kv_heads > 0, "page_summaries: kv_heads must be positive, got ", kv_heads);
    OOMB_EXPECTS(head_dim > 0, "page_summaries: head_dim must be positive, got ", head_dim);
    OOMB_EXPECTS(reserve_ids >= 0, "page_summaries: reserve_ids must not be negative, got ",
                 reserve_ids);
    reserve(reserve_ids);
  }

  /// Makes room for ids [0, ids) now, so views taken later are not invalidated by growth.
  void reserve(std::int32_t ids) {
    OOMB_EXPECTS(ids >= 0, "page_summaries: cannot reserve a negative number of ids (", ids, ")");
    if (ids > num_ids()) grow_to(ids);
  }

  /// Appends the keys of tokens [first_token, first_token + n) of page `id`; `keys` is
  /// [n][kv_heads][head_dim] with any strides, element type bf16, float or double.
  /// first_token == 0 restarts the page. Throws invalid_argument (summary unchanged) for keys in
  /// device memory (the host reads them: copy to host or pinned memory first), a
  /// negative id, mismatched head counts or head_dim, a first_token other than 0 or the page's
  /// current token count, or a non-finite key.
  template <class E>
  void update(std::int32_t id, std::int32_t first_token, const tensor_view<E, 3>& keys) {
    const std::int64_t n = keys.extent(0);
    OOMB_EXPECTS(host_accessible(keys.kind()), "page_summaries: keys of page ", id, " are in ",
                 to_string(keys.kind()), " memory, which the host cannot read (copy them to host or "
                 "pinned memory first)");
    OOMB_EXPECTS(id >= 0, "page_summaries: page id must not be negative, got ", id);
    OOMB_EXPECTS(keys.extent(1) == kv_heads_, "page_summaries: keys have ", keys.extent(1),
                 " KV heads, the summaries ", kv_heads_);
    OOMB_EXPECTS(keys.extent(2) == head_dim_, "page_summaries: keys have head_dim ", keys.extent(2),
                 ", the summaries ", head_dim_);
    const std::int32_t have = tokens(id);
    OOMB_EXPECTS(first_token == 0 || first_token == have, "page_summaries: page ", id, " holds ",
                 have, " tokens; cannot append at token ", first_token,
                 " (tokens come in order; 0 restarts the page)");
    OOMB_EXPECTS(n >= 0 && n <= std::numeric_limits<std::int32_t>::max() - first_token,
                 "page_summaries: bad token count ", n, " at token ", first_token);
    const auto& st = keys.strides();
    // Rows of head_dim channels; a unit channel stride (the common case) gets its own loop so
    // the compiler vectorises it.
    const auto for_each_row = [&](auto&& fn) {
      for (std::int64_t t = 0; t < n; ++t)  // token order outermost: sums independent of chunking
        for (std::int64_t h = 0; h < kv_heads_; ++h) {
          const auto* row = keys.data() + t * st[0] + h * st[1];
          if (st[2] == 1)
            fn(t, h, row, std::integral_constant<std::int64_t, 1>{});
          else
            fn(t, h, row, st[2]);
        }
    };
    // Check everything before touching anything: strong guarantee.
    bool finite = true;
    for_each_row([&](std::int64_t, std::int64_t, const auto* row, auto step) {
      int ok = 1;  // a local flag (not the captured bool) lets the loop vectorise
      for (std::int64_t d = 0; d < head_dim_; ++d)
        ok &= std::abs(detail::key_to_float(row[d * step])) <= std::numeric_limits<float>::max();
      finite = finite && ok;
    });
    if (!finite)
      for_each_row([&](std::int64_t t, std::int64_t h, const auto* row, auto step) {
        for (std::int64_t d = 0; d < head_dim_; ++d)
          OOMB_EXPECTS(std::isfinite(detail::key_to_float(row[d * step])), "page_summaries: non-finite key ",
                       detail::key_to_float(row[d * step]), " at page ", id, ", token ", first_token + t,
                       ", kv head ", h, ", channel ", d);
      });
    if (id >= num_ids()) grow_to(id + 1, /*geometric=*/true);
    if (first_token == 0) reset(id);

    const std::int64_t row_len = std::int64_t(kv_heads_) * head_dim_;
    float* const mn0 = min_.data() + std::int64_t(id) * row_len;
    float* const mx0 = max_.data() + std::int64_t(id) * row_len;
    double* const sum0 = sum_.data() + std::int64_t(id) * row_len;
    for_each_row([&](std::int64_t, std::int64_t h, const auto* row, auto step) {
      float* mn = mn0 + h * head_dim_;
      float* mx = mx0 + h * head_dim_;
      double* sum = sum0 + h * head_dim_;
      for (std::int64_t d = 0; d < head_dim_; ++d) {
        const auto& k = row[d * step];
        const float f = detail::key_to_float(k);
        mn[d] = f < mn[d] ? f : mn[d];
        mx[d] = f > mx[d] ? f : mx[d];
        sum[d] += detail::key_to_double(k);
      }
    });
    const std::int32_t count = first_token + static_cast<std::int32_t>(n);
    tokens_[static_cast<std::size_t>(id)] = count;
    float* mean = mean_.data() + std::int64_t(id) * row_len;
    for (std::int64_t i = 0; i < row_len; ++i)
      mean[i] = count == 0 ? 0.0f : static_cast<float>(sum0[i] / count);
  }

  /// Appends tokens [first_token, first_token + count) of the K page of `id`, read from `pool`.
  template <class E>
  void update_from_pool(const page_pool_view<E>& pool, std::int32_t id, std::int32_t first_token,
                        std::int32_t count) {
    OOMB_EXPECTS(pool.kv_heads == kv_heads_ && pool.head_dim == head_dim_,
                 "page_summaries: pool pages have ", pool.kv_heads, " KV heads of head_dim ",
                 pool.head_dim, ", the summaries ", kv_heads_, " of ", head_dim_);
    OOMB_EXPECTS(first_token >= 0 && count >= 0 && first_token + std::int64_t(count) <= pool.page_size,
                 "page_summaries: tokens [", first_token, ", ", first_token + std::int64_t(count),
                 ") do not fit a page of ", pool.page_size);
    OOMB_EXPECTS(id >= 0, "page_summaries: page id must not be negative, got ", id);
    const tensor_view<const E, 3> keys(pool.k(id, first_token, 0), {count, kv_heads_, head_dim_},
                                       {pool.stride_token, pool.stride_head, 1});
    update(id, first_token, keys);
  }

  /// Forgets page `id` (released): its summary becomes empty. Ids never seen are ignored.
  void clear(std::int32_t id) noexcept {
    if (id >= 0 && id < num_ids()) reset(id);
  }

  /// Tokens summarised for page `id` (0 for ids never seen).
  std::int32_t tokens(std::int32_t id) const noexcept {
    return id >= 0 && id < num_ids() ? tokens_[static_cast<std::size_t>(id)] : 0;
  }

  std::int32_t num_ids() const noexcept { return static_cast<std::int32_t>(tokens_.size()); }
  std::int32_t kv_heads() const noexcept { return kv_heads_; }
  std::int32_t head_dim() const noexcept { return head_dim_; }

  /// The POD view kernels and scorers read (see the class comment for its lifetime).
  page_summary_view view() const noexcept {
    page_summary_view v;
    v.min = min_.data();
    v.max = max_.data();
    v.mean = mean_.data();
    v.tokens = tokens_.data();
    v.num_ids = num_ids();
    v.kv_heads = kv_heads_;
    v.head_dim = head_dim_;
    return v;
  }

 private:
  std::size_t row() const noexcept { return static_cast<std::size_t>(kv_heads_) * head_dim_; }

  // Reserve everything first, then resize within capacity: either all arrays grow or none.
  // Growth from update() is geometric (at least doubling the ids held), so ids seen in ascending
  // order cost amortised O(1) copies each; reserve() asks for exactly what it is given.
  void grow_to(std::int32_t ids, bool geometric = false) {
    const std::size_t n = static_cast<std::size_t>(ids);
    const std::size_t have = tokens_.capacity();
    const std::size_t cap = n <= have ? have : geometric ? std::max(n, 2 * have) : n;
    const std::size_t elems = cap * row();
    OOMB_CHECK(elems / row() == cap, out_of_memory, "page_summaries: ", cap, " ids of ", row(),
               " channels overflow the address space");
    min_.reserve(elems);
    max_.reserve(elems);
    mean_.reserve(elems);
    sum_.reserve(elems);
    tokens_.reserve(cap);
    const std::size_t used = n * row();
    min_.resize(used, std::numeric_limits<float>::infinity());
    max_.resize(used, -std::numeric_limits<float>::infinity());
    mean_.resize(used, 0.0f);
    sum_.resize(used, 0.0);
    tokens_.resize(n, 0);
  }

  void reset(std::int32_t id) noexcept {
    const std::size_t first = static_cast<std::size_t>(id) * row();
    for (std::size_t i = first; i < first + row(); ++i) {
      min_[i] = std::numeric_limits<float>::infinity();
      max_[i] = -std::numeric_limits<float>::infinity();
      mean_[i] = 0.0f;
      sum_[i] = 0.0;
    }
    tokens_[static_cast<std::size_t>(id)] = 0;
  }

  std::int32_t kv_heads_;
  std::int32_t head_dim_;
  std::vector<float> min_, max_, mean_;
  std::vector<double> sum_;  // host only: the exact running sum behind mean_
  std::vector<std::int32_t> tokens_;
};

OOMB_NAMESPACE_END
