// oomb — the memory-resource concept.
// SPDX-License-Identifier: Apache-2.0
//
// A memory resource hands out large slabs, rarely; pages come from pools built on top of it
// (block_pool). A type R is a memory resource when it has
//   void* allocate(std::size_t bytes, std::size_t alignment);           // throws out_of_memory
//   void  deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;
//   static constexpr memory_kind kind;                                   // host, pinned or device
// Each resource checks itself right beside its definition:
//   static_assert(oomb::is_memory_resource_v<my_resource>);
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "oomb/core/memory_kind.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {
template <class R, class = void>
struct has_allocate : std::false_type {};
template <class R>
struct has_allocate<R, std::enable_if_t<std::is_same_v<
                           decltype(std::declval<R&>().allocate(std::size_t{}, std::size_t{})), void*>>>
    : std::true_type {};

template <class R, class = void>
struct has_deallocate : std::false_type {};
template <class R>
struct has_deallocate<R, std::enable_if_t<noexcept(std::declval<R&>().deallocate(
                             static_cast<void*>(nullptr), std::size_t{}, std::size_t{}))>>
    : std::true_type {};

template <class R, class = void>
struct has_kind : std::false_type {};
template <class R>
struct has_kind<R, std::enable_if_t<std::is_same_v<std::remove_cv_t<decltype(R::kind)>, memory_kind>>>
    : std::true_type {};
}  // namespace detail

/// True when R satisfies the memory-resource concept (see the file comment).
template <class R>
struct is_memory_resource
    : std::bool_constant<detail::has_allocate<R>::value && detail::has_deallocate<R>::value &&
                         detail::has_kind<R>::value> {};

template <class R>
inline constexpr bool is_memory_resource_v = is_memory_resource<R>::value;

OOMB_NAMESPACE_END
