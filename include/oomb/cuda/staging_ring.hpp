// oomb — event-guarded staging: pinned (and device) staging buffers, and a ring of slots each
// guarded by a CUDA event, handed out again only once that event has completed.
// SPDX-License-Identifier: Apache-2.0
//
//   staging_ring<my_slot> ring;
//   for (std::size_t i : ring.take(n, make_slot)) {   // n slots whose last users have completed
//     fill(ring[i]); enqueue_readers(ring[i], stream);
//     ring.record(i, stream);                          // ring[i] is busy until this work completes
//   }
//
// The host writes staging itself, so a stream wait cannot protect a slot still being read: a slot
// is reused only once the event recorded behind its last reader has completed, asked with
// cudaEventQuery and never waited for. With too few slots free the ring grows by the missing ones
// instead of blocking (all or nothing), so the host never waits and ordering stays with streams
// and events. What a slot holds (pinned memory a kernel reads through its mapping, or a pinned
// half copied to a device twin; a fixed or a growing size) is the user's type: the ring only owns,
// guards and hands out slots. Not internally synchronised.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/stream_view.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {
struct free_pinned_staging {
  void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
};
struct free_device_staging {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
}  // namespace detail

/// Pinned host staging of `T`s (cudaHostAlloc), freed with cudaFreeHost.
template <class T>
using pinned_staging = std::unique_ptr<T[], detail::free_pinned_staging>;
/// Device staging of `T`s (cudaMalloc), freed with cudaFree.
template <class T>
using device_staging = std::unique_ptr<T[], detail::free_device_staging>;

/// Pins `count` Ts with cudaHostAlloc `flags` (add cudaHostAllocMapped for memory kernels read
/// directly). Throws out_of_memory (or cuda_error) naming `owner` and the size.
template <class T>
pinned_staging<T> make_pinned_staging(std::size_t count, unsigned flags, const char* owner) {
  void* p = nullptr;
  OOMB_CUDA_CHECK_ALLOC(cudaHostAlloc(&p, count * sizeof(T), flags), owner, ": pinning ", count * sizeof(T),
                        " bytes of staging");
  return pinned_staging<T>(static_cast<T*>(p));
}

/// Allocates `count` Ts of device memory on the current device. Throws out_of_memory (or
/// cuda_error) naming `owner` and the size.
template <class T>
device_staging<T> make_device_staging(std::size_t count, const char* owner) {
  void* p = nullptr;
  OOMB_CUDA_CHECK_ALLOC(cudaMalloc(&p, count * sizeof(T)), owner, ": allocating ", count * sizeof(T),
                        " device bytes of staging");
  return device_staging<T>(static_cast<T*>(p));
}

/// A ring of `Slot`s, each guarded by an event (see the file comment). `Slot` is movable.
template <class Slot>
class staging_ring {
 public:
  staging_ring() = default;
  staging_ring(const staging_ring&) = delete;
  staging_ring& operator=(const staging_ring&) = delete;
  staging_ring(staging_ring&&) noexcept = default;
  staging_ring& operator=(staging_ring&&) = delete;  // would free staging in flight
  /// Waits for every slot's event (its staging is about to be freed): an edge, not the hot path.
  ~staging_ring() {
    for (const entry& e : entries_)
      if (e.done) (void)cudaEventSynchronize(e.done.get());
  }

  /// Appends `n` slots made by `make()` (a callable returning a Slot), all or none: if `make` or
  /// an event creation throws, the ring is as it was. Returns the index of the first new slot.
  template <class Make>
  std::size_t grow(std::size_t n, Make&& make) {
    std::vector<entry> fresh;
    fresh.reserve(n);
    for (std::size_t k = 0; k < n; ++k) fresh.push_back(entry{make(), cuda_event::create()});
    const std::size_t first = entries_.size();
    entries_.reserve(first + n);  // so the moves below cannot throw
    for (entry& e : fresh) entries_.push_back(std::move(e));
    return first;
  }

  /// Indices of `n` distinct slots whose event has completed (polled, never waited for), in ring
  /// order from where the last take ended; slots missing are made by `make()` (as grow()). Strong
  /// guarantee: a throw (from make, or cuda_error from an event whose work failed) leaves the ring
  /// as it was. A taken slot stays busy only once record() guards it: record each before the next
  /// take. The returned list is valid until the next take.
  template <class Make>
  const std::vector<std::size_t>& take(std::size_t n, Make&& make) {
    taken_.clear();
    taken_.reserve(n);
    for (std::size_t k = 0; k < entries_.size() && taken_.size() < n; ++k) {
      const std::size_t i = (next_ + k) % entries_.size();
      if (entries_[i].done.ready()) taken_.push_back(i);
    }
    if (taken_.size() < n) {
      const std::size_t missing = n - taken_.size();
      const std::size_t first = grow(missing, make);
      for (std::size_t k = 0; k < missing; ++k) taken_.push_back(first + k);
    }
    if (!taken_.empty()) next_ = (taken_.back() + 1) % entries_.size();
    return taken_;
  }

  /// Marks slot `i` busy until the work enqueued so far on `stream` (its last reader's stream; join
  /// several first) has completed. Throws cuda_error if the event cannot be recorded.
  void record(std::size_t i, cuda_stream_view stream) {
    OOMB_EXPECTS(i < entries_.size(), "staging_ring: slot ", i, " out of range [0, ", entries_.size(), ")");
    OOMB_CUDA_CHECK(cudaEventRecord(entries_[i].done.get(), stream.get()), "staging_ring: recording slot ", i,
                    "'s event");
  }

  /// Slot `i`'s event: what a stream waits on to run after the slot's last recorded work.
  const cuda_event& event(std::size_t i) const noexcept { return entries_[i].done; }
  Slot& operator[](std::size_t i) noexcept { return entries_[i].slot; }
  const Slot& operator[](std::size_t i) const noexcept { return entries_[i].slot; }
  /// Slots now: those grown at first plus any a take added.
  std::size_t size() const noexcept { return entries_.size(); }

 private:
  struct entry {
    Slot slot;
    cuda_event done;  // a fresh event reads complete: a new slot is free
  };

  std::vector<entry> entries_;
  std::vector<std::size_t> taken_;
  std::size_t next_ = 0;
};

OOMB_NAMESPACE_END
