// oomb — an owning CUDA stream satisfying the stream concept.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// Owner of one cudaStream_t, created non-blocking (it never synchronises with the legacy default
/// stream) on the current device. Move-only. Operations are those of cuda_stream_view; view() (or
/// the implicit conversion) passes it to functions that take a view. The destructor does not wait:
/// CUDA finishes work already enqueued on a destroyed stream.
class cuda_stream {
 public:
  using event_type = cuda_event;

  /// Priority: lower numbers run first (cudaDeviceGetStreamPriorityRange); 0 is the default.
  explicit cuda_stream(int priority = 0) {
    OOMB_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority),
                    "cuda_stream: creating a stream (priority ", priority, ")");
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  cuda_stream(cuda_stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  cuda_stream& operator=(cuda_stream&& o) noexcept {
    if (this != &o) {
      reset();
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  ~cuda_stream() { reset(); }

  /// The highest priority this device offers (for copy streams that must not queue behind compute).
  static int greatest_priority() {
    int least = 0, greatest = 0;
    OOMB_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cuda_stream: querying priorities");
    return greatest;
  }

  cuda_stream_view view() const {
    OOMB_EXPECTS(stream_ != nullptr, "cuda_stream: use of a moved-from stream");
    return cuda_stream_view(stream_);
  }
  operator cuda_stream_view() const { return view(); }  // NOLINT: an owner is usable as a view
  cudaStream_t get() const noexcept { return stream_; }

  void enqueue_copy(void* dst, const void* src, std::size_t bytes) { view().enqueue_copy(dst, src, bytes); }
  void enqueue_copies(const copy_op* ops, std::size_t count) { view().enqueue_copies(ops, count); }
  void enqueue_memset(void* dst, int value, std::size_t bytes) { view().enqueue_memset(dst, value, bytes); }
  cuda_event record() { return view().record(); }
  void record(cuda_event& e) { view().record(e); }
  void wait(const cuda_event& e) { view().wait(e); }
  bool ready() const { return view().ready(); }
  void synchronize() const { view().synchronize(); }

 private:
  void reset() noexcept {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

static_assert(is_stream_v<cuda_stream>);

OOMB_NAMESPACE_END
