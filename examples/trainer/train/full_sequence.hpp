// oomb trainer — full-sequence forward and backward: the baseline the chunk-recurrent path equals.
// SPDX-License-Identifier: Apache-2.0
//
// Plain backprop over the whole sequence with every activation kept (memory O(N) per layer): what
// a framework does without oomb, and the reference of the gradient-equivalence tests. It runs on
// the CPU backend only: the oracle stays on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/backend/cpu_backend.hpp"
#include "trainer/cpu/causal_attention.hpp"
#include "trainer/model/block.hpp"
#include "trainer/model/params.hpp"
#include "trainer/train/targets.hpp"

namespace oomb_trainer {

/// Returns the sequence's loss (mean over counted targets) and ADDS its gradient into `grads`.
template <class T>
double full_sequence_loss_and_grad(const qwen2_params<T>& p, qwen2_params<T>& grads, const sequence& seq) {
  seq.validate();
  const auto& c = p.config();
  using backend = cpu_backend<T>;
  backend be;
  const block_dims D(c);
  const std::int64_t N = seq.size();
  const std::int64_t counted = seq.counted_targets();
  OOMB_EXPECTS(counted > 0, "full_sequence: the loss mask leaves no target");
  const T scale = T(1) / T(counted);
  const auto rope = be.rope(0, N, D.d, c.rope_theta);
  const T attn_scale = T(1) / std::sqrt(T(D.d));

  std::vector<T> x(static_cast<std::size_t>(N * D.H));
  be.embedding_forward(N, D.H, c.vocab_size, seq.tokens.data(), p.embed(), x.data());
  std::vector<block_acts<backend>> acts(static_cast<std::size_t>(c.num_hidden_layers));
  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    auto& a = acts[static_cast<std::size_t>(l)];
    a.resize(N, D);
    block_forward(be, D, p.layer(l), rope, x.data(), a, [&](block_acts<backend>& b) {
      cpu::causal_attention_forward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(), b.v.data(),
                                    b.o.data(), b.lse.data());
    });
  }
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  seq.targets(0, N, targets.data());
  std::vector<T> dx(x.size());
  be.head_loss_and_grad(p, &grads, N, x.data(), targets.data(), scale, dx.data());
  block_scratch<backend> bs;
  for (std::int32_t l = c.num_hidden_layers; l-- > 0;) {
    block_backward(be, D, p.layer(l), grads.layer(l), rope, acts[static_cast<std::size_t>(l)], dx.data(), bs,
                   [&](block_acts<backend>& b, const T* d_o, T* dq, T* dk, T* dv) {
                     cpu::causal_attention_backward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(),
                                                    b.v.data(), b.o.data(), b.lse.data(), d_o, dq, dk, dv);
                   });
  }
  be.embedding_backward(N, D.H, seq.tokens.data(), dx.data(), grads.embed());
  return be.take_loss() / static_cast<double>(counted);
}

}  // namespace oomb_trainer
