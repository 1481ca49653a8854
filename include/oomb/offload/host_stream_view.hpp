// oomb — a non-owning view of a host_stream, the CPU twin of cuda_stream_view.
// SPDX-License-Identifier: Apache-2.0
//
// The residency scheduler takes its compute stream by value as a view, so a caller can pass a
// temporary view of a stream it (or a framework) owns. host_stream_view is that view on the CPU:
// code written against residency_scheduler<host_backend> moves to cuda_backend by swapping types.
#pragma once

#include <cstddef>
#include <utility>

#include "oomb/core/error.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// A host_stream without ownership: trivially copyable, pass by value; the stream must outlive
/// every use of the view. Implicit from host_stream& (as cuda_stream converts to cuda_stream_view);
/// no null view exists. Views compare equal when they name the same stream.
class host_stream_view {
 public:
  using event_type = host_event;

  host_stream_view(host_stream& s) noexcept : stream_(&s) {}  // NOLINT: an owner is usable as a view
  host_stream_view(std::nullptr_t) = delete;                  // NOLINT: no stream is not a stream

  host_stream& get() const noexcept { return *stream_; }

  void enqueue_copy(void* dst, const void* src, std::size_t bytes) const { stream_->enqueue_copy(dst, src, bytes); }
  void enqueue_copies(const copy_op* ops, std::size_t count) const { stream_->enqueue_copies(ops, count); }
  template <class F>
  void enqueue(F&& f) const {
    stream_->enqueue(std::forward<F>(f));
  }
  host_event record() const { return stream_->record(); }
  void wait(const host_event& e) const { stream_->wait(e); }
  void synchronize() const { stream_->synchronize(); }

  friend bool operator==(host_stream_view a, host_stream_view b) noexcept { return a.stream_ == b.stream_; }
  friend bool operator!=(host_stream_view a, host_stream_view b) noexcept { return a.stream_ != b.stream_; }

 private:
  host_stream* stream_;
};

static_assert(is_stream_v<host_stream_view>);

OOMB_NAMESPACE_END
