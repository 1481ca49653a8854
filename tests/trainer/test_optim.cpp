// AdamW, gradient clipping and the learning-rate schedule against hand-computed values and
// torch.optim.AdamW / torch.nn.utils.clip_grad_norm_ (values pasted from a float64 run).
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "io_test_util.hpp"
#include "trainer/optim/adamw.hpp"
#include "trainer/optim/clip.hpp"
#include "trainer/optim/schedule.hpp"

using namespace oomb_trainer;
using io_test::expect_error;

TEST_CASE("AdamW step 1 by hand: p <- p (1 - lr wd) - lr g / (|g| + eps)") {
  std::vector<double> w = {0.5, -1.5, 2.0}, b = {0.25, -0.75};
  std::vector<double> gw = {0.1, -0.2, 0.3}, gb = {0.5, -0.05};
  std::vector<named_tensor<double>> params = {{"w", {1, 3}, w.data()}, {"b", {2}, b.data()}};
  std::vector<named_tensor<double>> grads = {{"w", {1, 3}, gw.data()}, {"b", {2}, gb.data()}};
  adamw_options o;
  o.weight_decay = 0.1;
  adamw<double> opt(params, o);
  CHECK(opt.decays(0));
  CHECK(!opt.decays(1));  // rank-1: a bias or norm weight
  const std::vector<double> w0 = w, b0 = b;
  opt.step(0.1, params, grads);
  CHECK(opt.steps_taken() == 1);
  // After one step the bias-corrected moments are exactly g and g^2.
  for (int i = 0; i < 3; ++i)
    CHECK(w[i] == doctest::Approx(w0[i] * (1 - 0.1 * 0.1) - 0.1 * gw[i] / (std::fabs(gw[i]) + 1e-8)).epsilon(1e-15));
  for (int i = 0; i < 2; ++i)
    CHECK(b[i] == doctest::Approx(b0[i] - 0.1 * gb[i] / (std::fabs(gb[i]) + 1e-8)).epsilon(1e-15));
  CHECK(opt.exp_avg(0)[1] == doctest::Approx(0.1 * -0.2).epsilon(1e-15));
  CHECK(opt.exp_avg_sq(0)[2] == doctest::Approx(0.001 * 0.09).epsilon(1e-15));
}

TEST_CASE("AdamW three steps match torch.optim.AdamW (float64), moments too") {
  std::vector<double> w = {0.5, -1.5, 2.0}, b = {0.25, -0.75};
  std::vector<double> gw(3), gb(2);
  std::vector<named_tensor<double>> params = {{"w", {1, 3}, w.data()}, {"b", {2}, b.data()}};
  std::vector<named_tensor<double>> grads = {{"w", {1, 3}, gw.data()}, {"b", {2}, gb.data()}};
  adamw_options o;
  o.weight_decay = 0.1;
  adamw<double> opt(params, o);
  const double gws[3][3] = {{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.05}, {1.0, -0.01, 0.2}};
  const double gbs[3][2] = {{0.5, -0.05}, {0.2, 0.3}, {-0.7, 0.01}};
  const double lrs[3] = {0.1, 0.05, 0.02};
  // torch 2.15, float64, AdamW(betas=(0.9, 0.999), eps=1e-8), weight_decay 0.1 on w, 0 on b.
  const double tw[3][3] = {{0.395000009999999, -1.3850000049999998, 1.8800000033333333},
                           {0.4210001836925637, -1.4001857675836162, 1.8314336377253029},
                           {0.4116413159669103, -1.403983546137807, 1.8106305991103617}};
  const double tb[3][2] = {{0.15000000199999997, -0.650000019999996},
                           {0.1050712429514641, -0.6811959518730872},
                           {0.10673544094603317, -0.6912566248428313}};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 3; ++i) gw[i] = gws[s][i];
    for (int i = 0; i < 2; ++i) gb[i] = gbs[s][i];
    opt.step(lrs[s], params, grads);
    for (int i = 0; i < 3; ++i) CHECK(w[i] == doctest::Approx(tw[s][i]).epsilon(1e-14));
    for (int i = 0; i < 2; ++i) CHECK(b[i] == doctest::Approx(tb[s][i]).epsilon(1e-14));
  }
  const double tm[3] = {0.07209999999999997, 0.027799999999999995, 0.04879999999999999};
  const double tv[3] = {0.001169820010000001, 0.00028977004000000023, 0.00013231759000000012};
  for (int i = 0; i < 3; ++i) {
    CHECK(opt.exp_avg(0)[i] == doctest::Approx(tm[i]).epsilon(1e-14));
    CHECK(opt.exp_avg_sq(0)[i] == doctest::Approx(tv[i]).epsilon(1e-14));
  }
}

TEST_CASE("AdamW in float follows the double run; decay_vectors decays biases too") {
  const auto p0 = io_test::random_vector<double>(64, 7);
  std::vector<double> pd = p0;
  std::vector<float> pf(p0.begin(), p0.end());
  adamw_options o;
  o.weight_decay = 0.05;
  adamw<double> od({{"x", {8, 8}, pd.data()}}, o);
  adamw<float> of({{"x", {8, 8}, pf.data()}}, o);
  for (int s = 0; s < 5; ++s) {
    auto g = io_test::random_vector<double>(64, 100 + static_cast<std::uint64_t>(s));
    std::vector<float> gf(g.begin(), g.end());
    std::vector<double> gd(gf.begin(), gf.end());  // the same (float-representable) gradients
    od.step(1e-2, {{"x", {8, 8}, pd.data()}}, {{"x", {8, 8}, gd.data()}});
    of.step(1e-2, {{"x", {8, 8}, pf.data()}}, {{"x", {8, 8}, gf.data()}});
  }
  double num = 0, den = 0;
  for (int i = 0; i < 64; ++i) {
    num += (pf[i] - pd[i]) * (pf[i] - pd[i]);
    den += (pd[i] - p0[i]) * (pd[i] - p0[i]);
  }
  CHECK(std::sqrt(num / den) < 1e-4);  // float rounding only, relative to the distance moved

  // Zero gradients: only decay acts (m = v = 0 gives a zero Adam update).
  std::vector<double> v = {1.0, -2.0}, z = {0.0, 0.0};
  adamw_options d = o;
  d.decay_vectors = true;
  adamw<double> ov({{"bias", {2}, v.data()}}, d);
  CHECK(ov.decays(0));
  ov.step(0.5, {{"bias", {2}, v.data()}}, {{"bias", {2}, z.data()}});
  CHECK(v[0] == 1.0 * (1 - 0.5 * 0.05));
  CHECK(v[1] == -2.0 * (1 - 0.5 * 0.05));
}

TEST_CASE("AdamW resumes bit for bit from its state tensors and step count") {
  const auto p0 = io_test::random_vector<double>(30, 9);
  std::vector<std::vector<double>> gs;
  for (int s = 0; s < 4; ++s) gs.push_back(io_test::random_vector<double>(30, 200 + static_cast<std::uint64_t>(s)));
  adamw_options o;
  o.weight_decay = 0.01;
  std::vector<double> a = p0;
  adamw<double> straight({{"p", {5, 6}, a.data()}}, o);
  for (auto& g : gs) straight.step(3e-3, {{"p", {5, 6}, a.data()}}, {{"p", {5, 6}, g.data()}});

  std::vector<double> b = p0;
  adamw<double> first({{"p", {5, 6}, b.data()}}, o);
  for (int s = 0; s < 2; ++s) first.step(3e-3, {{"p", {5, 6}, b.data()}}, {{"p", {5, 6}, gs[s].data()}});
  adamw<double> second({{"p", {5, 6}, b.data()}}, o);
  auto from = first.state_tensors(), to = second.state_tensors();
  REQUIRE(from.size() == 2);
  CHECK(from[0].name == "p.exp_avg");
  CHECK(from[1].name == "p.exp_avg_sq");
  CHECK(from[1].shape == std::vector<std::int64_t>{5, 6});
  for (std::size_t t = 0; t < 2; ++t) std::copy(from[t].data, from[t].data + 30, to[t].data);
  second.set_steps_taken(first.steps_taken());
  for (int s = 2; s < 4; ++s) second.step(3e-3, {{"p", {5, 6}, b.data()}}, {{"p", {5, 6}, gs[s].data()}});
  CHECK(std::memcmp(a.data(), b.data(), 30 * sizeof(double)) == 0);
}

TEST_CASE("AdamW refuses mismatched parameters and bad options") {
  std::vector<double> p(6, 1.0), g(6, 0.5);
  adamw<double> opt({{"p", {2, 3}, p.data()}});
  expect_error<oomb::invalid_argument>([&] { opt.step(0.1, {{"q", {2, 3}, p.data()}}, {{"p", {2, 3}, g.data()}}); },
                                       {"'q'", "'p'"});
  expect_error<oomb::invalid_argument>([&] { opt.step(0.1, {{"p", {3, 2}, p.data()}}, {{"p", {2, 3}, g.data()}}); },
                                       {"[3, 2]", "[2, 3]"});
  expect_error<oomb::invalid_argument>([&] { opt.step(0.1, {}, {}); }, {"1 parameters registered"});
  expect_error<oomb::invalid_argument>([&] { opt.step(std::nan(""), {{"p", {2, 3}, p.data()}}, {{"p", {2, 3}, g.data()}}); },
                                       {"learning rate"});
  CHECK(p == std::vector<double>(6, 1.0));  // nothing changed
  adamw_options bad;
  bad.beta2 = 1.0;
  expect_error<oomb::invalid_argument>([&] { adamw<double> o({{"p", {6}, p.data()}}, bad); }, {"beta2"});
  expect_error<oomb::invalid_argument>([&] { adamw<double> o({{"p", {6}, p.data()}, {"p", {6}, p.data()}}); },
                                       {"'p' registered twice"});
}

TEST_CASE("global gradient-norm clipping: norm returned, scaled as torch's clip_grad_norm_") {
  std::vector<double> a = {3.0, 4.0}, b = {12.0};
  std::vector<named_tensor<double>> g = {{"a", {2}, a.data()}, {"b", {1}, b.data()}};
  CHECK(global_grad_norm(g) == 13.0);
  CHECK(clip_grad_norm(g, 6.5) == 13.0);
  // torch: clip_grad_norm_([3, 4], [12], 6.5) -> [1.4999998846153937, 1.9999998461538582], [5.999999538461575]
  CHECK(a[0] == doctest::Approx(1.4999998846153937).epsilon(1e-15));
  CHECK(a[1] == doctest::Approx(1.9999998461538582).epsilon(1e-15));
  CHECK(b[0] == doctest::Approx(5.999999538461575).epsilon(1e-15));
  CHECK(global_grad_norm(g) == doctest::Approx(6.5).epsilon(1e-6));

  std::vector<float> c = {0.3f, -0.4f};
  std::vector<named_tensor<float>> gf = {{"c", {2}, c.data()}};
  CHECK(clip_grad_norm(gf, 1.0) == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(c == std::vector<float>{0.3f, -0.4f});  // below the limit: untouched
  CHECK(clip_grad_norm(gf, 0.0) == doctest::Approx(0.5).epsilon(1e-7));  // 0 disables clipping
  CHECK(c == std::vector<float>{0.3f, -0.4f});

  std::vector<double> n = {1.0, std::numeric_limits<double>::quiet_NaN()};
  std::vector<named_tensor<double>> gn = {{"n", {2}, n.data()}};
  CHECK(std::isnan(clip_grad_norm(gn, 1.0)));
  CHECK(n[0] == 1.0);  // left for the caller to handle
  expect_error<oomb::invalid_argument>([&] { (void)clip_grad_norm(g, std::nan("")); }, {"NaN"});
}

TEST_CASE("lr schedule: linear warm-up to max, then cosine or linear to min, or constant") {
  using oomb_trainer::lr_schedule_kind;
  const lr_schedule s(lr_schedule_kind::cosine, 1e-3, 1e-4, 10, 110);
  CHECK(s(0) == doctest::Approx(1e-4).epsilon(1e-15));
  CHECK(s(4) == doctest::Approx(5e-4).epsilon(1e-15));
  CHECK(s(9) == doctest::Approx(1e-3).epsilon(1e-15));
  CHECK(s(10) == doctest::Approx(1e-3).epsilon(1e-15));
  CHECK(s(60) == doctest::Approx(5.5e-4).epsilon(1e-14));  // half way: the mean
  CHECK(s(35) == doctest::Approx(1e-4 + 9e-4 * 0.5 * (1 + std::cos(M_PI * 0.25))).epsilon(1e-14));
  CHECK(s(110) == 1e-4);
  CHECK(s(1000) == 1e-4);
  for (std::int64_t t = 10; t < 110; ++t) CHECK(s(t + 1) <= s(t));
  const lr_schedule flat(lr_schedule_kind::cosine, 2e-3, 2e-3, 0, 0);
  CHECK(flat(0) == 2e-3);
  const lr_schedule no_warmup(lr_schedule_kind::cosine, 1.0, 0.0, 0, 4);
  CHECK(no_warmup(0) == 1.0);
  CHECK(no_warmup(2) == doctest::Approx(0.5).epsilon(1e-15));

  // Linear: the same warm-up, then a straight line: a quarter of the way, three quarters of the span left.
  const lr_schedule lin(lr_schedule_kind::linear, 1e-3, 1e-4, 10, 110);
  CHECK(lin(4) == s(4));
  CHECK(lin(10) == doctest::Approx(1e-3).epsilon(1e-15));
  CHECK(lin(35) == doctest::Approx(1e-4 + 9e-4 * 0.75).epsilon(1e-14));
  CHECK(lin(60) == doctest::Approx(5.5e-4).epsilon(1e-14));
  CHECK(lin(109) == doctest::Approx(1e-4 + 9e-4 * 0.01).epsilon(1e-14));
  CHECK(lin(110) == 1e-4);
  for (std::int64_t t = 10; t < 110; ++t) CHECK(lin(t) - lin(t + 1) == doctest::Approx(9e-6).epsilon(1e-9));
  // Constant: the warm-up, then max_lr for ever (min_lr unused).
  const lr_schedule flat_after(lr_schedule_kind::constant, 1e-3, 1e-4, 10, 110);
  CHECK(flat_after(4) == s(4));
  CHECK(flat_after(10) == 1e-3);
  CHECK(flat_after(109) == 1e-3);
  CHECK(flat_after(5000) == 1e-3);

  CHECK(oomb_trainer::parse_lr_schedule("linear") == lr_schedule_kind::linear);
  CHECK(std::string(oomb_trainer::lr_schedule_name(lr_schedule_kind::constant)) == "constant");
  expect_error<oomb::invalid_argument>([] { (void)oomb_trainer::parse_lr_schedule("step"); }, {"'step' is not cosine, linear or constant"});
  expect_error<oomb::invalid_argument>([] { lr_schedule x(lr_schedule_kind::cosine, 1e-3, 1e-2, 0, 10); }, {"min_lr"});
  expect_error<oomb::invalid_argument>([] { lr_schedule x(lr_schedule_kind::linear, 1e-3, 0, 20, 10); }, {"shorter than the warm-up"});
  expect_error<oomb::invalid_argument>([&] { (void)s(-1); }, {"negative step"});
}
