// oomb — the residency backend concept: what residency_scheduler needs from a platform.
// SPDX-License-Identifier: Apache-2.0
//
// A backend B (host_backend on the CPU, cuda_backend on the GPU) has
//   using stream_type         = ...;  // the copy streams (is_stream_v), owned by the caller
//   using compute_stream_type = ...;  // a non-owning view (is_stream_v), taken by value; built
//                                     // from stream_type&, same event type, ==/!= compare streams
//   using near_resource       = ...;  // memory resource of the slots
//   using far_resource        = ...;  // memory resource of the homes (any resource: a framework's
//                                     // pinned allocator, a limiting_adaptor, ...)
//   void zero_fill(stream_type&, void* dst, std::size_t bytes);  // enqueue a fill with zero bytes
// and optionally
//   transfer_report transfer(stream_type&, block_pool<D>& dst, id_span dst_ids,
//                            const block_pool<S>& src, id_span src_ids);  // how a batch moves
//   transfer_report transfer(stream_type&, block_pool<D>& dst, id_span dst_ids,
//                            const block_pool<S>& src, id_span src_ids, sources_read_hook read);
//       // the same, for a backend whose batches finish reading their sources before their
//       // destinations are written (pageable homes: the DMA out of the slots, then the host's
//       // copies into the homes): it calls read() once, when what it enqueued on the stream so far
//       // covers every read of the sources; a write-back's slots are then reused after that point
//       // and its homes read after the whole batch
//   void prepare(block_pool<near_resource>& near, block_pool<far_resource>& far);
//       // called once by the scheduler's constructor: allocate transfer staging up front, so no
//       // batch allocates (and fails) on the hot path
//   void range_begin(const char* name) noexcept;  void range_end() noexcept;
//       // profiler ranges around each scheduler batch (cuda_backend: NVTX); offload/ stays std-only
// and, for homes holding a narrower encoding than the slots (converting_host_backend), all three:
//   std::size_t near_block_bytes(std::size_t far_block_bytes) const;  // a slot's bytes
//   transfer_report decode_pages(stream_type&, block_pool<near_resource>& near, id_span slots,
//                                const block_pool<far_resource>& far, id_span homes);  // home -> slot
//   transfer_report encode_pages(stream_type&, block_pool<far_resource>& far, id_span homes,
//                                const block_pool<near_resource>& near, id_span slots);  // slot -> home
//       // then transfer() is not used; the reports count the homes' bytes
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "oomb/core/id_span.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/resource.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// What a backend calls when a batch's sources have been read (see the file comment): a plain
/// function and its context, so no call allocates. Calling an empty hook does nothing; the call
/// may throw (what the scheduler records there), and the backend lets that through.
struct sources_read_hook {
  void (*fn)(void*) = nullptr;
  void* context = nullptr;
  void operator()() const {
    if (fn != nullptr) fn(context);
  }
};

namespace detail {
template <class B, class = void>
struct is_residency_backend : std::false_type {};
template <class B>
struct is_residency_backend<
    B, std::void_t<typename B::stream_type, typename B::compute_stream_type, typename B::near_resource,
                   typename B::far_resource,
                   decltype(std::declval<B&>().zero_fill(std::declval<typename B::stream_type&>(),
                                                         static_cast<void*>(nullptr), std::size_t{})),
                   decltype(std::declval<typename B::compute_stream_type>() ==
                            std::declval<typename B::compute_stream_type>())>>
    : std::bool_constant<
          is_stream_v<typename B::stream_type> && is_stream_v<typename B::compute_stream_type> &&
          std::is_same_v<typename B::stream_type::event_type, typename B::compute_stream_type::event_type> &&
          std::is_constructible_v<typename B::compute_stream_type, typename B::stream_type&> &&
          std::is_trivially_copyable_v<typename B::compute_stream_type> &&
          is_memory_resource_v<typename B::near_resource> && is_memory_resource_v<typename B::far_resource>> {};

template <class B, class D, class S, class = void>
struct has_backend_transfer : std::false_type {};
template <class B, class D, class S>
struct has_backend_transfer<
    B, D, S,
    std::enable_if_t<std::is_same_v<
        decltype(std::declval<B&>().transfer(std::declval<typename B::stream_type&>(), std::declval<block_pool<D>&>(),
                                             id_span{}, std::declval<const block_pool<S>&>(), id_span{})),
        transfer_report>>> : std::true_type {};

template <class B, class D, class S, class = void>
struct has_backend_sources_read : std::false_type {};
template <class B, class D, class S>
struct has_backend_sources_read<
    B, D, S,
    std::enable_if_t<std::is_same_v<
        decltype(std::declval<B&>().transfer(std::declval<typename B::stream_type&>(), std::declval<block_pool<D>&>(),
                                             id_span{}, std::declval<const block_pool<S>&>(), id_span{},
                                             sources_read_hook{})),
        transfer_report>>> : std::true_type {};

template <class B, class = void>
struct has_backend_near_block_bytes : std::false_type {};
template <class B>
struct has_backend_near_block_bytes<
    B, std::enable_if_t<std::is_same_v<decltype(std::declval<const B&>().near_block_bytes(std::size_t{})), std::size_t>>>
    : std::true_type {};

// Both directions of a converting backend (named, since near and far may be the same resource).
template <class B, class = void>
struct has_backend_codec : std::false_type {};
template <class B>
struct has_backend_codec<
    B, std::enable_if_t<
           has_backend_near_block_bytes<B>::value &&
           std::is_same_v<decltype(std::declval<B&>().decode_pages(
                              std::declval<typename B::stream_type&>(), std::declval<block_pool<typename B::near_resource>&>(),
                              id_span{}, std::declval<const block_pool<typename B::far_resource>&>(), id_span{})),
                          transfer_report> &&
           std::is_same_v<decltype(std::declval<B&>().encode_pages(
                              std::declval<typename B::stream_type&>(), std::declval<block_pool<typename B::far_resource>&>(),
                              id_span{}, std::declval<const block_pool<typename B::near_resource>&>(), id_span{})),
                          transfer_report>>> : std::true_type {};

template <class B, class = void>
struct has_backend_prepare : std::false_type {};
template <class B>
struct has_backend_prepare<B, std::void_t<decltype(std::declval<B&>().prepare(
                                  std::declval<block_pool<typename B::near_resource>&>(),
                                  std::declval<block_pool<typename B::far_resource>&>()))>> : std::true_type {};

template <class B, class = void>
struct has_backend_ranges : std::false_type {};
template <class B>
struct has_backend_ranges<B, std::void_t<decltype(std::declval<B&>().range_begin(static_cast<const char*>(nullptr))),
                                         decltype(std::declval<B&>().range_end())>> : std::true_type {};
}  // namespace detail

/// True when B is a residency backend (see the file comment).
template <class B>
inline constexpr bool is_residency_backend_v = detail::is_residency_backend<B>::value;

/// A profiler range around one scheduler batch: the backend's range_begin/range_end when it has
/// them, nothing otherwise.
template <class Backend>
class residency_range {
 public:
  residency_range(Backend& b, const char* name) noexcept : backend_(&b) {
    (void)name;
    if constexpr (detail::has_backend_ranges<Backend>::value) backend_->range_begin(name);
  }
  residency_range(const residency_range&) = delete;
  residency_range& operator=(const residency_range&) = delete;
  ~residency_range() {
    if constexpr (detail::has_backend_ranges<Backend>::value) backend_->range_end();
  }

 private:
  Backend* backend_;
};

OOMB_NAMESPACE_END
