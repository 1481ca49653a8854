// oomb — small host tables (page lists, slot tables, offsets) to the device without a host wait:
// a pinned staging ring and its device twin, carved per upload, each region guarded by an event.
// SPDX-License-Identifier: Apache-2.0
//
//   auto t = ring.upload(host_ids.data(), host_ids.size(), stream);  // copy enqueued on `stream`
//   kernel<<<..., stream>>>(t.data, ...);                             // readers of t.data
//   ring.release(t, stream);       // after the last reader is enqueued, on the stream it runs on
//
// upload() copies the table into the next free region of a pinned buffer and enqueues one
// cudaMemcpyAsync from there into the same region of a device buffer of equal capacity; kernels
// read the device copy (L2-cached, unlike mapped host memory). A region is free again once it was
// released and the event release() recorded after its readers has completed (asked with
// cudaEventQuery, never waited for): both its halves are then idle (the readers ran after the
// copy). Regions are reclaimed in upload order, so a region that is never released holds back
// every later one.
//
// Capacity and growth: the ring starts with `capacity` bytes (each region rounded up to 256, the
// device pointers' alignment). When the next upload does not fit in the free part, because the
// regions ahead of it are still in flight, the host has written nothing it cannot overwrite and
// waiting for them would block the host (the host writes the pinned half itself, so a stream wait
// cannot help), so the ring grows instead: a new pair of buffers of twice the capacity (at least
// the upload), up to `max_capacity`; beyond it upload() throws out_of_memory naming both numbers.
// Outgrown buffers are kept until destruction, when regions still in use by them may be in
// flight, and because freeing device memory mid-step can synchronise the device: what the ring
// holds is at most twice its capacity. A ring sized for the tables of the uploads in flight at
// once never grows. The regions are not staging_ring slots (staging_ring.hpp, whose buffers this
// ring uses): variable spans carved in order from one buffer pair pack small tables without a
// slot's size each, and reclaiming them in order needs no search.
//
// Exceptions: upload() and release() validate everything first and give the strong guarantee (a
// throwing call leaves the ring as it was: nothing enqueued, no region taken, the previous
// buffers in place). The destructor waits for the events of every region still held (an edge,
// not the hot path) so no copy reads freed memory; readers must be released or done by then.
// Buffers are allocated on the device current at construction; use the ring on that device. Not
// internally synchronised.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream_view.hpp"

OOMB_NAMESPACE_BEGIN

/// A pinned staging ring with a device twin (see the file comment).
class upload_ring {
 public:
  /// Regions start at multiples of this many bytes.
  static constexpr std::size_t region_alignment = 256;

  /// One uploaded table: `count` elements at device address `data`, valid until released and its
  /// readers are done. `serial` names the region for release().
  template <class T>
  struct uploaded {
    const T* data = nullptr;
    std::size_t count = 0;
    std::uint64_t serial = 0;
  };

  /// A ring of `capacity` bytes (pinned and device each) that may grow to `max_capacity` bytes.
  explicit upload_ring(std::size_t capacity, std::size_t max_capacity = std::numeric_limits<std::size_t>::max())
      : max_capacity_(max_capacity) {
    OOMB_EXPECTS(capacity > 0, "upload_ring: capacity must be positive");
    OOMB_EXPECTS(max_capacity >= capacity, "upload_ring: max_capacity (", max_capacity, " bytes) is below capacity (",
                 capacity, " bytes)");
    current_ = make_buffer(round_up(capacity));
  }
  upload_ring(const upload_ring&) = delete;
  upload_ring& operator=(const upload_ring&) = delete;
  /// Waits for every held region's copy and, for released ones, its readers (see the file comment).
  ~upload_ring() {
    for (const region& r : regions_)
      if (r.done) (void)cudaEventSynchronize(r.done.get());
  }

  /// Copies `count` elements from host memory `host` into a free region and enqueues their copy to
  /// the device on `stream`; the returned table may be read by kernels enqueued after it on
  /// `stream` (or ordered after it by an event). Never blocks the host. Throws invalid_argument for
  /// an empty or null table, out_of_memory when the table does not fit beside the regions in flight
  /// without outgrowing max_capacity or pinning / device memory runs out, cuda_error when the copy cannot be enqueued.
  template <class T>
  uploaded<T> upload(const T* host, std::size_t count, cuda_stream_view stream) {
    static_assert(std::is_trivially_copyable_v<T>, "upload_ring: tables are trivially copyable");
    OOMB_EXPECTS(count > 0 && host != nullptr, "upload_ring: nothing to upload (", count, " elements at ",
                 static_cast<const void*>(host), ")");
    OOMB_CHECK(count <= max_capacity_ / sizeof(T), out_of_memory, "upload_ring: a table of ", count, " elements of ",
               sizeof(T), " bytes exceeds max_capacity (", max_capacity_, " bytes)");
    const std::size_t bytes = count * sizeof(T), span = round_up(bytes);
    reclaim();

    // Placement: in the current buffer, or at the start of a new, larger one.
    std::size_t offset = 0;
    buffer grown;
    if (!fits(span, offset)) {
      grown = make_buffer(grown_capacity(span));
      offset = 0;
    }
    retired_.reserve(retired_.size() + 1);  // so committing cannot throw
    cuda_event done = free_events_.empty() ? cuda_event::create() : take_free_event();
    buffer& target = grown.capacity > 0 ? grown : current_;

    regions_.emplace_back();  // bookkeeping first: if the copy below throws, it is taken back
    region& r = regions_.back();
    try {
      std::memcpy(target.host.get() + offset, host, bytes);
      OOMB_CUDA_CHECK(cudaMemcpyAsync(target.device.get() + offset, target.host.get() + offset, bytes,
                                      cudaMemcpyHostToDevice, stream.get()),
                      "upload_ring: copying ", bytes, " bytes to the device");
      // Guards the pinned half until release() moves the guard after the readers.
      OOMB_CUDA_CHECK(cudaEventRecord(done.get(), stream.get()), "upload_ring: recording the copy's event");
    } catch (...) {
      regions_.pop_back();  // `done` and `grown` are freed on the way out
      throw;
    }

    // --- nothing below can fail
    if (grown.capacity > 0) {
      retired_.push_back(std::move(current_));
      current_ = std::move(grown);
      older_regions_ = regions_.size() - 1;  // every region but this one lies in an outgrown buffer
      ++growths_;
    }
    r.offset = offset;
    r.span = span;
    r.done = std::move(done);
    head_ = offset + span;
    const std::uint64_t serial = first_serial_ + regions_.size() - 1;
    return uploaded<T>{reinterpret_cast<const T*>(current_.device.get() + offset), count, serial};
  }

  /// Marks a table's readers as enqueued: its region is free once the work enqueued so far on
  /// `last_reader` (the stream its last reader runs on; join several first) has completed. Throws
  /// invalid_argument for a table not held by this ring or released already.
  template <class T>
  void release(const uploaded<T>& table, cuda_stream_view last_reader) {
    OOMB_EXPECTS(table.serial >= first_serial_ && table.serial - first_serial_ < regions_.size() &&
                     !regions_[static_cast<std::size_t>(table.serial - first_serial_)].released,
                 "upload_ring: table ", table.serial, " is not held (or was released already)");
    region& r = regions_[static_cast<std::size_t>(table.serial - first_serial_)];
    OOMB_CUDA_CHECK(cudaEventRecord(r.done.get(), last_reader.get()), "upload_ring: recording a release");
    r.released = true;
  }

  /// Bytes of the current buffer (pinned and device each).
  std::size_t capacity() const noexcept { return current_.capacity; }
  /// Pinned bytes held, outgrown buffers included (as many device bytes again).
  std::size_t held_bytes() const noexcept {
    std::size_t b = current_.capacity;
    for (const buffer& o : retired_) b += o.capacity;
    return b;
  }
  /// Times the ring grew.
  std::size_t growths() const noexcept { return growths_; }
  /// Regions not yet reclaimed (released or not), as of the last upload.
  std::size_t regions_held() const noexcept { return regions_.size(); }

 private:
  struct buffer {
    pinned_staging<unsigned char> host;
    device_staging<unsigned char> device;
    std::size_t capacity = 0;
  };
  struct region {
    std::size_t offset = 0, span = 0;
    cuda_event done;
    bool released = false;
  };

  static std::size_t round_up(std::size_t b) noexcept {
    return (b + region_alignment - 1) / region_alignment * region_alignment;
  }

  static buffer make_buffer(std::size_t capacity) {
    return buffer{make_pinned_staging<unsigned char>(capacity, cudaHostAllocPortable, "upload_ring"),
                  make_device_staging<unsigned char>(capacity, "upload_ring"), capacity};
  }

  std::size_t grown_capacity(std::size_t span) const {
    const std::size_t doubled = current_.capacity > max_capacity_ / 2 ? max_capacity_ : 2 * current_.capacity;
    const std::size_t want = std::max(doubled, span);
    OOMB_CHECK(want <= max_capacity_ && want > current_.capacity, out_of_memory, "upload_ring: ", span,
               " bytes do not fit beside the regions in flight in ", current_.capacity,
               " bytes, and growing would exceed max_capacity (", max_capacity_, " bytes)");
    return want;
  }

  // Pops the oldest regions while they are released and their events have completed.
  void reclaim() {
    while (!regions_.empty() && regions_.front().released && regions_.front().done.ready()) {
      cuda_event e = std::move(regions_.front().done);
      regions_.pop_front();
      ++first_serial_;
      if (older_regions_ > 0) --older_regions_;
      free_events_.push_back(std::move(e));
    }
  }

  // Whether `span` bytes fit in the current buffer's free part; sets `offset` if so. The current
  // buffer's regions are the newest regions_.size() - older_regions_ ones; the oldest of them is
  // the ring's tail, head_ its head (head_ == tail with regions held: full).
  bool fits(std::size_t span, std::size_t& offset) {
    const std::size_t cap = current_.capacity;
    if (regions_.size() == older_regions_) {  // the current buffer is empty
      head_ = 0;
      offset = 0;
      return span <= cap;
    }
    const std::size_t tail = regions_[older_regions_].offset;
    if (head_ > tail) {
      if (span <= cap - head_) {
        offset = head_;
        return true;
      }
      offset = 0;  // wrap: what is left at the end stays unused this lap
      return span <= tail;
    }
    offset = head_;
    return span <= tail - head_;
  }

  cuda_event take_free_event() {
    cuda_event e = std::move(free_events_.back());
    free_events_.pop_back();
    return e;
  }

  std::size_t max_capacity_;
  buffer current_;
  std::vector<buffer> retired_;
  std::deque<region> regions_;       // in upload order
  std::size_t older_regions_ = 0;    // leading regions_ that lie in retired_ buffers
  std::uint64_t first_serial_ = 0;   // serial of regions_.front()
  std::size_t head_ = 0;
  std::vector<cuda_event> free_events_;
  std::size_t growths_ = 0;
};

OOMB_NAMESPACE_END
