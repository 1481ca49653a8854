// AdamW and the gradient norm / clipping factor on the GPU against optim/adamw.hpp and
// optim/clip.hpp (float), over several steps, with and without weight decay; the optimizer state
// split between device and pinned host memory (cuda/adamw_state.cuh) against all of it on the
// device, bit for bit.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <oomb/core/error.hpp>

#include "trainer/cuda/adamw_state.cuh"
#include "trainer/cuda/ops/adamw.cuh"
#include "trainer/cuda/ops/grad_norm.cuh"
#include "trainer/optim/adamw.hpp"
#include "trainer/optim/clip.hpp"

#include "device_util.cuh"
#include "model_util.hpp"

namespace {

using namespace ops_test;
namespace ops = oomb_trainer::gpu::ops;

// Both sides compute in fp32 from the same coefficients; the GPU may contract a * b + c into one
// FMA, so the updates differ in the last bits (~1e-7 relative).
constexpr double tol_f32 = 1e-6;

}  // namespace

TEST_CASE("adamw: fused update equals optim/adamw.hpp over three steps, clip factor read from the device") {
  test_stream stream;
  oomb_trainer::adamw_options opt;
  opt.weight_decay = 0.1;
  const std::int64_t n_w = 1000 * 3 + 7, n_b = 33;  // a matrix that decays, a vector that does not
  std::vector<float> w = random_vector<float>(std::size_t(n_w), 81), b = random_vector<float>(std::size_t(n_b), 82);
  std::vector<float> gw(w.size()), gb(b.size());
  using nt = oomb_trainer::named_tensor<float>;
  const std::vector<nt> params{{"w", {1, n_w}, w.data()}, {"b", {n_b}, b.data()}};
  const std::vector<nt> grads{{"w", {1, n_w}, gw.data()}, {"b", {n_b}, gb.data()}};
  oomb_trainer::adamw<float> ref(params, opt);
  CHECK(ref.decays(0));
  CHECK_FALSE(ref.decays(1));

  device_array<float> dw(w), db(b), mw(w.size()), vw(w.size()), mb(b.size()), vb(b.size()), ggw(w.size()), ggb(b.size());
  device_array<bf16> cw(w.size());
  device_array<float> scale(1);
  for (auto* a : {&mw, &vw, &mb, &vb}) a->upload(std::vector<float>(a->size(), 0.0f));
  const float clip = 0.5f;
  scale.upload({clip});
  for (int t = 1; t <= 3; ++t) {
    CAPTURE(t);
    const auto rgw = random_vector<float>(w.size(), 100 + t), rgb = random_vector<float>(b.size(), 200 + t);
    ggw.upload(rgw);
    ggb.upload(rgb);
    for (std::size_t i = 0; i < gw.size(); ++i) gw[i] = rgw[i] * clip;  // the CPU clips the gradients first
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = rgb[i] * clip;
    const double lr = 1e-2 * t;
    ref.step(lr, params, grads);
    ops::adamw_update(n_w, dw.get(), mw.get(), vw.get(), ggw.get(), cw.get(), ops::adamw_step_coefficients(opt, lr, t, true),
                      scale.get(), stream.view());
    ops::adamw_update(n_b, db.get(), mb.get(), vb.get(), ggb.get(), nullptr, ops::adamw_step_coefficients(opt, lr, t, false),
                      scale.get(), stream.view());
    const auto pw = dw.download();
    expect_close("adamw p (decay)", rel_err(pw, w), tol_f32);
    expect_close("adamw p (no decay)", rel_err(db.download(), b), tol_f32);
    expect_close("adamw m (decay)", rel_err(mw.download(), ref.exp_avg(0)), tol_f32);
    expect_close("adamw v (decay)", rel_err(vw.download(), ref.exp_avg_sq(0)), tol_f32);
    expect_close("adamw m (no decay)", rel_err(mb.download(), ref.exp_avg(1)), tol_f32);
    expect_close("adamw v (no decay)", rel_err(vb.download(), ref.exp_avg_sq(1)), tol_f32);
    const auto c = cw.download();
    bool rounded = true;
    for (std::size_t i = 0; i < c.size(); ++i) rounded = rounded && c[i] == bf16(pw[i]);
    CHECK(rounded);  // the compute copy is the new master weight rounded to bf16
  }
  CHECK_THROWS_AS(ops::adamw_step_coefficients(opt, 1e-3, 0, true), oomb::invalid_argument);
  CHECK_THROWS_AS(ops::adamw_update(0, dw.get(), mw.get(), vw.get(), ggw.get(), nullptr, {}, nullptr, stream.view()),
                  oomb::invalid_argument);
}

TEST_CASE("grad_norm: the global norm and clipping factor equal optim/clip.hpp, bit-reproducibly") {
  test_stream stream;
  const auto a = random_vector<float>(100003, 91), b = random_vector<float>(77, 92, -3.0, 3.0);
  const auto c16 = random_bf16(4096, 93);
  const auto cf = to_float(c16);
  using nt = oomb_trainer::named_tensor<float>;
  std::vector<float> ac = a, bc = b, cc = cf;
  const std::vector<nt> grads{{"a", {std::int64_t(a.size())}, ac.data()},
                              {"b", {std::int64_t(b.size())}, bc.data()},
                              {"c", {std::int64_t(cf.size())}, cc.data()}};
  const double norm_ref = oomb_trainer::global_grad_norm(grads);

  device_array<float> da(a), dbb(b), partials(ops::grad_norm_partials), out(2);
  device_array<bf16> dc(c16);
  const auto run = [&](float max_norm) {
    ops::grad_norm_begin(partials.get(), stream.view());
    ops::grad_norm_accumulate(std::int64_t(a.size()), da.get(), partials.get(), stream.view());
    ops::grad_norm_accumulate(std::int64_t(b.size()), dbb.get(), partials.get(), stream.view());
    ops::grad_norm_accumulate(std::int64_t(c16.size()), dc.get(), partials.get(), stream.view());
    ops::grad_norm_finish(partials.get(), max_norm, out.get(), out.get() + 1, stream.view());
    return out.download();
  };
  const auto clipped = run(10.0f);
  expect_close("grad_norm norm", std::abs(clipped[0] - norm_ref) / norm_ref, tol_f32);
  CHECK(norm_ref > 10.0);
  const double scale_ref = 10.0 / (norm_ref + 1e-6);
  expect_close("grad_norm clip factor", std::abs(clipped[1] - scale_ref) / scale_ref, tol_f32);
  CHECK(trainer_test::same_bits(run(10.0f), clipped));
  CHECK(run(1e9f)[1] == 1.0f);  // below max_norm: no clipping
  CHECK(run(0.0f)[1] == 1.0f);  // max_norm <= 0: disabled
  std::vector<float> with_nan = a;
  with_nan[5] = NAN;
  da.upload(with_nan);
  const auto nan_run = run(10.0f);
  CHECK(std::isnan(nan_run[0]));
  CHECK(nan_run[1] == 1.0f);  // as clip_grad_norm: a non-finite norm leaves the gradients be
  CHECK_THROWS_AS(ops::grad_norm_finish(partials.get(), NAN, out.get(), nullptr, stream.view()), oomb::invalid_argument);
}

TEST_CASE("adamw_state: a split state (host part streamed in pieces) updates to the same bits as all of it on the GPU") {
  test_stream stream;
  oomb_trainer::adamw_options opt;
  opt.weight_decay = 0.1;
  const auto cfg = trainer_test::tiny_config(4, 2, false, 16, 2, 40);
  const oomb_trainer::param_layout layout(cfg);
  const auto& entries = layout.entries();
  const std::size_t n = layout.total();
  const auto master0 = random_vector<float>(n, 11), m0 = random_vector<float>(n, 12);
  auto v0 = random_vector<float>(n, 13, 0.0, 1e-2);  // a second moment is >= 0
  const auto coefficients = [&](int t) {
    std::vector<ops::adamw_coefficients> c;
    for (const auto& e : entries) c.push_back(ops::adamw_step_coefficients(opt, 1e-2 * t, t, e.shape.size() >= 2));
    return c;
  };
  device_array<float> scale(std::vector<float>{0.75f});
  // The reference: every tensor in place on the device, as the unsplit trainer updates it.
  device_array<float> rp(master0), rm(m0), rv(v0);
  device_array<bf16> rc(std::vector<bf16>(n, bf16(0.0f)));
  std::vector<std::vector<float>> grads;
  for (int t = 1; t <= 3; ++t) {
    grads.push_back(random_vector<float>(n, 100 + t));
    device_array<float> g(grads.back());
    const auto c = coefficients(t);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      ops::adamw_update(std::int64_t(e.numel), rp.get() + e.offset, rm.get() + e.offset, rv.get() + e.offset, g.get() + e.offset,
                        rc.get() + e.offset, c[i], scale.get(), stream.view());
    }
  }
  const auto want_p = rp.download(), want_m = rm.download(), want_v = rv.download();
  const auto want_c = rc.download();

  // Splits: everything on the host, mid-layer, only the last tensor on the host, none; pieces
  // that cross tensor boundaries and wrap the three-slot ring many times, and one larger than the
  // host part.
  const std::size_t mid = layout.layer_entry(1, oomb_trainer::layer_tensor::v_w);  // inside layer 1
  for (const std::size_t on_gpu : {std::size_t(0), mid, entries.size() - 1, entries.size()}) {
    for (const std::size_t piece : {std::size_t(61), std::size_t(1000), n}) {
      CAPTURE(on_gpu);
      CAPTURE(piece);
      oomb_trainer::gpu::adamw_state state(cfg, on_gpu, piece);
      const auto& split = state.split();
      CHECK(split.host_offset == (on_gpu == entries.size() ? n : entries[on_gpu].offset));
      // Masters from a device array, moments copied in through the checkpoint view's streamed
      // tensors (device part and pinned host part alike).
      device_array<float> full(master0);
      state.set_masters(full.get(), stream.view());
      {
        const oomb_trainer::gpu::adamw_checkpoint_view view(state);
        for (std::size_t i = 0; i < entries.size(); ++i) {
          const auto& e = entries[i];
          view.moments()[2 * i].copy_in(m0.data() + e.offset);
          view.moments()[2 * i + 1].copy_in(v0.data() + e.offset);
        }
      }
      // Padding between tensors is never updated; the reference's moments there are the initial ones.
      device_array<bf16> compute(std::vector<bf16>(n, bf16(0.0f)));
      for (int t = 1; t <= 3; ++t) {
        device_array<float> g(grads[t - 1]);
        state.update(g.get(), compute.get(), coefficients(t), scale.get(), stream.view());
        OOMB_CUDA_CHECK(cudaStreamSynchronize(stream.view().get()), "adamw_state test");
        const auto u = state.last_update();
        CHECK(u.bytes_to_device == 12 * split.host_elements());
        CHECK(u.bytes_to_host == 12 * split.host_elements());
        CHECK(u.seconds >= 0.0);
      }
      std::vector<float> got_p(n);
      state.masters_to_host(got_p.data(), stream.view());
      CHECK(trainer_test::same_bits(got_p, want_p));
      CHECK(trainer_test::same_bits(compute.download(), want_c));
      const oomb_trainer::gpu::adamw_checkpoint_view view(state);
      bool state_equal = true;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        const auto copied_out = [&](const oomb_trainer::streamed_tensor<float>& t, const std::vector<float>& want) {
          std::vector<float> host(e.numel, -1.0f);
          t.copy_out(host.data());
          return std::memcmp(host.data(), want.data() + e.offset, e.numel * sizeof(float)) == 0;
        };
        state_equal = state_equal && copied_out(view.moments()[2 * i], want_m) && copied_out(view.moments()[2 * i + 1], want_v) &&
                      copied_out(view.masters()[i], want_p);
      }
      CHECK(state_equal);
    }
  }
  // The masters moved: the test compares updated values, not the start.
  CHECK_FALSE(trainer_test::same_bits(want_p, master0));
  CHECK_THROWS_AS(oomb_trainer::gpu::adamw_state(cfg, entries.size() + 1), oomb::invalid_argument);
}
