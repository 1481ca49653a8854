// RMSNorm, RoPE, SwiGLU, the embedding and the elementwise glue on the GPU against their CPU ops (float), on seeded
// random inputs the CPU reads exactly; shapes that are not multiples of the kernels' block sizes.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <oomb/core/error.hpp>

#include "trainer/cpu/embedding.hpp"
#include "trainer/cpu/rmsnorm.hpp"
#include "trainer/cpu/rope.hpp"
#include "trainer/cpu/swiglu.hpp"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/embedding.cuh"
#include "trainer/cuda/ops/rmsnorm.cuh"
#include "trainer/cuda/ops/rope.cuh"
#include "trainer/cuda/ops/sum.cuh"
#include "trainer/cuda/ops/swiglu.cuh"

#include "device_util.cuh"

namespace {

using namespace ops_test;
namespace ops = oomb_trainer::gpu::ops;
namespace cpu = oomb_trainer::cpu;

// fp32 results differ from the CPU's only in fp32 summation order or libm's last bits (~1e-7);
// a bf16 output adds one rounding (at most 2^-9 relative per element, ~1e-3 norm-wise).
constexpr double tol_f32 = 1e-5;
constexpr double tol_bf16 = 4e-3;

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

template <class G>
void check_rmsnorm(std::int64_t n, std::int32_t H, std::uint64_t seed) {
  CAPTURE(n);
  CAPTURE(H);
  test_stream stream;
  const float eps = 1e-6f;
  const auto x = random_bf16(std::size_t(n) * H, seed, -2.0, 2.0), w = random_bf16(std::size_t(H), seed + 1, 0.5, 1.5);
  const auto xf = to_float(x), wf = to_float(w);
  std::vector<float> dyf = random_vector<float>(std::size_t(n) * H, seed + 2);
  std::vector<G> dy(dyf.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = G(dyf[i]);
  for (std::size_t i = 0; i < dy.size(); ++i) dyf[i] = static_cast<float>(dy[i]);
  const auto dx0 = random_vector<float>(xf.size(), seed + 3), dw0 = random_vector<float>(wf.size(), seed + 4);

  std::vector<float> y_ref(xf.size()), rstd_ref(static_cast<std::size_t>(n));
  cpu::rmsnorm_forward(n, H, xf.data(), wf.data(), eps, y_ref.data(), rstd_ref.data());

  device_array<bf16> dx_in(x), dw_in(w), y(xf.size());
  device_array<float> rstd(static_cast<std::size_t>(n)), gx(dx0), gw(dw0);
  device_array<G> ddy(dy);
  device_array<char> ws(ops::rmsnorm_backward_workspace_bytes(n, H));
  ops::rmsnorm_forward(n, H, dx_in.get(), dw_in.get(), eps, y.get(), rstd.get(), stream.view());
  const auto rstd_gpu = rstd.download();
  expect_close("rmsnorm y (bf16)", rel_err(to_float(y.download()), y_ref), tol_bf16);
  expect_close("rmsnorm rstd", rel_err(rstd_gpu, rstd_ref), tol_f32);

  // The backward from the same rstd on both sides.
  std::vector<float> dx_ref = dx0, dw_ref = dw0;
  cpu::rmsnorm_backward(n, H, xf.data(), wf.data(), rstd_gpu.data(), dyf.data(), dx_ref.data(), dw_ref.data());
  ops::rmsnorm_backward(n, H, dx_in.get(), dw_in.get(), rstd.get(), ddy.get(), gx.get(), gw.get(), ws.get(), ws.size(),
                        stream.view());
  const auto dw1 = gw.download();
  expect_close("rmsnorm dx", rel_err(minus(gx.download(), dx0), minus(dx_ref, dx0)), tol_f32);
  expect_close("rmsnorm dw", rel_err(minus(dw1, dw0), minus(dw_ref, dw0)), tol_f32);
  // Deterministic: the same call from the same state gives the same bits.
  gw.upload(dw0);
  ops::rmsnorm_backward(n, H, dx_in.get(), dw_in.get(), rstd.get(), ddy.get(), gx.get(), gw.get(), ws.get(), ws.size(),
                        stream.view());
  CHECK(trainer_test::same_bits(gw.download(), dw1));
}

}  // namespace

TEST_CASE("rmsnorm: forward and backward equal the CPU op; dw is deterministic") {
  check_rmsnorm<float>(150, 200, 21);   // rows not a multiple of the 8-row chunk, H not of 256
  check_rmsnorm<bf16>(70, 896, 22);     // Qwen2.5-0.5B's hidden size, bf16 dy
  check_rmsnorm<float>(3, 3584, 23);    // 7B's
  check_rmsnorm<bf16>(70 * 4, 128, 24);  // qwen3's per-head q/k norms: n * heads rows of head_dim
  check_rmsnorm<bf16>(33 * 7, 64, 25);
}

TEST_CASE("rmsnorm: bad arguments are refused") {
  test_stream stream;
  device_array<bf16> x(random_bf16(64, 1));
  device_array<float> f(64);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_forward(1, 20000, x.get(), x.get(), 1e-6f, x.get(), f.get(), stream.view()),
                       doctest::Contains("H must be at most"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(ops::rmsnorm_backward(8, 8, x.get(), x.get(), f.get(), f.get(), f.get(), f.get(), f.get(), 4,
                                             stream.view()),
                       doctest::Contains("workspace of 4 bytes given"), oomb::invalid_argument);
}

TEST_CASE("rope: forward and backward equal the CPU op at far positions, fp32 tables from double") {
  test_stream stream;
  const std::int64_t n = 37;
  const std::int32_t heads = 3, d = 64;
  oomb_trainer::rope_config plain;
  plain.theta = 1e6;
  const cpu::rope_table<float> table(4'000'000, n, oomb_trainer::rope_frequencies_for(plain, d, 4'000'000 + n));
  device_array<float> cos_d(table.cos), sin_d(table.sin);
  const ops::rope_table_view view{cos_d.get(), sin_d.get(), n, d / 2};

  const auto xf = random_vector<float>(std::size_t(n) * heads * d, 31);
  std::vector<float> fwd = xf, bwd = xf;
  cpu::rope_forward(n, heads, d, fwd.data(), table);
  cpu::rope_backward(n, heads, d, bwd.data(), table);
  device_array<float> x(xf);
  ops::rope_forward(n, heads, d, x.get(), view, stream.view());
  expect_close("rope forward (fp32)", rel_err(x.download(), fwd), tol_f32);
  x.upload(xf);
  ops::rope_backward(n, heads, d, x.get(), view, stream.view());
  expect_close("rope backward (fp32)", rel_err(x.download(), bwd), tol_f32);

  const auto xb = random_bf16(xf.size(), 32);
  std::vector<float> fwd_b = to_float(xb);
  cpu::rope_forward(n, heads, d, fwd_b.data(), table);
  device_array<bf16> x16(xb);
  ops::rope_forward(n, heads, d, x16.get(), view, stream.view());
  expect_close("rope forward (bf16)", rel_err(to_float(x16.download()), fwd_b), tol_bf16);

  CHECK_THROWS_WITH_AS(ops::rope_forward(n, heads, 128, x.get(), view, stream.view()),
                       doctest::Contains("table is for head_dim 64"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(ops::rope_forward(n + 1, heads, d, x.get(), view, stream.view()),
                       doctest::Contains("holds 37 positions"), oomb::invalid_argument);
}

TEST_CASE("rope: scaled tables (linear, yarn with its attention factor, llama3, longrope) on the GPU equal the CPU op") {
  test_stream stream;
  const std::int64_t n = 29, first = 200'000;
  const std::int32_t heads = 2, d = 128;
  oomb_trainer::rope_config r;
  r.theta = 5e5;
  r.factor = 8.0;
  r.original_max_position_embeddings = 8192;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  for (int i = 0; i < d / 2; ++i) {
    r.short_factor.push_back(1.0 + 0.01 * i);
    r.long_factor.push_back(1.0 + 0.2 * i);
  }
  for (const auto kind : {oomb_trainer::rope_kind::linear, oomb_trainer::rope_kind::yarn, oomb_trainer::rope_kind::llama3,
                          oomb_trainer::rope_kind::longrope}) {
    CAPTURE(oomb_trainer::rope_kind_name(kind));
    r.kind = kind;
    const auto f = oomb_trainer::rope_frequencies_for(r, d, first + n);
    if (kind == oomb_trainer::rope_kind::yarn || kind == oomb_trainer::rope_kind::longrope) CHECK(f.attention_factor > 1.0);
    const cpu::rope_table<float> table(first, n, f);
    device_array<float> cos_d(table.cos), sin_d(table.sin);
    const ops::rope_table_view view{cos_d.get(), sin_d.get(), n, d / 2};
    const auto xb = random_bf16(std::size_t(n) * heads * d, 33);
    std::vector<float> fwd = to_float(xb), bwd = to_float(xb);
    cpu::rope_forward(n, heads, d, fwd.data(), table);
    cpu::rope_backward(n, heads, d, bwd.data(), table);
    device_array<bf16> x(xb);
    ops::rope_forward(n, heads, d, x.get(), view, stream.view());
    expect_close("scaled rope forward (bf16)", rel_err(to_float(x.download()), fwd), tol_bf16);
    x.upload(xb);
    ops::rope_backward(n, heads, d, x.get(), view, stream.view());
    expect_close("scaled rope backward (bf16)", rel_err(to_float(x.download()), bwd), tol_bf16);
  }
}

TEST_CASE("swiglu: forward and backward equal the CPU op") {
  test_stream stream;
  const std::int64_t n = 1000 * 7 + 3;
  const auto g = random_bf16(std::size_t(n), 41, -6.0, 6.0), u = random_bf16(std::size_t(n), 42);
  const auto gf = to_float(g), uf = to_float(u), dh = random_vector<float>(std::size_t(n), 43);
  std::vector<float> h_ref(gf.size()), dg_ref(gf.size()), du_ref(gf.size());
  cpu::swiglu_forward(n, gf.data(), uf.data(), h_ref.data());
  cpu::swiglu_backward(n, gf.data(), uf.data(), dh.data(), dg_ref.data(), du_ref.data());

  device_array<bf16> dg_in(g), du_in(u), h16(gf.size()), dg16(gf.size()), du16(gf.size());
  device_array<float> h32(gf.size()), ddh(dh), dg32(gf.size()), du32(gf.size());
  ops::swiglu_forward(n, dg_in.get(), du_in.get(), h16.get(), stream.view());
  ops::swiglu_forward(n, dg_in.get(), du_in.get(), h32.get(), stream.view());
  ops::swiglu_backward(n, dg_in.get(), du_in.get(), ddh.get(), dg32.get(), du32.get(), stream.view());
  ops::swiglu_backward(n, dg_in.get(), du_in.get(), ddh.get(), dg16.get(), du16.get(), stream.view());
  expect_close("swiglu h (fp32)", rel_err(h32.download(), h_ref), tol_f32);
  expect_close("swiglu h (bf16)", rel_err(to_float(h16.download()), h_ref), tol_bf16);
  expect_close("swiglu dg (fp32)", rel_err(dg32.download(), dg_ref), tol_f32);
  expect_close("swiglu du (fp32)", rel_err(du32.download(), du_ref), tol_f32);
  expect_close("swiglu dg (bf16)", rel_err(to_float(dg16.download()), dg_ref), tol_bf16);
  expect_close("swiglu du (bf16)", rel_err(to_float(du16.download()), du_ref), tol_bf16);
  CHECK_THROWS_AS(ops::swiglu_forward(0, dg_in.get(), du_in.get(), h16.get(), stream.view()), oomb::invalid_argument);
}

TEST_CASE("embedding: forward copies rows, backward scatter-adds deterministically, bad tokens are reported") {
  test_stream stream;
  const std::int64_t n = 301;
  const std::int32_t H = 130, vocab = 50;  // many repeated tokens
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n));
  for (std::size_t t = 0; t < tokens.size(); ++t) tokens[t] = std::int32_t((t * 7919 + t * t) % vocab);
  const auto table = random_bf16(std::size_t(vocab) * H, 51), dout = random_bf16(std::size_t(n) * H, 52);
  const auto tablef = to_float(table), doutf = to_float(dout);
  const auto dtable0 = random_vector<float>(tablef.size(), 53);
  std::vector<float> out_ref(std::size_t(n) * H), dtable_ref = dtable0;
  cpu::embedding_forward(n, H, vocab, tokens.data(), tablef.data(), out_ref.data());
  cpu::embedding_backward(n, H, tokens.data(), doutf.data(), dtable_ref.data());

  device_array<std::int32_t> dtok(tokens), bad(1);
  device_array<bf16> dtab(table), ddout(dout);
  device_array<float> out(out_ref.size()), dtable(dtable0);
  device_array<char> ws(ops::embedding_backward_workspace_bytes(n, vocab));
  bad.upload({-1});
  ops::embedding_forward(n, H, vocab, dtok.get(), dtab.get(), out.get(), bad.get(), stream.view());
  CHECK(out.download() == out_ref);  // a copy: exact
  CHECK(bad.download()[0] == -1);
  ops::embedding_backward(n, H, vocab, dtok.get(), ddout.get(), dtable.get(), ws.get(), ws.size(), stream.view());
  const auto d1 = dtable.download();
  expect_close("embedding dtable", rel_err(minus(d1, dtable0), minus(dtable_ref, dtable0)), tol_f32);
  dtable.upload(dtable0);
  ops::embedding_backward(n, H, vocab, dtok.get(), ddout.get(), dtable.get(), ws.get(), ws.size(), stream.view());
  CHECK(trainer_test::same_bits(dtable.download(), d1));

  // A token out of range: its row is NaN, its position reported, the others still copied.
  std::vector<std::int32_t> with_bad = tokens;
  with_bad[123] = vocab;
  dtok.upload(with_bad);
  ops::embedding_forward(n, H, vocab, dtok.get(), dtab.get(), out.get(), bad.get(), stream.view());
  const auto out_bad = out.download();
  CHECK(bad.download()[0] == 123);
  CHECK(std::isnan(out_bad[123 * H]));
  CHECK(out_bad[124 * H] == out_ref[124 * H]);
  CHECK_THROWS_WITH_AS(ops::embedding_backward(n, H, vocab, dtok.get(), ddout.get(), dtable.get(), ws.get(), 8,
                                               stream.view()),
                       doctest::Contains("workspace of 8 bytes"), oomb::invalid_argument);
}

TEST_CASE("elementwise: convert rounds like oomb::bf16, add_into adds in fp32") {
  test_stream stream;
  const std::int64_t n = 5003;
  const auto a = random_vector<float>(std::size_t(n), 61, -100.0, 100.0), b = random_vector<float>(std::size_t(n), 62);
  device_array<float> da(a), db(b);
  device_array<bf16> h(a.size());
  ops::convert(n, da.get(), h.get(), stream.view());
  const auto hb = h.download();
  bool rounded = true;
  for (std::size_t i = 0; i < a.size(); ++i) rounded = rounded && hb[i] == bf16(a[i]);
  CHECK(rounded);  // exactly the host's round-to-nearest-even
  ops::add_into(n, h.get(), db.get(), stream.view());
  const auto sum = db.download();
  bool added = true;
  for (std::size_t i = 0; i < a.size(); ++i) added = added && sum[i] == b[i] + static_cast<float>(hb[i]);
  CHECK(added);  // one fp32 add: exact agreement
  CHECK_THROWS_WITH_AS(ops::add_into(n, da.get(), da.get(), stream.view()), doctest::Contains("must not be the same"),
                       oomb::invalid_argument);
}

TEST_CASE("elementwise: fill and scale as the host does them; add_sum adds in double, the same bits every run") {
  test_stream stream;
  const std::int64_t n = 70001;  // not a multiple of the block: a ragged tail
  const auto a = random_vector<float>(std::size_t(n), 63, -3.0, 3.0);
  device_array<float> x(a);
  ops::scale(n, 0.37f, x.get(), stream.view());
  const auto scaled = x.download();
  bool exact = true;
  for (std::size_t i = 0; i < a.size(); ++i) exact = exact && scaled[i] == a[i] * 0.37f;
  CHECK(exact);  // one fp32 multiply
  ops::fill(n, 1.5f, x.get(), stream.view());
  const auto filled = x.download();
  CHECK(std::all_of(filled.begin(), filled.end(), [](float v) { return v == 1.5f; }));
  device_array<bf16> h{static_cast<std::size_t>(n)};
  ops::fill(n, bf16(-0.25f), h.get(), stream.view());
  const auto hf = h.download();
  CHECK(std::all_of(hf.begin(), hf.end(), [](bf16 v) { return v == bf16(-0.25f); }));
  ops::fill(0, 2.0f, static_cast<float*>(nullptr), stream.view());  // nothing to do, no pointer needed

  device_array<double> sum(std::vector<double>{0.5});
  x.upload(a);
  ops::add_sum(n, x.get(), sum.get(), stream.view());
  const double got = sum.download()[0];
  double want = 0.5;
  for (float v : a) want += double(v);
  CHECK(std::abs(got - want) <= 1e-12 * std::abs(want) + 1e-12);  // the order of a double sum of floats
  sum.upload(std::vector<double>{0.5});
  ops::add_sum(n, x.get(), sum.get(), stream.view());
  CHECK(sum.download()[0] == got);  // fixed order: the same bits again
  CHECK_THROWS_WITH_AS(ops::scale(0, 1.0f, x.get(), stream.view()), doctest::Contains("must be positive"),
                       oomb::invalid_argument);
}
