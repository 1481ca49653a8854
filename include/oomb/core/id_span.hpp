// oomb — id_span: a non-owning list of int32 page (or slot) ids, the argument of batch calls.
// SPDX-License-Identifier: Apache-2.0
//
// C++17 has no std::span; batch calls take this instead of (pointer, count) pairs so that a
// std::vector, a C array or a pointer and a count all work. Like any span it dangles when the ids
// it names go away; callees copy what they keep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// Read-only view of `size()` consecutive int32 ids.
class id_span {
 public:
  constexpr id_span() noexcept = default;
  constexpr id_span(const std::int32_t* data, std::size_t size) noexcept : data_(data), size_(size) {}
  id_span(const std::vector<std::int32_t>& v) noexcept : data_(v.data()), size_(v.size()) {}  // NOLINT: implicit on purpose
  /// Valid only for the full expression the list appears in (a call argument: `f({3, 4, 5})`).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"  // intended: a span of a call's argument list
#endif
  constexpr id_span(std::initializer_list<std::int32_t> l) noexcept : data_(l.begin()), size_(l.size()) {}  // NOLINT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  template <std::size_t N>
  constexpr id_span(const std::int32_t (&a)[N]) noexcept : data_(a), size_(N) {}  // NOLINT

  constexpr const std::int32_t* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr const std::int32_t* begin() const noexcept { return data_; }
  constexpr const std::int32_t* end() const noexcept { return data_ + size_; }
  constexpr std::int32_t operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const std::int32_t* data_ = nullptr;
  std::size_t size_ = 0;
};

OOMB_NAMESPACE_END
