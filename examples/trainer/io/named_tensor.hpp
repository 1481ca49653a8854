// oomb trainer — a named, shaped, non-owning reference to a caller's tensor.
// SPDX-License-Identifier: Apache-2.0
//
// How the checkpoint code and the optimizer are told about the model's parameters without
// knowing the model: the caller lists its tensors (HF names, shapes, pointers into its storage,
// or, for storage the host cannot address, the copies in and out of it).
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "oomb/core/error.hpp"

namespace oomb_trainer {

/// Number of elements of `shape`; throws oomb::invalid_argument on a negative dimension or overflow.
inline std::uint64_t shape_numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    OOMB_EXPECTS(d >= 0, "negative dimension ", d, " in a shape");
    const auto u = static_cast<std::uint64_t>(d);
    OOMB_EXPECTS(u == 0 || n <= UINT64_MAX / u, "shape has too many elements");
    n *= u;
  }
  return n;
}

/// "[2, 3]" — shapes in error messages.
inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

/// A caller-owned tensor: `data` holds shape_numel(shape) contiguous row-major elements.
/// T is float or double (const-qualified for tensors that are only read).
template <class T>
struct named_tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  T* data = nullptr;

  using value_type = T;
  std::uint64_t numel() const { return shape_numel(shape); }
};

/// A tensor the host cannot address (on a GPU): `copy_out` writes its numel() elements into a host
/// buffer, `copy_in` reads them from one. Checkpoints move such tensors one at a time through a
/// buffer of one tensor, so a model on the GPU is saved and loaded with host memory for its
/// largest tensor rather than for all of them. T is float or double.
template <class T>
struct streamed_tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::function<void(T* host)> copy_out;
  std::function<void(const T* host)> copy_in;

  using value_type = T;
  std::uint64_t numel() const { return shape_numel(shape); }
};

}  // namespace oomb_trainer
