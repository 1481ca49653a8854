// oomb — element types named at run time (what a framework tensor carries), and the trait that
// admits a caller's own 2-byte bfloat16 type wherever oomb::bf16 is accepted.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "oomb/core/bf16.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// The kinds of element DLPack and frameworks name (the numbers are DLPack's type codes).
enum class dtype_code : std::uint8_t { int_ = 0, uint_ = 1, float_ = 2, bfloat = 4 };

/// An element type at run time: a kind and a width in bits (one lane).
struct dtype {
  dtype_code code = dtype_code::float_;
  std::uint8_t bits = 32;

  friend constexpr bool operator==(dtype a, dtype b) noexcept { return a.code == b.code && a.bits == b.bits; }
  friend constexpr bool operator!=(dtype a, dtype b) noexcept { return !(a == b); }
};

/// "float32", "bfloat16", "int64", "uint8", ...
inline std::string to_string(dtype t) {
  const char* kind = t.code == dtype_code::int_ ? "int" : t.code == dtype_code::uint_ ? "uint"
                     : t.code == dtype_code::float_ ? "float" : t.code == dtype_code::bfloat ? "bfloat" : "code?";
  return kind + std::to_string(int(t.bits));
}

/// True for a type with the bit layout of oomb::bf16 (the upper half of an IEEE binary32), so a
/// page or tensor of it is read as oomb::bf16 without a copy. oomb::bf16 and, where cuda_bf16.h
/// was included first, __nv_bfloat16 are; specialise it for others, e.g. PyTorch's
///   template <> struct oomb::bf16_layout_compatible<c10::BFloat16> : std::true_type {};
template <class T>
struct bf16_layout_compatible : std::false_type {};
template <>
struct bf16_layout_compatible<bf16> : std::true_type {};
#if defined(__CUDA_BF16_TYPES_EXIST__)
template <>
struct bf16_layout_compatible<__nv_bfloat16> : std::true_type {};
#endif

template <class T>
inline constexpr bool bf16_layout_compatible_v = bf16_layout_compatible<std::remove_cv_t<T>>::value;

/// The same memory seen as oomb::bf16 (const kept): a view of a caller's bf16-layout type, e.g. a
/// c10::BFloat16 tensor, handed to oomb without a copy.
template <class T, std::size_t Rank, class = std::enable_if_t<bf16_layout_compatible_v<T>>>
auto as_bf16(const tensor_view<T, Rank>& v) noexcept {
  static_assert(sizeof(T) == sizeof(bf16), "bf16_layout_compatible<T>: T must be a 2-byte type");
  using B = std::conditional_t<std::is_const_v<T>, const bf16, bf16>;
  return tensor_view<B, Rank>(reinterpret_cast<B*>(v.data()), v.shape(), v.strides(), v.kind());
}

namespace detail {
template <class>
inline constexpr bool unsupported_element = false;
}  // namespace detail

/// The dtype of element type E (cv ignored): floating point, integers (not bool), or a
/// bf16-layout-compatible type (bfloat16). Other types do not compile.
template <class E>
constexpr dtype dtype_of() noexcept {
  using T = std::remove_cv_t<E>;
  if constexpr (bf16_layout_compatible_v<T>) {
    static_assert(sizeof(T) == 2 && alignof(T) <= 2 && std::is_trivially_copyable_v<T>,
                  "bf16_layout_compatible<T>: T must be a trivially copyable 2-byte type");
    return {dtype_code::bfloat, 16};
  } else if constexpr (std::is_floating_point_v<T>) {
    return {dtype_code::float_, std::uint8_t(8 * sizeof(T))};
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return {std::is_signed_v<T> ? dtype_code::int_ : dtype_code::uint_, std::uint8_t(8 * sizeof(T))};
  } else {
    static_assert(detail::unsupported_element<T>, "dtype_of: no dtype for this element type");
    return {};
  }
}

OOMB_NAMESPACE_END
