// oomb trainer — y = x W^T + b with W in the HF layout [out][in].
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "trainer/cpu/common.hpp"

namespace oomb_trainer::cpu {

/// y [n][out] = x [n][in] W^T + b (b may be null).
template <class T>
void linear_forward(std::int64_t n, std::int32_t in, std::int32_t out, const T* x, const T* W, const T* b, T* y) {
  for (std::int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * in;
    T* yr = y + t * out;
    for (std::int32_t o = 0; o < out; ++o) {
      const T s = dot<T>(xr, W + std::int64_t(o) * in, in);
      yr[o] = b != nullptr ? s + b[o] : s;
    }
  }
}

/// dx [n][in] += dy W (skipped when dx is null); dW [out][in] += dy^T x; db [out] += sum_t dy (when
/// not null). Rows of dW and dx are updated with contiguous axpys (vectorised).
template <class T>
void linear_backward(std::int64_t n, std::int32_t in, std::int32_t out, const T* x, const T* W, const T* dy,
                     T* dx, T* dW, T* db) {
  for (std::int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * in;
    const T* dyr = dy + t * out;
    for (std::int32_t o = 0; o < out; ++o) {
      const T g = dyr[o];
      axpy(in, g, xr, dW + std::int64_t(o) * in);
      if (dx != nullptr) axpy(in, g, W + std::int64_t(o) * in, dx + t * in);
      if (db != nullptr) db[o] += g;
    }
  }
}

}  // namespace oomb_trainer::cpu
