// Page-sparse chunk-recurrent training on PARTIAL selections equals a full-sequence run whose
// attention is masked by the selections stage 1 stored (double, every parameter tensor, norm-wise
// <= 1e-10), for Quest and mean-key scoring, GQA groups 1, 2 and 3, tied and untied, offload on and
// off. The checks that make the equality mean something: the masked reference is far from dense,
// and moves far when one selected page is swapped for another, so a backward that ignored (or
// misread) the selection would fail it.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model_util.hpp"
#include "support/gradient_runs.hpp"
#include "test_util.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::model_params;
using oomb_trainer::selection_mask;
using trainer_test::chunked_run;
using trainer_test::gradient_run;
using trainer_test::run_chunked;
using trainer_test::run_full_sequence;

/// The mask with one selected page of one tile swapped for a past page the tile did not select
/// (the last tile of the last chunk, layer 0, that has both).
selection_mask swap_one_page(const selection_mask& m) {
  selection_mask out = m;
  for (std::size_t ti = m.tables.size(); ti-- > 0;) {
    const auto& t = m.tables[ti];
    const std::int64_t c = static_cast<std::int64_t>(ti) / m.layers;
    if (static_cast<std::int64_t>(ti) % m.layers != 0) continue;
    const auto past = static_cast<std::int32_t>(c * m.chunk / m.page);
    for (std::int32_t tile = t.num_tiles(); tile-- > 0;) {
      const auto [b, e] = t.tile(tile);
      std::vector<std::int32_t> pages(b, e);
      if (pages.empty() || static_cast<std::int32_t>(pages.size()) == past) continue;
      std::int32_t unselected = 0;
      while (std::binary_search(pages.begin(), pages.end(), unselected)) ++unselected;
      pages.erase(pages.begin());
      pages.insert(std::lower_bound(pages.begin(), pages.end(), unselected), unselected);
      oomb::sparse_page_table swapped;
      for (std::int32_t k = 0; k < t.num_tiles(); ++k) {
        const auto [kb, ke] = t.tile(k);
        swapped.add_tile(k == tile ? pages : std::vector<std::int32_t>(kb, ke));
      }
      out.tables[ti] = swapped;
      return out;
    }
  }
  FAIL("no tile with a partial selection to perturb");
  return out;
}

}  // namespace

TEST_CASE("sparse reference: chunk-recurrent sparse gradients equal the full sequence masked by the stored selections") {
  struct gqa {
    std::int32_t hq, hkv;
  };
  int cases = 0;
  double worst_seen = 0, closest_to_dense = INFINITY, smallest_swap = INFINITY;
  // 170 tokens in chunks of 32 and pages of 16: the last chunk has 10 past pages; budget 1 + sink 1
  // + local 1 keeps 3 of them per tile of 16 queries.
  const std::int64_t N = 170;
  for (const auto score : {oomb::score_kind::quest, oomb::score_kind::mean})
    for (const gqa h : {gqa{2, 2}, gqa{4, 2}, gqa{6, 2}})
      for (bool tied : {false, true}) {
        const std::string scoring = oomb::to_string(score);
        CAPTURE(scoring);
        CAPTURE(h.hq);
        CAPTURE(h.hkv);
        CAPTURE(tied);
        const auto cfg = trainer_test::tiny_config(h.hq, h.hkv, tied, 4, 2, 13);
        model_params<double> p(cfg);
        oomb_trainer::init_perturbed(p, 300 + cases, 0.5);  // attention far from uniform
        const auto seq = trainer_test::random_sequence(N, cfg.vocab_size, 400 + cases, /*masked=*/cases % 2 == 0);
        ++cases;

        chunk_options opt;
        opt.chunk = 32;
        opt.page = 16;
        opt.window_pages = 2;  // several windows per layer
        opt.sparse = true;
        opt.budget = 1;
        opt.sink = 1;
        opt.local = 1;
        opt.tile = 16;
        opt.score = score;
        const chunked_run sparse = run_chunked(p, seq, opt);
        // Partial: half the past pages over the step, 3 of 10 in the last chunk's tile.
        CHECK(2 * sparse.stats.sparse_pages_selected == sparse.stats.sparse_pages_candidate);
        CHECK(sparse.mask.tables.back().num_entries() == 3);
        const gradient_run masked = run_full_sequence(p, seq, &sparse.mask);
        const double err = trainer_test::check_equals_reference(p, sparse, masked);
        worst_seen = std::max(worst_seen, err);

        // Offload streams the same windows: the same selections, the same bits.
        chunk_options off = opt;
        off.offload = true;
        off.near_pages = 4;
        const chunked_run streamed = run_chunked(p, seq, off);
        CHECK(streamed.stats.bytes_to_near > 0);
        CHECK(streamed.loss == sparse.loss);
        CHECK(trainer_test::same_bits(streamed.grads, sparse.grads));
        CHECK(trainer_test::worst_tensor_error(p, streamed.grads, masked.grads, nullptr) <= 1e-10);

        // The equality is meaningful: the masked reference is far from dense ...
        const gradient_run dense = run_full_sequence(p, seq, nullptr);
        const double from_dense = trainer_test::worst_tensor_error(p, masked.grads, dense.grads, nullptr);
        CHECK(from_dense > 1e-3);
        closest_to_dense = std::min(closest_to_dense, from_dense);
        // ... and one page swapped in one tile of one layer moves it far beyond the tolerance.
        const selection_mask swapped = swap_one_page(sparse.mask);
        const gradient_run other = run_full_sequence(p, seq, &swapped);
        const double from_swap = trainer_test::worst_tensor_error(p, other.grads, sparse.grads, nullptr);
        CHECK(from_swap > 1e-6);
        smallest_swap = std::min(smallest_swap, from_swap);
      }
  MESSAGE("sparse (3 of up to 10 past pages) vs masked full sequence: worst tensor gradient error ", worst_seen, " over ",
          cases, " cases; masked reference vs dense: at least ", closest_to_dense, "; vs one page swapped in one tile: at least ",
          smallest_swap);
}

TEST_CASE("sparse reference: a mask selecting every page is dense, bit for bit; bad masks are named") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 51);
  const auto seq = trainer_test::random_sequence(83, cfg.vocab_size, 52);
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.sparse = true;
  opt.budget = 8;  // covers every past page
  opt.tile = 16;
  const chunked_run all = run_chunked(p, seq, opt);
  CHECK(all.stats.sparse_pages_selected == all.stats.sparse_pages_candidate);
  const gradient_run masked = run_full_sequence(p, seq, &all.mask);
  const gradient_run dense = run_full_sequence(p, seq, nullptr);
  CHECK(masked.loss == dense.loss);
  CHECK(trainer_test::same_bits(masked.grads, dense.grads));

  selection_mask bad = all.mask;
  bad.tables.pop_back();
  CHECK_THROWS_WITH_AS(run_full_sequence(p, seq, &bad), doctest::Contains("tables for 3 chunks"),
                       oomb::invalid_argument);
  bad = all.mask;
  bad.tile = 8;
  CHECK_THROWS_WITH_AS(run_full_sequence(p, seq, &bad), doctest::Contains("tiles"),
                       oomb::invalid_argument);
  bad = all.mask;
  bad.tables[2] = oomb::sparse_page_table{};  // chunk 1, layer 0: selects page 2, its own
  bad.tables[2].add_tile({0, 2});
  bad.tables[2].add_tile({0});
  CHECK_THROWS_WITH_AS(run_full_sequence(p, seq, &bad), doctest::Contains("not before the chunk"),
                       oomb::invalid_argument);
}
