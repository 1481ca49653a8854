// paged_kv_cache: configuration checks, atomic appends, K/V addressing in both layouts, pops,
// properties of random operation sequences (ownership, accounting, no leaks), bad input.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "paging_test_util.hpp"

using oomb::host_resource;
using oomb::kv_layout;
using oomb::paged_kv_cache;
using oomb::paged_kv_config;
using paging_test::expect_error;

namespace {

paged_kv_config small_config(kv_layout layout = kv_layout::head_major) {
  paged_kv_config c;
  c.layers = 3;
  c.shape.page_size = 16;
  c.shape.kv_heads = 2;
  c.shape.head_dim = 8;
  c.shape.layout = layout;
  c.chunk_size = 32;
  c.pool.max_pages = 64;
  return c;
}

template <class E>
float to_f(E x) {
  return static_cast<float>(x);
}

/// A value unique to (seq, layer, pos, head, dim, k-or-v), exactly representable in bf16.
float tag(std::int32_t seq, std::int32_t layer, std::int64_t pos, std::int32_t head, std::int32_t d, int kv) {
  const auto h = static_cast<std::uint32_t>(seq * 7919 + layer * 104729 + pos * 31 + head * 17 + d * 5 + kv * 3);
  return static_cast<float>(h % 251) - 125.0f;  // small integers: exact in bf16, float, double
}

}  // namespace

TEST_CASE("paged_kv_cache: configuration is validated, naming the values") {
  host_resource r;
  auto c = small_config();
  c.shape.page_size = 100;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"page_size", "100"});
  c = small_config();
  c.shape.page_size = 8;
  c.chunk_size = 16;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"page_size", "8"});
  c = small_config();
  c.chunk_size = 40;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); },
                                       {"chunk_size 40", "page_size 16"});
  c.chunk_size = 0;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"chunk_size 0"});
  c = small_config();
  c.layers = 0;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"layers", "0"});
  c = small_config();
  c.shape.kv_heads = 0;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"kv_heads", "0"});
  c = small_config();
  c.shape.head_dim = -2;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"head_dim", "-2"});
  c = small_config();
  c.pool.max_pages = 0;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"max_pages", "0"});
  c = small_config();
  c.pool.mode = oomb::pool_mode::growing;
  c.pool.pages_per_slab = 0;
  expect_error<oomb::invalid_argument>([&] { paged_kv_cache<float, host_resource>(r, c); }, {"pages_per_slab", "0"});
}

TEST_CASE("paged_kv_cache: geometry and one pool of K/V pairs for all layers") {
  host_resource upstream;
  oomb::statistics_adaptor<host_resource> r(upstream);
  const auto c = small_config();
  paged_kv_cache<oomb::bf16, decltype(r)> kv(r, c);
  CHECK(kv.num_layers() == 3);
  CHECK(kv.page_size() == 16);
  CHECK(kv.chunk_size() == 32);
  CHECK(kv.shape() == c.shape);
  CHECK(kv.pair_bytes() == 2 * 16 * 2 * 8 * sizeof(oomb::bf16));
  CHECK(kv.pool().block_bytes() == kv.pair_bytes());
  CHECK(kv.stats().capacity == 64);
  CHECK(kv.stats().in_use == 0);
  CHECK(kv.pool().is_contiguous());
  // The contiguous pool takes its one range up front.
  CHECK(r.statistics().bytes_in_use >= 64 * kv.pair_bytes());

  const auto s = kv.add_sequence();
  CHECK(kv.num_seqs() == 1);
  CHECK(kv.pages_needed(s, 20) == 2);
  CHECK(kv.append(s, 20) == 0);
  CHECK(kv.seq_len(s) == 20);
  CHECK(kv.num_pages(s) == 2);
  CHECK(kv.num_chunks(s) == 1);
  CHECK(kv.stats().in_use == 2 * 3);  // two pages in each of three layers

  // Every layer got its own pages, all distinct.
  std::set<std::int32_t> ids;
  for (std::int32_t l = 0; l < 3; ++l)
    for (auto id : kv.page_ids(s, l)) CHECK(ids.insert(id).second);
  CHECK(ids.size() == 6);
}

TEST_CASE_TEMPLATE("paged_kv_cache: K/V written through k()/v() read back through view() and page views", E,
                   float, double, oomb::bf16) {
  for (kv_layout layout : {kv_layout::head_major, kv_layout::token_major}) {
    CAPTURE(static_cast<int>(layout));
    host_resource r;
    const auto c = small_config(layout);
    paged_kv_cache<E, host_resource> kv(r, c);
    const auto a = kv.add_sequence();
    const auto b = kv.add_sequence();
    kv.append(a, 32);
    kv.append(b, 32);
    CHECK(kv.append(a, 21) == 32);  // second chunk, partial
    const auto hd = c.shape.head_dim;
    for (std::int32_t s : {a, b})
      for (std::int32_t l = 0; l < c.layers; ++l)
        for (std::int64_t p = 0; p < kv.seq_len(s); ++p)
          for (std::int32_t h = 0; h < c.shape.kv_heads; ++h) {
            E* k = kv.k(s, l, p, h);
            E* v = kv.v(s, l, p, h);
            for (std::int32_t d = 0; d < hd; ++d) {
              k[d] = E(tag(s, l, p, h, d, 0));
              v[d] = E(tag(s, l, p, h, d, 1));
            }
          }
    std::int64_t checked = 0;
    for (std::int32_t l = 0; l < c.layers; ++l) {
      const auto view = kv.view(l);
      CHECK(view.table.num_seqs == 2);
      CHECK(view.table.seq_len(a) == 53);
      CHECK(view.table.seq_len(b) == 32);
      CHECK(view.table.page_len(a, 3) == 5);
      for (std::int32_t s : {a, b})
        for (std::int64_t p = 0; p < kv.seq_len(s); ++p)
          for (std::int32_t h = 0; h < c.shape.kv_heads; ++h) {
            const auto page = kv.k_page(s, l, static_cast<std::int32_t>(p / 16));
            const auto vpage = kv.v_page(kv.page_id(s, l, static_cast<std::int32_t>(p / 16)));
            CHECK(page.shape() == std::array<std::int64_t, 3>{2, 16, 8});
            for (std::int32_t d = 0; d < hd; ++d) {
              const float want_k = tag(s, l, p, h, d, 0);
              const float want_v = tag(s, l, p, h, d, 1);
              CHECK(to_f(view.k_at(s, p, h)[d]) == want_k);
              CHECK(to_f(view.v_at(s, p, h)[d]) == want_v);
              CHECK(to_f(page(h, p % 16, d)) == want_k);
              CHECK(to_f(vpage(h, p % 16, d)) == want_v);
              ++checked;
            }
          }
    }
    CHECK(checked == 3 * (53 + 32) * 2 * 8);
  }
}

TEST_CASE("paged_kv_cache: chunks, chunk_pages, for_each_page and pop_chunk") {
  host_resource r;
  auto c = small_config();
  c.chunk_size = 64;  // four pages a chunk
  paged_kv_cache<float, host_resource> kv(r, c);
  const auto s = kv.add_sequence();
  kv.append(s, 64);
  kv.append(s, 64);
  kv.append(s, 17);
  CHECK(kv.num_chunks(s) == 3);
  CHECK(kv.chunk_pages(s, 0) == std::pair<std::int32_t, std::int32_t>{0, 4});
  CHECK(kv.chunk_pages(s, 1) == std::pair<std::int32_t, std::int32_t>{4, 8});
  CHECK(kv.chunk_pages(s, 2) == std::pair<std::int32_t, std::int32_t>{8, 10});

  std::vector<std::int32_t> window;
  kv.for_each_page(s, 2, 4, 8, [&](std::int32_t i, std::int32_t id) {
    CHECK(id == kv.page_id(s, 2, i));
    window.push_back(id);
  });
  CHECK(window.size() == 4);

  // pop_chunk hands every freed id to the callback, after the pool has it back.
  std::multiset<std::int32_t> expected;
  for (std::int32_t l = 0; l < 3; ++l)
    for (std::int32_t i = 8; i < 10; ++i) expected.insert(kv.page_id(s, l, i));
  std::multiset<std::int32_t> released;
  CHECK(kv.pop_chunk(s, [&](std::int32_t id) {
    CHECK_FALSE(kv.pool().owns(id));
    released.insert(id);
  }) == 17);
  CHECK(released == expected);
  CHECK(kv.seq_len(s) == 128);
  CHECK(kv.stats().in_use == 3 * 8);
  CHECK(kv.pop_chunk(s) == 64);
  kv.pop(s, 64);
  CHECK(kv.seq_len(s) == 0);
  CHECK(kv.pop_chunk(s) == 0);
  CHECK(kv.stats().in_use == 0);
}

TEST_CASE("paged_kv_cache: an append the pool cannot hold changes nothing") {
  host_resource r;
  auto c = small_config();
  c.pool.max_pages = 12;  // 3 layers: a 32-token chunk takes 6 pages
  paged_kv_cache<float, host_resource> kv(r, c);
  const auto a = kv.add_sequence();
  const auto b = kv.add_sequence();
  kv.append(a, 32);  // 6 pages
  kv.append(b, 16);  // 3 pages: 3 left
  kv.clear_changes();
  const auto csr0 = kv.csr(0);
  const auto stats = kv.stats();
  expect_error<oomb::out_of_memory>([&] { kv.append(a, 17); },
                                    {"17 tokens", "sequence 0", "2 pages in each of 3 layers", "6 page pairs",
                                     "3 left of 12"});
  CHECK(kv.seq_len(a) == 32);
  CHECK(kv.stats().in_use == stats.in_use);
  CHECK(kv.changes().empty());
  CHECK(kv.csr(0).indices == csr0.indices);
  CHECK(kv.csr(0).indptr == csr0.indptr);
  // Still usable: free a chunk and the same append fits.
  kv.pop_chunk(b);
  kv.append(a, 17);
  CHECK(kv.seq_len(a) == 49);
  CHECK(kv.stats().in_use == 12);
}

TEST_CASE("paged_kv_cache: bad input throws invalid_argument naming the values, cache unchanged") {
  host_resource r;
  paged_kv_cache<float, host_resource> kv(r, small_config());
  const auto s = kv.add_sequence();
  kv.append(s, 32);
  kv.append(s, 10);
  kv.clear_changes();
  const auto in_use = kv.stats().in_use;
  const auto ids = kv.csr(1).indices;

  expect_error<oomb::invalid_argument>([&] { kv.append(1, 16); }, {"sequence 1"});
  expect_error<oomb::invalid_argument>([&] { kv.append(s, 0); }, {"0 tokens", "1..32"});
  expect_error<oomb::invalid_argument>([&] { kv.append(s, 33); }, {"33 tokens", "1..32"});
  expect_error<oomb::invalid_argument>([&] { kv.append(s, 5); }, {"holds 42", "chunk_size 32"});
  expect_error<oomb::invalid_argument>([&] { kv.pop(s, 43); }, {"pop 43", "holds 42"});
  expect_error<oomb::invalid_argument>([&] { kv.pop(s, 5); }, {"leave 37", "chunk_size 32"});
  expect_error<oomb::invalid_argument>([&] { kv.pop(s, -1); }, {"pop -1"});
  expect_error<oomb::invalid_argument>([&] { kv.pop_chunk(4); }, {"sequence 4"});
  expect_error<oomb::invalid_argument>([&] { kv.k(s, 0, 42, 0); }, {"position 42", "[0, 42)"});
  expect_error<oomb::invalid_argument>([&] { kv.v(s, 0, -1, 0); }, {"position -1"});
  expect_error<oomb::invalid_argument>([&] { kv.k(s, 3, 0, 0); }, {"layer 3", "[0, 3)"});
  expect_error<oomb::invalid_argument>([&] { kv.k(s, 0, 0, 2); }, {"kv head 2", "[0, 2)"});
  expect_error<oomb::invalid_argument>([&] { kv.k(9, 0, 0, 0); }, {"sequence 9"});
  expect_error<oomb::invalid_argument>([&] { kv.view(3); }, {"layer 3"});
  expect_error<oomb::invalid_argument>([&] { kv.chunk_pages(s, 2); }, {"chunk 2", "[0, 2)"});
  expect_error<oomb::invalid_argument>([&] { kv.page_id(s, 0, 3); }, {"page 3"});
  expect_error<oomb::invalid_argument>([&] { kv.k_page(63); }, {"page id 63", "not in use"});
  expect_error<oomb::invalid_argument>([&] { kv.v_page(-1); }, {"page id -1"});
  expect_error<oomb::invalid_argument>([&] { kv.for_each_page(s, 0, 2, 4, [](std::int32_t, std::int32_t) {}); },
                                       {"[2, 4)"});

  CHECK(kv.seq_len(s) == 42);
  CHECK(kv.stats().in_use == in_use);
  CHECK(kv.changes().empty());
  CHECK(kv.csr(1).indices == ids);
  kv.pop_chunk(s);
  kv.append(s, 32);
  CHECK(kv.seq_len(s) == 64);
}

TEST_CASE("paged_kv_cache: a growing pool addresses pages but has no kernel view") {
  host_resource r;
  auto c = small_config();
  c.pool.mode = oomb::pool_mode::growing;
  c.pool.pages_per_slab = 4;
  c.pool.max_pages = 40;
  paged_kv_cache<float, host_resource> kv(r, c);
  const auto s = kv.add_sequence();
  for (int i = 0; i < 6; ++i) kv.append(s, 32);  // 36 pages: several slabs
  CHECK(kv.stats().reserved == 36);
  CHECK(kv.stats().reserved_bytes < std::size_t(40) * kv.pair_bytes());
  for (std::int64_t p = 0; p < kv.seq_len(s); ++p) *kv.k(s, 2, p, 1) = static_cast<float>(p);
  for (std::int64_t p = 0; p < kv.seq_len(s); ++p)
    CHECK(kv.k_page(s, 2, static_cast<std::int32_t>(p / 16))(1, p % 16, 0) == static_cast<float>(p));
  expect_error<oomb::invalid_argument>([&] { kv.view(0); }, {"contiguous"});
  expect_error<oomb::invalid_argument>([&] { kv.pool_view(); }, {"contiguous"});
  expect_error<oomb::out_of_memory>([&] { kv.append(s, 32); }, {"4 left of 40"});
  while (kv.pop_chunk(s) > 0) {
  }
  CHECK(kv.stats().in_use == 0);
}

TEST_CASE("paged_kv_cache: random operation sequences keep ownership and accounting exact") {
  for (auto mode : {oomb::pool_mode::contiguous, oomb::pool_mode::growing}) {
    for (std::uint64_t seed : {21u, 22u, 23u}) {
      CAPTURE(seed);
      CAPTURE(static_cast<int>(mode));
      paging_test::rng rnd(seed);
      host_resource r;
      auto c = small_config(rnd.uniform(0, 1) ? kv_layout::head_major : kv_layout::token_major);
      c.layers = static_cast<std::int32_t>(rnd.uniform(1, 4));
      c.pool.max_pages = static_cast<std::int32_t>(rnd.uniform(12, 60));
      c.pool.mode = mode;
      c.pool.pages_per_slab = 7;
      paged_kv_cache<float, host_resource> kv(r, c);
      // The model: a stamp per held page, written into the page itself, so any page handed out
      // twice would overwrite another's stamp.
      std::map<std::int32_t, std::tuple<std::int32_t, std::int32_t, std::int32_t>> owner;  // id -> place
      std::int64_t ooms = 0;
      auto stamp = [](std::int32_t s, std::int32_t l, std::int32_t i) { return float(s * 10000 + l * 1000 + i); };
      for (int step = 0; step < 500; ++step) {
        const auto op = rnd.uniform(0, 12);
        if (op == 0 || kv.num_seqs() == 0) {
          if (kv.num_seqs() < 5) kv.add_sequence();
        } else {
          const auto s = static_cast<std::int32_t>(rnd.uniform(0, kv.num_seqs() - 1));
          if (op <= 9) {
            const auto len = kv.seq_len(s);
            if (len % c.chunk_size != 0) kv.pop_chunk(s);  // only a full last chunk can grow
            for (auto it = owner.begin(); it != owner.end();)
              it = kv.pool().owns(it->first) ? std::next(it) : owner.erase(it);
            const auto before = kv.num_pages(s);
            // Mostly full chunks, so sequences grow until the pool runs out.
            const auto tokens = rnd.uniform(0, 3) != 0 ? c.chunk_size : rnd.uniform(1, c.chunk_size);
            const auto need = std::int64_t(kv.pages_needed(s, tokens)) * c.layers;
            if (need > kv.pool().available()) {
              CHECK_THROWS_AS(kv.append(s, tokens), oomb::out_of_memory);
              ++ooms;
            } else {
              kv.append(s, tokens);
              for (std::int32_t l = 0; l < c.layers; ++l)
                for (std::int32_t i = before; i < kv.num_pages(s); ++i) {
                  const auto id = kv.page_id(s, l, i);
                  CHECK(owner.emplace(id, std::make_tuple(s, l, i)).second);  // never held twice
                  *kv.k_page(id).data() = stamp(s, l, i);
                }
            }
          } else {
            std::vector<std::int32_t> freed;
            kv.pop_chunk(s, [&](std::int32_t id) { freed.push_back(id); });
            for (auto id : freed) CHECK(owner.erase(id) == 1);
          }
        }
        // Accounting: the pool holds exactly the table's pages; free + used = capacity.
        const auto st = kv.stats();
        CHECK(st.in_use == kv.table().total_pages());
        CHECK(kv.pool().available() + st.in_use == st.capacity);
        CHECK(st.in_use == static_cast<std::int32_t>(owner.size()));
        if (step % 25 == 0) {
          for (const auto& [id, place] : owner) {
            const auto [s, l, i] = place;
            CHECK(kv.page_id(s, l, i) == id);
            CHECK(*kv.k_page(id).data() == stamp(s, l, i));
          }
        }
      }
      CHECK(ooms > 0);  // the capacity limit was really exercised
      for (std::int32_t s = 0; s < kv.num_seqs(); ++s)
        while (kv.pop_chunk(s) > 0) {
        }
      CHECK(kv.stats().in_use == 0);
      CHECK(kv.table().total_pages() == 0);
      CHECK(kv.pool().available() == c.pool.max_pages);
    }
  }
}

TEST_CASE("paged_kv_cache: the change log replays to the exported CSR; view tracks changes") {
  host_resource r;
  auto c = small_config();
  c.layers = 2;
  paged_kv_cache<float, host_resource> kv(r, c);
  const auto a = kv.add_sequence();
  kv.append(a, 32);
  const auto v1 = kv.view(1);
  CHECK(v1.table.seq_len(a) == 32);
  kv.append(a, 3);
  CHECK(kv.view(1).table.seq_len(a) == 35);  // view() re-exports after a change
  auto changes = kv.take_changes();
  CHECK(changes.lengths.back() == oomb::length_delta{a, 35});
  std::vector<std::vector<std::int32_t>> copy(2);
  for (const auto& d : changes.pages) {
    auto& t = copy[static_cast<std::size_t>(d.layer)];
    if (t.size() <= static_cast<std::size_t>(d.page)) t.resize(static_cast<std::size_t>(d.page) + 1, -1);
    t[static_cast<std::size_t>(d.page)] = d.id;
  }
  for (std::int32_t l = 0; l < 2; ++l) CHECK(copy[static_cast<std::size_t>(l)] == kv.csr(l).indices);
  CHECK(kv.changes().empty());
  kv.pop_chunk(a);
  CHECK(kv.changes().pages.size() == 2);  // page 2 of both layers removed
  CHECK(kv.changes().pages[0].removed());
}

TEST_CASE("paged_kv_cache: record_changes = false keeps no log") {
  host_resource r;
  auto c = small_config();
  c.record_changes = false;
  paged_kv_cache<float, host_resource> kv(r, c);
  kv.append(kv.add_sequence(), 32);
  CHECK(kv.changes().empty());
  CHECK(kv.csr(0).indices.size() == 2);
}

TEST_CASE("paged_kv_cache: moves keep pages and tables") {
  host_resource r;
  paged_kv_cache<float, host_resource> kv(r, small_config());
  const auto s = kv.add_sequence();
  kv.append(s, 20);
  *kv.k(s, 1, 19, 1) = 3.5f;
  paged_kv_cache<float, host_resource> moved(std::move(kv));
  CHECK(moved.seq_len(s) == 20);
  CHECK(*moved.k(s, 1, 19, 1) == 3.5f);
  CHECK(moved.view(1).k_at(s, 19, 1)[0] == 3.5f);
  moved.pop_chunk(s);
  CHECK(moved.stats().in_use == 0);
}

TEST_CASE("paged_kv_cache: page_ids windows and for_each_span cover a position range page by page") {
  host_resource r;
  auto c = small_config(kv_layout::token_major);
  c.chunk_size = 64;
  paged_kv_cache<float, host_resource> kv(r, c);
  const auto s = kv.add_sequence();
  kv.append(s, 64);
  kv.append(s, 40);  // 104 tokens: 7 pages

  const auto window = kv.page_ids(s, 1, 2, 5);
  REQUIRE(window.size() == 3);
  for (std::int32_t i = 0; i < 3; ++i) CHECK(window[static_cast<std::size_t>(i)] == kv.page_id(s, 1, 2 + i));
  CHECK(kv.page_ids(s, 1, 7, 7).empty());

  // Write positions [5, 100) through spans, read back through k().
  std::int64_t covered = 0, expect_pos = 5;
  kv.for_each_span(s, 1, 5, 100, [&](std::int64_t pos, std::int32_t id, std::int32_t token, std::int32_t count) {
    CHECK(pos == expect_pos);
    CHECK(token == pos % 16);
    CHECK(count >= 1);
    CHECK(token + count <= 16);
    CHECK(id == kv.page_id(s, 1, static_cast<std::int32_t>(pos / 16)));
    const auto page = kv.k_page(id);
    for (std::int32_t t = 0; t < count; ++t)
      for (std::int32_t h = 0; h < 2; ++h) page(h, token + t, 3) = static_cast<float>((pos + t) * 10 + h);
    covered += count;
    expect_pos += count;
  });
  CHECK(covered == 95);
  for (std::int64_t p = 5; p < 100; ++p)
    for (std::int32_t h = 0; h < 2; ++h) CHECK(kv.k(s, 1, p, h)[3] == static_cast<float>(p * 10 + h));

  int calls = 0;
  kv.for_each_span(s, 0, 30, 30, [&](std::int64_t, std::int32_t, std::int32_t, std::int32_t) { ++calls; });
  CHECK(calls == 0);
  expect_error<oomb::invalid_argument>(
      [&] { kv.for_each_span(s, 0, 10, 105, [](std::int64_t, std::int32_t, std::int32_t, std::int32_t) {}); },
      {"[10, 105)", "[0, 104]"});
  expect_error<oomb::invalid_argument>(
      [&] { kv.for_each_span(s, 5, 0, 1, [](std::int64_t, std::int32_t, std::int32_t, std::int32_t) {}); },
      {"layer 5"});
  expect_error<oomb::invalid_argument>([&] { kv.page_ids(s, 0, 3, 8); }, {"[3, 8)", "[0, 7]"});
  expect_error<oomb::invalid_argument>([&] { kv.page_ids(s, 0, -1, 2); }, {"[-1, 2)"});

  // pool(): the same pool, const or not; ids the table holds are owned.
  auto& pool = kv.pool();
  CHECK(&pool == &static_cast<const paged_kv_cache<float, host_resource>&>(kv).pool());
  CHECK(pool.owns(kv.page_id(s, 0, 0)));
}
