// oomb — the stream concept: an ordered queue of copies (and, on the host, work) with events.
// SPDX-License-Identifier: Apache-2.0
//
// A type S is a stream when it has
//   using event_type = ...;                        // see below
//   void enqueue_copy(void* dst, const void* src, std::size_t bytes);
//   void enqueue_copies(const copy_op* ops, std::size_t count);   // one batch, any order inside
//   event_type record();                           // completes when all work enqueued so far has
//   void wait(const event_type& e);                // later work starts only after e completed
// and an event E has
//   bool ready() const;                            // non-blocking query
//   void wait() const;                             // blocks the calling thread; for the edges of a
//                                                  // step, never its middle
// The host stream also has `enqueue(callable)`. A stream never synchronises the whole device, and
// work on one stream runs in the order it was enqueued. Streams are owners: movable, not copyable.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// One copy of a batch.
struct copy_op {
  void* dst;
  const void* src;
  std::size_t bytes;
};

namespace detail {
template <class E, class = void>
struct is_event : std::false_type {};
template <class E>
struct is_event<E, std::enable_if_t<std::is_same_v<decltype(std::declval<const E&>().ready()), bool> &&
                                    std::is_void_v<decltype(std::declval<const E&>().wait())>>>
    : std::true_type {};

template <class S, class = void>
struct is_stream : std::false_type {};
template <class S>
struct is_stream<
    S, std::void_t<typename S::event_type,
                   decltype(std::declval<S&>().enqueue_copy(static_cast<void*>(nullptr),
                                                            static_cast<const void*>(nullptr),
                                                            std::size_t{})),
                   decltype(std::declval<S&>().enqueue_copies(static_cast<const copy_op*>(nullptr),
                                                              std::size_t{})),
                   decltype(std::declval<S&>().wait(std::declval<const typename S::event_type&>()))>>
    : std::bool_constant<std::is_same_v<decltype(std::declval<S&>().record()), typename S::event_type> &&
                         is_event<typename S::event_type>::value> {};
}  // namespace detail

/// True when E satisfies the event concept.
template <class E>
inline constexpr bool is_event_v = detail::is_event<E>::value;

/// True when S satisfies the stream concept (see the file comment).
template <class S>
inline constexpr bool is_stream_v = detail::is_stream<S>::value;

OOMB_NAMESPACE_END
