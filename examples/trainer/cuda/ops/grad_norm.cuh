// oomb trainer — the global gradient norm and the clipping factor on the device, as
// optim/clip.hpp, without a host synchronisation:
//   grad_norm_begin(partials)               zeroes the partial sums
//   grad_norm_accumulate(n, g, partials)    once per gradient tensor (any number)
//   grad_norm_finish(partials, max_norm, norm, scale)
// writes norm = sqrt(sum g^2) and scale = max_norm / (norm + 1e-6) when norm > max_norm (finite,
// max_norm > 0), else 1, both to device memory; adamw_update reads the scale. Block b always adds
// into partial b and the partials are summed in order, so the norm is the same bits on every run.
// Squares are summed in fp32 per block, the partials in double.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

/// Partial sums (floats) grad_norm_* use: the `partials` array's length.
inline constexpr int grad_norm_partials = 1024;

namespace detail {

constexpr int grad_norm_threads = 256;

template <class G>
__global__ void __launch_bounds__(grad_norm_threads) grad_norm_kernel(std::int64_t n, const G* __restrict__ g,
                                                                      float* __restrict__ partials) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float x = load(g[i]);
    s += x * x;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] += s;
}

// A template so two translation units may include this header (one definition per instantiation).
template <int = 0>
__global__ void grad_norm_finish_kernel(const float* __restrict__ partials, float max_norm, float* __restrict__ norm,
                                        float* __restrict__ scale) {
  double s = 0.0;
  for (int b = 0; b < grad_norm_partials; ++b) s += double(partials[b]);
  const double r = sqrt(s);
  *norm = static_cast<float>(r);
  if (scale != nullptr)
    *scale = max_norm > 0.0f && isfinite(r) && r > double(max_norm) ? static_cast<float>(double(max_norm) / (r + 1e-6)) : 1.0f;
}

}  // namespace detail

/// Zeroes the grad_norm_partials floats at `partials` (device).
inline void grad_norm_begin(float* partials, stream_view stream) {
  OOMB_EXPECTS(partials != nullptr, "grad_norm_begin: null pointer");
  OOMB_CUDA_CHECK(cudaMemsetAsync(partials, 0, grad_norm_partials * sizeof(float), stream.get()),
                  "grad_norm_begin: zeroing the partial sums");
}

/// Adds the squares of g [n] (G: float or bf16) into the partial sums.
template <class G>
void grad_norm_accumulate(std::int64_t n, const G* g, float* partials, stream_view stream) {
  static_assert(is_element_v<G>, "grad_norm_accumulate: g is float or bf16");
  OOMB_EXPECTS(n >= 0, "grad_norm_accumulate: negative n ", n);
  OOMB_EXPECTS(partials != nullptr && (g != nullptr || n == 0), "grad_norm_accumulate: null pointer");
  if (n == 0) return;
  detail::grad_norm_kernel<<<grad_norm_partials, detail::grad_norm_threads, 0, stream.get()>>>(n, g, partials);
  OOMB_OPS_CHECK_LAUNCH("grad_norm_accumulate");
}

/// Writes the norm and (when `scale` is not null) the clipping factor for `max_norm` (<= 0: no
/// clipping, scale 1; a non-finite norm also gives 1, as clip_grad_norm leaves such gradients be).
inline void grad_norm_finish(const float* partials, float max_norm, float* norm, float* scale, stream_view stream) {
  OOMB_EXPECTS(partials != nullptr && norm != nullptr, "grad_norm_finish: null pointer");
  OOMB_EXPECTS(!std::isnan(max_norm), "grad_norm_finish: max_norm is NaN");
  detail::grad_norm_finish_kernel<><<<1, 1, 0, stream.get()>>>(partials, max_norm, norm, scale);
  OOMB_OPS_CHECK_LAUNCH("grad_norm_finish");
}

}  // namespace oomb_trainer::gpu::ops
