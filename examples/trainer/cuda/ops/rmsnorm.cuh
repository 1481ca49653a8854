// oomb trainer — RMSNorm forward and backward on the GPU, as cpu/rmsnorm.hpp:
//   y = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps)   (statistics in fp32)
// The backward adds into dx (fp32) and into dw (fp32) through per-chunk partial sums combined in a
// fixed order, so dw is the same on every run; the partials live in the caller's workspace
// (rmsnorm_backward_workspace_bytes).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

constexpr int rmsnorm_threads = 256;
constexpr int rmsnorm_rows_per_chunk = 8;  // 512 blocks for a 4,096-token chunk: every SM busy
constexpr std::int32_t rmsnorm_max_hidden = 10240;  // the backward keeps an fp32 dw row in 48 KB of shared memory

inline void check_rmsnorm(const char* what, std::int64_t n, std::int32_t H) {
  OOMB_EXPECTS(n > 0 && H > 0, what, ": n and H must be positive, got ", n, ", ", H);
  OOMB_EXPECTS(H <= rmsnorm_max_hidden, what, ": H must be at most ", rmsnorm_max_hidden, ", got ", H);
}

inline std::int64_t rmsnorm_chunks(std::int64_t n) { return (n + rmsnorm_rows_per_chunk - 1) / rmsnorm_rows_per_chunk; }

template <class X, class Y>
__global__ void __launch_bounds__(rmsnorm_threads) rmsnorm_forward_kernel(std::int32_t H, const X* __restrict__ x,
                                                                          const bf16* __restrict__ w, float eps,
                                                                          Y* __restrict__ y, float* __restrict__ rstd) {
  __shared__ float scratch[32];
  const std::int64_t t = blockIdx.x;
  const X* xr = x + t * H;
  float ss = 0.0f;
  for (std::int32_t i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = load(xr[i]);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum(ss, scratch) / float(H) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  Y* yr = y + t * H;
  for (std::int32_t i = threadIdx.x; i < H; i += blockDim.x) yr[i] = store<Y>(load(w[i]) * (load(xr[i]) * r));
}

/// One block per chunk of rows: dx rows written in place, the chunk's dw partial row to `partial`.
template <class X, class G>
__global__ void __launch_bounds__(rmsnorm_threads) rmsnorm_backward_kernel(
    std::int64_t n, std::int32_t H, const X* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ rstd,
    const G* __restrict__ dy, float* __restrict__ dx, float* __restrict__ partial) {
  extern __shared__ float dw_part[];  // [H]; thread k owns columns k, k + blockDim.x, ...
  __shared__ float scratch[32];
  for (std::int32_t j = threadIdx.x; j < H; j += blockDim.x) dw_part[j] = 0.0f;
  const std::int64_t t0 = std::int64_t(blockIdx.x) * rmsnorm_rows_per_chunk;
  const std::int64_t t1 = t0 + rmsnorm_rows_per_chunk < n ? t0 + rmsnorm_rows_per_chunk : n;
  for (std::int64_t t = t0; t < t1; ++t) {
    const X* xr = x + t * H;
    const G* dyr = dy + t * H;
    float s = 0.0f;
    for (std::int32_t i = threadIdx.x; i < H; i += blockDim.x) s += load(dyr[i]) * load(w[i]) * load(xr[i]);
    const float r = rstd[t];
    const float c = r * r * r * block_sum(s, scratch) / float(H);
    float* dxr = dx + t * H;
    for (std::int32_t j = threadIdx.x; j < H; j += blockDim.x) {
      const float xj = load(xr[j]), gj = load(dyr[j]);
      dxr[j] += r * load(w[j]) * gj - c * xj;
      dw_part[j] += gj * (xj * r);
    }
  }
  float* out = partial + std::int64_t(blockIdx.x) * H;
  for (std::int32_t j = threadIdx.x; j < H; j += blockDim.x) out[j] = dw_part[j];
}

}  // namespace detail

/// y [n][H] = w * x * rstd and rstd [n] (fp32, kept for the backward). X, Y: bf16 or float.
template <class X, class Y>
void rmsnorm_forward(std::int64_t n, std::int32_t H, const X* x, const bf16* w, float eps, Y* y, float* rstd,
                     stream_view stream) {
  static_assert(is_element_v<X> && is_element_v<Y>, "rmsnorm_forward: x and y are bf16 or float");
  detail::check_rmsnorm("rmsnorm_forward", n, H);
  OOMB_EXPECTS(x != nullptr && w != nullptr && y != nullptr && rstd != nullptr, "rmsnorm_forward: null pointer");
  OOMB_EXPECTS(eps >= 0.0f, "rmsnorm_forward: eps must be >= 0, got ", eps);
  OOMB_EXPECTS(n < (std::int64_t(1) << 31), "rmsnorm_forward: at most 2^31 - 1 rows, got ", n);
  detail::rmsnorm_forward_kernel<<<unsigned(n), detail::rmsnorm_threads, 0, stream.get()>>>(H, x, w, eps, y, rstd);
  OOMB_OPS_CHECK_LAUNCH("rmsnorm_forward");
}

/// Bytes of workspace rmsnorm_backward needs for n rows of width H.
inline std::size_t rmsnorm_backward_workspace_bytes(std::int64_t n, std::int32_t H) {
  detail::workspace_carver c;
  c.take<float>(std::size_t(detail::rmsnorm_chunks(n)) * std::size_t(H));
  return c.bytes();
}

/// dx [n][H] += the gradient through the norm; dw [H] += sum_t dy * x * rstd (deterministic).
/// x and rstd are the forward's; X, G (dy): bf16 or float.
template <class X, class G>
void rmsnorm_backward(std::int64_t n, std::int32_t H, const X* x, const bf16* w, const float* rstd, const G* dy,
                      float* dx, float* dw, void* workspace, std::size_t workspace_bytes, stream_view stream) {
  static_assert(is_element_v<X> && is_element_v<G>, "rmsnorm_backward: x and dy are bf16 or float");
  detail::check_rmsnorm("rmsnorm_backward", n, H);
  OOMB_EXPECTS(x != nullptr && w != nullptr && rstd != nullptr && dy != nullptr && dx != nullptr && dw != nullptr,
               "rmsnorm_backward: null pointer");
  detail::check_workspace("rmsnorm_backward", workspace, workspace_bytes, rmsnorm_backward_workspace_bytes(n, H));
  const std::int64_t chunks = detail::rmsnorm_chunks(n);
  OOMB_EXPECTS(chunks < (std::int64_t(1) << 31), "rmsnorm_backward: too many rows: ", n);
  float* partial = detail::workspace_carver(workspace).take<float>(std::size_t(chunks) * std::size_t(H));
  detail::rmsnorm_backward_kernel<<<unsigned(chunks), detail::rmsnorm_threads, std::size_t(H) * sizeof(float),
                                    stream.get()>>>(n, H, x, w, rstd, dy, dx, partial);
  OOMB_OPS_CHECK_LAUNCH("rmsnorm_backward");
  detail::column_sum_add(chunks, H, static_cast<const float*>(partial), dw, stream, "rmsnorm_backward (dw)");
}

}  // namespace oomb_trainer::gpu::ops
