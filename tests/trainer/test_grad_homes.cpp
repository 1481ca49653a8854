// bf16 gradient homes (--grad-homes bf16): the near slots add in the gradient type, every
// write-back rounds the page to bf16. Against fp32 homes and the full sequence (double arithmetic,
// offload, windows smaller than the past, so gradient pages go home and come back many times).
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <oomb/memory/host_resource.hpp>
#include <oomb/paging/grad_mirror.hpp>

#include "model_util.hpp"
#include "support/compiled_trainer.hpp"
#include "support/gradient_runs.hpp"
#include "test_util.hpp"
#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::page_home_format;
using oomb_trainer::model_params;
using trainer_test::chunked_run;
using trainer_test::run_chunked;
// oomb-train --device cpu's trainer.
using float_trainer = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<float>, oomb::belady_eviction>;

}  // namespace

TEST_CASE("grad homes: bf16 homes differ from fp32 homes, within the bound of one bf16 rounding per write-back") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 41);
  const std::int64_t N = 160;  // 10 chunks of one page: a page's gradient is added to by up to 9 chunks
  const auto seq = trainer_test::random_sequence(N, cfg.vocab_size, 42);
  const trainer_test::gradient_run full = trainer_test::run_full_sequence(p, seq);

  chunk_options o;
  o.chunk = 16;
  o.page = 16;
  o.window_pages = 2;
  o.offload = true;
  o.near_pages = 4;  // 4 gradient slots for up to 9 past pages a layer: pages go home between windows
  const chunked_run fp32 = run_chunked(p, seq, o);
  o.grad_homes = page_home_format::bf16;
  const chunked_run bf16 = run_chunked(p, seq, o);
  o.grad_homes = page_home_format::bf16_stochastic;
  const chunked_run sr = run_chunked(p, seq, o), sr_again = run_chunked(p, seq, o);

  // The forward does not read gradient pages; the same schedule moves a quarter of the gradient
  // bytes (the double trainer's own homes hold doubles: 8 bytes an element, bf16 2).
  constexpr std::uint64_t narrower = sizeof(double) / sizeof(oomb::bf16);
  CHECK(bf16.loss == fp32.loss);
  CHECK(std::abs(fp32.loss - full.loss) <= 1e-12 * std::abs(full.loss));
  CHECK(bf16.grad_tier.write_backs == fp32.grad_tier.write_backs);
  CHECK(bf16.grad_tier.write_backs > std::uint64_t(cfg.num_hidden_layers) * (N / 16));  // pages went home repeatedly
  CHECK(narrower * bf16.grad_tier.bytes_to_far == fp32.grad_tier.bytes_to_far);
  CHECK(narrower * bf16.grad_tier.bytes_to_near == fp32.grad_tier.bytes_to_near);
  CHECK(narrower * bf16.memory.far_grad_reserved == fp32.memory.far_grad_reserved);
  CHECK(bf16.memory.near_bytes == fp32.memory.near_bytes);  // the slots still hold doubles

  std::string which;
  const double err_fp32 = trainer_test::worst_tensor_error(p, fp32.grads, full.grads, nullptr);
  const double err_bf16 = trainer_test::worst_tensor_error(p, bf16.grads, full.grads, &which);
  const double between = trainer_test::worst_tensor_error(p, bf16.grads, fp32.grads, nullptr);
  CAPTURE(which);
  CHECK(err_fp32 <= 1e-10);
  // Each write-back rounds a partial sum to bf16: relative error u = 2^-8 at most per element.
  // A page goes home at most once per later chunk (9 here), so its final dK/dV is off by at most
  // 9u of the largest partial sum, and dK/dV enter every gradient linearly: 9 * 2^-8 = 3.5e-2
  // bounds the norm-wise error of each tensor. (Rounding happened: not 1e-10 from fp32 homes.)
  const double bound = double((N - 1) / o.chunk) * std::ldexp(1.0, -8);
  CHECK_FALSE(trainer_test::same_bits(bf16.grads, fp32.grads));
  CHECK(between > 1e-6);
  CHECK(err_bf16 <= bound);
  // Stochastic rounding: the same bound (each rounding is within one bf16 ulp, 2u), reproducible
  // (seed 0, the write counter as key), and other bits than nearest-even.
  const double err_sr = trainer_test::worst_tensor_error(p, sr.grads, full.grads, nullptr);
  CHECK(sr.loss == fp32.loss);
  CHECK(trainer_test::same_bits(sr.grads, sr_again.grads));
  CHECK_FALSE(trainer_test::same_bits(sr.grads, bf16.grads));
  CHECK(err_sr <= 2 * bound);
  MESSAGE("bf16 gradient homes: worst tensor gradient error vs the full sequence ", err_bf16, " (", which, "), vs fp32 homes ",
          between, "; stochastic rounding ", err_sr, "; fp32 homes vs full ", err_fp32, "; bound ", bound, "; ",
          bf16.grad_tier.write_backs, " write-backs");
}

TEST_CASE("grad homes: the float trainer (oomb-train --device cpu) runs bf16 homes; in place and unknown formats are refused") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<float> p(cfg), g(cfg);
  oomb_trainer::init_perturbed(p, 5);
  chunk_options o;
  o.chunk = 16;
  o.page = 16;
  o.offload = true;
  o.near_pages = 2;
  o.grad_homes = page_home_format::bf16;
  float_trainer trainer(cfg, o, 64);
  const double loss = trainer.loss_and_grad(p, g, trainer_test::random_sequence(64, cfg.vocab_size, 6));
  CHECK(std::isfinite(loss));
  CHECK(trainer.memory().far_grad_in_use == 0);
  CHECK(trainer.memory().grad_pair_bytes == 2 * 16 * 2 * 4 * 2);  // 2 x page x kv heads x head dim x bf16

  o.offload = false;
  CHECK_THROWS_WITH_AS(float_trainer(cfg, o, 64),
                       doctest::Contains("--grad-homes bf16 needs --offload"), oomb::invalid_argument);

  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  const std::vector<std::string> args{"--config", tiny, "--synthetic", "kv-recall", "--seq-len", "64", "--chunk", "16",
                                      "--steps", "1", "--out", "o", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return oomb_trainer::parse_train_options(a);
  };
  CHECK(with({}).grad_homes == page_home_format::same);
  CHECK(with({"--offload", "--grad-homes", "fp32"}).grad_homes == page_home_format::same);
  const auto bf = with({"--offload", "--grad-homes", "bf16"});
  CHECK(bf.grad_homes == page_home_format::bf16);
  CHECK(oomb_trainer::chunk_options_of(bf).grad_homes == page_home_format::bf16);
  CHECK(with({"--offload", "--grad-homes", "bf16-stochastic"}).grad_homes == page_home_format::bf16_stochastic);
  CHECK(oomb_trainer::options_json(bf)["grad_homes"] == "bf16");  // options.json says what ran
  CHECK(oomb_trainer::options_json(with({}))["grad_homes"] == "fp32");
  CHECK_THROWS_WITH_AS(with({"--grad-homes", "bf16"}), doctest::Contains("--grad-homes bf16 needs --offload"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(with({"--offload", "--grad-homes", "fp16"}), doctest::Contains("--grad-homes: unknown format 'fp16' (known: fp32, bf16, bf16-stochastic)"),
                       oomb::invalid_argument);
}

TEST_CASE("grad homes: a mirror over bf16 homes holds 2-byte elements and refuses to read them as its gradient type") {
  oomb::host_resource mem;
  oomb::grad_mirror_config c;
  c.shape = oomb::page_shape{16, 2, 4, oomb::kv_layout::head_major};
  c.kv_ids = 4;
  c.pool.max_pages = 4;
  const oomb::grad_mirror<float, oomb::host_resource> fp32(mem, c);
  c.home_element_bytes = sizeof(oomb::bf16);
  oomb::grad_mirror<float, oomb::host_resource> bf16(mem, c);
  CHECK(fp32.holds_elements());
  CHECK_FALSE(bf16.holds_elements());
  CHECK(2 * bf16.pair_bytes() == fp32.pair_bytes());
  CHECK(bf16.pool().block_bytes() == bf16.pair_bytes());
  CHECK(bf16.touch_zeroed(1) >= 0);  // zero bytes are zeros in any encoding
  CHECK_THROWS_WITH_AS(bf16.dk_page(1), doctest::Contains("4-byte elements, but the pool's homes hold 2-byte ones"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(bf16.accumulate(1, nullptr, nullptr), oomb::invalid_argument);
  CHECK_THROWS_AS(bf16.pool_view(), oomb::invalid_argument);
  c.home_element_bytes = 8;
  CHECK_THROWS_WITH_AS((oomb::grad_mirror<float, oomb::host_resource>(mem, c)), doctest::Contains("wider than the 4-byte"),
                       oomb::invalid_argument);
}
