// oomb trainer — how long a stream stood still waiting for transfers: the "exposed transfer time".
// SPDX-License-Identifier: Apache-2.0
//
// A stall is measured on the device, in stream order: begin() enqueues a one-thread kernel that
// reads the global timer once the work before it is done, the caller then enqueues its waits on
// copy events, and end() enqueues one that adds (timer - start) to a device total once the waits
// are satisfied. So the total is the time the stream spent on those waits and nothing else, with
// no host synchronisation and no event objects that grow with the number of waits (a 512K-token
// step makes ~10^5 of them). Each pair costs two tiny launches (~2-4 us of stream time when
// nothing is waited for: that floor is in the total, and stays well under 1% of a step).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

#include "trainer/backend/device_buffer.cuh"

namespace oomb_trainer::gpu {

namespace detail {

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// clock[0]: the start of the open stall; clock[1]: the sum of closed stalls (ns).
template <int = 0>
__global__ void stall_clock_kernel(std::uint64_t* clock, bool begin) {
  const std::uint64_t now = global_timer_ns();
  if (begin)
    clock[0] = now;
  else
    clock[1] += now - clock[0];
}

}  // namespace detail

class stall_clock {
 public:
  stall_clock() : clock_(2) {}

  /// Enqueues on `stream`: the zeroing of the total (before a step).
  void reset(oomb::cuda_stream_view stream) {
    OOMB_CUDA_CHECK(cudaMemsetAsync(clock_.data(), 0, 2 * sizeof(std::uint64_t), stream.get()), "stall_clock: reset");
  }
  /// Brackets the waits enqueued on `stream` between the two calls.
  void begin(oomb::cuda_stream_view stream) { launch(stream, true); }
  void end(oomb::cuda_stream_view stream) { launch(stream, false); }
  /// The device address of the total in ns (read it after the stream's work is done).
  const std::uint64_t* total_ns() const noexcept { return clock_.data() + 1; }

 private:
  void launch(oomb::cuda_stream_view stream, bool begin) {
    detail::stall_clock_kernel<<<1, 1, 0, stream.get()>>>(clock_.data(), begin);
    OOMB_CUDA_CHECK(cudaGetLastError(), "stall_clock: launch");
  }

  device_buffer<std::uint64_t> clock_;
};

}  // namespace oomb_trainer::gpu
