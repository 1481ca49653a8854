// oomb — a memory resource over a user's allocator, given as two callbacks and an optional stream.
// SPDX-License-Identifier: Apache-2.0
//
// This is how a framework's allocator (PyTorch's caching allocator, RMM, a JAX buffer pool) backs
// oomb's slabs: oomb asks it for large blocks, rarely, and carves pages out of them itself.
//
// Stream-ordered frees. With a stream, both callbacks receive it: every block is allocated and
// freed on that one stream, so the allocator may hand a freed block to later work on the same
// stream at once (that is what stream-ordered allocators do). Before oomb frees a block, every
// use of it on another stream is ordered before the free by an event the free's stream waited
// for (oomb's owners wait for their own events before they free; a caller that used the memory
// on other streams does the same), never by a host-wide synchronisation. Reuse of a freed block
// on a different stream is the allocator's business and must wait on an event recorded on this
// stream after the free (RMM and cudaFreeAsync do; PyTorch does it through record_stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

#include "oomb/core/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// The Stream argument of a callback_resource whose callbacks take no stream.
struct no_stream {};

/// A memory resource of kind `Kind` whose allocate/deallocate call the user's callbacks:
///   allocate(bytes, alignment[, stream]) -> void*   (nullptr, or a throw, for "no memory")
///   deallocate(p, bytes, alignment[, stream])       (must not throw)
/// with the stream argument only when Stream is not no_stream (e.g. cuda_stream_view). `Kind`
/// says where the callbacks' memory is (host, pinned or device); nothing checks that it is true.
/// allocate() throws invalid_argument for an alignment that is not a power of two or a block the
/// callback returned misaligned (after giving it back), and out_of_memory when the callback
/// returns nullptr or throws anything but an oomb::error (its message is kept). Copyable (the
/// callbacks are copied with it). Thread-safe when the callbacks are.
template <memory_kind Kind, class Stream = no_stream>
class callback_resource {
  static constexpr bool has_stream = !std::is_same_v<Stream, no_stream>;

 public:
  static constexpr memory_kind kind = Kind;
  using stream_type = Stream;
  using allocate_fn = std::conditional_t<has_stream, std::function<void*(std::size_t, std::size_t, Stream)>,
                                         std::function<void*(std::size_t, std::size_t)>>;
  using deallocate_fn =
      std::conditional_t<has_stream, std::function<void(void*, std::size_t, std::size_t, Stream)>,
                         std::function<void(void*, std::size_t, std::size_t)>>;

  callback_resource(allocate_fn allocate, deallocate_fn deallocate, Stream stream = Stream{})
      : allocate_(std::move(allocate)), deallocate_(std::move(deallocate)), stream_(stream) {
    OOMB_EXPECTS(allocate_ && deallocate_, "callback_resource: both callbacks must be set (allocate ",
                 bool(allocate_) ? "set" : "empty", ", deallocate ", bool(deallocate_) ? "set" : "empty", ")");
  }

  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "callback_resource: alignment must be a power of two, got ", alignment);
    void* p = nullptr;
    try {
      p = call_allocate(bytes, alignment);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      OOMB_FAIL(out_of_memory, "callback_resource: the ", to_string(Kind), " allocator failed for ", bytes,
                " bytes (alignment ", alignment, "): ", e.what());
    }
    OOMB_CHECK(p != nullptr, out_of_memory, "callback_resource: the ", to_string(Kind),
               " allocator has no ", bytes, " bytes (alignment ", alignment, ")");
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      deallocate(p, bytes, alignment);
      OOMB_FAIL(invalid_argument, "callback_resource: the allocator returned ", p, " for ", bytes,
                " bytes, not aligned to the ", alignment, " bytes asked");
    }
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) noexcept {
    if constexpr (has_stream)
      deallocate_(p, bytes, alignment, stream_);
    else
      deallocate_(p, bytes, alignment);
  }

  /// The stream both callbacks receive (no_stream{} when they take none).
  Stream stream() const noexcept { return stream_; }

 private:
  void* call_allocate(std::size_t bytes, std::size_t alignment) {
    if constexpr (has_stream)
      return allocate_(bytes, alignment, stream_);
    else
      return allocate_(bytes, alignment);
  }

  allocate_fn allocate_;
  deallocate_fn deallocate_;
  Stream stream_;
};

static_assert(is_memory_resource_v<callback_resource<memory_kind::host>>);
static_assert(is_memory_resource_v<callback_resource<memory_kind::device, void*>>);

OOMB_NAMESPACE_END
