// Packed documents (--packing documents, issue 31): positions restart at each document and a query
// attends only its own document's keys. The full-sequence reference of a packed sequence equals
// each document trained alone (the independent check of its block-diagonal mask and positions);
// chunk-recurrent training of packed sequences equals it (double, every tensor), dense, over
// windows, streamed and page-sparse with per-document selections.
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
using oomb_trainer::sequence;
using trainer_test::chunked_run;
using trainer_test::gradient_run;
using trainer_test::run_chunked;
using trainer_test::run_full_sequence;

// 170 tokens in chunks of 32 and pages of 16: documents start mid-page and mid-chunk (13, 140,
// 150), on a chunk boundary (64), span chunks (13..64, 64..140) and lie inside one (140..150).
const std::vector<std::int32_t> starts{0, 13, 64, 140, 150};
constexpr std::int64_t N = 170;

/// Random tokens packed as documents from `doc_starts`: as token_sequences packs them, the target
/// at each document's first token does not count; with `masked` a random half of the others do.
sequence packed(std::int64_t n, std::int32_t vocab, std::uint64_t seed, const std::vector<std::int32_t>& doc_starts,
                bool masked) {
  sequence s = trainer_test::random_sequence(n, vocab, seed, masked);
  if (s.mask.empty()) s.mask.assign(s.tokens.size(), 1);
  for (std::int32_t d : doc_starts) s.mask[static_cast<std::size_t>(d)] = 0;
  s.doc_starts = doc_starts;
  return s;
}

/// The documents of `s` as sequences of their own (their masks' first entries, ignored, stay).
std::vector<sequence> split(const sequence& s) {
  std::vector<sequence> out;
  for (std::size_t d = 0; d < s.doc_starts.size(); ++d) {
    const auto b = static_cast<std::size_t>(s.doc_starts[d]);
    const auto e = d + 1 < s.doc_starts.size() ? static_cast<std::size_t>(s.doc_starts[d + 1]) : s.tokens.size();
    sequence one;
    one.tokens.assign(s.tokens.begin() + std::ptrdiff_t(b), s.tokens.begin() + std::ptrdiff_t(e));
    one.mask.assign(s.mask.begin() + std::ptrdiff_t(b), s.mask.begin() + std::ptrdiff_t(e));
    out.push_back(one);
  }
  return out;
}

chunk_options paged_options(std::int32_t window_pages) {
  chunk_options o;
  o.chunk = 32;
  o.page = 16;
  o.window_pages = window_pages;
  return o;
}

}  // namespace

TEST_CASE("documents: document starts per position and the longest document") {
  std::vector<std::int64_t> out(12);
  oomb_trainer::document_starts_of({0, 3, 4, 9}, 2, 10, out.data());
  CHECK(std::vector<std::int64_t>(out.begin(), out.begin() + 10) ==
        std::vector<std::int64_t>{0, 3, 4, 4, 4, 4, 4, 9, 9, 9});
  oomb_trainer::document_starts_of({}, 5, 3, out.data());
  CHECK(std::vector<std::int64_t>(out.begin(), out.begin() + 3) == std::vector<std::int64_t>{0, 0, 0});
  sequence s;
  s.tokens.assign(12, 1);
  CHECK(s.longest_document() == 12);
  s.doc_starts = {0, 3, 4, 9};
  CHECK(s.longest_document() == 5);
  s.doc_starts = {0, 3};
  CHECK(s.longest_document() == 9);
}

TEST_CASE("documents: the full-sequence reference of a packed sequence equals each document trained alone") {
  for (const bool masked : {false, true}) {
    CAPTURE(masked);
    const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
    model_params<double> p(cfg);
    oomb_trainer::init_perturbed(p, 41, 0.5);
    const sequence s = packed(N, cfg.vocab_size, 42, starts, masked);
    const gradient_run whole = run_full_sequence(p, s);
    // Each document alone, weighted by its counted targets: the packed loss is their mean.
    double loss = 0;
    std::vector<double> grads(whole.grads.size(), 0.0);
    for (const sequence& doc : split(s)) {
      const double w = double(doc.counted_targets()) / double(s.counted_targets());
      if (w == 0) continue;
      const gradient_run one = run_full_sequence(p, doc);
      loss += w * one.loss;
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += w * one.grads[i];
    }
    CHECK(std::abs(whole.loss - loss) <= 1e-12 * std::abs(loss));
    std::string which;
    CHECK(trainer_test::worst_tensor_error(p, whole.grads, grads, &which) <= 1e-12);
    CAPTURE(which);
    // The documents matter: the same tokens as one stream (the same mask) train differently.
    sequence stream = s;
    stream.doc_starts.clear();
    CHECK(std::abs(run_full_sequence(p, stream).loss - whole.loss) > 1e-4);
  }
}

TEST_CASE("documents: chunk-recurrent gradients equal the block-diagonal full sequence; offload is bit-exact") {
  struct gqa {
    std::int32_t hq, hkv;
  };
  int cases = 0;
  double worst_seen = 0;
  for (const gqa h : {gqa{2, 2}, gqa{4, 2}, gqa{6, 1}})
    for (const std::int32_t window_pages : {0, 2}) {  // one window per layer; windows cutting documents
      CAPTURE(h.hq);
      CAPTURE(window_pages);
      const auto cfg = trainer_test::tiny_config(h.hq, h.hkv, cases % 2 == 1, 4, 2, 13);
      model_params<double> p(cfg);
      oomb_trainer::init_perturbed(p, 500 + cases, 0.5);
      const sequence s = packed(N, cfg.vocab_size, 600 + cases, starts, cases % 3 == 0);
      ++cases;
      const gradient_run full = run_full_sequence(p, s);
      const chunk_options opt = paged_options(window_pages);
      const chunked_run plain = run_chunked(p, s, opt);
      const double err = trainer_test::check_equals_reference(p, plain, full);
      worst_seen = std::max(worst_seen, err);

      chunk_options off = opt;
      off.offload = true;
      off.near_pages = window_pages > 0 ? 4 : 2 * static_cast<std::int32_t>((N + 15) / 16);  // the same windows as in place
      const chunked_run streamed = run_chunked(p, s, off);
      CHECK(streamed.loss == plain.loss);
      CHECK(trainer_test::same_bits(streamed.grads, plain.grads));
      if (window_pages > 0) {  // 4 slots: pages stream (with the whole sequence's slots nothing moves)
        // Pages wholly in earlier documents are never moved: fewer bytes than the same tokens as one stream.
        sequence stream = s;
        stream.doc_starts.clear();
        CHECK(streamed.stats.bytes_to_near > 0);
        CHECK(streamed.stats.bytes_to_near < run_chunked(p, stream, off).stats.bytes_to_near);
      }

      chunk_options kept = opt;
      kept.keep_attention_outputs = true;
      const chunked_run k = run_chunked(p, s, kept);
      CHECK(trainer_test::same_bits(k.grads, plain.grads));

      // Sparse whose budget covers every page: dense, bit for bit.
      chunk_options all = opt;
      all.sparse = true;
      all.budget = 16;
      all.sink = 1;
      all.local = 1;
      all.tile = 16;
      const chunked_run sp = run_chunked(p, s, all);
      CHECK(sp.loss == plain.loss);
      CHECK(trainer_test::same_bits(sp.grads, plain.grads));
    }
  MESSAGE("packed documents: worst norm-wise gradient error, chunk-recurrent vs block-diagonal full sequence: ",
          worst_seen, " over ", cases, " cases");
}

TEST_CASE("documents: page-sparse selections stay in each tile's document and equal the full sequence masked by them") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  model_params<double> p(cfg);
  oomb_trainer::init_perturbed(p, 71, 0.5);
  const sequence s = packed(N, cfg.vocab_size, 72, starts, false);
  chunk_options opt = paged_options(2);
  opt.sparse = true;
  opt.budget = 1;
  opt.sink = 1;
  opt.local = 1;
  opt.tile = 16;
  for (const auto score : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    const std::string scoring = oomb::to_string(score);
    CAPTURE(scoring);
    opt.score = score;
    const chunked_run sp = run_chunked(p, s, opt);
    CHECK(sp.stats.sparse_pages_selected < sp.stats.sparse_pages_candidate);  // partial selections
    // Every tile selects from the page holding its first query's document start on, and at most
    // budget + sink + local pages: sink pages are its document's first.
    std::int64_t partial = 0;
    for (std::size_t ti = 0; ti < sp.mask.tables.size(); ++ti) {
      const auto c = static_cast<std::int64_t>(ti) / cfg.num_hidden_layers;
      const auto& t = sp.mask.tables[ti];
      for (std::int32_t tile = 0; tile < t.num_tiles(); ++tile) {
        const std::int64_t q = c * opt.chunk + std::int64_t(tile) * opt.tile;
        const std::int32_t doc = *(std::upper_bound(starts.begin(), starts.end(), q) - 1);
        const std::int32_t first = doc / opt.page, past = static_cast<std::int32_t>(c * opt.chunk / opt.page);
        const auto [b, e] = t.tile(tile);
        CHECK(std::all_of(b, e, [&](std::int32_t pg) { return pg >= first && pg < past; }));
        CHECK(e - b == std::min<std::int32_t>(3, std::max(0, past - first)));
        if (e - b > 0 && past - first > 3) {
          CHECK(*b == first);  // the sink: the document's first page
          ++partial;
        }
      }
    }
    CHECK(partial > 0);
    const gradient_run masked = run_full_sequence(p, s, &sp.mask);
    const double err = trainer_test::check_equals_reference(p, sp, masked);
    // ... and the masked reference is not the dense one: the selections matter.
    CHECK(trainer_test::worst_tensor_error(p, run_full_sequence(p, s).grads, masked.grads, nullptr) > 1e-3);
    MESSAGE(scoring, ": packed sparse vs masked full sequence ", err);
  }
}
