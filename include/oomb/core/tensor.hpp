// oomb — tensor_traits, the bridge to a caller's tensor type, and tensor_view, the default one.
// SPDX-License-Identifier: Apache-2.0
//
// Pools and caches hand out pages as tensor_view; `as<T>(view)` converts to any tensor type T for
// which the caller specialises tensor_traits<T>. A view never owns: a view of a released page is
// dangling, as with std::span.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "oomb/core/config.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/memory_kind.hpp"

OOMB_NAMESPACE_BEGIN

/// Specialise for a tensor type T to let oomb make and read it:
///   using element_type = ...;  static constexpr std::size_t rank = ...;
///   static element_type* data(const T&);
///   static std::array<std::int64_t, rank> shape(const T&), strides(const T&);  // strides in elements
///   static T make(element_type*, const std::array<std::int64_t, rank>& shape,
///                 const std::array<std::int64_t, rank>& strides, memory_kind);
template <class T>
struct tensor_traits;

/// Non-owning, trivially copyable strided view of `Rank` dimensions (strides in elements).
/// Extents and strides are kept as plain arrays so the accessors kernels use (data, extent,
/// stride, size, kind, operator()) compile in device code without --expt-relaxed-constexpr
/// (std::array's members are host-only constexpr functions under nvcc). Views are made on the
/// host (from std::array extents) and passed to kernels by value; shape() and strides() hand out
/// std::array copies on the host.
template <class E, std::size_t Rank>
class tensor_view {
  static constexpr std::size_t storage = Rank > 0 ? Rank : 1;

 public:
  using element_type = E;
  using index_array = std::array<std::int64_t, Rank>;
  static constexpr std::size_t rank = Rank;

  tensor_view() = default;
  tensor_view(E* data, const index_array& shape, const index_array& strides,
              memory_kind kind = memory_kind::host) noexcept
      : data_(data), kind_(kind) {
    const std::int64_t* sh = shape.data();
    const std::int64_t* st = strides.data();
    for (std::size_t d = 0; d < Rank; ++d) {
      shape_[d] = sh[d];
      strides_[d] = st[d];
    }
  }

  /// A row-major view: the last dimension is contiguous.
  static tensor_view contiguous(E* data, const index_array& shape, memory_kind kind = memory_kind::host) noexcept {
    index_array strides{};
    std::int64_t s = 1;
    for (std::size_t i = Rank; i-- > 0;) {
      strides[i] = s;
      s *= shape[i];
    }
    return tensor_view(data, shape, strides, kind);
  }

  OOMB_HOST_DEVICE E* data() const noexcept { return data_; }
  index_array shape() const noexcept { return to_array(shape_); }
  index_array strides() const noexcept { return to_array(strides_); }
  OOMB_HOST_DEVICE std::int64_t extent(std::size_t d) const noexcept { return shape_[d]; }
  OOMB_HOST_DEVICE std::int64_t stride(std::size_t d) const noexcept { return strides_[d]; }
  OOMB_HOST_DEVICE memory_kind kind() const noexcept { return kind_; }
  OOMB_HOST_DEVICE std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (std::size_t d = 0; d < Rank; ++d) n *= shape_[d];
    return n;
  }

  /// Element at the given indices. Checked on the host when OOMB_ENABLE_BOUNDS_CHECKS is on.
  template <class... I, class = std::enable_if_t<sizeof...(I) == Rank>>
  OOMB_HOST_DEVICE E& operator()(I... idx) const {
    const std::int64_t index[storage] = {static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (std::size_t d = 0; d < Rank; ++d) {
#if OOMB_ENABLE_BOUNDS_CHECKS && !defined(__CUDA_ARCH__)
      OOMB_CHECK(index[d] >= 0 && index[d] < shape_[d], invalid_argument, "tensor_view index ",
                 index[d], " out of range [0, ", shape_[d], ") in dimension ", d);
#endif
      off += index[d] * strides_[d];
    }
    return data_[off];
  }

 private:
  static index_array to_array(const std::int64_t (&a)[storage]) noexcept {
    index_array r{};
    for (std::size_t d = 0; d < Rank; ++d) r[d] = a[d];
    return r;
  }

  E* data_ = nullptr;
  std::int64_t shape_[storage] = {};
  std::int64_t strides_[storage] = {};
  memory_kind kind_ = memory_kind::host;
};

static_assert(std::is_trivially_copyable_v<tensor_view<float, 3>>, "views must be PODs for kernels");

template <class E, std::size_t Rank>
struct tensor_traits<tensor_view<E, Rank>> {
  using element_type = E;
  static constexpr std::size_t rank = Rank;
  using index_array = std::array<std::int64_t, Rank>;
  static E* data(const tensor_view<E, Rank>& t) noexcept { return t.data(); }
  static index_array shape(const tensor_view<E, Rank>& t) noexcept { return t.shape(); }
  static index_array strides(const tensor_view<E, Rank>& t) noexcept { return t.strides(); }
  static tensor_view<E, Rank> make(E* data, const index_array& shape, const index_array& strides,
                                   memory_kind kind) noexcept {
    return tensor_view<E, Rank>(data, shape, strides, kind);
  }
};

/// Converts a view into the caller's tensor type T through tensor_traits<T>.
template <class T, class E, std::size_t Rank>
T as(const tensor_view<E, Rank>& v) {
  using traits = tensor_traits<T>;
  static_assert(traits::rank == Rank, "as<T>: T's rank differs from the view's");
  static_assert(std::is_same_v<std::remove_cv_t<typename traits::element_type>, std::remove_cv_t<E>>,
                "as<T>: T's element type differs from the view's");
  return traits::make(v.data(), v.shape(), v.strides(), v.kind());
}

OOMB_NAMESPACE_END
