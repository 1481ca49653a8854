#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "oomb/sparse/selection.hpp"
#include "oomb/sparse/sparse_page_table.hpp"
#include "sparse_test_util.hpp"

using namespace sparse_test;

TEST_CASE("selection: exhaustive comparison with brute force on small random cases") {
  std::mt19937_64 rng(4242);
  std::uniform_int_distribution<int> n_of(0, 40), small(0, 6), level(0, 9);
  std::uniform_int_distribution<int> special(0, 30);
  int compared = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int n = n_of(rng), budget = small(rng) + (trial % 3 == 0 ? 4 : 0), sink = small(rng) / 2,
              local = small(rng) / 2;
    // Few distinct levels, so ties are common; some -inf and NaN.
    std::vector<float> scores(std::size_t(n) + 1);
    for (auto& x : scores) {
      const int sp = special(rng);
      x = sp == 0 ? std::numeric_limits<float>::quiet_NaN()
          : sp == 1 ? -std::numeric_limits<float>::infinity()
                    : float(level(rng)) * 0.25f - 1.1f;
    }
    oomb::page_selector sel({budget, sink, local});
    std::vector<std::int32_t> got;
    sel.select(scores.data(), n, got);
    const auto want = ref_select(scores, n, budget, sink, local);
    REQUIRE(got == want);
    ++compared;
  }
  CHECK(compared == 20000);
}

TEST_CASE("selection: properties on larger random cases") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 500; ++trial) {
    std::uniform_int_distribution<int> n_of(1, 3000), cfg(0, 64);
    const int n = n_of(rng), budget = cfg(rng), sink = cfg(rng) / 8, local = cfg(rng) / 4;
    const auto scores = random_vector(rng, std::size_t(n));
    const auto got = oomb::select_pages(scores.data(), n, {budget, sink, local});
    CAPTURE(n);
    CAPTURE(budget);
    REQUIRE(got.size() == std::size_t(std::min<std::int64_t>(n, std::int64_t(budget) + sink + local)));
    REQUIRE(std::is_sorted(got.begin(), got.end()));
    REQUIRE(std::adjacent_find(got.begin(), got.end()) == got.end());  // sorted + no equal neighbours
    const std::set<std::int32_t> in(got.begin(), got.end());
    for (int i = 0; i < std::min(sink, n); ++i) REQUIRE(in.count(i) == 1);
    for (int i = std::max(0, n - local); i < n; ++i) REQUIRE(in.count(i) == 1);
    // Every chosen middle page scores at least as high as every rejected middle page.
    if (n > budget + sink + local) {
      float worst_in = std::numeric_limits<float>::infinity(), best_out = -worst_in;
      for (int i = sink; i < n - local; ++i) {
        const float x = scores[std::size_t(i)];
        if (in.count(i))
          worst_in = std::min(worst_in, x);
        else
          best_out = std::max(best_out, x);
      }
      if (budget > 0) REQUIRE(worst_in >= best_out);
    }
  }
}

TEST_CASE("selection: ties go to the lower page index") {
  std::vector<float> scores(50, 0.5f);
  auto got = oomb::select_pages(scores.data(), 50, {5, 2, 3});
  CHECK(got == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 47, 48, 49});
  scores[30] = 0.75f;  // one better page, then the four lowest of the tie
  got = oomb::select_pages(scores.data(), 50, {5, 2, 3});
  CHECK(got == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 30, 47, 48, 49});
  // A NaN score loses even to -infinity.
  std::vector<float> odd = {1, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 2};
  CHECK(oomb::select_pages(odd.data(), 4, {3, 0, 0}) == std::vector<std::int32_t>{0, 2, 3});
  // -0 and +0 are equal scores: the lower index wins.
  const std::vector<float> zeros = {-1.0f, -0.0f, 0.0f, -2.0f};
  CHECK(oomb::select_pages(zeros.data(), 4, {1, 0, 0}) == std::vector<std::int32_t>{1});
  const std::vector<float> zeros2 = {-1.0f, 0.0f, -0.0f, -2.0f};
  CHECK(oomb::select_pages(zeros2.data(), 4, {1, 0, 0}) == std::vector<std::int32_t>{1});
  // Infinities order as numbers; the largest finite float still loses to +inf.
  const std::vector<float> big = {std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  CHECK(oomb::select_pages(big.data(), 4, {1, 0, 0}) == std::vector<std::int32_t>{1});
  CHECK(oomb::select_pages(big.data(), 4, {3, 0, 0}) == std::vector<std::int32_t>{0, 1, 3});
}

TEST_CASE("selection: few pages keep them all; sink and local only") {
  const std::vector<float> scores = {0.3f, -0.2f, 0.9f, 0.1f, 0.4f, -0.6f};
  CHECK(oomb::select_pages(scores.data(), 6, {4, 1, 1}) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
  CHECK(oomb::select_pages(scores.data(), 5, {10, 0, 0}) == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  CHECK(oomb::select_pages(scores.data(), 6, {0, 1, 2}) == std::vector<std::int32_t>{0, 4, 5});
  CHECK(oomb::select_pages(scores.data(), 6, {2, 0, 0}) == std::vector<std::int32_t>{2, 4});
  CHECK(oomb::select_pages(scores.data(), 0, {2, 1, 1}).empty());
  // Sink and local pages' scores are never read: NaN there changes nothing.
  std::vector<float> guarded = scores;
  guarded[0] = guarded[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK(oomb::select_pages(guarded.data(), 6, {1, 1, 1}) == std::vector<std::int32_t>{0, 2, 5});
}

TEST_CASE("selection: bad configuration names the value") {
  CHECK_THROWS_WITH_AS(oomb::page_selector({-3, 0, 0}), doctest::Contains("budget must not be negative, got -3"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::page_selector({1, -1, 0}), doctest::Contains("sink must not be negative, got -1"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::page_selector({1, 0, -4}), doctest::Contains("local must not be negative, got -4"),
                       oomb::invalid_argument);
  oomb::page_selector sel({1, 0, 0});
  std::vector<std::int32_t> out = {9};
  const float s = 1.0f;
  CHECK_THROWS_WITH_AS(sel.select(&s, -2, out), doctest::Contains("num_past must not be negative, got -2"),
                       oomb::invalid_argument);
}

TEST_CASE("sparse_page_table: CSR over tiles and its POD view") {
  oomb::sparse_page_table t;
  CHECK(t.num_tiles() == 0);
  CHECK(t.indptr() == std::vector<std::int32_t>{0});
  t.add_tile({0, 3, 7});
  t.add_tile(std::vector<std::int32_t>{});
  t.add_tile({1, 2});
  CHECK(t.num_tiles() == 3);
  CHECK(t.num_entries() == 5);
  CHECK(t.indptr() == std::vector<std::int32_t>{0, 3, 3, 5});
  CHECK(t.indices() == std::vector<std::int32_t>{0, 3, 7, 1, 2});
  const auto v = t.view();
  CHECK(v.num_tiles == 3);
  CHECK(v.num_pages(0) == 3);
  CHECK(v.num_pages(1) == 0);
  CHECK(v.page(2, 1) == 2);
  CHECK(v.page(0, 2) == 7);
  const auto [b, e] = t.tile(2);
  CHECK(e - b == 2);
  CHECK(*b == 1);

  CHECK_THROWS_WITH_AS(t.add_tile({4, 4}), doctest::Contains("tile 3 pages not strictly ascending: 4 then 4"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.add_tile({-1}), doctest::Contains("tile 3 has negative page -1"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.tile(3), doctest::Contains("tile 3 out of range [0, 3)"), oomb::invalid_argument);
  CHECK(t.num_tiles() == 3);
  CHECK(t.num_entries() == 5);

  t.truncate(1);
  CHECK(t.indptr() == std::vector<std::int32_t>{0, 3});
  CHECK(t.indices() == std::vector<std::int32_t>{0, 3, 7});
  t.clear();
  CHECK(t.num_tiles() == 0);
  CHECK(t.num_entries() == 0);
}
