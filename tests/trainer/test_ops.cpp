// Every CPU op's backward against central finite differences in double, on tiny shapes.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "test_util.hpp"
#include "trainer/cpu/causal_attention.hpp"
#include "trainer/cpu/cross_entropy.hpp"
#include "trainer/cpu/embedding.hpp"
#include "trainer/cpu/linear.hpp"
#include "trainer/cpu/rmsnorm.hpp"
#include "trainer/cpu/rope.hpp"
#include "trainer/cpu/swiglu.hpp"

namespace {

using trainer_test::random_vector;
using trainer_test::rel_err;
using vec = std::vector<double>;

/// Central differences of loss() with respect to every element of x.
template <class F>
vec numeric_grad(vec& x, F&& loss, double eps = 1e-6) {
  vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double lp = loss();
    x[i] = keep - eps;
    const double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

double weighted_sum(const vec& w, const vec& y) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

}  // namespace

TEST_CASE("ops: embedding backward scatters rows (repeated tokens add)") {
  const std::int32_t H = 5, V = 7, n = 6;
  const std::vector<std::int32_t> tokens{3, 0, 3, 6, 1, 3};
  vec table = random_vector<double>(V * H, 1);
  const vec w = random_vector<double>(n * H, 2);
  auto loss = [&] {
    vec out(n * H);
    oomb_trainer::cpu::embedding_forward(n, H, V, tokens.data(), table.data(), out.data());
    return weighted_sum(w, out);
  };
  vec dtable(table.size(), 0.0);
  oomb_trainer::cpu::embedding_backward(n, H, tokens.data(), w.data(), dtable.data());
  CHECK(rel_err(dtable, numeric_grad(table, loss)) < 1e-8);
  const std::vector<std::int32_t> bad{1, 7};
  vec out(2 * H);
  CHECK_THROWS_WITH_AS(oomb_trainer::cpu::embedding_forward(2, H, V, bad.data(), table.data(), out.data()),
                       doctest::Contains("token 7 at position 1"), oomb::invalid_argument);
}

TEST_CASE("ops: RMSNorm forward and backward") {
  const std::int32_t H = 11, n = 3;  // H not a multiple of the 8 lanes
  vec x = random_vector<double>(n * H, 3), wn = random_vector<double>(H, 4, 0.5, 1.5);
  const vec w = random_vector<double>(n * H, 5);
  const double eps = 1e-6;
  auto fwd = [&](vec& y, vec& r) {
    y.assign(n * H, 0);
    r.assign(n, 0);
    oomb_trainer::cpu::rmsnorm_forward(n, H, x.data(), wn.data(), eps, y.data(), r.data());
  };
  vec y, r;
  fwd(y, r);
  double ms = 0;
  for (int i = 0; i < H; ++i) ms += x[i] * x[i];
  CHECK(y[2] == doctest::Approx(wn[2] * x[2] / std::sqrt(ms / H + eps)).epsilon(1e-14));
  auto loss = [&] {
    vec yy, rr;
    fwd(yy, rr);
    return weighted_sum(w, yy);
  };
  vec dx(x.size(), 0.0), dw(H, 0.0);
  oomb_trainer::cpu::rmsnorm_backward(n, H, x.data(), wn.data(), r.data(), w.data(), dx.data(), dw.data());
  CHECK(rel_err(dx, numeric_grad(x, loss)) < 1e-8);
  CHECK(rel_err(dw, numeric_grad(wn, loss)) < 1e-8);
}

TEST_CASE("ops: linear with and without bias") {
  const std::int32_t in = 13, out = 6, n = 4;
  vec x = random_vector<double>(n * in, 6), W = random_vector<double>(out * in, 7), b = random_vector<double>(out, 8);
  const vec w = random_vector<double>(n * out, 9);
  for (bool bias : {true, false}) {
    auto loss = [&] {
      vec y(n * out);
      oomb_trainer::cpu::linear_forward(n, in, out, x.data(), W.data(), bias ? b.data() : nullptr, y.data());
      return weighted_sum(w, y);
    };
    vec dx(x.size(), 0.0), dW(W.size(), 0.0), db(b.size(), 0.0);
    oomb_trainer::cpu::linear_backward(n, in, out, x.data(), W.data(), w.data(), dx.data(), dW.data(),
                                       bias ? db.data() : nullptr);
    CHECK(rel_err(dx, numeric_grad(x, loss)) < 1e-8);
    CHECK(rel_err(dW, numeric_grad(W, loss)) < 1e-8);
    if (bias) CHECK(rel_err(db, numeric_grad(b, loss)) < 1e-8);
  }
}

TEST_CASE("ops: RoPE rotate-half at absolute positions") {
  const std::int32_t heads = 3, d = 8, n = 5;
  const double theta = 10000.0;
  oomb_trainer::rope_config plain;
  plain.theta = theta;
  const auto freqs = oomb_trainer::rope_frequencies_for(plain, d, 1000 + n);
  const oomb_trainer::cpu::rope_table<double> tab(1000, n, freqs);
  // Rows of a table starting later are the same bits as the matching rows of one starting at 0.
  const oomb_trainer::cpu::rope_table<double> whole(0, 1000 + n, freqs);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int32_t i = 0; i < d / 2; ++i) {
      CHECK(tab.cos[static_cast<std::size_t>(t * 4 + i)] == whole.cos[static_cast<std::size_t>((1000 + t) * 4 + i)]);
      CHECK(tab.sin[static_cast<std::size_t>(t * 4 + i)] == whole.sin[static_cast<std::size_t>((1000 + t) * 4 + i)]);
    }
  // The HF formula for one element: position 1002, dimension pair (1, 5).
  vec x = random_vector<double>(n * heads * d, 10);
  vec y = x;
  oomb_trainer::cpu::rope_forward(n, heads, d, y.data(), tab);
  const double angle = 1002.0 / std::pow(theta, 2.0 / 8.0);
  const std::size_t base = (2 * heads + 1) * d;  // row t = 2, head 1
  const double c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));  // fp32 tables
  CHECK(y[base + 1] == doctest::Approx(x[base + 1] * c - x[base + 5] * s).epsilon(1e-14));
  CHECK(y[base + 5] == doctest::Approx(x[base + 5] * c + x[base + 1] * s).epsilon(1e-14));
  CHECK(std::abs(c - std::cos(angle)) > 0);  // the rounding is real: angle computed in double, stored fp32

  const vec w = random_vector<double>(x.size(), 11);
  auto loss = [&] {
    vec z = x;
    oomb_trainer::cpu::rope_forward(n, heads, d, z.data(), tab);
    return weighted_sum(w, z);
  };
  vec dx = w;
  oomb_trainer::cpu::rope_backward(n, heads, d, dx.data(), tab);
  CHECK(rel_err(dx, numeric_grad(x, loss)) < 1e-8);
  // float and double tables hold the same fp32 values.
  const oomb_trainer::cpu::rope_table<float> tf(1000, n, freqs);
  for (std::size_t i = 0; i < tf.cos.size(); ++i) {
    CHECK(static_cast<double>(tf.cos[i]) == tab.cos[i]);
    CHECK(static_cast<double>(tf.sin[i]) == tab.sin[i]);
  }
  // The attention factor (yarn, longrope) scales cos and sin before they are rounded to fp32.
  auto scaled = freqs;
  scaled.attention_factor = 1.25;
  const oomb_trainer::cpu::rope_table<double> ts(1000, n, scaled);
  for (std::size_t i = 0; i < ts.cos.size(); ++i) {
    const double a = double(1000 + std::int64_t(i) / (d / 2)) * freqs.inv_freq[i % std::size_t(d / 2)];
    CHECK(ts.cos[i] == double(static_cast<float>(std::cos(a) * 1.25)));
    CHECK(ts.sin[i] == double(static_cast<float>(std::sin(a) * 1.25)));
  }
}

TEST_CASE("ops: SwiGLU") {
  const std::int32_t n = 17;
  vec g = random_vector<double>(n, 12, -3, 3), u = random_vector<double>(n, 13);
  const vec w = random_vector<double>(n, 14);
  auto loss = [&] {
    vec h(n);
    oomb_trainer::cpu::swiglu_forward(n, g.data(), u.data(), h.data());
    return weighted_sum(w, h);
  };
  vec dg(n), du(n);
  oomb_trainer::cpu::swiglu_backward(n, g.data(), u.data(), w.data(), dg.data(), du.data());
  CHECK(rel_err(dg, numeric_grad(g, loss)) < 1e-8);
  CHECK(rel_err(du, numeric_grad(u, loss)) < 1e-8);
}

TEST_CASE("ops: cross-entropy row") {
  const std::int32_t V = 9;
  vec logits = random_vector<double>(V, 15, -4, 4);
  const double scale = 0.37;
  vec dl(V);
  const double l = oomb_trainer::cpu::cross_entropy_row(V, logits.data(), 4, scale, dl.data());
  double sum = 0;
  for (double x : logits) sum += std::exp(x);
  CHECK(l == doctest::Approx(std::log(sum) - logits[4]).epsilon(1e-14));
  auto loss = [&] {
    vec tmp(V);
    return scale * oomb_trainer::cpu::cross_entropy_row(V, logits.data(), 4, 1.0, tmp.data());
  };
  CHECK(rel_err(dl, numeric_grad(logits, loss)) < 1e-8);
  CHECK_THROWS_WITH_AS(oomb_trainer::cpu::cross_entropy_row(V, logits.data(), 9, 1.0, dl.data()),
                       doctest::Contains("target 9"), oomb::invalid_argument);
}

TEST_CASE("ops: causal attention over contiguous arrays (the baseline), GQA 1, 2, 3") {
  for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{3, 1}}) {
    CAPTURE(hq);
    const std::int32_t n = 9, d = 4;
    const double scale = 0.5;
    vec q = random_vector<double>(n * hq * d, 16), k = random_vector<double>(n * hkv * d, 17),
        v = random_vector<double>(n * hkv * d, 18);
    const vec w = random_vector<double>(q.size(), 19);
    auto fwd = [&](vec& o, vec& lse) {
      o.assign(q.size(), 0);
      lse.assign(static_cast<std::size_t>(hq * n), 0);
      oomb_trainer::cpu::causal_attention_forward(n, hq, hkv, d, scale, q.data(), k.data(), v.data(), o.data(),
                                                  lse.data());
    };
    vec o, lse;
    fwd(o, lse);
    // Query 0 sees only key 0: its output is v[0] and its lse the single score.
    for (int x = 0; x < d; ++x) CHECK(o[static_cast<std::size_t>(x)] == doctest::Approx(v[static_cast<std::size_t>(x)]));
    auto loss = [&] {
      vec oo, ll;
      fwd(oo, ll);
      return weighted_sum(w, oo);
    };
    vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    oomb_trainer::cpu::causal_attention_backward(n, hq, hkv, d, scale, q.data(), k.data(), v.data(), o.data(),
                                                 lse.data(), w.data(), dq.data(), dk.data(), dv.data());
    CHECK(rel_err(dq, numeric_grad(q, loss)) < 1e-8);
    CHECK(rel_err(dk, numeric_grad(k, loss)) < 1e-8);
    CHECK(rel_err(dv, numeric_grad(v, loss)) < 1e-8);
  }
}
