// oomb — an owning CUDA event satisfying the event concept.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "oomb/cuda/error.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// Owner of one cudaEvent_t. Created without timing (cheaper to record and to wait on) unless
/// asked; move-only. A default-constructed (empty) event is complete: ready() is true, wait()
/// returns. Recorded by cuda_stream_view::record / record(event&); a stream waits on it with
/// cudaStreamWaitEvent, the host queries it with cudaEventQuery (non-blocking) and blocks with
/// cudaEventSynchronize (for the edges of a step only).
class cuda_event {
 public:
  struct timing_t {};
  /// Pass to the constructor to get an event that elapsed_ms() can read.
  static constexpr timing_t timing{};

  /// An empty event: no CUDA object, already complete.
  cuda_event() noexcept = default;
  /// Creates an event on the current device (no timing).
  static cuda_event create() { return cuda_event(cudaEventDisableTiming); }
  /// Creates an event on the current device that records timestamps.
  explicit cuda_event(timing_t) : cuda_event(cudaEventDefault) {}

  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  cuda_event(cuda_event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      reset();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  ~cuda_event() { reset(); }

  /// Non-blocking: true once the work captured by the last record has completed (or nothing was
  /// recorded). Throws cuda_error if that work failed.
  bool ready() const {
    if (event_ == nullptr) return true;
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    OOMB_CUDA_CHECK(e, "cuda_event: querying an event");
    return true;
  }

  /// Blocks the calling thread until ready(). For the edges of a step, never its middle.
  void wait() const {
    if (event_ != nullptr) OOMB_CUDA_CHECK(cudaEventSynchronize(event_), "cuda_event: waiting for an event");
  }

  cudaEvent_t get() const noexcept { return event_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  explicit cuda_event(unsigned flags) {
    OOMB_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags), "cuda_event: creating an event (flags ", flags, ")");
  }
  void reset() noexcept {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = nullptr;
  }

  cudaEvent_t event_ = nullptr;
};

static_assert(is_event_v<cuda_event>);

/// Milliseconds between two completed timing events (`start` recorded first).
inline float elapsed_ms(const cuda_event& start, const cuda_event& stop) {
  float ms = 0;
  OOMB_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cuda_event: reading elapsed time");
  return ms;
}

OOMB_NAMESPACE_END
