// oomb — a tensor view whose element type and rank are known at run time, as a framework
// tensor's are; checked conversion to and from the typed tensor_view.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "oomb/core/dtype.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/memory_kind.hpp"
#include "oomb/core/tensor.hpp"

OOMB_NAMESPACE_BEGIN

/// Non-owning, trivially copyable: data, dtype, rank (at most max_rank), shape and strides (in
/// elements), memory kind and device ordinal. as<E, Rank>() gives the typed view after checking
/// dtype, rank and alignment, so a tensor from a framework is used by oomb without a copy.
class any_tensor_view {
 public:
  static constexpr std::int32_t max_rank = 8;
  using index_array = std::array<std::int64_t, max_rank>;

  any_tensor_view() = default;
  /// Throws invalid_argument for a rank outside [0, max_rank] or a negative extent.
  any_tensor_view(void* data, dtype type, std::int32_t rank, const std::int64_t* shape, const std::int64_t* strides,
                  memory_kind kind, std::int32_t device = 0)
      : data_(data), type_(type), rank_(rank), kind_(kind), device_(device) {
    OOMB_EXPECTS(rank >= 0 && rank <= max_rank, "any_tensor_view: rank ", rank, " outside [0, ", max_rank, "]");
    for (std::int32_t d = 0; d < rank; ++d) {
      OOMB_EXPECTS(shape[d] >= 0, "any_tensor_view: extent ", shape[d], " of dimension ", d, " is negative");
      shape_[std::size_t(d)] = shape[d];
      strides_[std::size_t(d)] = strides[d];
    }
  }

  /// The untyped view of a typed one (device: the ordinal of the GPU holding device memory).
  template <class E, std::size_t Rank>
  static any_tensor_view of(const tensor_view<E, Rank>& v, std::int32_t device = 0) {
    static_assert(Rank <= std::size_t(max_rank), "any_tensor_view: rank above max_rank");
    // const is a property of the typed view; the untyped one carries the address only.
    void* p = const_cast<void*>(static_cast<const void*>(v.data()));
    return any_tensor_view(p, dtype_of<E>(), std::int32_t(Rank), v.shape().data(), v.strides().data(), v.kind(),
                           device);
  }

  void* data() const noexcept { return data_; }
  dtype type() const noexcept { return type_; }
  std::int32_t rank() const noexcept { return rank_; }
  const std::int64_t* shape() const noexcept { return shape_.data(); }
  const std::int64_t* strides() const noexcept { return strides_.data(); }
  memory_kind kind() const noexcept { return kind_; }
  std::int32_t device() const noexcept { return device_; }
  std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (std::int32_t d = 0; d < rank_; ++d) n *= shape_[std::size_t(d)];
    return n;
  }

  /// The typed view. Throws invalid_argument, naming both sides, when the dtype is not E's (any
  /// bf16-layout-compatible E reads a bfloat16 tensor), the rank is not Rank, or the data is not
  /// aligned for E.
  template <class E, std::size_t Rank>
  tensor_view<E, Rank> as() const {
    constexpr dtype want = dtype_of<E>();
    OOMB_EXPECTS(type_ == want, "any_tensor_view: the tensor holds ", to_string(type_), ", the view asks for ",
                 to_string(want));
    OOMB_EXPECTS(rank_ == std::int32_t(Rank), "any_tensor_view: the tensor has ", rank_,
                 " dimensions, the view asks for ", Rank);
    OOMB_EXPECTS(reinterpret_cast<std::uintptr_t>(data_) % alignof(E) == 0, "any_tensor_view: data ", data_,
                 " is not aligned to the ", alignof(E), " bytes of its element type");
    typename tensor_view<E, Rank>::index_array shape{}, strides{};
    for (std::size_t d = 0; d < Rank; ++d) {
      shape[d] = shape_[d];
      strides[d] = strides_[d];
    }
    return tensor_view<E, Rank>(static_cast<E*>(data_), shape, strides, kind_);
  }

 private:
  void* data_ = nullptr;
  dtype type_{};
  std::int32_t rank_ = 0;
  index_array shape_{};
  index_array strides_{};
  memory_kind kind_ = memory_kind::host;
  std::int32_t device_ = 0;
};

static_assert(std::is_trivially_copyable_v<any_tensor_view>);

OOMB_NAMESPACE_END
