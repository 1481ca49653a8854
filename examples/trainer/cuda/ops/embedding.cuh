// oomb trainer — token embedding on the GPU, as cpu/embedding.hpp: rows of a [vocab][H] table.
// SPDX-License-Identifier: Apache-2.0
//
// Tokens live on the device, so a bad token cannot throw: the forward writes NaN into its row
// (never reads outside the table) and records its position in *bad_position, which the caller
// sets to -1 before (cudaMemsetAsync with 0xff) and reads back when it next synchronises.
// The backward is deterministic without atomics: positions are sorted by token (CUB's stable radix
// sort, in the caller's workspace), and one block adds each token's rows in position order.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

template <class E, class O>
__global__ void embedding_forward_kernel(std::int32_t H, std::int32_t vocab, const std::int32_t* __restrict__ tokens,
                                         const E* __restrict__ table, O* __restrict__ out, std::int32_t* bad_position) {
  const std::int64_t t = blockIdx.x;
  const std::int32_t id = tokens[t];
  O* row = out + t * H;
  if (id < 0 || id >= vocab) {
    for (std::int32_t i = threadIdx.x; i < H; i += blockDim.x) row[i] = store<O>(__int_as_float(0x7fc00000));
    if (threadIdx.x == 0) atomicCAS(bad_position, -1, static_cast<std::int32_t>(t));
    return;
  }
  const E* src = table + std::int64_t(id) * H;
  for (std::int32_t i = threadIdx.x; i < H; i += blockDim.x) row[i] = store<O>(load(src[i]));
}

/// Sort keys (an out-of-range token gets key `vocab`, sorted last and skipped) and positions.
template <int = 0>  // a template: every translation unit may include this header
__global__ void embedding_keys_kernel(std::int64_t n, std::int32_t vocab, const std::int32_t* __restrict__ tokens,
                                      std::uint32_t* __restrict__ keys, std::uint32_t* __restrict__ positions) {
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < n; t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int32_t id = tokens[t];
    keys[t] = id >= 0 && id < vocab ? static_cast<std::uint32_t>(id) : static_cast<std::uint32_t>(vocab);
    positions[t] = static_cast<std::uint32_t>(t);
  }
}

/// Block i starts work only where a run of equal tokens starts; it sums the run's rows in order.
template <class G>
__global__ void embedding_backward_kernel(std::int64_t n, std::int32_t H, std::int32_t vocab,
                                          const std::uint32_t* __restrict__ keys, const std::uint32_t* __restrict__ positions,
                                          const G* __restrict__ dout, float* __restrict__ dtable) {
  const std::int64_t i = blockIdx.x;
  const std::uint32_t key = keys[i];
  if (key >= static_cast<std::uint32_t>(vocab) || (i > 0 && keys[i - 1] == key)) return;
  std::int64_t end = i + 1;
  while (end < n && keys[end] == key) ++end;
  float* dst = dtable + std::int64_t(key) * H;
  for (std::int32_t c = threadIdx.x; c < H; c += blockDim.x) {
    float s = 0.0f;
    for (std::int64_t j = i; j < end; ++j) s += load(dout[std::int64_t(positions[j]) * H + c]);
    dst[c] += s;
  }
}

inline int key_bits(std::int32_t vocab) {  // bits of the largest key, `vocab`
  int b = 1;
  while ((std::int64_t(1) << b) <= vocab) ++b;
  return b;
}

struct embedding_workspace {
  std::uint32_t *keys_in, *keys_out, *pos_in, *pos_out;
  void* sort_temp;
  std::size_t sort_bytes;   ///< of sort_temp
  std::size_t total_bytes;  ///< of the whole workspace
};

inline embedding_workspace carve_embedding(void* base, std::int64_t n, std::int32_t vocab) {
  std::size_t sort_bytes = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                        static_cast<std::uint32_t*>(nullptr),
                                                        static_cast<const std::uint32_t*>(nullptr),
                                                        static_cast<std::uint32_t*>(nullptr), n, 0, key_bits(vocab));
  OOMB_CUDA_CHECK(e, "embedding_backward: sizing the radix sort of ", n, " tokens");
  workspace_carver c(base);
  embedding_workspace w{};
  w.keys_in = c.take<std::uint32_t>(std::size_t(n));
  w.keys_out = c.take<std::uint32_t>(std::size_t(n));
  w.pos_in = c.take<std::uint32_t>(std::size_t(n));
  w.pos_out = c.take<std::uint32_t>(std::size_t(n));
  w.sort_temp = c.take<char>(sort_bytes);
  w.sort_bytes = sort_bytes;
  w.total_bytes = c.bytes();
  return w;
}

inline void check_embedding(const char* what, std::int64_t n, std::int32_t H, std::int32_t vocab) {
  OOMB_EXPECTS(n > 0 && H > 0 && vocab > 0, what, ": n, H and vocab must be positive, got ", n, ", ", H, ", ", vocab);
  OOMB_EXPECTS(n < (std::int64_t(1) << 31), what, ": at most 2^31 - 1 tokens, got ", n);
}

}  // namespace detail

/// out [n][H] = table [tokens[t]]; a token outside [0, vocab) gets a NaN row and its position in
/// *bad_position (device, set to -1 by the caller). E (table), O (out): bf16 or float.
template <class E, class O>
void embedding_forward(std::int64_t n, std::int32_t H, std::int32_t vocab, const std::int32_t* tokens, const E* table,
                       O* out, std::int32_t* bad_position, stream_view stream) {
  static_assert(is_element_v<E> && is_element_v<O>, "embedding_forward: bf16 or float");
  detail::check_embedding("embedding_forward", n, H, vocab);
  OOMB_EXPECTS(tokens != nullptr && table != nullptr && out != nullptr && bad_position != nullptr,
               "embedding_forward: null pointer");
  detail::embedding_forward_kernel<<<unsigned(n), 128, 0, stream.get()>>>(H, vocab, tokens, table, out, bad_position);
  OOMB_OPS_CHECK_LAUNCH("embedding_forward");
}

/// Bytes of workspace embedding_backward needs for n tokens of a vocabulary of `vocab`.
inline std::size_t embedding_backward_workspace_bytes(std::int64_t n, std::int32_t vocab) {
  detail::check_embedding("embedding_backward_workspace_bytes", n, 1, vocab);
  const detail::embedding_workspace w = detail::carve_embedding(nullptr, n, vocab);
  return w.total_bytes;
}

/// dtable [tokens[t]] += dout [t] in fp32, deterministic; tokens outside [0, vocab) are skipped
/// (the forward reported them). G (dout): bf16 or float.
template <class G>
void embedding_backward(std::int64_t n, std::int32_t H, std::int32_t vocab, const std::int32_t* tokens, const G* dout,
                        float* dtable, void* workspace, std::size_t workspace_bytes, stream_view stream) {
  static_assert(is_element_v<G>, "embedding_backward: dout is bf16 or float");
  detail::check_embedding("embedding_backward", n, H, vocab);
  OOMB_EXPECTS(tokens != nullptr && dout != nullptr && dtable != nullptr, "embedding_backward: null pointer");
  detail::check_workspace("embedding_backward", workspace, workspace_bytes, embedding_backward_workspace_bytes(n, vocab));
  const detail::embedding_workspace w = detail::carve_embedding(workspace, n, vocab);
  detail::embedding_keys_kernel<><<<detail::grid_for(n, 256), 256, 0, stream.get()>>>(n, vocab, tokens, w.keys_in, w.pos_in);
  OOMB_OPS_CHECK_LAUNCH("embedding_backward (keys)");
  std::size_t sort_bytes = w.sort_bytes;
  OOMB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w.sort_temp, sort_bytes, w.keys_in, w.keys_out, w.pos_in, w.pos_out, n, 0,
                                                  detail::key_bits(vocab), stream.get()),
                  "embedding_backward: sorting ", n, " tokens");
  detail::embedding_backward_kernel<<<unsigned(n), 128, 0, stream.get()>>>(n, H, vocab, w.keys_out, w.pos_out, dout, dtable);
  OOMB_OPS_CHECK_LAUNCH("embedding_backward");
}

}  // namespace oomb_trainer::gpu::ops
