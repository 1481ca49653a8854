// oomb trainer — a fixed-order sum on the device: the step's loss, added up from its per-row
// losses without a float atomic, so every run gives the same bits.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

/// *sum += v[0] + ... + v[n-1], one block, in double, in a fixed order.
template <int Threads>
__global__ void add_sum_kernel(std::int64_t n, const float* v, double* sum) {
  __shared__ double part[Threads];
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += Threads) s += double(v[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = Threads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum += part[0];
}

}  // namespace detail

/// *sum (one double in device memory) += the n floats of v, summed in double in a fixed order.
inline void add_sum(std::int64_t n, const float* v, double* sum, stream_view stream) {
  OOMB_EXPECTS(n >= 0, "add_sum: n must not be negative, got ", n);
  OOMB_EXPECTS(v != nullptr && sum != nullptr, "add_sum: null pointer");
  detail::add_sum_kernel<256><<<1, 256, 0, stream.get()>>>(n, v, sum);
  OOMB_OPS_CHECK_LAUNCH("add_sum");
}

}  // namespace oomb_trainer::gpu::ops
