// oomb trainer — RMSNorm (Qwen2RMSNorm): y = w * x / sqrt(mean(x^2) + eps), row by row.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>

#include "trainer/cpu/common.hpp"

namespace oomb_trainer::cpu {

/// y [n][H] = w * x * rstd, rstd [n] = 1 / sqrt(mean(x^2) + eps) (kept for the backward).
template <class T>
void rmsnorm_forward(std::int64_t n, std::int32_t H, const T* x, const T* w, T eps, T* y, T* rstd) {
  for (std::int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * H;
    T* yr = y + t * H;
    const T r = T(1) / std::sqrt(dot<T>(xr, xr, H) / T(H) + eps);
    rstd[t] = r;
    for (std::int32_t i = 0; i < H; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

/// dx [n][H] += d(y)/dx^T dy;  dw [H] += sum_t dy * x * rstd.
///   dx_j = r * w_j * dy_j - r^3 * x_j / H * sum_i dy_i * w_i * x_i
template <class T>
void rmsnorm_backward(std::int64_t n, std::int32_t H, const T* x, const T* w, const T* rstd, const T* dy,
                      T* dx, T* dw) {
  for (std::int64_t t = 0; t < n; ++t) {
    const T* xr = x + t * H;
    const T* dyr = dy + t * H;
    T* dxr = dx + t * H;
    const T r = rstd[t];
    T s[lanes] = {};
    std::int32_t i = 0;
    for (; i + lanes <= H; i += lanes)
      for (int k = 0; k < lanes; ++k) s[k] += dyr[i + k] * w[i + k] * xr[i + k];
    for (int wdt = lanes / 2; wdt > 0; wdt /= 2)
      for (int k = 0; k < wdt; ++k) s[k] += s[k + wdt];
    T sum = s[0];
    for (; i < H; ++i) sum += dyr[i] * w[i] * xr[i];
    const T c = r * r * r * sum / T(H);
    for (std::int32_t j = 0; j < H; ++j) {
      dxr[j] += r * w[j] * dyr[j] - c * xr[j];
      dw[j] += dyr[j] * (xr[j] * r);
    }
  }
}

}  // namespace oomb_trainer::cpu
