// oomb trainer — one Qwen2 decoder layer over a run of tokens, forward and backward.
// SPDX-License-Identifier: Apache-2.0
//
//   xn1 = rmsnorm(x); q, k, v = xn1 W^T + b; rope(q, k); o = attention(q, k, v)
//   x1 = x + o W_o^T; xn2 = rmsnorm(x1); h = silu(xn2 W_g^T) * (xn2 W_u^T); x_out = x1 + h W_d^T
//
// The attention is a callback, so the two training paths share every other line: the full
// sequence passes contiguous causal attention, the chunk-recurrent path paged attention over the
// cache (which also writes the chunk's K/V to its pages).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/cpu/linear.hpp"
#include "trainer/cpu/rmsnorm.hpp"
#include "trainer/cpu/rope.hpp"
#include "trainer/cpu/swiglu.hpp"
#include "trainer/io/config.hpp"
#include "trainer/model/params.hpp"

namespace oomb_trainer {

/// The sizes one layer needs, named as in the rest of the trainer.
struct block_dims {
  std::int32_t H = 0, I = 0, hq = 0, hkv = 0, d = 0;
  double eps = 0;
  explicit block_dims(const model_config& c)
      : H(c.hidden_size), I(c.intermediate_size), hq(c.num_attention_heads), hkv(c.num_key_value_heads),
        d(c.head_dim), eps(c.rms_norm_eps) {}
  std::int32_t qdim() const noexcept { return hq * d; }
  std::int32_t kvdim() const noexcept { return hkv * d; }
};

/// What the backward of one layer needs from its forward, for n tokens.
template <class T>
struct block_acts {
  std::int64_t n = 0;
  std::vector<T> x_in, xn1, rstd1, q, k, v, o, lse, x1, xn2, rstd2, g, u, h;

  void resize(std::int64_t tokens, const block_dims& D) {
    n = tokens;
    auto sz = [&](std::int64_t per) { return static_cast<std::size_t>(tokens * per); };
    x_in.resize(sz(D.H));
    xn1.resize(sz(D.H));
    rstd1.resize(sz(1));
    q.resize(sz(D.qdim()));
    k.resize(sz(D.kvdim()));
    v.resize(sz(D.kvdim()));
    o.resize(sz(D.qdim()));
    lse.resize(sz(D.hq));
    x1.resize(sz(D.H));
    xn2.resize(sz(D.H));
    rstd2.resize(sz(1));
    g.resize(sz(D.I));
    u.resize(sz(D.I));
    h.resize(sz(D.I));
  }
  /// Bytes held (for the memory report).
  std::size_t bytes() const noexcept {
    std::size_t n_el = 0;
    for (const auto* v_ : {&x_in, &xn1, &rstd1, &q, &k, &v, &o, &lse, &x1, &xn2, &rstd2, &g, &u, &h})
      n_el += v_->capacity();
    return n_el * sizeof(T);
  }
};

/// Scratch of the backward, reused across layers and chunks.
template <class T>
struct block_scratch {
  std::vector<T> tmp, dx1, dxn, dh, dg, du, d_o, dq, dk, dv;
};

/// Forward of layer `p` over acts.n tokens: x [n][H] is the input and becomes the output.
/// attention(a) must fill a.o [n][hq*d] and a.lse [hq][n] from a.q, a.k, a.v (RoPE applied).
/// With `finish == false` only q/k/v and the attention run (what a last layer needs in stage 1,
/// where nothing reads its output).
template <class T, class Attention>
void block_forward(const block_dims& D, const layer_params<const T>& p, const cpu::rope_table<T>& rope,
                   T* x, block_acts<T>& a, Attention&& attention, bool finish = true) {
  const std::int64_t n = a.n;
  std::copy(x, x + n * D.H, a.x_in.begin());
  cpu::rmsnorm_forward(n, D.H, x, p.input_norm, T(D.eps), a.xn1.data(), a.rstd1.data());
  cpu::linear_forward(n, D.H, D.qdim(), a.xn1.data(), p.q_w, p.q_b, a.q.data());
  cpu::linear_forward(n, D.H, D.kvdim(), a.xn1.data(), p.k_w, p.k_b, a.k.data());
  cpu::linear_forward(n, D.H, D.kvdim(), a.xn1.data(), p.v_w, p.v_b, a.v.data());
  cpu::rope_forward(n, D.hq, D.d, a.q.data(), rope);
  cpu::rope_forward(n, D.hkv, D.d, a.k.data(), rope);
  attention(a);
  if (!finish) return;
  // x1 = x + o W_o^T (x still holds the input)
  cpu::linear_forward(n, D.qdim(), D.H, a.o.data(), p.o_w, static_cast<const T*>(nullptr), a.x1.data());
  for (std::int64_t i = 0; i < n * D.H; ++i) a.x1[static_cast<std::size_t>(i)] += x[i];
  cpu::rmsnorm_forward(n, D.H, a.x1.data(), p.post_norm, T(D.eps), a.xn2.data(), a.rstd2.data());
  cpu::linear_forward(n, D.H, D.I, a.xn2.data(), p.gate_w, static_cast<const T*>(nullptr), a.g.data());
  cpu::linear_forward(n, D.H, D.I, a.xn2.data(), p.up_w, static_cast<const T*>(nullptr), a.u.data());
  cpu::swiglu_forward(n * D.I, a.g.data(), a.u.data(), a.h.data());
  cpu::linear_forward(n, D.I, D.H, a.h.data(), p.down_w, static_cast<const T*>(nullptr), x);
  for (std::int64_t i = 0; i < n * D.H; ++i) x[i] += a.x1[static_cast<std::size_t>(i)];
}

/// Backward of block_forward: dx [n][H] holds d(output) and becomes d(input); parameter gradients
/// are added into `gp`. attention_backward(a, d_o, dq, dk, dv) must WRITE dq [n][hq*d], dk and dv
/// [n][hkv*d] (the gradients of the chunk's own q, k, v after RoPE).
template <class T, class AttentionBackward>
void block_backward(const block_dims& D, const layer_params<const T>& p, const layer_params<T>& gp,
                    const cpu::rope_table<T>& rope, block_acts<T>& a, T* dx, block_scratch<T>& s,
                    AttentionBackward&& attention_backward) {
  const std::int64_t n = a.n;
  auto sized = [](std::vector<T>& v, std::int64_t count) -> T* {
    v.assign(static_cast<std::size_t>(count), T(0));
    return v.data();
  };
  // MLP: x_out = x1 + h W_d^T
  T* dh = sized(s.dh, n * D.I);
  cpu::linear_backward(n, D.I, D.H, a.h.data(), p.down_w, dx, dh, gp.down_w, static_cast<T*>(nullptr));
  T* dg = sized(s.dg, n * D.I);
  T* du = sized(s.du, n * D.I);
  cpu::swiglu_backward(n * D.I, a.g.data(), a.u.data(), dh, dg, du);
  T* dxn = sized(s.dxn, n * D.H);
  cpu::linear_backward(n, D.H, D.I, a.xn2.data(), p.gate_w, dg, dxn, gp.gate_w, static_cast<T*>(nullptr));
  cpu::linear_backward(n, D.H, D.I, a.xn2.data(), p.up_w, du, dxn, gp.up_w, static_cast<T*>(nullptr));
  // dx1 = dx_out + rmsnorm backward
  s.dx1.assign(dx, dx + n * D.H);
  cpu::rmsnorm_backward(n, D.H, a.x1.data(), p.post_norm, a.rstd2.data(), dxn, s.dx1.data(), gp.post_norm);
  // attention: x1 = x + o W_o^T
  T* d_o = sized(s.d_o, n * D.qdim());
  cpu::linear_backward(n, D.qdim(), D.H, a.o.data(), p.o_w, s.dx1.data(), d_o, gp.o_w, static_cast<T*>(nullptr));
  T* dq = sized(s.dq, n * D.qdim());
  T* dk = sized(s.dk, n * D.kvdim());
  T* dv = sized(s.dv, n * D.kvdim());
  attention_backward(a, static_cast<const T*>(d_o), dq, dk, dv);
  cpu::rope_backward(n, D.hq, D.d, dq, rope);
  cpu::rope_backward(n, D.hkv, D.d, dk, rope);
  dxn = sized(s.dxn, n * D.H);
  cpu::linear_backward(n, D.H, D.qdim(), a.xn1.data(), p.q_w, dq, dxn, gp.q_w, gp.q_b);
  cpu::linear_backward(n, D.H, D.kvdim(), a.xn1.data(), p.k_w, dk, dxn, gp.k_w, gp.k_b);
  cpu::linear_backward(n, D.H, D.kvdim(), a.xn1.data(), p.v_w, dv, dxn, gp.v_w, gp.v_b);
  // dx_in = dx1 + rmsnorm backward
  std::copy(s.dx1.begin(), s.dx1.end(), dx);
  cpu::rmsnorm_backward(n, D.H, a.x_in.data(), p.input_norm, a.rstd1.data(), dxn, dx, gp.input_norm);
}

}  // namespace oomb_trainer
