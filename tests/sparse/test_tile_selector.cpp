#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/tile_selector.hpp"
#include "sparse_test_util.hpp"

using namespace sparse_test;

namespace {

struct fixture {
  int pages, page_size, q_heads, kv_heads, dim;
  oomb::page_summaries summaries;
  std::vector<std::int32_t> ids;  // logical page -> pool id (a shuffled page table row)

  fixture(std::mt19937_64& rng, int pages_, int page_size_, int q_heads_, int kv_heads_, int dim_)
      : pages(pages_), page_size(page_size_), q_heads(q_heads_), kv_heads(kv_heads_), dim(dim_),
        summaries(kv_heads_, dim_) {
    ids.resize(std::size_t(pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int p = 0; p < pages; ++p) {
      // Pages differ in scale, so scores spread and selection matters.
      const auto keys = random_vector(rng, std::size_t(page_size) * kv_heads * dim, 0.5f + float(p % 7));
      summaries.update(ids[std::size_t(p)], 0,
                       oomb::tensor_view<const float, 3>::contiguous(keys.data(), {page_size, kv_heads, dim}));
    }
  }

  // Brute-force tile score of logical page i: max over the tile's queries and heads.
  float ref_score(oomb::score_kind kind, const std::vector<float>& q, int q0, int q1, int i) const {
    const auto v = summaries.view();
    const int group = q_heads / kv_heads;
    float best = -std::numeric_limits<float>::infinity();
    for (int t = q0; t < q1; ++t)
      for (int qh = 0; qh < q_heads; ++qh)
        best = std::max(best, oomb::page_score(kind, q.data() + (std::size_t(t) * q_heads + qh) * dim, v,
                                               ids[std::size_t(i)], qh / group));
    return best;
  }
};

void check_against_brute_force(oomb::score_kind kind, int tile, oomb::selection_config pc, int n_queries,
                               std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  fixture f(rng, 60, 16, 4, 2, 24);
  const auto q = random_vector(rng, std::size_t(n_queries) * f.q_heads * f.dim);
  const auto qv = oomb::tensor_view<const float, 3>::contiguous(q.data(), {n_queries, f.q_heads, f.dim});
  oomb::tile_selector sel({tile, kind, pc}, f.q_heads, f.kv_heads, f.dim);
  const int tiles = (n_queries + tile - 1) / tile;
  CHECK(sel.num_tiles(n_queries) == tiles);

  // Shared boundary.
  oomb::sparse_page_table table;
  table.add_tile({5});  // something already there stays
  const int past = 50;
  sel.select(f.summaries.view(), qv, f.ids.data(), past, table);
  REQUIRE(table.num_tiles() == 1 + tiles);
  for (int t = 0; t < tiles; ++t) {
    const int q0 = t * tile, q1 = std::min(n_queries, q0 + tile);
    std::vector<float> scores(static_cast<std::size_t>(past));
    for (int i = 0; i < past; ++i) scores[std::size_t(i)] = f.ref_score(kind, q, q0, q1, i);
    const auto want = ref_select(scores, past, pc.budget, pc.sink, pc.local);
    const auto [b, e] = table.tile(1 + t);
    REQUIRE(std::vector<std::int32_t>(b, e) == want);
  }

  // A boundary per tile.
  std::vector<std::int32_t> bounds(static_cast<std::size_t>(tiles));
  for (int t = 0; t < tiles; ++t) bounds[std::size_t(t)] = 3 + (17 * t) % 58;
  oomb::sparse_page_table per_tile;
  sel.select(f.summaries.view(), qv, f.ids.data(), bounds.data(), per_tile);
  REQUIRE(per_tile.num_tiles() == tiles);
  const auto v = per_tile.view();
  for (int t = 0; t < tiles; ++t) {
    const int q0 = t * tile, q1 = std::min(n_queries, q0 + tile), n = bounds[std::size_t(t)];
    std::vector<float> scores(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) scores[std::size_t(i)] = f.ref_score(kind, q, q0, q1, i);
    const auto want = ref_select(scores, n, pc.budget, pc.sink, pc.local);
    REQUIRE(v.num_pages(t) == std::int32_t(want.size()));
    for (int i = 0; i < v.num_pages(t); ++i) REQUIRE(v.page(t, i) == want[std::size_t(i)]);
  }

  // Per document: tile t's candidates are [first[t], past), sink pages counted from first[t]; a
  // first page at or past the boundary leaves none. Brute force over the candidates only.
  std::vector<std::int32_t> first(static_cast<std::size_t>(tiles));
  for (int t = 0; t < tiles; ++t) first[std::size_t(t)] = (11 * t) % 56;  // 0, 11, 22, ..., some >= past
  oomb::sparse_page_table per_doc;
  sel.select(f.summaries.view(), qv, f.ids.data(), past, first.data(), per_doc);
  REQUIRE(per_doc.num_tiles() == tiles);
  for (int t = 0; t < tiles; ++t) {
    const int q0 = t * tile, q1 = std::min(n_queries, q0 + tile), lo = std::min(first[std::size_t(t)], past);
    std::vector<float> scores(static_cast<std::size_t>(past - lo));
    for (int i = lo; i < past; ++i) scores[std::size_t(i - lo)] = f.ref_score(kind, q, q0, q1, i);
    auto want = ref_select(scores, past - lo, pc.budget, pc.sink, pc.local);
    for (auto& pg : want) pg += lo;
    const auto [b, e] = per_doc.tile(t);
    REQUIRE(std::vector<std::int32_t>(b, e) == want);
    CHECK(std::all_of(b, e, [&](std::int32_t pg) { return pg >= lo; }));
  }
}

}  // namespace

TEST_CASE("tile_selector: every tile's selection equals brute-force scoring and selection") {
  for (auto kind : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    CAPTURE(oomb::to_string(kind));
    check_against_brute_force(kind, 128, {8, 1, 2}, 300, 1);  // default tile, last tile short
    check_against_brute_force(kind, 16, {5, 0, 0}, 64, 2);
    check_against_brute_force(kind, 7, {12, 4, 4}, 30, 3);
    check_against_brute_force(kind, 1, {0, 2, 3}, 5, 4);
  }
}

TEST_CASE("tile_selector: Quest keeps the page holding a dominant key") {
  // One page holds a key aligned with the queries, far above every other key: its bound is the
  // largest, so even a budget of 1 picks it.
  std::mt19937_64 rng(8);
  const int dim = 32, pages = 40, page_size = 16;
  oomb::page_summaries s(1, dim);
  std::vector<std::int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  const auto q = random_vector(rng, std::size_t(4) * dim);
  for (int p = 0; p < pages; ++p) {
    auto keys = random_vector(rng, std::size_t(page_size) * dim, 0.1f);
    if (p == 23)
      for (int d = 0; d < dim; ++d) keys[std::size_t(5) * dim + d] = q[std::size_t(d)] * 10.0f;
    s.update(p, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {page_size, 1, dim}));
  }
  oomb::tile_selector sel({128, oomb::score_kind::quest, {1, 1, 1}}, 1, 1, dim);
  oomb::sparse_page_table t;
  sel.select(s.view(), oomb::tensor_view<const float, 3>::contiguous(q.data(), {4, 1, dim}), ids.data(), pages, t);
  const auto [b, e] = t.tile(0);
  CHECK(std::vector<std::int32_t>(b, e) == std::vector<std::int32_t>{0, 23, 39});
}

TEST_CASE("tile_selector: short pasts keep every page without scoring") {
  oomb::page_summaries empty(2, 8);  // no ids at all: scoring anything would throw
  oomb::tile_selector sel({4, oomb::score_kind::quest, {2, 1, 1}}, 2, 2, 8);
  std::vector<float> q(std::size_t(10) * 2 * 8, 0.5f);
  oomb::sparse_page_table t;
  sel.select(empty.view(), oomb::tensor_view<const float, 3>::contiguous(q.data(), {10, 2, 8}), nullptr, 4, t);
  CHECK(t.num_tiles() == 3);
  CHECK(t.indptr() == std::vector<std::int32_t>{0, 4, 8, 12});
  sel.select(empty.view(), oomb::tensor_view<const float, 3>::contiguous(q.data(), {10, 2, 8}), nullptr, 0, t);
  CHECK(t.num_tiles() == 6);
  CHECK(t.num_entries() == 12);
}

TEST_CASE("tile_selector: bad input names values; a failed call appends nothing") {
  CHECK_THROWS_WITH_AS(oomb::tile_selector({0, oomb::score_kind::quest, {1, 0, 0}}, 4, 2, 8),
                       doctest::Contains("tile_queries must be positive, got 0"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::tile_selector({128, oomb::score_kind::quest, {-1, 0, 0}}, 4, 2, 8),
                       doctest::Contains("budget must not be negative, got -1"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::tile_selector({128, oomb::score_kind::quest, {1, 0, 0}}, 5, 2, 8),
                       doctest::Contains("q_heads (5) must be a positive multiple of kv_heads (2)"),
                       oomb::invalid_argument);

  std::mt19937_64 rng(21);
  fixture f(rng, 20, 16, 2, 1, 8);
  oomb::tile_selector sel({2, oomb::score_kind::mean, {2, 0, 0}}, 2, 1, 8);
  const auto q = random_vector(rng, std::size_t(6) * 2 * 8);
  const auto qv = oomb::tensor_view<const float, 3>::contiguous(q.data(), {6, 2, 8});
  oomb::sparse_page_table t;
  sel.select(f.summaries.view(), qv, f.ids.data(), 10, t);
  REQUIRE(t.num_tiles() == 3);
  const auto before = t.indices();
  // Tile 2's boundary reaches a logical page whose id is outside the summaries.
  std::vector<std::int32_t> ids = f.ids;
  ids.push_back(999);
  const std::int32_t bounds[3] = {5, 10, 21};
  CHECK_THROWS_WITH_AS(sel.select(f.summaries.view(), qv, ids.data(), bounds, t),
                       doctest::Contains("has id 999, outside the summaries' ids [0, 20)"),
                       oomb::invalid_argument);
  CHECK(t.num_tiles() == 3);
  CHECK(t.indices() == before);
  CHECK_THROWS_WITH_AS(sel.select(f.summaries.view(), qv, f.ids.data(), -1, t),
                       doctest::Contains("past_pages must not be negative, got -1"), oomb::invalid_argument);
  const auto none = oomb::tensor_view<const float, 3>::contiguous(q.data(), {0, 2, 8});
  CHECK_THROWS_WITH_AS(sel.select(f.summaries.view(), none, f.ids.data(), 4, t),
                       doctest::Contains("no queries"), oomb::invalid_argument);
  oomb::page_summaries wrong(2, 8);
  wrong.reserve(20);
  CHECK_THROWS_WITH_AS(sel.select(wrong.view(), qv, f.ids.data(), 10, t),
                       doctest::Contains("summaries have 2 KV heads of head_dim 8, the selector 1 of 8"),
                       oomb::invalid_argument);
  // Mismatches surface even when no tile needs scoring (past <= budget + sink + local).
  CHECK_THROWS_WITH_AS(sel.select(wrong.view(), qv, f.ids.data(), 1, t),
                       doctest::Contains("summaries have 2 KV heads"), oomb::invalid_argument);
  const auto three_heads = oomb::tensor_view<const float, 3>::contiguous(q.data(), {2, 3, 8});
  CHECK_THROWS_WITH_AS(sel.select(f.summaries.view(), three_heads, f.ids.data(), 1, t),
                       doctest::Contains("queries have 3 heads of head_dim 8, the selector expects 2 of 8"),
                       oomb::invalid_argument);
  // Queries in device memory are refused before any tile is read on the host, scored or not.
  const oomb::tensor_view<const float, 3> on_device(q.data(), qv.shape(), qv.strides(), oomb::memory_kind::device);
  for (const std::int32_t past : {1, 10})
    CHECK_THROWS_WITH_AS(sel.select(f.summaries.view(), on_device, f.ids.data(), past, t),
                         doctest::Contains("tile_selector: queries are in device memory"), oomb::invalid_argument);
  CHECK(t.num_tiles() == 3);
}
