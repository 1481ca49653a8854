// Training on version 2 token files: the file's loss mask reaches the loss (a masked run's step is
// the device trainer's step on the masked sequence, not the unmasked one), --packing documents
// trains on packed sequences, a stopped-and-resumed packed run gives the straight run's losses and
// weights bit for bit, and the checkpoint, log, options and banner say what the data was.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/data/token_sequences.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/trainers/cpu_trainer.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::log_lines;
using training_test::temp_dir;

/// A version 2 file of `docs` documents of 5 to 90 tokens (a learnable pattern: each token follows
/// from the previous), each a "prompt" of a third of it (mask 0) and an "answer" (mask 1).
void write_documents(const std::string& path, int docs, bool masked, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> toks;
  std::vector<std::uint64_t> starts;
  std::vector<std::uint8_t> mask;
  for (int d = 0; d < docs; ++d) {
    starts.push_back(toks.size());
    const std::uint32_t n = 5 + rng() % 86, prompt = n / 3;
    std::uint32_t t = rng() % 64;
    for (std::uint32_t i = 0; i < n; ++i) {
      toks.push_back(t);
      mask.push_back(i >= prompt);
      t = i % 9 == 0 ? rng() % 64 : (t * 5 + 1) % 64;
    }
  }
  oomb_trainer::write_token_file(path, toks.data(), toks.size(), 64, starts, masked ? mask.data() : nullptr);
}

oomb_trainer::train_options data_options(const std::string& data, const std::string& out) {
  oomb_trainer::train_options o;
  o.config = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  o.data = data;
  o.seq_len = 64;
  o.chunk = 16;
  o.page = 16;
  o.steps = 6;
  o.lr = 3e-3;
  o.warmup = 1;
  o.out = out;
  o.quiet = true;
  return o;
}

}  // namespace

TEST_CASE("data training: the token file's loss mask is the loss's, on windows and on packed documents") {
  temp_dir tmp("data-mask");
  write_documents(tmp / "chat.tokens", 40, true, 11);
  for (const auto packing : {oomb_trainer::packing_kind::none, oomb_trainer::packing_kind::documents}) {
    const std::string packing_name = oomb_trainer::packing_name(packing);
    CAPTURE(packing_name);
    auto o = data_options(tmp / "chat.tokens", tmp / (std::string("out-") + oomb_trainer::packing_name(packing)));
    o.packing = packing;
    oomb_trainer::training_run run(o);
    // The sequence the run trains on first: the same source on its own.
    oomb_trainer::token_sequences source(oomb_trainer::token_reader::open(o.data, 64), o.seq_len, packing, o.seed);
    const oomb_trainer::sequence seq = source.next();
    REQUIRE(seq.mask.size() == std::size_t(o.seq_len));
    REQUIRE(seq.counted_targets() < o.seq_len - 1);  // the prompts (and, packed, the document starts) are left out
    oomb_trainer::sequence unmasked = seq;
    unmasked.mask.clear();

    oomb_trainer::trainer_setup setup;
    setup.config = run.config();
    setup.chunk = oomb_trainer::chunk_options_of(o);
    setup.max_tokens = o.seq_len;
    auto loss_of = [&](const oomb_trainer::sequence& s) {
      oomb_trainer::cpu_trainer t(setup);
      t.init(o.seed);
      oomb_trainer::step_settings st;
      st.lr = 0;
      st.clip = o.clip;
      return t.step({s}, st, {}).loss;
    };
    const double masked_loss = loss_of(seq), all_loss = loss_of(unmasked);
    const oomb_trainer::step_record r = run.step();
    MESSAGE("first step: loss " << r.loss << "; the masked sequence alone " << masked_loss << ", unmasked " << all_loss);
    CHECK(r.loss == masked_loss);  // the same bits: the run trained on exactly this sequence and mask
    CHECK(std::abs(all_loss - masked_loss) > 1e-6);  // the mask changes the loss (by 1e-3 to 1e-2 here: random weights)
    const auto log = log_lines(fs::path(o.out) / "log.jsonl");
    REQUIRE(log.size() == 1);
    CHECK(log[0]["loss_kind"] == "mask");
    CHECK(log[0].contains("sequences_skipped"));
    CHECK(log[0].contains("padding_tokens") == (packing == oomb_trainer::packing_kind::documents));
  }
}

TEST_CASE("data training: --packing documents, stopped and resumed, gives the straight run's losses and weights bit for bit") {
  temp_dir tmp("data-resume");
  write_documents(tmp / "docs.tokens", 60, true, 5);
  auto o = data_options(tmp / "docs.tokens", tmp / "a");
  o.packing = oomb_trainer::packing_kind::documents;
  o.batch = 2;
  o.offload = true;
  o.near_pages = 4;
  std::vector<std::string> banner;
  oomb_trainer::training_run a(o, [&](const std::string& line) { banner.push_back(line); });
  std::vector<double> whole;
  std::vector<std::int64_t> padding;
  while (!a.done()) {
    const auto r = a.step();
    whole.push_back(r.loss);
    padding.push_back(r.padding_tokens);
  }
  CHECK(whole.back() < whole.front());
  const std::string text = a.banner();
  CHECK(text.find("packed by documents") != std::string::npos);
  CHECK(text.find("attention and positions per document") != std::string::npos);

  auto ob = o;
  ob.out = tmp / "b";
  ob.stop_after = 2;
  oomb_trainer::training_run b(ob);
  b.run();  // 2 steps, then a checkpoint
  REQUIRE(b.steps_taken() == 2);
  const nlohmann::json st = nlohmann::json::parse(std::ifstream(tmp / "b/checkpoint/trainer_state.json"));
  CHECK(st["extra"]["packing"] == "documents");
  // The position is the units taken: the first 4 sequences' documents, re-counted here.
  oomb_trainer::token_sequences source(oomb_trainer::token_reader::open(o.data, 64), o.seq_len, o.packing, o.seed);
  for (int k = 0; k < 4; ++k) (void)source.next();
  CHECK(st["data_position"] == source.position());

  auto oc = o;
  oc.out = tmp / "b";
  oc.resume = tmp / "b/checkpoint";
  oomb_trainer::training_run c(oc);
  CHECK(c.steps_taken() == 2);
  std::vector<double> resumed;
  while (!c.done()) resumed.push_back(c.step().loss);
  REQUIRE(resumed.size() == 4);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(resumed[i] == whole[i + 2]);  // exactly
  }
  const auto wc = c.weights(), wa = a.weights();
  CHECK(std::memcmp(wc.data(), wa.data(), wa.size() * sizeof(float)) == 0);
  const auto log = log_lines(tmp / "b/log.jsonl");
  REQUIRE(log.size() == 6);
  for (std::size_t i = 0; i < log.size(); ++i) CHECK(log[i]["padding_tokens"] == padding[i]);

  // Resuming it without --packing (another order of the same file) is refused, naming the field.
  auto od = oc;
  od.packing = oomb_trainer::packing_kind::none;
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run{od}, doctest::Contains("the checkpoint's run had packing \"documents\""),
                       oomb::invalid_argument);
  // options.json says it.
  const nlohmann::json opts = nlohmann::json::parse(std::ifstream(tmp / "b/options.json"));
  CHECK(opts["packing"] == "documents");
}

TEST_CASE("data training: --packing is parsed and checked; a version 1 file cannot be packed") {
  using oomb_trainer::parse_train_options;
  temp_dir tmp("data-flags");
  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  const std::vector<std::string> base{"--config", tiny, "--seq-len", "64", "--chunk", "16", "--steps", "2", "--out", tmp / "o"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CHECK(parse_train_options(with({"--data", "t.tokens"})).packing == oomb_trainer::packing_kind::none);
  CHECK(parse_train_options(with({"--data", "t.tokens", "--packing", "documents"})).packing ==
        oomb_trainer::packing_kind::documents);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--data", "t.tokens", "--packing", "best-fit"})),
                       doctest::Contains("--packing: unknown packing 'best-fit'"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--synthetic", "kv-recall", "--packing", "documents"})),
                       doctest::Contains("--packing documents packs the documents of a --data token file"),
                       oomb::invalid_argument);
  std::vector<std::uint32_t> toks(200, 3);
  oomb_trainer::write_token_file(tmp / "v1.tokens", toks.data(), toks.size(), 64);
  auto o = parse_train_options(with({"--data", tmp / "v1.tokens", "--packing", "documents", "--quiet"}));
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run{o}, doctest::Contains("is a version 1 token file"),
                       oomb::invalid_argument);
}
