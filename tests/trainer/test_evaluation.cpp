// Evaluation: chunk_recurrent::evaluate's per-token losses against the training step's loss and
// single-target runs (double), in place, streamed, sparse; the cache empty after it; the position
// buckets; oomb-train's --eval-data / --eval-every / --eval-sequences / --steps 0.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_util.hpp"
#include "support/compiled_trainer.hpp"
#include "trainer/app/evaluation.hpp"
#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/tokens.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::log_lines;
using oomb_trainer::chunk_options;
using oomb_trainer::model_params;
using double_trainer = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<double>>;

}  // namespace

TEST_CASE("evaluate: per-token losses add up to the step's loss and equal single-target steps; the cache is empty after") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 7);
  const std::int64_t N = 83;
  const auto seq = trainer_test::random_sequence(N, cfg.vocab_size, 8, /*masked=*/true);
  chunk_options base;
  base.chunk = 32;
  base.page = 16;
  base.window_pages = 2;
  auto offload = base;
  offload.offload = true;
  offload.near_pages = 4;
  auto sparse = base;  // budget 1 + sink 1 + local 1 of up to 5 past pages: a real selection
  sparse.sparse = true;
  sparse.budget = 1;
  sparse.sink = 1;
  sparse.local = 1;
  sparse.tile = 16;
  auto kept = base;
  kept.keep_attention_outputs = true;
  for (const auto& [name, opt] : {std::pair{"in place", base}, std::pair{"offload", offload}, std::pair{"sparse", sparse},
                                   std::pair{"kept outputs", kept}}) {
    CAPTURE(name);
    double_trainer t(cfg, opt, N);
    const auto losses = t.evaluate(p, seq);
    REQUIRE(losses.size() == std::size_t(N));
    double sum = 0;
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      const bool counts = i + 1 < N && seq.mask[std::size_t(i + 1)] != 0;
      CHECK(std::isnan(losses[std::size_t(i)]) == !counts);
      if (counts) {
        sum += losses[std::size_t(i)];
        ++counted;
      }
    }
    CHECK(t.memory().far_kv_in_use == 0);  // every chunk's pages went back
    CHECK(t.memory().far_grad_in_use == 0);
    // The training step over the same sequence computes the same mean (forward of stage 2; the
    // selections are the same, made by the same stage 1).
    model_params<double> grads(cfg);
    const double loss = t.loss_and_grad(p, grads, seq);
    CHECK(std::abs(sum / double(counted) - loss) <= 1e-13 * std::abs(loss));
    if (opt.sparse) continue;  // a one-target mask leaves the selection unchanged, but not worth the time
    // One prediction alone: a mask counting only token j's prediction.
    for (const std::int64_t j : {std::int64_t(5), std::int64_t(40), N - 1}) {
      if (seq.mask[std::size_t(j)] == 0) continue;
      auto one = seq;
      one.mask.assign(one.mask.size(), 0);
      one.mask[std::size_t(j)] = 1;
      model_params<double> g(cfg);
      const double single = t.loss_and_grad(p, g, one);
      CHECK(std::abs(losses[std::size_t(j - 1)] - single) <= 1e-13 * std::abs(single));
    }
  }
}

TEST_CASE("evaluation: the mean and the buckets of the predicted token's position") {
  oomb_trainer::evaluation e;
  std::vector<double> l(40000, std::nan(""));
  l[0] = 1.0;      // predicts position 1: 0-4K
  l[4094] = 3.0;   // position 4095: 0-4K
  l[4095] = 0.5;   // position 4096: 4K-32K
  l[32767] = 2.0;  // position 32768: 32K-128K
  e.add(l);
  CHECK(e.predictions == 4);
  CHECK(e.loss() == doctest::Approx(6.5 / 4));
  CHECK(e.confident == 1);  // 0.5 < ln 2
  const auto j = e.to_json(true);
  CHECK(j["eval_loss_by_position"]["0-4K"] == 2.0);
  CHECK(j["eval_loss_by_position"]["4K-32K"] == 0.5);
  CHECK(j["eval_loss_by_position"]["32K-128K"] == 2.0);
  CHECK_FALSE(j["eval_loss_by_position"].contains("128K-1M"));
  CHECK(j["eval_predictions_by_position"]["0-4K"] == 2);
  CHECK(j["eval_answer_accuracy"] == 0.25);
  CHECK(e.line(true).find("by position 0-4K 2.0000 · 4K-32K 0.5000 · 32K-128K 2.0000 | answer accuracy 25.0%") !=
        std::string::npos);
  l[7] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(e.add(l), doctest::Contains("predicting token 8 is not finite"), oomb::error);
}

TEST_CASE("oomb-train: --eval-every on kv-recall logs held-out losses and answer accuracy; evaluating changes no step") {
  training_test::temp_dir tmp("eval");
  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a{"--config", tiny, "--synthetic", "kv-recall", "--seq-len", "64", "--chunk", "16",
                               "--steps", "4", "--out", out, "--quiet"};
    a.insert(a.end(), extra.begin(), extra.end());
    return oomb_trainer::parse_train_options(a);
  };
  std::vector<std::string> lines;
  {
    oomb_trainer::training_run run(args(tmp / "eval", {"--eval-every", "2", "--eval-sequences", "3"}),
                                   [&](const std::string& l) { lines.push_back(l); });
    run.run();
  }
  oomb_trainer::training_run plain(args(tmp / "plain", {}));
  plain.run();
  const auto log = log_lines(fs::path(tmp / "eval") / "log.jsonl");
  const auto base = log_lines(fs::path(tmp / "plain") / "log.jsonl");
  REQUIRE(log.size() == 6);  // steps 1, 2, eval, 3, 4, eval
  CHECK(log[2]["step"] == 2);
  CHECK(log[2].contains("eval_loss"));
  CHECK(log[2]["eval_sequences"] == 3);
  CHECK(log[2].contains("eval_answer_accuracy"));
  CHECK(log[2]["eval_loss_by_position"].contains("0-4K"));
  CHECK(log[5]["step"] == 4);
  // The steps are the plain run's, bit for bit: the evaluation touched no state.
  CHECK(log[3]["loss"] == base[2]["loss"]);
  CHECK(log[4]["loss"] == base[3]["loss"]);
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("eval  | loss ", 0) == 0; }) == 2);

  // --steps 0: evaluate the checkpoint's weights and stop; nothing saved. The same weights give
  // the same held-out losses as the run's last evaluation.
  const std::string ckpt = (fs::path(tmp / "eval") / "checkpoint").string();
  {
    auto parsed = args(tmp / "only", {"--eval-every", "1", "--eval-sequences", "3", "--init", ckpt, "--steps", "0"});
    oomb_trainer::training_run run(parsed);
    run.run();
  }
  const auto again = log_lines(fs::path(tmp / "only") / "log.jsonl");
  REQUIRE(again.size() == 1);
  CHECK(again[0]["eval_loss"] == log[5]["eval_loss"]);
  CHECK_FALSE(fs::exists(fs::path(tmp / "only") / "checkpoint"));

  CHECK_THROWS_WITH_AS(args("o", {"--steps", "0"}), doctest::Contains("--steps is required (> 0; 0 with --eval-data"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(args("o", {"--eval-sequences", "2"}), doctest::Contains("--eval-sequences needs an evaluation"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(args("o", {"--eval-data", "x.bin"}), doctest::Contains("--eval-data is a token file held out from --data"),
                       oomb::invalid_argument);
}

TEST_CASE("oomb-train: --eval-data evaluates its first windows, at the end by default; too short a file is refused") {
  training_test::temp_dir tmp("eval-data");
  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  const auto cfg = oomb_trainer::load_model_config(tiny);
  auto write_tokens = [&](const std::string& path, std::int64_t n, std::uint64_t seed) {
    const auto s = trainer_test::random_sequence(n, cfg.vocab_size, seed);
    std::vector<std::uint32_t> ids(s.tokens.begin(), s.tokens.end());
    oomb_trainer::write_token_file(path, ids.data(), ids.size(), static_cast<std::uint32_t>(cfg.vocab_size));
  };
  write_tokens(tmp / "train.bin", 1000, 1);
  write_tokens(tmp / "eval.bin", 200, 2);
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a{"--config", tiny, "--data", tmp / "train.bin", "--seq-len", "64", "--chunk", "16",
                               "--steps", "2", "--out", out, "--quiet", "--eval-data", tmp / "eval.bin"};
    a.insert(a.end(), extra.begin(), extra.end());
    return oomb_trainer::parse_train_options(a);
  };
  {
    oomb_trainer::training_run run(args(tmp / "run", {"--eval-sequences", "3"}));
    run.run();
  }
  const auto log = log_lines(fs::path(tmp / "run") / "log.jsonl");
  REQUIRE(log.size() == 3);
  CHECK(log[2]["step"] == 2);
  CHECK(log[2]["eval_predictions"] == 3 * 63);
  CHECK_FALSE(log[2].contains("eval_answer_accuracy"));
  CHECK(std::isfinite(log[2]["eval_loss"].get<double>()));
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(args(tmp / "short", {"--eval-sequences", "4"})),
                       doctest::Contains("holds 200 tokens: 4 sequences of 64 need 256"), oomb::invalid_argument);
}

TEST_CASE("oomb-train: --eval-data of version 2 buckets by the position in the document and keeps the file's mask") {
  training_test::temp_dir tmp("eval-docs");
  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  const auto cfg = oomb_trainer::load_model_config(tiny);
  const auto s = trainer_test::random_sequence(1000, cfg.vocab_size, 3, /*masked=*/true);
  std::vector<std::uint32_t> ids(s.tokens.begin(), s.tokens.end());
  oomb_trainer::write_token_file(tmp / "train.bin", ids.data(), ids.size(), static_cast<std::uint32_t>(cfg.vocab_size));
  // Documents start at 0, 40 and 100: the second window [64, 128) holds the second's tail and the third's head.
  const std::vector<std::uint64_t> starts{0, 40, 100};
  oomb_trainer::write_token_file(tmp / "eval.bin", ids.data(), 200, static_cast<std::uint32_t>(cfg.vocab_size), starts,
                                 s.mask.data());
  std::vector<std::string> a{"--config", tiny, "--data", tmp / "train.bin", "--seq-len", "64", "--chunk", "16",
                             "--steps", "0", "--out", tmp / "run", "--quiet", "--eval-data", tmp / "eval.bin",
                             "--eval-sequences", "2"};
  oomb_trainer::training_run run(oomb_trainer::parse_train_options(a));
  std::vector<std::int64_t> pos;
  const auto w1 = run.eval_sequence(1, &pos);
  CHECK(pos[0] == 64 - 40);  // token 64 sits 24 into the document that starts at 40
  CHECK(pos[36] == 0);       // token 100 starts the third
  CHECK(pos[63] == 27);
  CHECK(w1.mask[36] == 0);   // predicting the third document's first token from the second's does not count
  for (std::size_t t = 0; t < 64; ++t)
    if (t != 36) CHECK(w1.mask[t] == s.mask[64 + t]);  // the file's mask otherwise
  run.run();
  const auto log = log_lines(fs::path(tmp / "run") / "log.jsonl");
  REQUIRE(log.size() == 1);
  std::int64_t counted = 0;
  for (std::size_t j = 1; j < 128; ++j) counted += (j % 64 != 0 && s.mask[j] && j != 40 && j != 100) ? 1 : 0;
  CHECK(log[0]["eval_predictions"] == counted);
  CHECK(log[0]["eval_predictions_by_position"]["0-4K"] == counted);
}
