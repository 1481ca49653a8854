// The page-sparse flags' shared pieces (examples/trainer/app/sparse_flags.hpp), which
// bench_trainer uses: --scoring's names, a shape flag without --sparse-budget refused, and "the
// budget covers every past page" agreeing with the selector's own rule and with oomb-train's
// refusal at every length.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <oomb/sparse/selection.hpp>

#include "trainer/app/options.hpp"
#include "trainer/app/sparse_flags.hpp"

namespace {

using oomb_trainer::chunk_options;

chunk_options sparse_options(std::int32_t chunk, std::int32_t page, std::int32_t budget, std::int32_t sink,
                             std::int32_t local) {
  chunk_options o;
  o.chunk = chunk;
  o.page = page;
  o.sparse = true;
  o.budget = budget;
  o.sink = sink;
  o.local = local;
  return o;
}

}  // namespace

TEST_CASE("sparse flags: --scoring takes quest and mean, nothing else") {
  CHECK(oomb_trainer::parse_score_kind("--scoring", "quest") == oomb::score_kind::quest);
  CHECK(oomb_trainer::parse_score_kind("--scoring", "mean") == oomb::score_kind::mean);
  for (const char* bad : {"", "Quest", "mean-key", "max"})
    CHECK_THROWS_WITH_AS(oomb_trainer::parse_score_kind("--scoring", bad), doctest::Contains("is not quest or mean"),
                         oomb::invalid_argument);
}

TEST_CASE("sparse flags: a shape flag needs --sparse-budget") {
  CHECK_NOTHROW(oomb_trainer::check_sparse_shape_flags(false, ""));
  CHECK_NOTHROW(oomb_trainer::check_sparse_shape_flags(true, "--scoring"));
  CHECK_THROWS_WITH_AS(oomb_trainer::check_sparse_shape_flags(false, "--scoring"),
                       doctest::Contains("--scoring shapes page-sparse attention: it needs --sparse-budget"),
                       oomb::invalid_argument);
}

TEST_CASE("sparse flags: the most past pages is the last chunk's past, by brute force") {
  for (const std::int32_t page : {16, 128})
    for (const std::int32_t chunk : {page, 4 * page})
      for (std::int64_t tokens = 2; tokens <= 9 * chunk; tokens += 7) {
        std::int64_t last_start = 0;  // the first token of the last chunk: its past pages are before it
        for (std::int64_t c = 0; c * chunk < tokens; ++c) last_start = c * chunk;
        CAPTURE(tokens);
        CHECK(oomb_trainer::max_past_pages(tokens, chunk, page) == last_start / page);
      }
}

TEST_CASE("sparse flags: covering every past page is the selector's dense case and oomb-train's refusal") {
  const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  struct pages {
    std::int32_t budget, sink, local;
  };
  for (std::int64_t tokens : {17, 64, 65, 100, 160}) {
    for (const pages p : {pages{0, 1, 1}, pages{1, 1, 1}, pages{2, 1, 1}, pages{3, 0, 0}, pages{5, 2, 2}, pages{0, 0, 0}}) {
      CAPTURE(tokens);
      CAPTURE(p.budget);
      CAPTURE(p.sink);
      CAPTURE(p.local);
      const chunk_options o = sparse_options(16, 16, p.budget, p.sink, p.local);
      const std::int64_t past = oomb_trainer::max_past_pages(tokens, o.chunk, o.page);
      const bool covers = oomb_trainer::sparse_covers_past(o, tokens);
      // The selectors take every page when past <= max_pages: the last chunk's tiles are dense.
      CHECK(covers == (past <= oomb::selection_config{o.budget, o.sink, o.local}.max_pages()));
      const std::vector<std::string> args{"--config", tiny, "--synthetic", "kv-recall", "--seq-len",
                                          std::to_string(tokens), "--chunk", "16", "--page", "16", "--steps", "1",
                                          "--out", "o", "--sparse-budget", std::to_string(p.budget), "--sink",
                                          std::to_string(p.sink), "--local", std::to_string(p.local)};
      if (covers) {
        CHECK_THROWS_WITH_AS(oomb_trainer::parse_train_options(args), doctest::Contains("that is dense attention"),
                             oomb::invalid_argument);
        CHECK(oomb_trainer::sparse_covers_past_reason(o, tokens).find("that is dense attention") != std::string::npos);
      } else {
        CHECK_NOTHROW(oomb_trainer::parse_train_options(args));
      }
    }
  }
}
