#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/scoring.hpp"
#include "sparse_test_util.hpp"

using namespace sparse_test;

TEST_CASE("quest_bound upper-bounds q·k for every key of the page (property)") {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int> tokens_of(1, 128), dim_of(1, 80);
  std::uniform_real_distribution<float> scale_of(0.01f, 50.0f);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int tokens = tokens_of(rng), dim = dim_of(rng);
    const float kscale = scale_of(rng), qscale = scale_of(rng);
    const auto keys = random_vector(rng, std::size_t(tokens) * dim, kscale);
    oomb::page_summaries s(1, dim);
    s.update(0, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {tokens, 1, dim}));
    const auto v = s.view();
    for (int qi = 0; qi < 8; ++qi) {
      const auto q = random_vector(rng, std::size_t(dim), qscale);
      const float bound = oomb::quest_bound(q.data(), v.min_of(0, 0), v.max_of(0, 0), dim);
      const double bound_exact = quest_double(q.data(), v.min_of(0, 0), v.max_of(0, 0), dim);
      double sum_abs = 0;
      for (int d = 0; d < dim; ++d)
        sum_abs += std::abs(q[std::size_t(d)]) *
                   std::max(std::abs(v.min_of(0, 0)[d]), std::abs(v.max_of(0, 0)[d]));
      const double tol = 2.0 * dim * std::numeric_limits<float>::epsilon() * sum_abs;
      CHECK(std::abs(bound - bound_exact) <= tol);
      for (int t = 0; t < tokens; ++t) {
        const float* k = keys.data() + std::size_t(t) * dim;
        // Exact, rounding included, against the library's own float dot (same summation tree)...
        REQUIRE(bound >= oomb::dot(q.data(), k, dim));
        // ...and against the true value in double, exactly for the double bound.
        REQUIRE(bound_exact >= dot_double(q.data(), k, dim) - 1e-12 * sum_abs);
        REQUIRE(double(bound) >= dot_double(q.data(), k, dim) - tol);
        ++checked;
      }
    }
  }
  CHECK(checked > 100000);
}

TEST_CASE("quest_bound of a one-token page equals q·k exactly; empty pages score -inf") {
  std::mt19937_64 rng(7);
  for (int dim : {1, 7, 8, 9, 64, 100}) {
    const auto k = random_vector(rng, std::size_t(dim));
    const auto q = random_vector(rng, std::size_t(dim));
    oomb::page_summaries s(1, dim);
    s.update(4, 0, oomb::tensor_view<const float, 3>::contiguous(k.data(), {1, 1, dim}));
    CHECK(oomb::page_score(oomb::score_kind::quest, q.data(), s.view(), 4, 0) ==
          oomb::dot(q.data(), k.data(), dim));
    CHECK(oomb::page_score(oomb::score_kind::mean, q.data(), s.view(), 4, 0) ==
          oomb::dot(q.data(), k.data(), dim));
    CHECK(oomb::dot(q.data(), k.data(), dim) == doctest::Approx(dot_double(q.data(), k.data(), dim)));
    CHECK(oomb::page_score(oomb::score_kind::quest, q.data(), s.view(), 0, 0) ==
          -std::numeric_limits<float>::infinity());
  }
}

namespace {

struct scoring_case {
  int pages, tokens, q_heads, kv_heads, dim, queries;
};

void check_tile_scorer(const scoring_case& c, oomb::score_kind kind, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  oomb::page_summaries s(c.kv_heads, c.dim);
  for (int p = 0; p < c.pages; ++p) {
    const auto keys = random_vector(rng, std::size_t(c.tokens) * c.kv_heads * c.dim);
    s.update(p, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {c.tokens, c.kv_heads, c.dim}));
  }
  const auto q = random_vector(rng, std::size_t(c.queries) * c.q_heads * c.dim);
  oomb::tile_scorer scorer(kind, c.q_heads, c.kv_heads, c.dim);
  scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {c.queries, c.q_heads, c.dim}));
  CHECK(scorer.queries() == c.queries);
  std::vector<std::int32_t> ids(std::size_t(c.pages));
  for (int i = 0; i < c.pages; ++i) ids[std::size_t(i)] = c.pages - 1 - i;  // any order of ids
  std::vector<float> out(ids.size());
  scorer.score(s.view(), ids.data(), c.pages, out.data());

  const auto v = s.view();
  const int group = c.q_heads / c.kv_heads;
  for (int i = 0; i < c.pages; ++i) {
    const int id = ids[std::size_t(i)];
    float best = -std::numeric_limits<float>::infinity();
    double best_exact = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < c.queries; ++t)
      for (int qh = 0; qh < c.q_heads; ++qh) {
        const float* qv = q.data() + (std::size_t(t) * c.q_heads + qh) * c.dim;
        const int kh = qh / group;
        best = std::max(best, oomb::page_score(kind, qv, v, id, kh));
        best_exact = std::max(best_exact, kind == oomb::score_kind::quest
                                              ? quest_double(qv, v.min_of(id, kh), v.max_of(id, kh), c.dim)
                                              : dot_double(qv, v.mean_of(id, kh), c.dim));
      }
    REQUIRE(out[std::size_t(i)] == best);  // same arithmetic: exact
    REQUIRE(out[std::size_t(i)] == doctest::Approx(best_exact).epsilon(1e-4).scale(1.0));
  }
}

}  // namespace

TEST_CASE("tile_scorer: max over queries, query heads and KV heads, against brute force") {
  for (auto kind : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    CAPTURE(oomb::to_string(kind));
    check_tile_scorer({40, 16, 6, 2, 20, 5}, kind, 31);
    check_tile_scorer({17, 128, 8, 1, 64, 128}, kind, 32);
    check_tile_scorer({9, 3, 4, 4, 9, 1}, kind, 33);
  }
}

TEST_CASE("tile_scorer: query head j reads KV head j / group (GQA)") {
  const int dim = 4, q_heads = 4, kv_heads = 2;
  // KV head 0's only key is all +1, KV head 1's all -1.
  std::vector<float> k = {1, 1, 1, 1, -1, -1, -1, -1};
  oomb::page_summaries s(kv_heads, dim);
  s.update(0, 0, oomb::tensor_view<const float, 3>::contiguous(k.data(), {1, kv_heads, dim}));
  // Query head j is (j + 1) in every channel.
  std::vector<float> q;
  for (int j = 0; j < q_heads; ++j) q.insert(q.end(), dim, float(j + 1));
  oomb::tile_scorer scorer(oomb::score_kind::quest, q_heads, kv_heads, dim);
  scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {1, q_heads, dim}));
  const std::int32_t id = 0;
  float score = 0;
  scorer.score(s.view(), &id, 1, &score);
  // Heads 0,1 -> KV 0: 4 and 8; heads 2,3 -> KV 1: -12 and -16. (j % kv_heads would give 12.)
  CHECK(score == 8.0f);
}

TEST_CASE("tile_scorer: strided bf16 queries score like their float copy") {
  std::mt19937_64 rng(77);
  const int dim = 16, q_heads = 4, kv_heads = 2, n = 3;
  oomb::page_summaries s(kv_heads, dim);
  const auto keys = random_vector(rng, std::size_t(8) * kv_heads * dim);
  s.update(0, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {8, kv_heads, dim}));
  // Head-major [h][t][d] bf16 queries, read through strides.
  std::vector<oomb::bf16> qb(std::size_t(q_heads) * n * dim);
  for (auto& x : qb) x = oomb::bf16(nonzero(rng));
  std::vector<float> qf(qb.size());  // [t][h][d]
  for (int h = 0; h < q_heads; ++h)
    for (int t = 0; t < n; ++t)
      for (int d = 0; d < dim; ++d)
        qf[(std::size_t(t) * q_heads + h) * dim + d] = float(qb[(std::size_t(h) * n + t) * dim + d]);
  oomb::tile_scorer a(oomb::score_kind::quest, q_heads, kv_heads, dim), b = a;
  a.load(oomb::tensor_view<const oomb::bf16, 3>(qb.data(), {n, q_heads, dim}, {dim, std::int64_t(n) * dim, 1}));
  b.load(oomb::tensor_view<const float, 3>::contiguous(qf.data(), {n, q_heads, dim}));
  const std::int32_t id = 0;
  float sa = 0, sb = 1;
  a.score(s.view(), &id, 1, &sa);
  b.score(s.view(), &id, 1, &sb);
  CHECK(sa == sb);
}

TEST_CASE("tile_scorer: bad input names the values") {
  CHECK_THROWS_WITH_AS(oomb::tile_scorer(oomb::score_kind::quest, 6, 4, 8),
                       doctest::Contains("q_heads (6) must be a positive multiple of kv_heads (4)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::tile_scorer(oomb::score_kind::mean, 4, 0, 8),
                       doctest::Contains("kv_heads must be positive, got 0"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::tile_scorer(oomb::score_kind::mean, 4, 2, 0),
                       doctest::Contains("head_dim must be positive, got 0"), oomb::invalid_argument);

  std::mt19937_64 rng(3);
  oomb::tile_scorer scorer(oomb::score_kind::quest, 4, 2, 8);
  oomb::page_summaries s(2, 8), other(1, 8);
  const auto keys = random_vector(rng, 2 * 8);
  s.update(0, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {1, 2, 8}));
  const std::int32_t ids[2] = {0, 5};
  float out[2];
  CHECK_THROWS_WITH_AS(scorer.score(s.view(), ids, 1, out), doctest::Contains("before load"),
                       oomb::invalid_argument);
  auto q = random_vector(rng, 3 * 4 * 8);
  CHECK_THROWS_WITH_AS(scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {3, 2, 8})),
                       doctest::Contains("queries have 2 heads, the scorer expects q_heads 4"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {3, 4, 4})),
                       doctest::Contains("head_dim 4, the scorer expects 8"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {0, 4, 8})),
                       doctest::Contains("at least one query, got 0"), oomb::invalid_argument);
  scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {3, 4, 8}));
  q[17] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {3, 4, 8})),
                       doctest::Contains("token 0, head 2, channel 1"), oomb::invalid_argument);
  CHECK(scorer.queries() == 3);  // the failed load left the previous tile in place
  // A view says where its memory is: device memory is refused (the host would read it), pinned
  // memory is read. The data here is host memory, so only the check stands between it and a read.
  const auto shape = std::array<std::int64_t, 3>{2, 4, 8}, strides = std::array<std::int64_t, 3>{32, 8, 1};
  CHECK_THROWS_WITH_AS(scorer.load(oomb::tensor_view<const float, 3>(q.data() + 32, shape, strides,
                                                                     oomb::memory_kind::device)),
                       doctest::Contains("tile_scorer: queries are in device memory"), oomb::invalid_argument);
  CHECK(scorer.queries() == 3);
  scorer.load(oomb::tensor_view<const float, 3>(q.data() + 32, shape, strides, oomb::memory_kind::pinned));
  CHECK(scorer.queries() == 2);
  CHECK_THROWS_WITH_AS(scorer.score(other.view(), ids, 1, out),
                       doctest::Contains("summaries have 1 KV heads of head_dim 8, the scorer 2 of 8"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(scorer.score(s.view(), ids, 2, out),
                       doctest::Contains("page 1 has id 5, outside the summaries' ids [0, 1)"),
                       oomb::invalid_argument);
  scorer.score(s.view(), ids, 1, out);
  CHECK(std::isfinite(out[0]));
}
