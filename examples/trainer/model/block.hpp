// oomb trainer — one decoder layer over a run of tokens, forward and backward.
// SPDX-License-Identifier: Apache-2.0
//
//   xn1 = rmsnorm(x); q, k, v = xn1 W^T (+ b); [qwen3: q, k = per-head rmsnorm(q), rmsnorm(k)];
//   rope(q, k); o = attention(q, k, v); x1 = x + o W_o^T (+ b_o); xn2 = rmsnorm(x1);
//   h = silu(xn2 W_g^T (+ b_g)) * (xn2 W_u^T (+ b_u)); x_out = x1 + h W_d^T (+ b_d)
// Biases the model lacks are null pointers (model/params.hpp), which every linear op skips.
//
// The attention is a callback, so the two training paths share every other line: the full
// sequence passes contiguous causal attention, the chunk-recurrent path paged attention over the
// cache (which also writes the chunk's K/V to its pages). Every op goes through the trainer
// backend B (ops/ops_backend.hpp), so the same lines run on the host and on a GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "trainer/io/config.hpp"
#include "trainer/model/params.hpp"
#include "trainer/model/rope_frequencies.hpp"

namespace oomb_trainer {

/// The sizes one layer needs, named as in the rest of the trainer.
struct block_dims {
  std::int32_t H = 0, I = 0, hq = 0, hkv = 0, d = 0;
  double eps = 0;
  bool qk_norm = false;  ///< per-head RMSNorm of q and k before RoPE (qwen3)
  explicit block_dims(const model_config& c)
      : H(c.hidden_size), I(c.intermediate_size), hq(c.num_attention_heads), hkv(c.num_key_value_heads),
        d(c.head_dim), eps(c.rms_norm_eps), qk_norm(c.qk_norm) {}
  std::int32_t qdim() const noexcept { return hq * d; }
  std::int32_t kvdim() const noexcept { return hkv * d; }
};

/// What the backward of one layer needs from its forward, for n tokens, in B's compute memory.
template <class B>
struct block_acts {
  using T = typename B::value_type;
  using S = typename B::stat_type;
  std::int64_t n = 0;
  typename B::template buffer<T> x_in, xn1, q, k, v, o, x1, xn2, g, u, h;
  typename B::template buffer<S> rstd1, lse, rstd2;  // statistics: fp32 even where activations are bf16
  // qk_norm only (empty otherwise): q and k before their norms, and the norms' rstd per row and head.
  typename B::template buffer<T> q_raw, k_raw;
  typename B::template buffer<S> rstd_q, rstd_k;

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
    q_raw.resize(D.qk_norm ? sz(D.qdim()) : 0);
    k_raw.resize(D.qk_norm ? sz(D.kvdim()) : 0);
    rstd_q.resize(D.qk_norm ? sz(D.hq) : 0);
    rstd_k.resize(D.qk_norm ? sz(D.hkv) : 0);
  }
  /// Bytes held (for the memory report).
  std::size_t bytes() const noexcept {
    std::size_t n_el = 0;
    for (const auto* v_ : {&x_in, &xn1, &q, &k, &v, &o, &x1, &xn2, &g, &u, &h, &q_raw, &k_raw}) n_el += v_->size();
    std::size_t n_stat = 0;
    for (const auto* v_ : {&rstd1, &lse, &rstd2, &rstd_q, &rstd_k}) n_stat += v_->size();
    return n_el * sizeof(T) + n_stat * sizeof(S);
  }
};

/// Scratch of the backward, reused across layers and chunks.
template <class B>
struct block_scratch {
  typename B::template buffer<typename B::value_type> dx1, dxn, dh, dg, du, d_o, dq, dk, dv;
  typename B::template buffer<typename B::value_type> dq_raw, dk_raw;  // qk_norm only
};

/// Forward of layer `p` (B's compute weights) over acts.n tokens: x [n][H] is the input and
/// becomes the output.
/// attention(a) must fill a.o [n][hq*d] and a.lse [hq][n] from a.q, a.k, a.v (RoPE applied).
/// With `finish == false` only q/k/v and the attention run (what a last layer needs in stage 1,
/// where nothing reads its output).
template <class B, class W, class Attention>
void block_forward(B& be, const block_dims& D, const layer_params<W>& p, const typename B::rope_type& rope,
                   typename B::value_type* x, block_acts<B>& a, Attention&& attention, bool finish = true) {
  using S = typename B::stat_type;
  const std::int64_t n = a.n;
  be.copy(n * D.H, x, a.x_in.data());
  be.rmsnorm_forward(n, D.H, x, p.input_norm, S(D.eps), a.xn1.data(), a.rstd1.data());
  if (D.qk_norm) {  // q, k = per-head rmsnorm(xn1 W^T + b): rows of d, n * heads of them
    be.linear_forward(n, D.H, D.qdim(), a.xn1.data(), p.q_w, p.q_b, a.q_raw.data());
    be.linear_forward(n, D.H, D.kvdim(), a.xn1.data(), p.k_w, p.k_b, a.k_raw.data());
    be.rmsnorm_forward(n * D.hq, D.d, a.q_raw.data(), p.q_norm, S(D.eps), a.q.data(), a.rstd_q.data());
    be.rmsnorm_forward(n * D.hkv, D.d, a.k_raw.data(), p.k_norm, S(D.eps), a.k.data(), a.rstd_k.data());
  } else {
    be.linear_forward(n, D.H, D.qdim(), a.xn1.data(), p.q_w, p.q_b, a.q.data());
    be.linear_forward(n, D.H, D.kvdim(), a.xn1.data(), p.k_w, p.k_b, a.k.data());
  }
  be.linear_forward(n, D.H, D.kvdim(), a.xn1.data(), p.v_w, p.v_b, a.v.data());
  be.rope_forward(n, D.hq, D.d, a.q.data(), rope);
  be.rope_forward(n, D.hkv, D.d, a.k.data(), rope);
  attention(a);
  if (!finish) return;
  // x1 = x + o W_o^T + b_o (x still holds the input)
  be.linear_forward(n, D.qdim(), D.H, a.o.data(), p.o_w, p.o_b, a.x1.data());
  be.add(n * D.H, x, a.x1.data());
  be.rmsnorm_forward(n, D.H, a.x1.data(), p.post_norm, S(D.eps), a.xn2.data(), a.rstd2.data());
  be.linear_forward(n, D.H, D.I, a.xn2.data(), p.gate_w, p.gate_b, a.g.data());
  be.linear_forward(n, D.H, D.I, a.xn2.data(), p.up_w, p.up_b, a.u.data());
  be.swiglu_forward(n * D.I, a.g.data(), a.u.data(), a.h.data());
  be.linear_forward(n, D.I, D.H, a.h.data(), p.down_w, p.down_b, x);
  be.add(n * D.H, a.x1.data(), x);
}

/// Backward of block_forward: dx [n][H] holds d(output) and becomes d(input); parameter gradients
/// are added into `gp` (B's gradient tensors, perhaps of another element type than `p`). attention_backward(a, d_o, dq, dk, dv) must WRITE dq [n][hq*d], dk and dv
/// [n][hkv*d] (the gradients of the chunk's own q, k, v after RoPE).
template <class B, class W, class G, class AttentionBackward>
void block_backward(B& be, const block_dims& D, const layer_params<W>& p, const layer_params<G>& gp,
                    const typename B::rope_type& rope, block_acts<B>& a, typename B::value_type* dx, block_scratch<B>& s,
                    AttentionBackward&& attention_backward) {
  using T = typename B::value_type;
  const std::int64_t n = a.n;
  auto zeroed = [&be](typename B::template buffer<T>& v, std::int64_t count) -> T* {
    v.resize(static_cast<std::size_t>(count));
    be.fill(count, T(0), v.data());
    return v.data();
  };
  // MLP: x_out = x1 + h W_d^T
  T* dh = zeroed(s.dh, n * D.I);
  be.linear_backward(n, D.I, D.H, a.h.data(), p.down_w, dx, dh, gp.down_w, gp.down_b);
  T* dg = zeroed(s.dg, n * D.I);
  T* du = zeroed(s.du, n * D.I);
  be.swiglu_backward(n * D.I, a.g.data(), a.u.data(), dh, dg, du);
  T* dxn = zeroed(s.dxn, n * D.H);
  be.linear_backward(n, D.H, D.I, a.xn2.data(), p.gate_w, dg, dxn, gp.gate_w, gp.gate_b);
  be.linear_backward(n, D.H, D.I, a.xn2.data(), p.up_w, du, dxn, gp.up_w, gp.up_b);
  // dx1 = dx_out + rmsnorm backward
  s.dx1.resize(static_cast<std::size_t>(n * D.H));
  be.copy(n * D.H, dx, s.dx1.data());
  be.rmsnorm_backward(n, D.H, a.x1.data(), p.post_norm, a.rstd2.data(), dxn, s.dx1.data(), gp.post_norm);
  // attention: x1 = x + o W_o^T + b_o
  T* d_o = zeroed(s.d_o, n * D.qdim());
  be.linear_backward(n, D.qdim(), D.H, a.o.data(), p.o_w, s.dx1.data(), d_o, gp.o_w, gp.o_b);
  T* dq = zeroed(s.dq, n * D.qdim());
  T* dk = zeroed(s.dk, n * D.kvdim());
  T* dv = zeroed(s.dv, n * D.kvdim());
  attention_backward(a, static_cast<const T*>(d_o), dq, dk, dv);
  be.rope_backward(n, D.hq, D.d, dq, rope);
  be.rope_backward(n, D.hkv, D.d, dk, rope);
  if (D.qk_norm) {  // back through the per-head norms: dq, dk become the gradients of q_raw, k_raw
    T* dq_raw = zeroed(s.dq_raw, n * D.qdim());
    T* dk_raw = zeroed(s.dk_raw, n * D.kvdim());
    be.rmsnorm_backward(n * D.hq, D.d, a.q_raw.data(), p.q_norm, a.rstd_q.data(), dq, dq_raw, gp.q_norm);
    be.rmsnorm_backward(n * D.hkv, D.d, a.k_raw.data(), p.k_norm, a.rstd_k.data(), dk, dk_raw, gp.k_norm);
    dq = dq_raw;
    dk = dk_raw;
  }
  dxn = zeroed(s.dxn, n * D.H);
  be.linear_backward(n, D.H, D.qdim(), a.xn1.data(), p.q_w, dq, dxn, gp.q_w, gp.q_b);
  be.linear_backward(n, D.H, D.kvdim(), a.xn1.data(), p.k_w, dk, dxn, gp.k_w, gp.k_b);
  be.linear_backward(n, D.H, D.kvdim(), a.xn1.data(), p.v_w, dv, dxn, gp.v_w, gp.v_b);
  // dx_in = dx1 + rmsnorm backward
  be.copy(n * D.H, s.dx1.data(), dx);
  be.rmsnorm_backward(n, D.H, a.x_in.data(), p.input_norm, a.rstd1.data(), dxn, dx, gp.input_norm);
}

}  // namespace oomb_trainer
