// oomb — reductions whose summation order is fixed by the source, for CPU references.
// SPDX-License-Identifier: Apache-2.0
//
// A CPU reference is the oracle GPU kernels are checked against, so its rounding must not depend
// on the compiler or on where the values live: reductions run in `lanes` independent partial sums
// combined in one fixed order (so GCC can vectorise them without -ffast-math, and two calls on the
// same values give the same bits — the property the offload and sparse-all tests rely on).
#pragma once

#include <cstdint>
#include <type_traits>

#include "oomb/core/bf16.hpp"

OOMB_NAMESPACE_BEGIN
namespace fixed_order {

/// Reads a stored element (float, double, oomb::bf16; const or not) as the arithmetic scalar T.
template <class T, class E>
inline T load(E e) noexcept {
  using U = std::remove_cv_t<E>;
  if constexpr (std::is_same_v<U, bf16>)
    return static_cast<T>(static_cast<float>(e));
  else
    return static_cast<T>(e);
}

/// Stores the arithmetic scalar T as element E (bf16 rounds to nearest even through float).
template <class E, class T>
inline E store(T t) noexcept {
  if constexpr (std::is_same_v<E, bf16>)
    return bf16(static_cast<float>(t));
  else
    return static_cast<E>(t);
}

/// Independent partial sums of a reduction; 8 fills one AVX register of float.
inline constexpr int lanes = 8;

/// sum_i a[i] * b[i] in T, in a fixed order: lane k sums i = k, k + lanes, ...; lanes are then
/// combined pairwise; the tail is added last.
template <class T, class A, class B>
inline T dot(const A* __restrict a, const B* __restrict b, std::int64_t n) noexcept {
  T acc[lanes] = {};
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int k = 0; k < lanes; ++k) acc[k] += load<T>(a[i + k]) * load<T>(b[i + k]);
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) s += load<T>(a[i]) * load<T>(b[i]);
  return s;
}

/// y[i] += alpha * x[i]; x and y do not overlap.
template <class T, class X>
inline void axpy(std::int64_t n, T alpha, const X* __restrict x, T* __restrict y) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * load<T>(x[i]);
}

/// y[i] = G(T(y[i]) + alpha * x[i]) for a stored element type G (a gradient page).
template <class T, class G>
inline void axpy_store(std::int64_t n, T alpha, const T* __restrict x, G* __restrict y) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] = store<G>(load<T>(y[i]) + alpha * x[i]);
}

}  // namespace fixed_order
OOMB_NAMESPACE_END
