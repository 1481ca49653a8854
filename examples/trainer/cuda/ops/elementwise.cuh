// oomb trainer — the elementwise glue between the ops: a type conversion (fp32 gradients become
// the bf16 inputs cuBLASLt takes), an in-place add (the residual connections, as block.hpp's
// x1 += x and x += x1), both in fp32 arithmetic; a fill and an in-place scale (the batch mean).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

template <class S, class D>
__global__ void convert_kernel(std::int64_t n, const S* __restrict__ src, D* __restrict__ dst) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = store<D>(load(src[i]));
}

template <class S, class D>
__global__ void add_into_kernel(std::int64_t n, const S* __restrict__ src, D* __restrict__ dst) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = store<D>(load(dst[i]) + load(src[i]));
}

template <class X>
__global__ void fill_kernel(std::int64_t n, X value, X* __restrict__ dst) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <int = 0>
__global__ void scale_kernel(std::int64_t n, float factor, float* __restrict__ x) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] *= factor;
}

inline void check_elementwise(const char* what, std::int64_t n, const void* src, const void* dst) {
  OOMB_EXPECTS(n > 0, what, ": n must be positive, got ", n);
  OOMB_EXPECTS(src != nullptr && dst != nullptr, what, ": null pointer");
  OOMB_EXPECTS(src != dst, what, ": src and dst must not be the same array");
}

}  // namespace detail

/// dst[i] = src[i] for i < n, converted (bf16 rounds to nearest even). S, D: bf16 or float.
template <class S, class D>
void convert(std::int64_t n, const S* src, D* dst, stream_view stream) {
  static_assert(is_element_v<S> && is_element_v<D>, "convert: bf16 or float");
  detail::check_elementwise("convert", n, src, dst);
  detail::convert_kernel<<<detail::grid_for(n, 256, 4096), 256, 0, stream.get()>>>(n, src, dst);
  OOMB_OPS_CHECK_LAUNCH("convert");
}

/// dst[i] += src[i] for i < n (sum in fp32, stored as D). S, D: bf16 or float.
template <class S, class D>
void add_into(std::int64_t n, const S* src, D* dst, stream_view stream) {
  static_assert(is_element_v<S> && is_element_v<D>, "add_into: bf16 or float");
  detail::check_elementwise("add_into", n, src, dst);
  detail::add_into_kernel<<<detail::grid_for(n, 256, 4096), 256, 0, stream.get()>>>(n, src, dst);
  OOMB_OPS_CHECK_LAUNCH("add_into");
}

/// dst[i] = value for i < n (nothing for n = 0). X: bf16 or float.
template <class X>
void fill(std::int64_t n, X value, X* dst, stream_view stream) {
  static_assert(is_element_v<X>, "fill: bf16 or float");
  OOMB_EXPECTS(n >= 0, "fill: n must not be negative, got ", n);
  if (n == 0) return;
  OOMB_EXPECTS(dst != nullptr, "fill: null pointer");
  detail::fill_kernel<<<detail::grid_for(n, 256, 4096), 256, 0, stream.get()>>>(n, value, dst);
  OOMB_OPS_CHECK_LAUNCH("fill");
}

/// x[i] *= factor for i < n, in fp32.
inline void scale(std::int64_t n, float factor, float* x, stream_view stream) {
  OOMB_EXPECTS(n > 0, "scale: n must be positive, got ", n);
  OOMB_EXPECTS(x != nullptr, "scale: null pointer");
  detail::scale_kernel<><<<detail::grid_for(n, 256, 4096), 256, 0, stream.get()>>>(n, factor, x);
  OOMB_OPS_CHECK_LAUNCH("scale");
}

}  // namespace oomb_trainer::gpu::ops
