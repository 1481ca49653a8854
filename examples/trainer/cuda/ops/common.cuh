// oomb trainer — what every CUDA op shares: element loads/stores in fp32, launch checks and grid
// sizes. The ops take raw device pointers, an explicit stream and caller-owned workspace; none
// allocates or synchronises with the host.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

/// Checks the launch just enqueued (configuration errors) without synchronising; faults inside
/// the kernel surface at the caller's next checked call.
#define OOMB_OPS_CHECK_LAUNCH(what) OOMB_CUDA_CHECK_LAUNCH(what, ": kernel launch")

namespace oomb_trainer::gpu::ops {

using oomb::bf16;
using stream_view = oomb::cuda_stream_view;

/// Element types the ops store: bf16 (weights, activations) and float (gradients, statistics).
template <class E>
inline constexpr bool is_element_v = std::is_same_v<E, bf16> || std::is_same_v<E, float>;

/// Reads a stored element as fp32 (the arithmetic type of every kernel).
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(bf16 x) { return __uint_as_float(std::uint32_t(x.bits) << 16); }

/// Stores an fp32 result as element E (bf16 rounds to nearest even).
template <class E>
__device__ __forceinline__ E store(float x) {
  if constexpr (std::is_same_v<E, bf16>)
    return bf16(x);
  else
    return x;
}

namespace detail {

/// Blocks for a grid-stride loop over n items, `threads` per block, capped (the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

/// Block-wide fp32 sum (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
/// `scratch` holds 32 floats; the call ends with the block synchronised, so it can be reused.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o /= 2) t += __shfl_xor_sync(0xffffffffu, t, o);
  __syncthreads();
  return t;
}

constexpr int column_sum_cols = 32, column_sum_row_groups = 8;

/// out[c] += sum_r in[r][c] over rows r < rows of a row-major [rows][cols] array, in fp32. Block:
/// 32 columns x 8 row groups; group g sums rows g, g + 8, ... and the 8 partials are added in a
/// fixed order, so the result is the same on every run. Grid: ceil(cols / 32) blocks.
template <class E>
__global__ void column_sum_add_kernel(std::int64_t rows, std::int32_t cols, const E* __restrict__ in,
                                      float* __restrict__ out) {
  __shared__ float part[column_sum_row_groups][column_sum_cols];
  const std::int32_t c = blockIdx.x * column_sum_cols + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += column_sum_row_groups) s += load(in[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int g = 0; g < column_sum_row_groups; ++g) total += part[g][threadIdx.x];
    out[c] += total;
  }
}

/// Enqueues column_sum_add_kernel.
template <class E>
void column_sum_add(std::int64_t rows, std::int32_t cols, const E* in, float* out, stream_view stream, const char* what) {
  const dim3 block(column_sum_cols, column_sum_row_groups);
  column_sum_add_kernel<<<unsigned((cols + column_sum_cols - 1) / column_sum_cols), block, 0, stream.get()>>>(rows, cols,
                                                                                                               in, out);
  OOMB_OPS_CHECK_LAUNCH(what);
}

/// Carves a caller's workspace into 256-byte aligned arrays, in a fixed order: run once with a
/// null base to size it (the planning functions), once over the real workspace to place them.
class workspace_carver {
 public:
  explicit workspace_carver(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(std::size_t count) {
    used_ = (used_ + 255) / 256 * 256;
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += count * sizeof(T);
    return p;
  }
  std::size_t bytes() const noexcept { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

/// Throws unless the caller's workspace is at least `needed` bytes.
inline void check_workspace(const char* what, const void* workspace, std::size_t bytes, std::size_t needed) {
  OOMB_EXPECTS(needed == 0 || (workspace != nullptr && bytes >= needed), what, ": workspace of ", bytes,
               " bytes given, ", needed, " needed (ask the matching *_workspace_bytes function)");
}

}  // namespace detail

}  // namespace oomb_trainer::gpu::ops
