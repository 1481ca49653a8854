// oomb trainer — the SwiGLU gate of Qwen2's MLP: h = silu(g) * u.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>

namespace oomb_trainer::cpu {

/// h[i] = silu(g[i]) * u[i] for i < n, silu(x) = x * sigmoid(x).
template <class T>
void swiglu_forward(std::int64_t n, const T* g, const T* u, T* h) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

/// dg = dh * u * silu'(g), du = dh * silu(g) (written, not accumulated);
/// silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
template <class T>
void swiglu_backward(std::int64_t n, const T* g, const T* u, const T* dh, T* dg, T* du) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    du[i] = dh[i] * g[i] * s;
    dg[i] = dh[i] * u[i] * s * (T(1) + g[i] * (T(1) - s));
  }
}

}  // namespace oomb_trainer::cpu
