// oomb trainer — final RMSNorm, LM head and next-token cross-entropy, forward and backward fused.
// SPDX-License-Identifier: Apache-2.0
//
// Logits are made, used and dropped one row at a time, so the head needs O(vocab) memory whatever
// the number of tokens (full logits are what kills long-context training in plain HF), and rows
// without a target cost nothing but the norm.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/cpu/cross_entropy.hpp"
#include "trainer/cpu/linear.hpp"
#include "trainer/cpu/rmsnorm.hpp"
#include "trainer/model/params.hpp"

namespace oomb_trainer {

/// Scratch of the head, reused across chunks.
template <class T>
struct head_scratch {
  std::vector<T> xf, rstd, dxf, logits, dlogits;
};

/// For n rows of final hidden states x [n][H]: row t's target is targets[t] (-1: none). Returns the
/// SUM of the counted rows' losses (natural log) and, when `grads` is not null, adds the gradient
/// of scale * sum into grads and WRITES dx [n][H]. With `row_loss`, writes each row's loss there
/// (0 for rows without a target).
template <class T>
T head_forward_backward(const model_params<T>& p, model_params<T>* grads, std::int64_t n, const T* x,
                        const std::int32_t* targets, T scale, T* dx, head_scratch<T>& s, T* row_loss = nullptr) {
  const auto& c = p.config();
  const std::int32_t H = c.hidden_size, V = c.vocab_size;
  s.xf.resize(static_cast<std::size_t>(n * H));
  s.rstd.resize(static_cast<std::size_t>(n));
  s.dxf.assign(static_cast<std::size_t>(n * H), T(0));
  s.logits.resize(static_cast<std::size_t>(V));
  s.dlogits.resize(static_cast<std::size_t>(V));
  cpu::rmsnorm_forward(n, H, x, p.final_norm(), T(c.rms_norm_eps), s.xf.data(), s.rstd.data());
  T loss = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    if (row_loss != nullptr) row_loss[t] = T(0);
    if (targets[t] < 0) continue;
    const T* xr = s.xf.data() + t * H;
    cpu::linear_forward(1, H, V, xr, p.lm_head(), static_cast<const T*>(nullptr), s.logits.data());
    const T row = cpu::cross_entropy_row(V, s.logits.data(), targets[t], scale, s.dlogits.data());
    if (row_loss != nullptr) row_loss[t] = row;
    loss += row;
    if (grads != nullptr)
      cpu::linear_backward(1, H, V, xr, p.lm_head(), s.dlogits.data(), s.dxf.data() + t * H, grads->lm_head(),
                           static_cast<T*>(nullptr));
  }
  if (grads != nullptr) {
    std::fill(dx, dx + n * H, T(0));
    cpu::rmsnorm_backward(n, H, x, p.final_norm(), s.rstd.data(), s.dxf.data(), dx, grads->final_norm());
  }
  return loss;
}

}  // namespace oomb_trainer
