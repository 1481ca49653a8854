#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "sparse_test_util.hpp"

using namespace sparse_test;

namespace {

// Keys of one page as [tokens][kv_heads][head_dim] in element type E; `ref` gets the float values.
template <class E>
std::vector<E> make_keys(std::mt19937_64& rng, int tokens, int heads, int dim, std::vector<float>& ref) {
  std::vector<E> k(std::size_t(tokens) * heads * dim);
  ref.resize(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = E(nonzero(rng, 3.0f));
    ref[i] = static_cast<float>(k[i]);
  }
  return k;
}

template <class E>
oomb::tensor_view<const E, 3> rows(const std::vector<E>& k, int first, int count, int heads, int dim) {
  return oomb::tensor_view<const E, 3>::contiguous(k.data() + std::size_t(first) * heads * dim,
                                                   {count, heads, dim});
}

bool same_page(const oomb::page_summary_view& a, std::int32_t ida, const oomb::page_summary_view& b,
               std::int32_t idb) {
  const std::size_t n = std::size_t(a.kv_heads) * a.head_dim * sizeof(float);
  return a.token_count(ida) == b.token_count(idb) &&
         std::memcmp(a.min_of(ida, 0), b.min_of(idb, 0), n) == 0 &&
         std::memcmp(a.max_of(ida, 0), b.max_of(idb, 0), n) == 0 &&
         std::memcmp(a.mean_of(ida, 0), b.mean_of(idb, 0), n) == 0;
}

template <class E>
void check_incremental(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int heads = 3, dim = 19, tokens = 128;  // head_dim not a multiple of 8 on purpose
  std::vector<float> ref;
  const auto keys = make_keys<E>(rng, tokens, heads, dim, ref);

  oomb::page_summaries s(heads, dim);
  s.update(7, 0, rows(keys, 0, tokens, heads, dim));  // at once
  for (int t = 0; t < tokens; ++t) s.update(2, t, rows(keys, t, 1, heads, dim));  // token by token
  std::uniform_int_distribution<int> chunk(1, 40);
  for (int t = 0; t < tokens;) {  // random chunks
    const int c = std::min(chunk(rng), tokens - t);
    s.update(11, t, rows(keys, t, c, heads, dim));
    t += c;
  }
  const auto v = s.view();
  CHECK(v.num_ids == 12);
  CHECK(v.token_count(7) == tokens);
  CHECK(same_page(v, 7, v, 2));
  CHECK(same_page(v, 7, v, 11));

  // Against the brute-force reference: min/max exact, mean exact too (double sums, token order).
  const auto r = summarize(ref, tokens, heads, dim);
  for (int h = 0; h < heads; ++h)
    for (int d = 0; d < dim; ++d) {
      REQUIRE(v.min_of(7, h)[d] == r.min[std::size_t(h) * dim + d]);
      REQUIRE(v.max_of(7, h)[d] == r.max[std::size_t(h) * dim + d]);
      REQUIRE(v.mean_of(7, h)[d] == doctest::Approx(r.mean[std::size_t(h) * dim + d]).epsilon(1e-6));
    }
  // Partial pages summarise only what they hold so far.
  oomb::page_summaries p(heads, dim);
  p.update(0, 0, rows(keys, 0, 37, heads, dim));
  const auto r37 = summarize(ref, 37, heads, dim);
  CHECK(p.tokens(0) == 37);
  CHECK(std::memcmp(p.view().max_of(0, 0), r37.max.data(), r37.max.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(p.view().min_of(0, 0), r37.min.data(), r37.min.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("page_summaries: incremental updates equal the at-once summary and the reference") {
  check_incremental<float>(101);
  check_incremental<double>(202);
  check_incremental<oomb::bf16>(303);
}

TEST_CASE("page_summaries: mean of float keys equals the double reference exactly") {
  std::mt19937_64 rng(17);
  const int heads = 2, dim = 8, tokens = 64;
  std::vector<float> ref;
  const auto keys = make_keys<float>(rng, tokens, heads, dim, ref);
  oomb::page_summaries s(heads, dim);
  for (int t = 0; t < tokens; t += 16) s.update(0, t, rows(keys, t, 16, heads, dim));
  const auto r = summarize(ref, tokens, heads, dim);
  CHECK(std::memcmp(s.view().mean_of(0, 0), r.mean.data(), r.mean.size() * sizeof(float)) == 0);
}

TEST_CASE("page_summaries: strided keys (token-major and head-major) give the same summary") {
  std::mt19937_64 rng(5);
  const int heads = 4, dim = 16, tokens = 32;
  std::vector<float> ref;
  const auto nhd = make_keys<float>(rng, tokens, heads, dim, ref);  // [t][h][d]
  std::vector<float> hnd(nhd.size());                               // [h][t][d]
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < dim; ++d)
        hnd[(std::size_t(h) * tokens + t) * dim + d] = nhd[(std::size_t(t) * heads + h) * dim + d];
  oomb::page_summaries s(heads, dim);
  s.update(0, 0, rows(nhd, 0, tokens, heads, dim));
  s.update(1, 0, oomb::tensor_view<const float, 3>(hnd.data(), {tokens, heads, dim},
                                                    {dim, std::int64_t(tokens) * dim, 1}));
  CHECK(same_page(s.view(), 0, s.view(), 1));
}

TEST_CASE("page_summaries: update_from_pool reads K pages of either layout") {
  for (auto layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major}) {
    CAPTURE(static_cast<int>(layout));
    std::mt19937_64 rng(layout == oomb::kv_layout::head_major ? 11 : 12);
    oomb::page_shape shape{16, 2, 24, layout};
    const int pages = 3;
    std::vector<oomb::bf16> pool(std::size_t(pages) * shape.pair_elements());
    for (auto& x : pool) x = oomb::bf16(nonzero(rng, 2.0f));
    const auto pv = oomb::page_pool_view<oomb::bf16>::over(pool.data(), shape);

    oomb::page_summaries from_pool(shape.kv_heads, shape.head_dim), direct(shape.kv_heads, shape.head_dim);
    from_pool.update_from_pool(pv, 2, 0, 5);
    from_pool.update_from_pool(pv, 2, 5, 11);
    // The same keys gathered by hand into [t][h][d], from the page model's layout formula.
    std::vector<oomb::bf16> gathered(std::size_t(16) * shape.kv_heads * shape.head_dim);
    const std::size_t k_page = std::size_t(2) * shape.pair_elements();
    for (int t = 0; t < 16; ++t)
      for (int h = 0; h < shape.kv_heads; ++h)
        for (int d = 0; d < shape.head_dim; ++d) {
          const std::size_t in_page = layout == oomb::kv_layout::head_major
                                          ? (std::size_t(h) * 16 + t) * shape.head_dim + d
                                          : (std::size_t(t) * shape.kv_heads + h) * shape.head_dim + d;
          gathered[(std::size_t(t) * shape.kv_heads + h) * shape.head_dim + d] = pool[k_page + in_page];
        }
    direct.update(2, 0, rows(gathered, 0, 16, shape.kv_heads, shape.head_dim));
    CHECK(same_page(from_pool.view(), 2, direct.view(), 2));

    CHECK_THROWS_AS(from_pool.update_from_pool(pv, 2, 16, 1), oomb::invalid_argument);
    oomb::page_summaries wrong(3, shape.head_dim);
    CHECK_THROWS_WITH_AS(wrong.update_from_pool(pv, 0, 0, 1),
                         doctest::Contains("2 KV heads of head_dim 24, the summaries 3 of 24"),
                         oomb::invalid_argument);
  }
}

TEST_CASE("page_summaries: restart, clear, growth and unseen ids") {
  std::mt19937_64 rng(9);
  const int heads = 1, dim = 8;
  std::vector<float> ref;
  const auto keys = make_keys<float>(rng, 40, heads, dim, ref);
  oomb::page_summaries s(heads, dim, 4);
  CHECK(s.num_ids() == 4);
  CHECK(s.tokens(3) == 0);
  CHECK(s.tokens(1000) == 0);
  CHECK(s.tokens(-1) == 0);

  s.update(3, 0, rows(keys, 0, 20, heads, dim));
  // A released id handed out again restarts at token 0 with the new page's keys only.
  s.update(3, 0, rows(keys, 20, 20, heads, dim));
  oomb::page_summaries fresh(heads, dim);
  fresh.update(0, 0, rows(keys, 20, 20, heads, dim));
  CHECK(same_page(s.view(), 3, fresh.view(), 0));

  s.clear(3);
  CHECK(s.tokens(3) == 0);
  s.clear(12345);  // never seen: ignored
  s.update(100, 0, rows(keys, 0, 1, heads, dim));
  CHECK(s.num_ids() == 101);
  CHECK(s.tokens(100) == 1);
  // A single token's summary is the token itself.
  for (int d = 0; d < dim; ++d) {
    CHECK(s.view().min_of(100, 0)[d] == ref[std::size_t(d)]);
    CHECK(s.view().max_of(100, 0)[d] == ref[std::size_t(d)]);
    CHECK(s.view().mean_of(100, 0)[d] == ref[std::size_t(d)]);
  }
}

TEST_CASE("page_summaries: ascending ids grow the store geometrically, keeping every summary") {
  // Each move of the store's arrays is a reallocation; growing by exactly one id at a time (the
  // old quadratic behaviour) moves them on every new id. Geometric growth moves them O(log n) times.
  std::mt19937_64 rng(21);
  const int heads = 2, dim = 8, ids = 4000;
  std::vector<float> ref;
  const auto keys = make_keys<float>(rng, ids, heads, dim, ref);
  oomb::page_summaries s(heads, dim);
  const float* where = nullptr;
  int moves = 0;
  for (int id = 0; id < ids; ++id) {
    s.update(id, 0, rows(keys, id, 1, heads, dim));
    if (s.view().min != where) ++moves, where = s.view().min;
  }
  CHECK(s.num_ids() == ids);
  CHECK(moves <= 16);  // log2(4000) ~ 12 doublings
  bool intact = true;  // every page still holds its single token after all the moves
  for (int id = 0; id < ids; ++id)
    for (int d = 0; d < heads * dim; ++d)
      intact = intact && s.view().min_of(id, 0)[d] == ref[std::size_t(id) * heads * dim + d] &&
               s.view().mean_of(id, 0)[d] == ref[std::size_t(id) * heads * dim + d];
  CHECK(intact);
  CHECK(s.tokens(ids) == 0);  // capacity beyond the ids seen is not an id
  // reserve() asks for exactly what it is given: a view taken after it survives updates within.
  oomb::page_summaries r(heads, dim);
  r.reserve(ids);
  const float* reserved = r.view().min;
  for (int id = ids - 1; id >= 0; id -= 97) r.update(id, 0, rows(keys, id, 1, heads, dim));
  CHECK(r.view().min == reserved);
}

TEST_CASE("page_summaries: bad input names the values and leaves the summary unchanged") {
  std::mt19937_64 rng(13);
  const int heads = 2, dim = 8;
  std::vector<float> ref;
  auto keys = make_keys<float>(rng, 10, heads, dim, ref);
  oomb::page_summaries s(heads, dim);
  s.update(0, 0, rows(keys, 0, 5, heads, dim));
  oomb::page_summaries before(heads, dim);
  before.update(0, 0, rows(keys, 0, 5, heads, dim));

  CHECK_THROWS_WITH_AS(s.update(0, 7, rows(keys, 5, 1, heads, dim)),
                       doctest::Contains("page 0 holds 5 tokens; cannot append at token 7"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(s.update(-2, 0, rows(keys, 5, 1, heads, dim)), doctest::Contains("got -2"),
                       oomb::invalid_argument);
  const auto three_heads = oomb::tensor_view<const float, 3>::contiguous(keys.data(), {1, 3, 4});
  CHECK_THROWS_WITH_AS(s.update(0, 5, three_heads), doctest::Contains("keys have 3 KV heads, the summaries 2"),
                       oomb::invalid_argument);
  const auto wide = oomb::tensor_view<const float, 3>::contiguous(keys.data(), {1, 2, 4});
  CHECK_THROWS_WITH_AS(s.update(0, 5, wide), doctest::Contains("keys have head_dim 4, the summaries 8"),
                       oomb::invalid_argument);
  keys[std::size_t(5) * heads * dim + 3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(s.update(0, 5, rows(keys, 5, 2, heads, dim)),
                       doctest::Contains("token 5, kv head 0, channel 3"), oomb::invalid_argument);
  keys[std::size_t(6) * heads * dim + 9] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(s.update(0, 6, rows(keys, 6, 1, heads, dim)), oomb::invalid_argument);
  CHECK(same_page(s.view(), 0, before.view(), 0));
  CHECK_THROWS_WITH_AS(oomb::page_summaries(0, 8), doctest::Contains("kv_heads must be positive, got 0"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::page_summaries(2, -1), doctest::Contains("head_dim must be positive, got -1"),
                       oomb::invalid_argument);
  // Keys in device memory are refused (the host would read them); pinned keys are read.
  const auto k5 = rows(keys, 7, 1, heads, dim);
  CHECK_THROWS_WITH_AS(s.update(0, 5, oomb::tensor_view<const float, 3>(k5.data(), k5.shape(), k5.strides(),
                                                                         oomb::memory_kind::device)),
                       doctest::Contains("keys of page 0 are in device memory"), oomb::invalid_argument);
  CHECK(same_page(s.view(), 0, before.view(), 0));
  // Still usable: the next in-order append works.
  s.update(0, 5, rows(keys, 7, 1, heads, dim));
  CHECK(s.tokens(0) == 6);
}
