// oomb trainer — next-token cross-entropy of one row of logits.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <oomb/core/error.hpp>

namespace oomb_trainer::cpu {

/// Returns -log softmax(logits)[target] (natural log) and writes
/// dlogits = scale * (softmax(logits) - onehot(target)): the gradient of scale * loss.
template <class T>
T cross_entropy_row(std::int32_t vocab, const T* logits, std::int32_t target, T scale, T* dlogits) {
  OOMB_EXPECTS(target >= 0 && target < vocab, "cross_entropy: target ", target, " is outside [0, ", vocab, ")");
  T m = logits[0];
  for (std::int32_t v = 1; v < vocab; ++v) m = std::max(m, logits[v]);
  T sum = 0;
  for (std::int32_t v = 0; v < vocab; ++v) {
    dlogits[v] = std::exp(logits[v] - m);
    sum += dlogits[v];
  }
  const T lse = m + std::log(sum);
  const T c = scale / sum;
  for (std::int32_t v = 0; v < vocab; ++v) dlogits[v] *= c;
  dlogits[target] -= scale;
  return lse - logits[target];
}

}  // namespace oomb_trainer::cpu
