// oomb trainer — intervals of a stream's time, measured on the device and summed into slots: how
// long the compute stream stood still waiting for transfers (the "exposed transfer time", one
// slot) and, opt-in, the GPU time of each kind of backend op (a slot per kind).
// SPDX-License-Identifier: Apache-2.0
//
// An interval is measured on the device, in stream order: begin() enqueues a one-thread kernel
// that reads the global timer once the work before it is done, the caller then enqueues the work
// (waits on copy events, an op's kernels), and end(slot) enqueues one that adds (timer - start)
// to the slot's device total once that work is done. So a total is the time the stream spent on
// that work and nothing else, with no host synchronisation and no event objects that grow with
// the number of intervals (a 512K-token step makes ~10^5 of them). Each pair costs two tiny
// launches (~2-4 us of stream time: that floor is in the total, and stays well under 1% of a
// step). Intervals do not nest: one start register.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

#include "trainer/cuda/device_buffer.cuh"

namespace oomb_trainer::gpu {

namespace detail {

__device__ inline std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// clock[0]: the start of the open interval; clock[1 + s]: the sum of slot s's closed intervals
/// (ns). slot < 0 opens an interval.
template <int = 0>
__global__ void interval_clock_kernel(std::uint64_t* clock, int slot) {
  const std::uint64_t now = global_timer_ns();
  if (slot < 0)
    clock[0] = now;
  else
    clock[1 + slot] += now - clock[0];
}

}  // namespace detail

class interval_clock {
 public:
  explicit interval_clock(int slots = 1) : slots_(slots), clock_(static_cast<std::size_t>(1 + slots)) {
    OOMB_EXPECTS(slots > 0, "interval_clock: at least one slot");
  }

  int slots() const noexcept { return slots_; }
  /// Enqueues on `stream`: the zeroing of every total (before a step).
  void reset(oomb::cuda_stream_view stream) {
    OOMB_CUDA_CHECK(cudaMemsetAsync(clock_.data(), 0, clock_.size() * sizeof(std::uint64_t), stream.get()),
                    "interval_clock: reset");
  }
  /// Brackets the work enqueued on `stream` between the two calls; end() adds it to `slot`.
  void begin(oomb::cuda_stream_view stream) { launch(stream, -1); }
  void end(oomb::cuda_stream_view stream, int slot = 0) {
    OOMB_EXPECTS(slot >= 0 && slot < slots_, "interval_clock: slot ", slot, " of ", slots_);
    launch(stream, slot);
  }
  /// The device address of the slots' totals in ns (read them after the stream's work is done).
  const std::uint64_t* totals_ns() const noexcept { return clock_.data() + 1; }

 private:
  void launch(oomb::cuda_stream_view stream, int slot) {
    detail::interval_clock_kernel<<<1, 1, 0, stream.get()>>>(clock_.data(), slot);
    OOMB_CUDA_CHECK(cudaGetLastError(), "interval_clock: launch");
  }

  int slots_;
  device_buffer<std::uint64_t> clock_;
};

}  // namespace oomb_trainer::gpu
