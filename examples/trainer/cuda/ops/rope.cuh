// oomb trainer — rotary position embedding on the GPU, HF's rotate-half convention, as
// cpu/rope.hpp. The kernels read cos/sin from tables the host computed in double and rounded to
// fp32 (cpu::rope_table<float>: an fp32 angle would be ~0.1 rad off at 4M positions), copied to
// the device by the caller; rope_table_view points at that copy.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <oomb/attention/rope_table.hpp>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

/// Device cos/sin [n][half] of n consecutive positions (row t: the position of x's row t); the
/// attention layer's type, so the same table feeds the K/V page writes that rotate K on the way.
using rope_table_view = oomb::attention::rope_table_view;

namespace detail {

/// Thread per (row, head, i < half): rotates the pair (i, i + half) by +angle (forward) or -angle
/// (backward, the transpose).
template <bool Backward, class E>
__global__ void rope_kernel(std::int64_t count, std::int32_t heads, std::int32_t half, E* __restrict__ x,
                            const float* __restrict__ cos_t, const float* __restrict__ sin_t) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < count;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int32_t i = static_cast<std::int32_t>(k % half);
    const std::int64_t th = k / half;  // row * heads + head
    const std::int64_t t = th / heads;
    const float c = cos_t[t * half + i], s = Backward ? -sin_t[t * half + i] : sin_t[t * half + i];
    E* a = x + th * 2 * half;
    const float xa = load(a[i]), xb = load(a[i + half]);
    a[i] = store<E>(xa * c - xb * s);
    a[i + half] = store<E>(xb * c + xa * s);
  }
}

template <bool Backward, class E>
void rope_launch(const char* what, std::int64_t n, std::int32_t heads, std::int32_t d, E* x, const rope_table_view& table,
                 stream_view stream) {
  static_assert(is_element_v<E>, "rope: x is bf16 or float");
  OOMB_EXPECTS(n > 0 && heads > 0, what, ": n and heads must be positive, got ", n, ", ", heads);
  OOMB_EXPECTS(d > 0 && d % 2 == 0, what, ": head_dim must be even and positive, got ", d);
  OOMB_EXPECTS(x != nullptr && table.cos != nullptr && table.sin != nullptr, what, ": null pointer");
  OOMB_EXPECTS(table.half == d / 2, what, ": the table is for head_dim ", 2 * table.half, ", x has head_dim ", d);
  OOMB_EXPECTS(table.n >= n, what, ": the table holds ", table.n, " positions, x has ", n, " rows");
  const std::int64_t count = n * heads * (d / 2);
  rope_kernel<Backward><<<grid_for(count, 256), 256, 0, stream.get()>>>(count, heads, d / 2, x, table.cos, table.sin);
  OOMB_OPS_CHECK_LAUNCH(what);
}

}  // namespace detail

/// Rotates x [n][heads][d] in place (row t at the table's position t). E: bf16 or float.
template <class E>
void rope_forward(std::int64_t n, std::int32_t heads, std::int32_t d, E* x, const rope_table_view& table,
                  stream_view stream) {
  detail::rope_launch<false>("rope_forward", n, heads, d, x, table, stream);
}

/// The backward of rope_forward: rotates the gradient dx [n][heads][d] back, in place.
template <class E>
void rope_backward(std::int64_t n, std::int32_t heads, std::int32_t d, E* dx, const rope_table_view& table,
                   stream_view stream) {
  detail::rope_launch<true>("rope_backward", n, heads, d, dx, table, stream);
}

}  // namespace oomb_trainer::gpu::ops
