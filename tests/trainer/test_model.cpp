// The full-sequence path (the baseline): loss and every parameter's gradient against finite
// differences in double, tied and untied head, with and without a loss mask.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>

#include "model_util.hpp"
#include "support/gradient_runs.hpp"
#include "test_util.hpp"

TEST_CASE("model: parameter layout uses HF names, one allocation, lm_head only when untied") {
  const auto untied = oomb_trainer::param_layout(trainer_test::tiny_config(2, 1, false));
  const auto tied = oomb_trainer::param_layout(trainer_test::tiny_config(2, 1, true));
  CHECK(untied.entries().size() == 1 + 2 * 12 + 1 + 1);
  CHECK(tied.entries().size() == untied.entries().size() - 1);
  CHECK(untied.entries().front().name == "model.embed_tokens.weight");
  CHECK(untied.entries().back().name == "lm_head.weight");
  CHECK(untied.entries()[3].name == "model.layers.0.self_attn.q_proj.bias");
  CHECK(untied.entries()[3].shape == std::vector<std::int64_t>{8});
  CHECK(untied.entries()[8].name == "model.layers.0.self_attn.o_proj.weight");
  CHECK(untied.entries()[8].shape == std::vector<std::int64_t>{8, 8});
  CHECK(untied.entries()[12].shape == std::vector<std::int64_t>{8, 19});  // down_proj [H][I]
  CHECK(tied.lm_head_offset() == tied.embed_offset());
  CHECK_THROWS_AS(untied.find("model.layers.2.mlp.up_proj.weight"), oomb::invalid_argument);
}

TEST_CASE("model: full-sequence gradients equal finite differences for every tensor") {
  for (bool tied : {false, true})
    for (bool masked : {false, true}) {
      CAPTURE(tied);
      CAPTURE(masked);
      const auto cfg = trainer_test::tiny_config(2, 1, tied);
      oomb_trainer::model_params<double> p(cfg);
      oomb_trainer::init_perturbed(p, 5);
      const auto seq = trainer_test::random_sequence(13, cfg.vocab_size, 6, masked);
      const trainer_test::gradient_run analytic = trainer_test::run_full_sequence(p, seq);
      CHECK(std::isfinite(analytic.loss));
      CHECK(analytic.loss > 0.5);
      const double eps = 1e-6;
      for (const auto& t : p.named()) {
        CAPTURE(t.name);
        std::vector<double> fd(t.numel()), an(t.numel());
        const double* gt = analytic.grads.data() + (t.data - p.data());
        for (std::size_t i = 0; i < t.numel(); ++i) {
          const double keep = t.data[i];
          t.data[i] = keep + eps;
          const double lp = trainer_test::run_full_sequence(p, seq).loss;
          t.data[i] = keep - eps;
          const double lm = trainer_test::run_full_sequence(p, seq).loss;
          t.data[i] = keep;
          fd[i] = (lp - lm) / (2 * eps);
          an[i] = gt[i];
        }
        CHECK(trainer_test::rel_err(an, fd) < 1e-6);
      }
    }
}
