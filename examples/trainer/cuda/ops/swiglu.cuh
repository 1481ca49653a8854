// oomb trainer — the SwiGLU gate of Qwen2's MLP on the GPU, as cpu/swiglu.hpp: h = silu(g) * u.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class E, class H>
__global__ void swiglu_forward_kernel(std::int64_t n, const E* __restrict__ g, const E* __restrict__ u, H* __restrict__ h) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float gi = load(g[i]);
    h[i] = store<H>(gi * sigmoid(gi) * load(u[i]));
  }
}

template <class E, class D, class DG>
__global__ void swiglu_backward_kernel(std::int64_t n, const E* __restrict__ g, const E* __restrict__ u,
                                       const D* __restrict__ dh, DG* __restrict__ dg, DG* __restrict__ du) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float gi = load(g[i]), ui = load(u[i]), d = load(dh[i]), s = sigmoid(gi);
    du[i] = store<DG>(d * gi * s);
    dg[i] = store<DG>(d * ui * s * (1.0f + gi * (1.0f - s)));
  }
}

inline void check_swiglu(const char* what, std::int64_t n, bool pointers) {
  OOMB_EXPECTS(n > 0, what, ": n must be positive, got ", n);
  OOMB_EXPECTS(pointers, what, ": null pointer");
}

}  // namespace detail

/// h[i] = silu(g[i]) * u[i] for i < n. E (g, u), H: bf16 or float.
template <class E, class H>
void swiglu_forward(std::int64_t n, const E* g, const E* u, H* h, stream_view stream) {
  static_assert(is_element_v<E> && is_element_v<H>, "swiglu_forward: bf16 or float");
  detail::check_swiglu("swiglu_forward", n, g != nullptr && u != nullptr && h != nullptr);
  detail::swiglu_forward_kernel<<<detail::grid_for(n, 256), 256, 0, stream.get()>>>(n, g, u, h);
  OOMB_OPS_CHECK_LAUNCH("swiglu_forward");
}

/// dg = dh * u * silu'(g), du = dh * silu(g) (written, not accumulated). E (g, u), D (dh), DG (dg,
/// du): bf16 or float.
template <class E, class D, class DG>
void swiglu_backward(std::int64_t n, const E* g, const E* u, const D* dh, DG* dg, DG* du, stream_view stream) {
  static_assert(is_element_v<E> && is_element_v<D> && is_element_v<DG>, "swiglu_backward: bf16 or float");
  detail::check_swiglu("swiglu_backward", n, g != nullptr && u != nullptr && dh != nullptr && dg != nullptr && du != nullptr);
  detail::swiglu_backward_kernel<<<detail::grid_for(n, 256), 256, 0, stream.get()>>>(n, g, u, dh, dg, du);
  OOMB_OPS_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace oomb_trainer::gpu::ops
