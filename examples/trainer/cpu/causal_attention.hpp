// oomb trainer — causal GQA attention over contiguous arrays: the full-sequence baseline.
// SPDX-License-Identifier: Apache-2.0
//
// Deliberately independent of the paged reference (attention.hpp): the chunk-recurrent path runs
// paged, windowed attention and is checked against this one, so the two share no attention code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/cpu/common.hpp"

namespace oomb_trainer::cpu {

/// o [n][hq][d] and lse [hq][n] of causal softmax(scale * q k^T) v where query i sees key j <= i
/// only if visible(i, j) (which must hold for j = i): the reference of page-sparse attention
/// (full_sequence.hpp's selection_mask). k, v are [n][hkv][d] and query head h reads KV head
/// h / (hq / hkv).
template <class T, class Visible>
void masked_causal_attention_forward(std::int64_t n, std::int32_t hq, std::int32_t hkv, std::int32_t d, T scale,
                                     const T* q, const T* k, const T* v, T* o, T* lse, Visible&& visible) {
  const std::int32_t group = hq / hkv;
  std::vector<T> s(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    OOMB_EXPECTS(visible(i, i), "masked_causal_attention: query ", i, " must see its own key");
    for (std::int32_t h = 0; h < hq; ++h) {
      const std::int32_t g = h / group;
      const T* qh = q + (i * hq + h) * d;
      T m = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) {
        if (!visible(i, j)) continue;
        s[static_cast<std::size_t>(j)] = scale * dot<T>(qh, k + (j * hkv + g) * d, d);
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      T sum = 0;
      for (std::int64_t j = 0; j <= i; ++j)
        if (visible(i, j)) sum += (s[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - m));
      T* oh = o + (i * hq + h) * d;
      std::fill(oh, oh + d, T(0));
      for (std::int64_t j = 0; j <= i; ++j)
        if (visible(i, j)) axpy(d, s[static_cast<std::size_t>(j)] / sum, v + (j * hkv + g) * d, oh);
      lse[h * n + i] = m + std::log(sum);
    }
  }
}

/// dq, dk, dv (+=) of the masked forward above, given o, lse and d_o.
template <class T, class Visible>
void masked_causal_attention_backward(std::int64_t n, std::int32_t hq, std::int32_t hkv, std::int32_t d, T scale,
                                      const T* q, const T* k, const T* v, const T* o, const T* lse, const T* d_o,
                                      T* dq, T* dk, T* dv, Visible&& visible) {
  const std::int32_t group = hq / hkv;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int32_t h = 0; h < hq; ++h) {
      const std::int32_t g = h / group;
      const std::int64_t row = (i * hq + h) * d;
      const T delta = dot<T>(d_o + row, o + row, d);
      for (std::int64_t j = 0; j <= i; ++j) {
        if (!visible(i, j)) continue;
        const std::int64_t kr = (j * hkv + g) * d;
        const T p = std::exp(scale * dot<T>(q + row, k + kr, d) - lse[h * n + i]);
        const T ds = p * (dot<T>(d_o + row, v + kr, d) - delta);
        axpy(d, scale * ds, k + kr, dq + row);
        axpy(d, scale * ds, q + row, dk + kr);
        axpy(d, p, d_o + row, dv + kr);
      }
    }
}

namespace detail {
constexpr bool all_visible(std::int64_t, std::int64_t) noexcept { return true; }
}  // namespace detail

/// The dense causal attention: every key j <= i visible.
template <class T>
void causal_attention_forward(std::int64_t n, std::int32_t hq, std::int32_t hkv, std::int32_t d, T scale,
                              const T* q, const T* k, const T* v, T* o, T* lse) {
  masked_causal_attention_forward(n, hq, hkv, d, scale, q, k, v, o, lse, detail::all_visible);
}

/// dq, dk, dv (+=) of the dense forward, given o, lse and d_o.
template <class T>
void causal_attention_backward(std::int64_t n, std::int32_t hq, std::int32_t hkv, std::int32_t d, T scale,
                               const T* q, const T* k, const T* v, const T* o, const T* lse, const T* d_o,
                               T* dq, T* dk, T* dv) {
  masked_causal_attention_backward(n, hq, hkv, d, scale, q, k, v, o, lse, d_o, dq, dk, dv, detail::all_visible);
}

}  // namespace oomb_trainer::cpu
