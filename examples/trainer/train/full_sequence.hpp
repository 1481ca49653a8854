// oomb trainer — full-sequence forward and backward: the baseline the chunk-recurrent path equals.
// SPDX-License-Identifier: Apache-2.0
//
// Plain backprop over the whole sequence with every activation kept (memory O(N) per layer): what
// a framework does without oomb, and the reference of the gradient-equivalence tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/cpu/causal_attention.hpp"
#include "trainer/cpu/embedding.hpp"
#include "trainer/model/block.hpp"
#include "trainer/model/head.hpp"
#include "trainer/model/params.hpp"
#include "trainer/train/targets.hpp"

namespace oomb_trainer {

/// Returns the sequence's loss (mean over counted targets) and ADDS its gradient into `grads`.
template <class T>
double full_sequence_loss_and_grad(const qwen2_params<T>& p, qwen2_params<T>& grads, const sequence& seq) {
  seq.validate();
  const auto& c = p.config();
  const block_dims D(c);
  const std::int64_t N = seq.size();
  const std::int64_t counted = seq.counted_targets();
  OOMB_EXPECTS(counted > 0, "full_sequence: the loss mask leaves no target");
  const T scale = T(1) / T(counted);
  const cpu::rope_table<T> rope(0, N, D.d, c.rope_theta);
  const T attn_scale = T(1) / std::sqrt(T(D.d));

  std::vector<T> x(static_cast<std::size_t>(N * D.H));
  cpu::embedding_forward(N, D.H, c.vocab_size, seq.tokens.data(), p.embed(), x.data());
  std::vector<block_acts<T>> acts(static_cast<std::size_t>(c.num_hidden_layers));
  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    auto& a = acts[static_cast<std::size_t>(l)];
    a.resize(N, D);
    block_forward(D, p.layer(l), rope, x.data(), a, [&](block_acts<T>& b) {
      cpu::causal_attention_forward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(), b.v.data(),
                                    b.o.data(), b.lse.data());
    });
  }
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  seq.targets(0, N, targets.data());
  head_scratch<T> hs;
  std::vector<T> dx(x.size());
  const T loss = head_forward_backward(p, &grads, N, x.data(), targets.data(), scale, dx.data(), hs);
  block_scratch<T> bs;
  for (std::int32_t l = c.num_hidden_layers; l-- > 0;) {
    block_backward(D, p.layer(l), grads.layer(l), rope, acts[static_cast<std::size_t>(l)], dx.data(), bs,
                   [&](block_acts<T>& b, const T* d_o, T* dq, T* dk, T* dv) {
                     cpu::causal_attention_backward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(),
                                                    b.v.data(), b.o.data(), b.lse.data(), d_o, dq, dk, dv);
                   });
  }
  cpu::embedding_backward(N, D.H, seq.tokens.data(), dx.data(), grads.embed());
  return static_cast<double>(loss) / static_cast<double>(counted);
}

}  // namespace oomb_trainer
