// oomb — recorded events shared by a batch, with their underlying events reused.
// SPDX-License-Identifier: Apache-2.0
//
// The scheduler records one event per batch and shares it (shared_ptr) among the slots the batch
// touched. Creating an event is a driver call on the GPU (cudaEventCreate), so an event_pool keeps
// a small free list: when the last holder drops an event (pruned once ready, or replaced), the
// event goes back to the list and the next record() re-records it (streams that support
// record(event&), as CUDA's do; for others, such as host_stream, each record() is a new event).
// Re-recording is safe: a stream wait already enqueued captured the earlier record.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {
template <class S, class E, class = void>
struct can_record_into : std::false_type {};
template <class S, class E>
struct can_record_into<S, E, std::void_t<decltype(std::declval<S&>().record(std::declval<E&>()))>> : std::true_type {};
}  // namespace detail

/// Records shared events of type Event, reusing released ones (at most `keep` kept spare).
template <class Event>
class event_pool {
 public:
  using event_ptr = std::shared_ptr<const Event>;

  explicit event_pool(std::size_t keep = 64) : spare_(std::make_shared<spares>(keep)) {}

  /// An event completing once everything enqueued on `stream` so far has completed.
  template <class Stream>
  event_ptr record(Stream& stream) {
    if constexpr (detail::can_record_into<Stream, Event>::value) {
      auto e = std::make_unique<Event>(spare_->take());
      stream.record(*e);
      return event_ptr(e.release(), giver{spare_});
    } else {
      return std::make_shared<const Event>(stream.record());
    }
  }

  /// Events kept for reuse now.
  std::size_t spare() const {
    std::lock_guard<std::mutex> lock(spare_->m);
    return spare_->events.size();
  }
  /// Events created by record() so far (the rest were reused).
  std::size_t created() const {
    std::lock_guard<std::mutex> lock(spare_->m);
    return spare_->created;
  }

 private:
  struct spares {
    explicit spares(std::size_t k) : keep(k) { events.reserve(k); }
    Event take() {
      std::lock_guard<std::mutex> lock(m);
      if (events.empty()) {
        ++created;
        return Event{};  // an empty event: the stream's record(event&) creates it
      }
      Event e = std::move(events.back());
      events.pop_back();
      return e;
    }
    void give(Event&& e) noexcept {
      std::lock_guard<std::mutex> lock(m);
      if (events.size() < keep) events.push_back(std::move(e));  // reserved: never reallocates
    }
    std::mutex m;  // holders may drop events on any thread
    std::size_t keep;
    std::size_t created = 0;
    std::vector<Event> events;
  };
  struct giver {
    std::shared_ptr<spares> to;
    void operator()(const Event* e) const noexcept {
      to->give(std::move(*const_cast<Event*>(e)));
      delete e;
    }
  };
  std::shared_ptr<spares> spare_;
};

OOMB_NAMESPACE_END
