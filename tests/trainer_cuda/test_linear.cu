// The cuBLASLt linear layer (forward with bias, dX, dW, db) against cpu/linear.hpp in float, on
// bf16 inputs the CPU reads exactly: only the accumulation order and output rounding differ.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <oomb/core/error.hpp>

#include "trainer/cpu/linear.hpp"
#include "trainer/cuda/ops/linear.cuh"

#include "device_util.cuh"

namespace {

using namespace ops_test;
namespace ops = oomb_trainer::gpu::ops;
namespace cpu = oomb_trainer::cpu;

// fp32 outputs: bf16 x bf16 products are exact in fp32, so only the fp32 sum order differs
// (~1e-7 relative); bf16 outputs add one rounding, at most 2^-9 relative per element.
constexpr double tol_f32 = 1e-5;
constexpr double tol_bf16 = 4e-3;

void check_linear(std::int64_t n, std::int32_t in, std::int32_t out, std::uint64_t seed) {
  CAPTURE(n);
  CAPTURE(in);
  CAPTURE(out);
  test_stream stream;
  ops::gemm_context ctx;
  const auto x = random_bf16(std::size_t(n) * in, seed), W = random_bf16(std::size_t(out) * in, seed + 1),
             b = random_bf16(std::size_t(out), seed + 2), dy = random_bf16(std::size_t(n) * out, seed + 3);
  const auto xf = to_float(x), Wf = to_float(W), bf = to_float(b), dyf = to_float(dy);
  const auto dx0 = random_vector<float>(std::size_t(n) * in, seed + 4);
  const auto dW0 = random_vector<float>(std::size_t(out) * in, seed + 5);
  const auto db0 = random_vector<float>(std::size_t(out), seed + 6);

  std::vector<float> y_ref(std::size_t(n) * out), y_nobias(y_ref.size());
  cpu::linear_forward(n, in, out, xf.data(), Wf.data(), bf.data(), y_ref.data());
  cpu::linear_forward(n, in, out, xf.data(), Wf.data(), static_cast<const float*>(nullptr), y_nobias.data());
  std::vector<float> dx_ref = dx0, dW_ref = dW0, db_ref = db0;
  cpu::linear_backward(n, in, out, xf.data(), Wf.data(), dyf.data(), dx_ref.data(), dW_ref.data(), db_ref.data());

  device_array<bf16> dx_d(x), dW_d(W), db_d(b), ddy(dy);
  device_array<bf16> y_bf(y_ref.size());
  device_array<float> y_f(y_ref.size()), gx(dx0), gW(dW0), gb(db0);
  device_array<bf16> gx_bf(dx0.size());
  ops::linear_forward(ctx, n, in, out, dx_d.get(), dW_d.get(), db_d.get(), y_bf.get(), stream.view());
  ops::linear_forward(ctx, n, in, out, dx_d.get(), dW_d.get(), static_cast<const bf16*>(nullptr), y_f.get(),
                      stream.view());
  ops::linear_backward_input(ctx, n, in, out, ddy.get(), dW_d.get(), gx.get(), true, stream.view());
  ops::linear_backward_input(ctx, n, in, out, ddy.get(), dW_d.get(), gx_bf.get(), false, stream.view());
  ops::linear_backward_weight(ctx, n, in, out, dx_d.get(), ddy.get(), gW.get(), stream.view());
  ops::bias_backward(n, out, ddy.get(), gb.get(), stream.view());

  expect_close("linear y (bf16, bias)", rel_err(to_float(y_bf.download()), y_ref), tol_bf16);
  expect_close("linear y (fp32)", rel_err(y_f.download(), y_nobias), tol_f32);
  expect_close("linear dx (fp32, +=)", rel_err(gx.download(), dx_ref), tol_f32);
  // dx written (not accumulated) in bf16: dx_ref - dx0 is the product alone.
  std::vector<float> dx_only(dx_ref.size());
  for (std::size_t i = 0; i < dx_only.size(); ++i) dx_only[i] = dx_ref[i] - dx0[i];
  expect_close("linear dx (bf16)", rel_err(to_float(gx_bf.download()), dx_only), tol_bf16);
  expect_close("linear dW", rel_err(gW.download(), dW_ref), tol_f32);
  expect_close("linear db", rel_err(gb.download(), db_ref), tol_f32);
}

}  // namespace

TEST_CASE("linear: forward (bias epilogue), dX, dW and db equal the CPU op") {
  check_linear(256, 128, 192, 11);  // tile multiples
  check_linear(77, 72, 40, 12);     // no dimension a multiple of a tile
  check_linear(5, 33, 17, 13);      // odd leading dimensions (2-byte alignment)
}

TEST_CASE("linear: the heuristic is asked once per problem") {
  test_stream stream;
  ops::gemm_context ctx;
  device_array<bf16> x(random_bf16(64 * 32, 1)), W(random_bf16(48 * 32, 2));
  device_array<float> y(64 * 48);
  for (int i = 0; i < 3; ++i)
    ops::linear_forward(ctx, 64, 32, 48, x.get(), W.get(), static_cast<const bf16*>(nullptr), y.get(), stream.view());
  CHECK(ctx.cached_plans() == 1);
  ops::linear_forward(ctx, 32, 32, 48, x.get(), W.get(), static_cast<const bf16*>(nullptr), y.get(), stream.view());
  CHECK(ctx.cached_plans() == 2);
  (void)y.download();
}

TEST_CASE("linear: bad arguments are refused with a clear error") {
  test_stream stream;
  ops::gemm_context ctx;
  device_array<bf16> x(random_bf16(64, 1)), b(random_bf16(8, 2));
  device_array<float> y(64);
  CHECK_THROWS_AS(ops::linear_forward(ctx, 0, 8, 8, x.get(), x.get(), static_cast<const bf16*>(nullptr), y.get(),
                                      stream.view()),
                  oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(ops::linear_forward(ctx, 8, 8, 8, x.get(), x.get(), b.get(), y.get(), stream.view()),
                       doctest::Contains("bias epilogue needs a bf16 output"), oomb::invalid_argument);
  CHECK_THROWS_AS(ops::linear_backward_weight(ctx, 8, 8, 8, nullptr, x.get(), y.get(), stream.view()),
                  oomb::invalid_argument);
}
