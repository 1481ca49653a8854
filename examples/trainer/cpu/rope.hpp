// oomb trainer — rotary position embedding, HF's rotate-half convention, at absolute positions.
// SPDX-License-Identifier: Apache-2.0
//
// Dimension i < d/2 of a head pairs with dimension i + d/2 and both rotate by the angle
// pos * inv_freq[i] (model/rope_frequencies.hpp: theta^(-2i/d) for plain RoPE, rescaled by the
// context-extension types), with cos and sin multiplied by the attention factor. Angles, cos and
// sin are computed in double and rounded to fp32 (the design brief's rule), in every build: a
// double model holds the same fp32 values as doubles, so the float and double models rotate by
// exactly the same numbers, and the HF fixtures (tools/fixtures/make_hf_fixture.py, which
// overrides HF's fp32 computation to do the same) match at 1e-9. Both training paths use the same
// tables, so the chunk-recurrent vs full-sequence checks are unaffected by the rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/model/rope_frequencies.hpp"

namespace oomb_trainer::cpu {

/// cos and sin (fp32 values) of the rotation angles of n rows: consecutive positions from `first`,
/// or the positions of a list (packed documents restart theirs at each document).
template <class T>
struct rope_table {
  std::int64_t n = 0;
  std::int32_t half = 0;  ///< d / 2
  std::vector<T> cos, sin;  ///< [n][half]

  rope_table() = default;
  rope_table(std::int64_t first, std::int64_t count, const rope_frequencies& f)
      : rope_table(count, f, [first](std::int64_t t) { return first + t; }) {
    OOMB_EXPECTS(first >= 0, "rope: bad position range [", first, ", ", first + count, ")");
  }
  /// Row t at position positions[t] (>= 0). (Named: a constructor would make rope_table(0, n, f) ambiguous.)
  static rope_table at_positions(const std::int64_t* positions, std::int64_t count, const rope_frequencies& f) {
    return rope_table(count, f, [positions](std::int64_t t) {
      OOMB_EXPECTS(positions[t] >= 0, "rope: negative position ", positions[t], " at row ", t);
      return positions[t];
    });
  }

 private:
  template <class PositionOf>
  rope_table(std::int64_t count, const rope_frequencies& f, PositionOf position_of) : n(count), half(f.head_dim() / 2) {
    OOMB_EXPECTS(half > 0, "rope: no frequencies");
    OOMB_EXPECTS(count >= 0, "rope: negative row count ", count);
    cos.resize(static_cast<std::size_t>(n * half));
    sin.resize(cos.size());
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int32_t i = 0; i < half; ++i) {
        const double angle = double(position_of(t)) * f.inv_freq[static_cast<std::size_t>(i)];
        const std::size_t at = static_cast<std::size_t>(t * half + i);
        cos[at] = static_cast<T>(static_cast<float>(std::cos(angle) * f.attention_factor));
        sin[at] = static_cast<T>(static_cast<float>(std::sin(angle) * f.attention_factor));
      }
  }
};

/// Rotates x [n][heads][d] in place: row t by the angles of the table's row t.
template <class T>
void rope_forward(std::int64_t n, std::int32_t heads, std::int32_t d, T* x, const rope_table<T>& table) {
  const std::int32_t half = d / 2;
  for (std::int64_t t = 0; t < n; ++t) {
    const T* c = table.cos.data() + t * half;
    const T* s = table.sin.data() + t * half;
    for (std::int32_t h = 0; h < heads; ++h) {
      T* a = x + (t * heads + h) * d;
      T* b = a + half;
      for (std::int32_t i = 0; i < half; ++i) {
        const T xa = a[i], xb = b[i];
        a[i] = xa * c[i] - xb * s[i];
        b[i] = xb * c[i] + xa * s[i];
      }
    }
  }
}

/// The backward of rope_forward: rotates the gradient dx [n][heads][d] back, in place.
template <class T>
void rope_backward(std::int64_t n, std::int32_t heads, std::int32_t d, T* dx, const rope_table<T>& table) {
  const std::int32_t half = d / 2;
  for (std::int64_t t = 0; t < n; ++t) {
    const T* c = table.cos.data() + t * half;
    const T* s = table.sin.data() + t * half;
    for (std::int32_t h = 0; h < heads; ++h) {
      T* a = dx + (t * heads + h) * d;
      T* b = a + half;
      for (std::int32_t i = 0; i < half; ++i) {
        const T ga = a[i], gb = b[i];
        a[i] = ga * c[i] + gb * s[i];
        b[i] = gb * c[i] - ga * s[i];
      }
    }
  }
}

}  // namespace oomb_trainer::cpu
