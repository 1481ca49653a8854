// oomb trainer — global gradient-norm clipping.
// SPDX-License-Identifier: Apache-2.0
//
// The norm is the L2 norm over every element of every gradient, accumulated in double in a fixed
// order (so the same gradients always give the same norm, bit for bit). Clipping scales all
// gradients by max_norm / (norm + 1e-6) when norm > max_norm, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <cmath>
#include <vector>

#include "oomb/core/error.hpp"
#include "trainer/io/named_tensor.hpp"

namespace oomb_trainer {

/// L2 norm of all gradients together.
template <class T>
double global_grad_norm(const std::vector<named_tensor<T>>& grads) {
  double sum = 0.0;
  for (const auto& g : grads) {
    const auto n = static_cast<std::size_t>(g.numel());
    OOMB_EXPECTS(g.data != nullptr || n == 0, "global_grad_norm: gradient '", g.name, "' has no data");
    for (std::size_t k = 0; k < n; ++k) {
      const double x = static_cast<double>(g.data[k]);
      sum += x * x;
    }
  }
  return std::sqrt(sum);
}

/// Scales the gradients so their global norm is at most `max_norm` and returns the norm they had
/// before. `max_norm` <= 0 disables clipping (the norm is still returned). A non-finite norm leaves
/// the gradients untouched (the caller decides: skip the step or stop), as scaling would only
/// spread the NaN.
template <class T>
double clip_grad_norm(const std::vector<named_tensor<T>>& grads, double max_norm) {
  OOMB_EXPECTS(!std::isnan(max_norm), "clip_grad_norm: max_norm is NaN");
  const double norm = global_grad_norm(grads);
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    const T scale = static_cast<T>(max_norm / (norm + 1e-6));
    for (const auto& g : grads) {
      const auto n = static_cast<std::size_t>(g.numel());
      for (std::size_t k = 0; k < n; ++k) g.data[k] *= scale;
    }
  }
  return norm;
}

}  // namespace oomb_trainer
