// oomb — a non-owning view of a CUDA stream, the explicit stream argument of every CUDA call.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/memcpy_batch.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// A cudaStream_t without ownership. Constructing one from `0` or `nullptr` does not compile, so no
/// call lands on the legacy default stream by accident (it synchronises with every other blocking
/// stream); a caller who means a default stream says so with legacy_default() or per_thread().
/// Trivially copyable; pass by value. Offers the stream concept's operations (enqueue_copy,
/// enqueue_copies, record, wait) so code written against the concept accepts it.
class cuda_stream_view {
 public:
  using event_type = cuda_event;

  constexpr explicit cuda_stream_view(cudaStream_t s) noexcept : stream_(s) {}
  cuda_stream_view(int) = delete;             // NOLINT: `0` would mean the legacy default stream
  cuda_stream_view(std::nullptr_t) = delete;  // NOLINT: so would nullptr

  /// The legacy default stream, named explicitly.
  static cuda_stream_view legacy_default() noexcept { return cuda_stream_view(cudaStreamLegacy); }
  /// The calling thread's default stream, named explicitly.
  static cuda_stream_view per_thread() noexcept { return cuda_stream_view(cudaStreamPerThread); }

  constexpr cudaStream_t get() const noexcept { return stream_; }
  constexpr operator cudaStream_t() const noexcept { return stream_; }  // NOLINT: for CUDA calls

  /// One asynchronous copy, direction inferred from the pointers (unified addressing).
  void enqueue_copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    OOMB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                    "cuda_stream: copy of ", bytes, " bytes ", src, " -> ", dst);
  }

  /// One batch (memcpy_batch_async): copies inside in any order, the batch in stream order.
  void enqueue_copies(const copy_op* ops, std::size_t count) const { memcpy_batch_async(ops, count, stream_); }

  /// Sets `bytes` bytes at `dst` to `value` (device memory: how gradient pages are zeroed).
  void enqueue_memset(void* dst, int value, std::size_t bytes) const {
    if (bytes == 0) return;
    OOMB_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_), "cuda_stream: memset of ", bytes,
                    " bytes at ", dst);
  }

  /// A new event completing when the work enqueued so far has completed.
  cuda_event record() const {
    cuda_event e = cuda_event::create();
    record(e);
    return e;
  }
  /// Re-records an existing event (no creation on the hot path).
  void record(cuda_event& e) const {
    if (!e) e = cuda_event::create();
    OOMB_CUDA_CHECK(cudaEventRecord(e.get(), stream_), "cuda_stream: recording an event");
  }

  /// Work enqueued after this call starts only once `e` has completed; never blocks the host.
  void wait(const cuda_event& e) const {
    if (e) OOMB_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.get(), 0), "cuda_stream: waiting on an event");
  }

  /// Non-blocking: true once everything enqueued so far has completed.
  bool ready() const {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaErrorNotReady) return false;
    OOMB_CUDA_CHECK(e, "cuda_stream: querying a stream");
    return true;
  }

  /// Blocks the host until the stream is idle. For the edges of a step, tests and benchmarks.
  void synchronize() const { OOMB_CUDA_CHECK(cudaStreamSynchronize(stream_), "cuda_stream: synchronizing a stream"); }

  friend constexpr bool operator==(cuda_stream_view a, cuda_stream_view b) noexcept { return a.stream_ == b.stream_; }
  friend constexpr bool operator!=(cuda_stream_view a, cuda_stream_view b) noexcept { return a.stream_ != b.stream_; }

 private:
  cudaStream_t stream_;
};

static_assert(is_stream_v<cuda_stream_view>);

OOMB_NAMESPACE_END
