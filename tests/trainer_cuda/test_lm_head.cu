// The fused LM head + cross-entropy against the CPU head's per-row linear + cross_entropy_row
// (float), for several tilings: whole-vocabulary rows, vocabulary tiles, partial last tiles.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>

#include <oomb/core/error.hpp>

#include "trainer/cpu/cross_entropy.hpp"
#include "trainer/cpu/linear.hpp"
#include "trainer/cuda/ops/lm_head_cross_entropy.cuh"

#include "device_util.cuh"

namespace {

using namespace ops_test;
namespace ops = oomb_trainer::gpu::ops;
namespace cpu = oomb_trainer::cpu;

// loss and lse come from fp32 logits of exact bf16 products: fp32 summation order only. The
// gradients go through bf16 dlogits (the GEMMs' input type): 2^-9 relative per element.
constexpr double tol_loss = 1e-5;
constexpr double tol_grad = 1e-2;

struct reference {
  std::vector<float> loss, lse, dx, dW;
};

reference run_cpu(std::int64_t n, std::int32_t H, std::int32_t V, const std::vector<float>& x, const std::vector<float>& W,
                  const std::vector<std::int32_t>& targets, float scale) {
  reference r;
  r.loss.assign(std::size_t(n), 0.0f);
  r.lse.resize(std::size_t(n));
  r.dx.assign(x.size(), 0.0f);
  r.dW.assign(W.size(), 0.0f);
  std::vector<float> logits(static_cast<std::size_t>(V)), dlogits(static_cast<std::size_t>(V));
  for (std::int64_t t = 0; t < n; ++t) {
    const float* xr = x.data() + t * H;
    cpu::linear_forward(1, H, V, xr, W.data(), static_cast<const float*>(nullptr), logits.data());
    double m = logits[0], s = 0;
    for (float l : logits) m = std::max(m, double(l));
    for (float l : logits) s += std::exp(double(l) - m);
    r.lse[std::size_t(t)] = float(m + std::log(s));
    const std::int32_t tg = targets[std::size_t(t)];
    if (tg < 0) continue;
    r.loss[std::size_t(t)] = cpu::cross_entropy_row(V, logits.data(), tg, scale, dlogits.data());
    cpu::linear_backward(1, H, V, xr, W.data(), dlogits.data(), r.dx.data() + t * H, r.dW.data(),
                         static_cast<float*>(nullptr));
  }
  return r;
}

struct problem {
  std::int64_t n;
  std::int32_t H, V;
  std::vector<bf16> x, W;
  std::vector<std::int32_t> targets;
  float scale;
};

problem make_problem(std::int64_t n, std::int32_t H, std::int32_t V, std::uint64_t seed) {
  problem p{n, H, V, random_bf16(std::size_t(n) * H, seed), random_bf16(std::size_t(V) * H, seed + 1), {}, 1.0f / float(n)};
  const auto u = random_vector<double>(std::size_t(n), seed + 2, 0.0, 1.0);
  p.targets.resize(std::size_t(n));
  for (std::size_t t = 0; t < p.targets.size(); ++t)
    p.targets[t] = u[t] < 0.1 ? -1 : std::int32_t(u[t] * V) % V;  // about 10% without a target
  p.targets[0] = 0;
  p.targets[1] = V - 1;
  return p;
}

struct gpu_result {
  std::vector<float> loss, lse, dx, dW;
  std::int32_t bad;
};

gpu_result run_gpu(const problem& p, const ops::lm_head_ce_plan& plan, const std::vector<float>& dW0, bool backward) {
  test_stream stream;
  ops::gemm_context ctx;
  device_array<bf16> x(p.x), W(p.W);
  device_array<std::int32_t> targets(p.targets), bad(std::vector<std::int32_t>{-1});
  device_array<float> loss(static_cast<std::size_t>(p.n)), lse(static_cast<std::size_t>(p.n)), dx(p.x.size()), dW(dW0);
  device_array<char> ws(ops::lm_head_ce_workspace_bytes(plan));
  dx.upload(random_vector<float>(p.x.size(), 99));  // poison: dx must be written, not added to
  ops::lm_head_ce_args a;
  a.n = p.n, a.H = p.H, a.V = p.V;
  a.x = x.get(), a.W = W.get(), a.targets = targets.get();
  a.loss = loss.get(), a.lse = lse.get(), a.bad_position = bad.get();
  a.scale = p.scale;
  if (backward) a.dx = dx.get(), a.dW = dW.get();
  ops::lm_head_cross_entropy(ctx, plan, a, ws.get(), ws.size(), stream.view());
  return {loss.download(), lse.download(), dx.download(), dW.download(), bad.download()[0]};
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

}  // namespace

TEST_CASE("lm_head_ce: loss, lse, dx and dW equal the CPU head for every tiling") {
  const problem p = make_problem(133, 72, 1003, 61);
  const reference ref = run_cpu(p.n, p.H, p.V, to_float(p.x), to_float(p.W), p.targets, p.scale);
  const auto dW0 = random_vector<float>(p.W.size(), 62, -1e-3, 1e-3);
  for (const ops::lm_head_ce_plan plan : {ops::lm_head_ce_plan{133, 1003}, ops::lm_head_ce_plan{50, 1003},
                                          ops::lm_head_ce_plan{64, 256}, ops::lm_head_ce_plan{133, 384}}) {
    CAPTURE(plan.tokens_tile);
    CAPTURE(plan.vocab_tile);
    const gpu_result g = run_gpu(p, plan, dW0, true);
    CHECK(g.bad == -1);
    expect_close("lm_head_ce loss", rel_err(g.loss, ref.loss), tol_loss);
    expect_close("lm_head_ce lse", rel_err(g.lse, ref.lse), tol_loss);
    expect_close("lm_head_ce dx", rel_err(g.dx, ref.dx), tol_grad);
    expect_close("lm_head_ce dW", rel_err(minus(g.dW, dW0), ref.dW), tol_grad);
    const gpu_result f = run_gpu(p, plan, dW0, false);  // forward only: the same loss, dW untouched
    CHECK(trainer_test::same_bits(f.loss, g.loss));
    CHECK(trainer_test::same_bits(f.dW, dW0));
  }
}

TEST_CASE("lm_head_ce: a target outside [-1, V) gives a NaN loss and its position") {
  problem p = make_problem(40, 16, 300, 71);
  p.targets[17] = p.V;
  const gpu_result g = run_gpu(p, {16, 128}, std::vector<float>(p.W.size(), 0.0f), true);
  CHECK(g.bad == 17);
  CHECK(std::isnan(g.loss[17]));
  CHECK(std::isfinite(g.loss[18]));
}

TEST_CASE("lm_head_ce: plans stay within the budget and prefer whole-vocabulary rows") {
  const std::int32_t V = 151936;
  const auto big = ops::plan_lm_head_ce(4096, V, std::size_t(1) << 30);
  CHECK(big.vocab_tile == V);
  CHECK(big.tokens_tile % 128 == 0);
  CHECK(big.tokens_tile >= 512);
  CHECK(ops::lm_head_ce_workspace_bytes(big) <= std::size_t(1) << 30);
  const auto small = ops::plan_lm_head_ce(4096, V, std::size_t(256) << 20);
  CHECK(small.vocab_tile < V);
  CHECK(small.vocab_tile % 256 == 0);
  CHECK(ops::lm_head_ce_workspace_bytes(small) <= std::size_t(256) << 20);
  CHECK(ops::plan_lm_head_ce(100, 1000, std::size_t(1) << 30).tokens_tile == 100);
  CHECK_THROWS_WITH_AS(ops::plan_lm_head_ce(4096, V, 1000), doctest::Contains("too small"), oomb::invalid_argument);
  test_stream stream;
  ops::gemm_context ctx;
  ops::lm_head_ce_args a;
  CHECK_THROWS_WITH_AS(ops::lm_head_cross_entropy(ctx, {16, 16}, a, nullptr, 0, stream.view()),
                       doctest::Contains("must be positive"), oomb::invalid_argument);
}
