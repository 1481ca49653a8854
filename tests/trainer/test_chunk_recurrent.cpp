// Chunk-recurrent training equals full-sequence backprop (double, every parameter tensor,
// norm-wise <= 1e-10) over a grid of lengths, chunk/page sizes, GQA ratios and heads; offload
// changes no bit; sparse attention with every page selected is dense, bit for bit.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "model_util.hpp"
#include "support/compiled_trainer.hpp"
#include "support/gradient_runs.hpp"
#include "test_util.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::model_params;
using trainer_test::chunked_run;
using trainer_test::run_chunked;
using double_trainer = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<double>>;

}  // namespace

TEST_CASE("chunk-recurrent: gradients equal full-sequence backprop; offload is bit-exact; sparse-all is dense") {
  struct gqa {
    std::int32_t hq, hkv;
  };
  int cases = 0;
  double worst_seen = 0;
  for (const gqa h : {gqa{2, 2}, gqa{4, 2}, gqa{7, 1}})
    for (bool tied : {false, true})
      for (const std::int64_t N : {37, 64, 83})       // 37 and 83: neither a multiple of the page nor the chunk
        for (const std::int32_t chunk : {16, 48}) {   // one page, three pages
          CAPTURE(h.hq);
          CAPTURE(h.hkv);
          CAPTURE(tied);
          CAPTURE(N);
          CAPTURE(chunk);
          const auto cfg = trainer_test::tiny_config(h.hq, h.hkv, tied, 4, 2, 13);
          model_params<double> p(cfg);
          oomb_trainer::init_perturbed(p, 100 + cases);
          const auto seq = trainer_test::random_sequence(N, cfg.vocab_size, 200 + cases, /*masked=*/cases % 3 == 0);
          ++cases;

          const trainer_test::gradient_run full = trainer_test::run_full_sequence(p, seq);

          chunk_options opt;
          opt.chunk = chunk;
          opt.page = 16;
          opt.window_pages = 2;  // several windows per layer
          const chunked_run plain = run_chunked(p, seq, opt);
          const double err = trainer_test::check_equals_reference(p, plain, full);
          worst_seen = std::max(worst_seen, err);

          // Offload: the same windows, streamed through 4 near slots: not one bit differs.
          chunk_options off = opt;
          off.offload = true;
          off.near_pages = std::max(4, chunk / 16);
          const chunked_run streamed = run_chunked(p, seq, off);
          CHECK(streamed.loss == plain.loss);
          CHECK(trainer_test::same_bits(streamed.grads, plain.grads));
          CHECK(streamed.stats.bytes_to_near > 0);
          CHECK(streamed.stats.bytes_to_far > 0);

          // Sparse with budget + sink + local covering every page: dense, bit for bit.
          chunk_options sp = opt;
          sp.sparse = true;
          sp.budget = 8;
          sp.sink = 1;
          sp.local = 1;
          sp.tile = 16;
          const chunked_run all = run_chunked(p, seq, sp);
          CHECK(all.loss == plain.loss);
          CHECK(trainer_test::same_bits(all.grads, plain.grads));
          CHECK(all.stats.sparse_pages_selected == all.stats.sparse_pages_candidate);
        }
  MESSAGE("worst norm-wise gradient error, chunk-recurrent vs full sequence: ", worst_seen, " over ", cases, " cases");
}

TEST_CASE("chunk-recurrent: one window per layer, token-major pages, and offload with sparse selection") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 7);
  const auto seq = trainer_test::random_sequence(150, cfg.vocab_size, 8);
  const std::vector<double> full = trainer_test::run_full_sequence(p, seq).grads;

  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.layout = oomb::kv_layout::token_major;
  const chunked_run one = run_chunked(p, seq, opt);
  CHECK(trainer_test::worst_tensor_error(p, one.grads, full, nullptr) <= 1e-10);

  // A real sparse selection (1 sink + 1 local + 1 scored page of up to 9 past pages), with and
  // without offload: identical bits, and a gradient error against dense that is reported.
  chunk_options sp = opt;
  sp.sparse = true;
  sp.budget = 1;
  sp.tile = 16;
  sp.window_pages = 2;
  const chunked_run sparse = run_chunked(p, seq, sp);
  CHECK(sparse.stats.sparse_pages_selected < sparse.stats.sparse_pages_candidate);
  chunk_options spo = sp;
  spo.offload = true;
  spo.near_pages = 4;
  spo.prefetch_last_selection = false;
  const chunked_run sparse_off = run_chunked(p, seq, spo);
  CHECK(trainer_test::same_bits(sparse_off.grads, sparse.grads));
  CHECK(sparse_off.stats.sparse_pages_predicted == 0);
  // Streamed with prefetch_last_selection (the default), stage 1 prefetches each chunk's likely
  // pages on the last chunk's selection (at most a window's): the same bits, and the guess counted.
  chunk_options guess = spo;
  guess.prefetch_last_selection = true;
  CHECK(chunk_options{}.prefetch_last_selection);
  const chunked_run sparse_guess = run_chunked(p, seq, guess);
  CHECK(trainer_test::same_bits(sparse_guess.grads, sparse.grads));
  CHECK(sparse_guess.stats.sparse_pages_predicted > 0);
  CHECK(sparse_guess.stats.sparse_pages_predicted_used > 0);
  CHECK(sparse_guess.stats.sparse_pages_predicted_used <= sparse_guess.stats.sparse_pages_predicted);
  MESSAGE("stage 1 prefetched ", sparse_guess.stats.sparse_pages_predicted, " pages on the last chunk's selection, ",
          sparse_guess.stats.sparse_pages_predicted_used, " of them then selected");
  const double err = trainer_test::worst_tensor_error(p, sparse.grads, full, nullptr);
  CHECK(err > 1e-6);  // a real approximation, not dense in disguise
  MESSAGE("sparse (budget 1, sink 1, local 1, 3 of up to 9 past pages) vs dense: worst tensor gradient error ", err,
          ", loss ", sparse.loss, " vs ", one.loss);
}

TEST_CASE("chunk-recurrent: keeping stage 1's attention outputs changes no bit, in place, streamed and sparse") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 3, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 17);
  const auto seq = trainer_test::random_sequence(83, cfg.vocab_size, 18, /*masked=*/true);  // a partial last chunk
  chunk_options base;
  base.chunk = 32;
  base.page = 16;
  base.window_pages = 2;
  chunk_options streamed = base;
  streamed.offload = true;
  streamed.near_pages = 4;
  chunk_options sparse = base;
  sparse.sparse = true;
  sparse.budget = 1;
  sparse.tile = 16;
  for (const chunk_options& opt : {base, streamed, sparse}) {
    CAPTURE(opt.offload);
    CAPTURE(opt.sparse);
    const chunked_run recomputed = run_chunked(p, seq, opt);
    chunk_options keep = opt;
    keep.keep_attention_outputs = true;
    double_trainer trainer(cfg, keep, seq.size());
    model_params<double> g(cfg);
    for (int step = 0; step < 2; ++step) {  // the blocks of step 1 are all released: step 2 reuses them
      g.zero();
      CHECK(trainer.loss_and_grad(p, g, seq) == recomputed.loss);
      CHECK(trainer_test::same_bits(std::vector<double>(g.data(), g.data() + g.size()), recomputed.grads));
    }
    const auto m = trainer.memory();
    // Two layers of three keep a block per chunk (3 chunks): 6 blocks of 32 tokens' o and lse.
    CHECK(m.far_outputs_reserved >= 6 * (32 * 4 * 4 + 4 * 32) * sizeof(double));
    if (opt.offload) {
      CHECK(trainer.last_stats().bytes_to_far > recomputed.stats.bytes_to_far);  // the blocks went home too
      CHECK(m.near_bytes > 0);
    }
  }
}

TEST_CASE("chunk-recurrent: stage 1 fills the far tier chunk by chunk, stage 2 returns each chunk's pages as it finishes") {
  const auto cfg = trainer_test::tiny_config(4, 2, true, 4, 3, 13);
  model_params<double> p(cfg), g(cfg);
  oomb_trainer::init_perturbed(p, 17);
  const auto seq = trainer_test::random_sequence(100, cfg.vocab_size, 18);  // chunks of 32: 32, 32, 32, 4 tokens
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    chunk_options opt;
    opt.chunk = 32;
    opt.page = 16;
    opt.offload = offload;
    opt.near_pages = 4;
    double_trainer trainer(cfg, opt, seq.size());
    std::vector<std::int32_t> kv_in_use, grad_in_use;
    std::vector<int> stages;
    trainer.loss_and_grad(p, g, seq, [&](const oomb_trainer::chunk_progress& pr) {
      const auto m = trainer.memory();
      stages.push_back(pr.stage * 10 + pr.chunk);
      kv_in_use.push_back(m.far_kv_in_use);
      grad_in_use.push_back(m.far_grad_in_use);
      if (offload) CHECK(m.near_kv_slots == 4);  // the near tier never grows
    });
    // Pages per chunk: 2, 2, 2, 1 in each of 3 layers.
    CHECK(stages == std::vector<int>{10, 11, 12, 13, 23, 22, 21, 20});
    CHECK(kv_in_use == std::vector<std::int32_t>{6, 12, 18, 21, 18, 12, 6, 0});
    // Gradient pages exist only for pages some later chunk attended, and go with their chunk.
    CHECK(grad_in_use[4] == 18);  // after chunk 3: every page of chunks 0-2 got a gradient page
    CHECK(grad_in_use[7] == 0);
    for (std::size_t i = 4; i + 1 < grad_in_use.size(); ++i) CHECK(grad_in_use[i + 1] <= grad_in_use[i]);
  }
}

TEST_CASE("chunk-recurrent: Belady eviction fed the stage-2 window order changes no bit and misses no more than LRU") {
  using lru = double_trainer;
  using belady = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<double>, oomb::belady_eviction>;
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 3, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 27);
  const auto seq = trainer_test::random_sequence(300, cfg.vocab_size, 28);
  struct shape {
    std::int32_t near, window;
  };
  for (const shape s : {shape{4, 2}, shape{8, 2}, shape{8, 4}, shape{16, 4}}) {
    CAPTURE(s.near);
    CAPTURE(s.window);
    chunk_options opt;
    opt.chunk = 32;
    opt.page = 16;
    opt.offload = true;
    opt.near_pages = s.near;
    opt.window_pages = s.window;
    auto run = [&](auto& trainer, std::vector<double>& grads) {
      model_params<double> g(cfg);
      trainer.loss_and_grad(p, g, seq);
      grads.assign(g.data(), g.data() + g.size());
      return trainer.kv_residency();
    };
    lru a(cfg, opt, seq.size());
    belady b(cfg, opt, seq.size());
    std::vector<double> ga, gb;
    const auto ra = run(a, ga), rb = run(b, gb);
    CHECK(trainer_test::same_bits(ga, gb));
    CHECK(rb.misses <= ra.misses);
    CHECK(rb.bytes_to_near <= ra.bytes_to_near);
    MESSAGE("near ", s.near, " window ", s.window, ": K/V page misses LRU ", ra.misses, ", Belady ", rb.misses,
            " (hits ", ra.hits, " / ", rb.hits, ")");
  }
}

TEST_CASE("chunk-recurrent: bf16 K/V pages and fp32 gradient pages: offload and sparse-all still bit for bit, error of bf16 rounding") {
  using paged = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<double, oomb::bf16, float>>;
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 37);
  const auto seq = trainer_test::random_sequence(83, cfg.vocab_size, 38);
  const trainer_test::gradient_run full = trainer_test::run_full_sequence(p, seq);
  auto run = [&](const chunk_options& o, std::vector<double>& grads) {
    paged trainer(cfg, o, seq.size());
    model_params<double> g(cfg);
    const double loss = trainer.loss_and_grad(p, g, seq);
    grads.assign(g.data(), g.data() + g.size());
    return loss;
  };
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 2;
  std::vector<double> plain, streamed, all;
  const double loss = run(opt, plain);
  chunk_options off = opt;
  off.offload = true;
  off.near_pages = 4;
  CHECK(run(off, streamed) == loss);
  CHECK(trainer_test::same_bits(streamed, plain));
  chunk_options sp = opt;
  sp.sparse = true;
  sp.budget = 8;
  sp.tile = 16;
  CHECK(run(sp, all) == loss);
  CHECK(trainer_test::same_bits(all, plain));
  // K and V rounded to bf16 (2^-9 = 2e-3 relative per element) and past pages' dK/dV summed in
  // fp32 (1e-7): the gradients move by a few units of bf16 rounding against double (7.7e-3
  // measured; the bound is 10 units), not by 1e-10 (the rounding happened) and not by 1.
  const double err = trainer_test::worst_tensor_error(p, plain, full.grads, nullptr);
  CHECK(err > 1e-6);
  CHECK(err < 2e-2);
  CHECK(std::abs(loss - full.loss) < 1e-2 * std::abs(full.loss));
  MESSAGE("bf16 K/V + fp32 gradient pages vs double full sequence: worst tensor gradient error ", err, ", loss ", loss,
          " vs ", full.loss);
}

TEST_CASE("chunk-recurrent: bad options are named") {
  chunk_options o;
  o.chunk = 40;
  o.page = 16;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("chunk size 40"), oomb::invalid_argument);
  o.chunk = 64;
  o.page = 24;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("24"), oomb::invalid_argument);
  o.page = 16;
  o.offload = true;
  o.near_pages = 2;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("must hold a chunk's 4 pages"), oomb::invalid_argument);
}
