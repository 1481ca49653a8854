// oomb — the CPU reference of paged, windowed, optionally page-sparse causal attention.
// SPDX-License-Identifier: Apache-2.0
//
// This file is the contract the GPU kernels (include/oomb/attention/) mirror; see
// /work/ATTENTION_CONTRACT.md for its origin. One call handles the queries of one chunk against one
// *window* of key pages; windows partition the keys, so
//   - forward over several windows, folded with merge_partial, equals one pass over all pages (up to
//     rounding), and
//   - the sum of backward calls over the windows (each given the GLOBAL o and lse) equals one
//     backward pass.
// Causal mask everywhere: a query at absolute position p sees keys at positions <= p; with
// per-document bounds (key_lower) only those at positions >= its bound too, so packed documents
// attend within themselves (block-diagonal causal).
// GQA: query head h reads KV head h / (hq / hkv), as HF's repeat_kv.
//
// Summation order is fixed by the source (oomb/core/fixed_order.hpp), and a sparse call that selects every
// past page runs exactly the arithmetic of a dense call, so the two agree bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/core/fixed_order.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention::reference {

using fixed_order::axpy;
using fixed_order::axpy_store;
using fixed_order::dot;

/// One call's work: the queries of one chunk against one window of key pages.
template <class T, class E>
struct attention_args {
  const T* q = nullptr;              ///< [sq][hq][d] row-major; query i sits at absolute position q_start + i (RoPE applied)
  std::int64_t q_start = 0;
  std::int32_t sq = 0, hq = 0, hkv = 0, d = 0;  ///< GQA: query head h reads KV head h / (hq / hkv)
  T scale = T(1);                    ///< usually 1/sqrt(d)
  paged_kv_view<const E> kv;   ///< sequence 0 of kv.table lists the window's pages, which are the
  std::int32_t first_page = 0;       ///<   logical pages first_page, first_page + 1, ... of the sequence
  /// Optional page-sparse past: per tile of `tile` consecutive queries, the sorted logical indices
  /// of the past pages (those wholly before q_start) it attends. The chunk's own pages (positions
  /// >= q_start) are always attended causally. nullptr = dense.
  const std::int32_t* tile_indptr = nullptr;  ///< [ceil(sq / tile) + 1]
  const std::int32_t* tile_pages = nullptr;
  std::int32_t tile = 128;
  /// Optional per-document bounds: query i sees only keys at absolute positions >= key_lower[i]
  /// (the start of its document; documents start mid-page and mid-chunk). Non-decreasing in i and
  /// at most the query's own position q_start + i, so every query sees its own key and a block of
  /// rows needs no key below the bound of its first row. Pages wholly below a row's bound are
  /// never read for it; pages below key_lower[0] by no row (their table entries may be -1).
  /// nullptr = no bound (as all 0).
  const std::int64_t* key_lower = nullptr;  ///< [sq]
};

namespace detail {

template <class T, class E>
void check_args(const attention_args<T, E>& a) {
  OOMB_EXPECTS(a.sq >= 0, "attention: sq must be >= 0, got ", a.sq);
  OOMB_EXPECTS(a.hq > 0 && a.hkv > 0 && a.hq % a.hkv == 0,
               "attention: query heads (", a.hq, ") must be a positive multiple of KV heads (", a.hkv, ")");
  OOMB_EXPECTS(a.d > 0, "attention: head_dim must be positive, got ", a.d);
  OOMB_EXPECTS(a.q_start >= 0, "attention: q_start must be >= 0, got ", a.q_start);
  OOMB_EXPECTS(a.first_page >= 0, "attention: first_page must be >= 0, got ", a.first_page);
  OOMB_EXPECTS(a.kv.pool.head_dim == a.d && a.kv.pool.kv_heads == a.hkv,
               "attention: pages hold ", a.kv.pool.kv_heads, " KV heads of dim ", a.kv.pool.head_dim,
               " but the call has ", a.hkv, " of dim ", a.d);
  OOMB_EXPECTS(a.kv.table.num_seqs >= 1, "attention: the window table must list sequence 0");
  OOMB_EXPECTS(a.kv.table.page_size > 0 && a.kv.table.page_size == a.kv.pool.page_size,
               "attention: table page size ", a.kv.table.page_size, " differs from the pool's ",
               a.kv.pool.page_size);
  if (a.tile_indptr != nullptr) {
    OOMB_EXPECTS(a.tile > 0, "attention: a sparse call needs tile > 0, got ", a.tile);
    const std::int64_t tiles = (std::int64_t(a.sq) + a.tile - 1) / a.tile;
    OOMB_EXPECTS(a.tile_pages != nullptr || a.tile_indptr[tiles] == 0,
                 "attention: a sparse call selecting ", a.tile_indptr[tiles], " pages needs tile_pages");
  }
  if (a.key_lower != nullptr)
    for (std::int32_t i = 0; i < a.sq; ++i) {
      const std::int64_t lo = a.key_lower[i];
      OOMB_EXPECTS(lo >= 0 && lo <= a.q_start + i, "attention: key_lower[", i, "] = ", lo,
                   " must lie in [0, the query's position ", a.q_start + i, "]");
      OOMB_EXPECTS(i == 0 || lo >= a.key_lower[i - 1], "attention: key_lower must not decrease: key_lower[", i - 1,
                   "] = ", a.key_lower[i - 1], ", key_lower[", i, "] = ", lo);
    }
}

/// Walks the pages query `i` sees in the window, in page order, calling f(id, entry, start, begin,
/// end): the page's id in the pool, its entry in the window's table, the position of its first
/// token, and the tokens [begin, end) of it the query sees (causal, and from its key_lower on).
/// Past pages (wholly before q_start) not selected for the query's tile are skipped; a sparse call
/// visits the tile's selected pages inside the window directly, so its cost does not grow with the
/// pages it skips. Pages wholly below the query's bound are skipped without reading their entry.
template <class T, class E, class F>
void for_each_visible_page(const attention_args<T, E>& a, std::int32_t i, F&& f) {
  const std::int64_t qpos = a.q_start + i;
  const std::int64_t lower = a.key_lower != nullptr ? a.key_lower[i] : 0;
  const std::int32_t P = a.kv.table.page_size;
  const std::int32_t np = a.kv.table.num_pages(0);
  auto visit = [&](std::int32_t pi) {
    const std::int64_t start = (std::int64_t(a.first_page) + pi) * P;
    const std::int32_t len = a.kv.table.page_len(0, pi);
    const auto begin = static_cast<std::int32_t>(std::clamp<std::int64_t>(lower - start, 0, len));
    const auto end = static_cast<std::int32_t>(std::min<std::int64_t>(len, qpos - start + 1));
    if (begin < end) f(a.kv.table.page(0, pi), pi, start, begin, end);
  };
  // The entry of the page holding the bound: the first one the query may see.
  std::int32_t pi = static_cast<std::int32_t>(std::clamp<std::int64_t>(lower / P - a.first_page, 0, np));
  if (a.tile_indptr != nullptr) {
    // Past pages: the tile's selection (ascending logical indices) within the window, from the bound's page.
    const std::int32_t j = i / a.tile;
    const std::int32_t* sel = a.tile_pages + a.tile_indptr[j];
    const std::int32_t* sel_end = a.tile_pages + a.tile_indptr[j + 1];
    if (sel != sel_end) sel = std::lower_bound(sel, sel_end, a.first_page + pi);
    for (; sel != sel_end && *sel - a.first_page < np; ++sel) {
      const std::int32_t k = *sel - a.first_page;
      const std::int64_t start = std::int64_t(*sel) * P;
      if (start + a.kv.table.page_len(0, k) <= a.q_start) visit(k);
    }
    // Then the window's pages that are not past (from the page holding q_start on).
    pi = std::max(pi, static_cast<std::int32_t>(std::max<std::int64_t>(0, a.q_start / P - a.first_page)));
    while (pi < np && (std::int64_t(a.first_page) + pi) * P + a.kv.table.page_len(0, pi) <= a.q_start) ++pi;
  }
  for (; pi < np; ++pi) {
    if ((std::int64_t(a.first_page) + pi) * P > qpos) break;
    visit(pi);
  }
}

/// Most keys one query can see in the window (sizes the score buffers).
template <class T, class E>
std::int64_t max_visible_keys(const attention_args<T, E>& a) {
  const std::int32_t np = a.kv.table.num_pages(0);
  std::int64_t pages = np;
  if (a.tile_indptr != nullptr) {
    const std::int64_t tiles = (std::int64_t(a.sq) + a.tile - 1) / a.tile;
    std::int64_t most = 0;
    for (std::int64_t j = 0; j < tiles; ++j) most = std::max<std::int64_t>(most, a.tile_indptr[j + 1] - a.tile_indptr[j]);
    const std::int64_t not_past = np - std::max<std::int64_t>(0, std::min<std::int64_t>(np, a.q_start / a.kv.table.page_size - a.first_page));
    pages = std::min<std::int64_t>(np, most + not_past);
  }
  return pages * a.kv.table.page_size;
}

}  // namespace detail

/// Forward over the window: o [sq][hq][d], normalised within the window; lse [hq][sq] natural-log
/// log-sum-exp of the scaled scores (-inf where the window holds no key the query may see; o = 0
/// there).
template <class T, class E>
void attention_forward(const attention_args<T, E>& a, T* o, T* lse) {
  detail::check_args(a);
  const std::int32_t group = a.hq / a.hkv, d = a.d;
  const std::int64_t max_keys = detail::max_visible_keys(a);
  const std::int64_t st = a.kv.pool.stride_token;
  std::vector<T> s(static_cast<std::size_t>(group * max_keys));
  std::vector<const E*> vrow(static_cast<std::size_t>(max_keys));
  for (std::int32_t i = 0; i < a.sq; ++i) {
    for (std::int32_t g = 0; g < a.hkv; ++g) {
      // Scores of the group's heads against every visible key (K read once per group).
      const T* qg = a.q + (std::int64_t(i) * a.hq + g * group) * d;
      std::int64_t n = 0;
      detail::for_each_visible_page(a, i, [&](std::int32_t id, std::int32_t, std::int64_t, std::int32_t begin,
                                              std::int32_t end) {
        const E* k = a.kv.pool.k(id, 0, g);
        const E* v = a.kv.pool.v(id, 0, g);
        for (std::int32_t t = begin; t < end; ++t, ++n) {
          vrow[static_cast<std::size_t>(n)] = v + t * st;
          for (std::int32_t r = 0; r < group; ++r)
            s[static_cast<std::size_t>(r * max_keys + n)] = a.scale * dot<T>(qg + r * d, k + t * st, d);
        }
      });
      for (std::int32_t r = 0; r < group; ++r) {
        const std::int32_t h = g * group + r;
        T* oh = o + (std::int64_t(i) * a.hq + h) * d;
        std::fill(oh, oh + d, T(0));
        T& l = lse[std::int64_t(h) * a.sq + i];
        if (n == 0) {
          l = -std::numeric_limits<T>::infinity();
          continue;
        }
        T* sr = s.data() + r * max_keys;
        T m = sr[0];
        for (std::int64_t j = 1; j < n; ++j) m = std::max(m, sr[j]);
        T sum = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          sr[j] = std::exp(sr[j] - m);
          sum += sr[j];
        }
        for (std::int64_t j = 0; j < n; ++j) axpy(d, sr[j], vrow[static_cast<std::size_t>(j)], oh);
        const T inv = T(1) / sum;
        for (std::int32_t x = 0; x < d; ++x) oh[x] *= inv;
        l = m + std::log(sum);
      }
    }
  }
}

/// Folds one window's partial (o, lse) into an accumulator by log-sum-exp (associative; the
/// accumulator starts as lse = -inf, o = 0).
template <class T>
void merge_partial(std::int32_t sq, std::int32_t hq, std::int32_t d, T* o_acc, T* lse_acc, const T* o,
                   const T* lse) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (std::int32_t i = 0; i < sq; ++i) {
    for (std::int32_t h = 0; h < hq; ++h) {
      T& la = lse_acc[std::int64_t(h) * sq + i];
      const T lb = lse[std::int64_t(h) * sq + i];
      if (lb == ninf) continue;  // the window saw nothing: accumulator unchanged
      T* oa = o_acc + (std::int64_t(i) * hq + h) * d;
      const T* ob = o + (std::int64_t(i) * hq + h) * d;
      if (la == ninf) {
        std::copy(ob, ob + d, oa);
        la = lb;
        continue;
      }
      const T m = std::max(la, lb);
      const T wa = std::exp(la - m), wb = std::exp(lb - m);
      const T l = m + std::log(wa + wb);
      const T ca = std::exp(la - l), cb = std::exp(lb - l);
      for (std::int32_t x = 0; x < d; ++x) oa[x] = ca * oa[x] + cb * ob[x];
      la = l;
    }
  }
}

/// Backward over one window, given the GLOBAL o and lse (after all windows were merged) and d_o:
///   dq += ...                                   [sq][hq][d]
///   keys at positions >= q_start (the chunk's own): dk_own / dv_own += ...  [sq][hkv][d], row = pos - q_start
///   keys before q_start (the past): added into their gradient pages through dpast, one per entry
///   of kv.table (dpast.grad_page[j] must be >= 0 for every past page entry j the window reads)
template <class T, class E, class G>
void attention_backward(const attention_args<T, E>& a, const T* o, const T* lse, const T* d_o, T* dq,
                        T* dk_own, T* dv_own, window_grad_view<G> dpast) {
  detail::check_args(a);
  const std::int32_t group = a.hq / a.hkv, d = a.d;
  const T ninf = -std::numeric_limits<T>::infinity();
  const std::int64_t st = a.kv.pool.stride_token;
  std::vector<T> delta(static_cast<std::size_t>(group));
  std::int32_t checked_entry = -1;
  for (std::int32_t i = 0; i < a.sq; ++i) {
    for (std::int32_t g = 0; g < a.hkv; ++g) {
      // delta = rowsum(dO * O), the softmax backward's correction, per head of the group.
      for (std::int32_t r = 0; r < group; ++r) {
        const std::int64_t row = (std::int64_t(i) * a.hq + g * group + r) * d;
        delta[static_cast<std::size_t>(r)] = dot<T>(d_o + row, o + row, d);
      }
      detail::for_each_visible_page(a, i, [&](std::int32_t id, std::int32_t entry, std::int64_t start,
                                              std::int32_t begin, std::int32_t end) {
        const E* kb = a.kv.pool.k(id, 0, g);
        const E* vb = a.kv.pool.v(id, 0, g);
        if (start < a.q_start && entry != checked_entry) {
          OOMB_EXPECTS(dpast.grad_page != nullptr && entry < dpast.pages && dpast.grad_page[entry] >= 0,
                       "attention_backward: past page entry ", entry, " (id ", id, ", position ", start,
                       ") has no gradient page (", dpast.pages, " entries)");
          checked_entry = entry;
        }
        for (std::int32_t t = begin; t < end; ++t) {
          const std::int64_t pos = start + t;
          const E* k = kb + t * st;
          const E* v = vb + t * st;
          const bool own = pos >= a.q_start;
          T* dk_row = own ? dk_own + ((pos - a.q_start) * a.hkv + g) * d : nullptr;
          T* dv_row = own ? dv_own + ((pos - a.q_start) * a.hkv + g) * d : nullptr;
          for (std::int32_t r = 0; r < group; ++r) {
            const std::int32_t h = g * group + r;
            const T l = lse[std::int64_t(h) * a.sq + i];
            if (l == ninf) continue;
            const std::int64_t row = (std::int64_t(i) * a.hq + h) * d;
            const T* qh = a.q + row;
            const T* doh = d_o + row;
            const T p = std::exp(a.scale * dot<T>(qh, k, d) - l);
            const T dp = dot<T>(doh, v, d);
            const T ds = p * (dp - delta[static_cast<std::size_t>(r)]);
            axpy(d, a.scale * ds, k, dq + row);
            if (own) {
              axpy(d, a.scale * ds, qh, dk_row);
              axpy(d, p, doh, dv_row);
            } else {
              axpy_store(d, a.scale * ds, qh, dpast.dk(entry, t, g));
              axpy_store(d, p, doh, dpast.dv(entry, t, g));
            }
          }
        }
      });
    }
  }
}

}  // namespace attention::reference
OOMB_NAMESPACE_END
