// oomb trainer — seeded normal(0, std) initialisation on the GPU, counter-based: the value of a
// parameter depends only on the seed and its index in the model's parameter space, never on the
// launch shape or on how tensors are split into calls, so a 7B model initialises in milliseconds
// on the device instead of a minute on one host core, and the same (seed, index) always gives the
// same weight. (The CPU trainer's init_hf draws from mt19937_64 in order: other numbers, the
// same distribution.)
// SPDX-License-Identifier: Apache-2.0
//
// Parameter index g takes lane g % 4 of Philox4x32-10 (cuRAND's header-only device function)
// at counter (g / 4, 0) and key = seed; the four 32-bit words of a counter become two normals each
// by Box-Muller: words (r0, r1) give u = ((r0 >> 8) + 1) / 2^24 in (0, 1] and w = (r1 >> 8) /
// 2^24 in [0, 1), z0 = sqrt(-2 ln u) cos(2 pi w), z1 = sqrt(-2 ln u) sin(2 pi w); likewise (r2,
// r3) give z2, z3. |z| stays below 5.8 (u >= 2^-24). Distinct tensors placed at distinct offsets
// of one parameter space draw disjoint counters, hence independent numbers.
#pragma once

#include <cstdint>

#include <curand_kernel.h>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

/// Thread per Philox counter c, covering parameters [4c, 4c + 4) of [offset, offset + n).
__device__ __forceinline__ void normal_init_counter(std::uint64_t c, std::uint64_t offset, std::int64_t n,
                                                    std::uint64_t seed, float std_dev, float* __restrict__ master,
                                                    bf16* __restrict__ compute) {
  const uint4 r = curand_Philox4x32_10(make_uint4(static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32), 0u, 0u),
                                       make_uint2(static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)));
  const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
  float z[4];
  for (int p = 0; p < 2; ++p) {
    const float u = (static_cast<float>(words[2 * p] >> 8) + 1.0f) * 0x1p-24f;
    const float w = static_cast<float>(words[2 * p + 1] >> 8) * 0x1p-24f;
    const float radius = sqrtf(-2.0f * logf(u));
    float s, co;
    sincospif(2.0f * w, &s, &co);
    z[2 * p] = radius * co;
    z[2 * p + 1] = radius * s;
  }
  for (int lane = 0; lane < 4; ++lane) {
    const std::uint64_t g = 4 * c + static_cast<std::uint64_t>(lane);
    if (g < offset || g - offset >= static_cast<std::uint64_t>(n)) continue;
    const float x = std_dev * z[lane];
    master[g - offset] = x;
    compute[g - offset] = bf16(x);
  }
}

template <int = 0>
__global__ void normal_init_kernel(std::uint64_t first, std::int64_t counters, std::uint64_t offset, std::int64_t n,
                                   std::uint64_t seed, float std_dev, float* __restrict__ master, bf16* __restrict__ compute) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < counters;
       i += std::int64_t(gridDim.x) * blockDim.x)
    normal_init_counter(first + static_cast<std::uint64_t>(i), offset, n, seed, std_dev, master, compute);
}

/// Philox counters parameters [offset, offset + n) touch.
inline std::int64_t normal_init_counters(std::uint64_t offset, std::int64_t n) {
  return static_cast<std::int64_t>((offset + static_cast<std::uint64_t>(n) - 1) / 4 - offset / 4 + 1);
}

/// normal_init on an explicit grid (any shape gives the same values; tests use two).
inline void normal_init_launch(std::int64_t n, std::uint64_t offset, std::uint64_t seed, float std_dev, float* master,
                               bf16* compute, unsigned blocks, unsigned threads, stream_view stream) {
  OOMB_EXPECTS(n > 0, "normal_init: n must be positive, got ", n);
  OOMB_EXPECTS(offset <= (std::uint64_t(1) << 62) && static_cast<std::uint64_t>(n) <= (std::uint64_t(1) << 62) - offset,
               "normal_init: the parameter range [", offset, ", ", offset, " + ", n, ") leaves the 2^62 index space");
  OOMB_EXPECTS(master != nullptr && compute != nullptr, "normal_init: null pointer");
  OOMB_EXPECTS(std_dev >= 0.0f && std_dev < 1e30f, "normal_init: std must be finite and >= 0, got ", std_dev);
  OOMB_EXPECTS(blocks > 0 && threads > 0 && threads <= 1024, "normal_init: bad launch shape ", blocks, " x ", threads);
  normal_init_kernel<><<<blocks, threads, 0, stream.get()>>>(offset / 4, normal_init_counters(offset, n), offset, n, seed,
                                                             std_dev, master, compute);
  OOMB_OPS_CHECK_LAUNCH("normal_init");
}

}  // namespace detail

/// master[i] = std * N(0, 1) and compute[i] = bf16(master[i]) for i < n: the parameters at
/// indices offset .. offset + n - 1 of the model's parameter space (see the file comment), drawn
/// from `seed`. master (fp32) and compute (bf16) are device arrays, written in one pass.
inline void normal_init(std::int64_t n, std::uint64_t offset, std::uint64_t seed, float std_dev, float* master,
                        bf16* compute, stream_view stream) {
  const std::int64_t counters = n > 0 ? detail::normal_init_counters(offset, n) : 1;
  detail::normal_init_launch(n, offset, seed, std_dev, master, compute, detail::grid_for(counters, 256, 8192), 256,
                             stream);
}

}  // namespace oomb_trainer::gpu::ops
