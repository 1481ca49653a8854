// oomb — many copies in one call: cudaMemcpyBatchAsync.
// Merging runs is page_transfer's (offload/page_transfer.hpp): it knows the pools' slabs, and a
// copy must never span two allocations, even ones whose addresses touch (CUDA refuses it).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// Scratch arrays for one batch call (structure of arrays, as the runtime wants them); reused so
/// the hot path allocates nothing once warm.
struct memcpy_batch_scratch {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
};

inline memcpy_batch_scratch& thread_batch_scratch() {
  thread_local memcpy_batch_scratch s;
  return s;
}

inline std::atomic<std::uint64_t>& batch_fallback_counter() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

inline void memcpy_each_async(const copy_op* ops, std::size_t count, cudaStream_t stream) {
  for (std::size_t i = 0; i < count; ++i) {
    if (ops[i].bytes == 0) continue;
    OOMB_CUDA_CHECK(cudaMemcpyAsync(ops[i].dst, ops[i].src, ops[i].bytes, cudaMemcpyDefault, stream),
                    "memcpy_batch_async: copy ", i, " of ", count, " (", ops[i].bytes, " bytes)");
  }
}

}  // namespace detail

/// Enqueues every copy of `ops` on `stream` as one batch: copies inside run in any order (they must
/// not overlap), the batch as a whole in stream order. Uses cudaMemcpyBatchAsync (CUDA >= 12.8;
/// one driver call, one submission to the copy engines, no SM used) and falls back to one
/// cudaMemcpyAsync per copy on older toolkits. Memory may be device, pinned, or any mix; pageable
/// host memory works but is staged by the driver and not truly asynchronous.
/// The stream must not be the legacy default stream (the batch API refuses it).
inline void memcpy_batch_async(const copy_op* ops, std::size_t count, cudaStream_t stream) {
  OOMB_EXPECTS(ops != nullptr || count == 0, "memcpy_batch_async: null batch of ", count, " copies");
  if (count == 0) return;
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
  detail::memcpy_batch_scratch& s = detail::thread_batch_scratch();
  s.dsts.clear();
  s.srcs.clear();
  s.sizes.clear();
  for (std::size_t i = 0; i < count; ++i) {
    if (ops[i].bytes == 0) continue;  // the runtime refuses empty copies
    s.dsts.push_back(ops[i].dst);
    s.srcs.push_back(ops[i].src);
    s.sizes.push_back(ops[i].bytes);
  }
  if (s.sizes.empty()) return;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;    // sources may be written by earlier work
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;     // keep the SMs for compute
  std::size_t attr_index = 0;
#if CUDART_VERSION >= 13000
  // CUDA 13: const arrays, no failure index.
  const cudaError_t e = cudaMemcpyBatchAsync(s.dsts.data(), s.srcs.data(), s.sizes.data(), s.sizes.size(),
                                             &attr, &attr_index, 1, stream);
#else
  // CUDA 12.8/12.9: non-const arrays and an index of the copy that failed.
  std::size_t fail_index = 0;
  const cudaError_t e = cudaMemcpyBatchAsync(s.dsts.data(), const_cast<void**>(s.srcs.data()), s.sizes.data(),
                                             s.sizes.size(), &attr, &attr_index, 1, &fail_index, stream);
#endif
  if (e == cudaSuccess) return;
  // The batch API refuses some operand kinds on some drivers (pageable memory, a legacy stream):
  // copy one by one instead (re-running a copy the batch may have started is harmless: copies in
  // a batch do not overlap). Any other failure is an error.
  if (e != cudaErrorInvalidValue && e != cudaErrorNotSupported)
    detail::raise_cuda<cuda_error>(__FILE__, __LINE__, e, "cudaMemcpyBatchAsync", "memcpy_batch_async: batch of ",
                                   s.sizes.size(), " copies");
  (void)cudaGetLastError();
  ++detail::batch_fallback_counter();
  detail::memcpy_each_async(ops, count, stream);
#else
  detail::memcpy_each_async(ops, count, stream);
#endif
}

/// Batches memcpy_batch_async copied one by one because the batch API refused them (see there).
inline std::uint64_t memcpy_batch_fallbacks() noexcept { return detail::batch_fallback_counter().load(); }

OOMB_NAMESPACE_END
