// page_table: append/pop against a simple model, CSR export, change-log replay, bad input.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "oomb/paging/page_table.hpp"
#include "paging_test_util.hpp"

using oomb::page_table;
using paging_test::expect_error;

namespace {

/// The obvious model: per (seq, layer) a vector of ids, per seq a length.
struct model {
  std::int32_t layers, page_size;
  std::vector<std::int64_t> len;
  std::vector<std::vector<std::vector<std::int32_t>>> ids;  // [seq][layer]

  std::int32_t pages(std::int64_t tokens) const {
    return static_cast<std::int32_t>((tokens + page_size - 1) / page_size);
  }
  std::int32_t add() {
    len.push_back(0);
    ids.emplace_back(static_cast<std::size_t>(layers));
    return static_cast<std::int32_t>(len.size() - 1);
  }
};

/// A hand-rolled CSR from the model, the way a reader of the docs would build one.
oomb::page_table_csr model_csr(const model& m, std::int32_t layer) {
  oomb::page_table_csr c;
  c.page_size = m.page_size;
  c.indptr.push_back(0);
  for (std::size_t s = 0; s < m.len.size(); ++s) {
    for (auto id : m.ids[s][static_cast<std::size_t>(layer)]) c.indices.push_back(id);
    c.indptr.push_back(static_cast<std::int32_t>(c.indices.size()));
    const std::int64_t len = m.len[s];
    c.last_page_len.push_back(len == 0 ? 0 : static_cast<std::int32_t>((len - 1) % m.page_size + 1));
  }
  return c;
}

void check_same(const oomb::page_table_csr& a, const oomb::page_table_csr& b) {
  CHECK(a.page_size == b.page_size);
  CHECK(a.indptr == b.indptr);
  CHECK(a.indices == b.indices);
  CHECK(a.last_page_len == b.last_page_len);
}

/// A device-style replica: a dense [layer][seq][max_pages] table plus lengths, updated only from
/// the change log.
struct replica {
  std::int32_t layers, page_size, max_pages;
  std::vector<std::int64_t> len;
  std::vector<std::vector<std::int32_t>> table;  // [layer] -> [seq * max_pages + page]

  replica(std::int32_t l, std::int32_t p, std::int32_t mp)
      : layers(l), page_size(p), max_pages(mp), table(static_cast<std::size_t>(l)) {}

  void apply(const oomb::page_table_changes& c) {
    for (const auto& d : c.lengths) {
      if (static_cast<std::size_t>(d.seq) >= len.size()) {
        len.resize(static_cast<std::size_t>(d.seq) + 1, 0);
        for (auto& t : table) t.resize(len.size() * static_cast<std::size_t>(max_pages), -1);
      }
    }
    for (const auto& d : c.pages) {
      REQUIRE(d.page < max_pages);
      table[static_cast<std::size_t>(d.layer)][static_cast<std::size_t>(d.seq) * max_pages + d.page] = d.id;
    }
    for (const auto& d : c.lengths) len[static_cast<std::size_t>(d.seq)] = d.tokens;
  }

  oomb::page_table_csr csr(std::int32_t layer) const {
    oomb::page_table_csr c;
    c.page_size = page_size;
    c.indptr.push_back(0);
    const auto& t = table[static_cast<std::size_t>(layer)];
    for (std::size_t s = 0; s < len.size(); ++s) {
      const auto n = static_cast<std::int32_t>((len[s] + page_size - 1) / page_size);
      for (std::int32_t i = 0; i < max_pages; ++i) {
        const std::int32_t id = t[s * static_cast<std::size_t>(max_pages) + static_cast<std::size_t>(i)];
        if (i < n) {
          CHECK(id >= 0);
          c.indices.push_back(id);
        } else {
          CHECK(id == -1);  // every removal reached the replica
        }
      }
      c.indptr.push_back(static_cast<std::int32_t>(c.indices.size()));
      c.last_page_len.push_back(len[s] == 0 ? 0 : static_cast<std::int32_t>((len[s] - 1) % page_size + 1));
    }
    return c;
  }
};

/// Everything observable about a table, to show a failed call changed nothing.
struct snapshot {
  std::vector<oomb::page_table_csr> layers;
  std::vector<std::int64_t> len;
  std::size_t page_changes, length_changes;
  std::int64_t total;

  explicit snapshot(const page_table& t)
      : page_changes(t.changes().pages.size()), length_changes(t.changes().lengths.size()),
        total(t.total_pages()) {
    for (std::int32_t l = 0; l < t.num_layers(); ++l) layers.push_back(t.export_csr(l));
    for (std::int32_t s = 0; s < t.num_seqs(); ++s) len.push_back(t.seq_len(s));
  }
  void check_equal(const page_table& t) const {
    const snapshot now(t);
    REQUIRE(now.layers.size() == layers.size());
    for (std::size_t l = 0; l < layers.size(); ++l) check_same(now.layers[l], layers[l]);
    CHECK(now.len == len);
    CHECK(now.page_changes == page_changes);
    CHECK(now.length_changes == length_changes);
    CHECK(now.total == total);
  }
};

/// Ids drawn from a free list, so ids get reused like a pool's.
struct id_source {
  std::int32_t next = 0;
  std::vector<std::int32_t> free;
  std::int32_t take() {
    if (!free.empty()) {
      const auto id = free.back();
      free.pop_back();
      return id;
    }
    return next++;
  }
};

}  // namespace

TEST_CASE("page_table: construction and accessors") {
  page_table t(3, 16);
  CHECK(t.num_layers() == 3);
  CHECK(t.page_size() == 16);
  CHECK(t.num_seqs() == 0);
  CHECK(t.total_pages() == 0);
  CHECK(t.recording_changes());
  CHECK(t.add_sequence() == 0);
  CHECK(t.add_sequence() == 1);
  CHECK(t.num_seqs() == 2);
  CHECK(t.seq_len(1) == 0);
  CHECK(t.num_pages(1) == 0);
  CHECK(t.last_page_len(1) == 0);
  CHECK(t.pages(0, 2).empty());
  // add_sequence logs a zero length so a replica learns the sequence exists.
  REQUIRE(t.changes().lengths.size() == 2);
  CHECK(t.changes().lengths[1] == oomb::length_delta{1, 0});
}

TEST_CASE("page_table: pages_needed counts partial pages") {
  page_table t(2, 16);
  const auto s = t.add_sequence();
  CHECK(t.pages_needed(s, 0) == 0);
  CHECK(t.pages_needed(s, 1) == 1);
  CHECK(t.pages_needed(s, 16) == 1);
  CHECK(t.pages_needed(s, 17) == 2);
  const std::vector<std::int32_t> ids = {7, 9};  // layer 0: 7, layer 1: 9
  t.append(s, 5, ids);
  CHECK(t.pages_needed(s, 11) == 0);  // fits the partial page
  CHECK(t.pages_needed(s, 12) == 1);
  CHECK(t.pages_needed(s, 43) == 2);  // 48 tokens: 3 pages, 1 held
  CHECK(t.pages_needed(s, 44) == 3);
}

TEST_CASE("page_table: append is layer-major, pop returns the same ids in the same order") {
  page_table t(2, 16);
  const auto a = t.add_sequence();
  const auto b = t.add_sequence();
  // 40 tokens = 3 pages per layer: layer 0 gets 10 11 12, layer 1 gets 20 21 22.
  t.append(a, 40, {10, 11, 12, 20, 21, 22});
  t.append(b, 16, {30, 31});
  CHECK(t.seq_len(a) == 40);
  CHECK(t.num_pages(a) == 3);
  CHECK(t.last_page_len(a) == 8);
  CHECK(t.last_page_len(b) == 16);
  CHECK(t.page(a, 0, 2) == 12);
  CHECK(t.page(a, 1, 0) == 20);
  CHECK(t.page(b, 1, 0) == 31);
  CHECK(t.pages_per_layer() == 4);
  CHECK(t.total_pages() == 8);
  const auto span = t.pages(a, 1);
  CHECK(std::vector<std::int32_t>(span.begin(), span.end()) == std::vector<std::int32_t>{20, 21, 22});

  std::vector<std::pair<std::int32_t, std::int32_t>> seen;
  t.for_each_page(a, 0, 1, 3, [&](std::int32_t i, std::int32_t id) { seen.emplace_back(i, id); });
  CHECK(seen == std::vector<std::pair<std::int32_t, std::int32_t>>{{1, 11}, {2, 12}});

  // Popping 8 tokens empties the partial page only; 24 more free two pages.
  CHECK(t.pages_freed(a, 8) == 1);
  CHECK(t.pop(a, 8) == std::vector<std::int32_t>{12, 22});
  CHECK(t.seq_len(a) == 32);
  CHECK(t.last_page_len(a) == 16);
  CHECK(t.pop(a, 1).empty());  // 31 tokens still need two pages
  CHECK(t.last_page_len(a) == 15);

  std::vector<std::int32_t> visited;
  t.pop(a, 31, [&](std::int32_t layer, std::int32_t i, std::int32_t id) {
    visited.push_back(layer * 1000 + i * 100 + id);
  });
  CHECK(visited == std::vector<std::int32_t>{10, 111, 1020, 1121});
  CHECK(t.seq_len(a) == 0);
  CHECK(t.total_pages() == 2);
  CHECK(t.pop(a, 0).empty());  // popping nothing is allowed
}

TEST_CASE("page_table: change log lists every page set and removed, in order") {
  page_table t(2, 16);
  const auto s = t.add_sequence();
  t.clear_changes();
  t.append(s, 20, {1, 2, 3, 4});
  t.pop(s, 10);  // 10 left: page 1 of each layer goes
  const auto& c = t.changes();
  const std::vector<oomb::page_delta> want = {
      {s, 0, 0, 1}, {s, 0, 1, 2}, {s, 1, 0, 3}, {s, 1, 1, 4}, {s, 0, 1, -1}, {s, 1, 1, -1}};
  CHECK(c.pages == want);
  CHECK(c.pages.back().removed());
  CHECK(c.lengths == std::vector<oomb::length_delta>{{s, 20}, {s, 10}});

  const auto taken = t.take_changes();
  CHECK(taken.pages.size() == 6);
  CHECK(t.changes().empty());

  t.record_changes(false);
  t.append(s, 30, {5, 6, 7, 8});
  CHECK(t.changes().empty());
  t.record_changes(true);
  t.append(s, 9, {9, 10});  // 40 -> 49 tokens: a fourth page
  CHECK(t.changes().pages.size() == 2);
  t.clear_changes();
  CHECK(t.changes().empty());
}

TEST_CASE("page_table: CSR export matches a simple model over seeded random operations") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    paging_test::rng r(seed);
    const auto layers = static_cast<std::int32_t>(r.uniform(1, 4));
    const std::int32_t page = 16 << r.uniform(0, 2);
    page_table t(layers, page);
    model m{layers, page, {}, {}};
    id_source ids;
    oomb::page_table_csr reused;  // export into the same buffers every time
    for (int step = 0; step < 400; ++step) {
      const auto op = r.uniform(0, 9);
      if (op == 0 || t.num_seqs() == 0) {
        CHECK(t.add_sequence() == m.add());
        continue;
      }
      const auto s = static_cast<std::int32_t>(r.uniform(0, t.num_seqs() - 1));
      const auto us = static_cast<std::size_t>(s);
      if (op <= 5) {
        const auto tokens = r.uniform(0, 3 * page);
        const std::int32_t n = m.pages(m.len[us] + tokens) - m.pages(m.len[us]);
        REQUIRE(t.pages_needed(s, tokens) == n);
        std::vector<std::int32_t> fresh;
        for (std::int32_t l = 0; l < layers; ++l)
          for (std::int32_t i = 0; i < n; ++i) {
            fresh.push_back(ids.take());
            m.ids[us][static_cast<std::size_t>(l)].push_back(fresh.back());
          }
        t.append(s, tokens, fresh);
        m.len[us] += tokens;
      } else {
        const auto tokens = r.uniform(0, m.len[us]);
        const std::int32_t keep = m.pages(m.len[us] - tokens);
        std::vector<std::int32_t> want;
        for (auto& v : m.ids[us]) {
          want.insert(want.end(), v.begin() + keep, v.end());
          v.resize(static_cast<std::size_t>(keep));
        }
        const auto freed = t.pop(s, tokens);
        CHECK(freed == want);
        for (auto id : freed) ids.free.push_back(id);
        m.len[us] -= tokens;
      }
      REQUIRE(t.seq_len(s) == m.len[us]);
      const auto l = static_cast<std::int32_t>(r.uniform(0, layers - 1));
      t.export_csr(l, reused);
      check_same(reused, model_csr(m, l));
      const auto v = reused.view();
      CHECK(v.num_seqs == t.num_seqs());
      CHECK(v.seq_len(s) == m.len[us]);
      if (t.num_pages(s) > 0) CHECK(v.page(s, t.num_pages(s) - 1) == m.ids[us][static_cast<std::size_t>(l)].back());
    }
  }
}

TEST_CASE("page_table: replaying the change log onto a copy equals the fresh export") {
  for (std::uint64_t seed : {11u, 12u, 13u, 14u}) {
    CAPTURE(seed);
    paging_test::rng r(seed);
    const auto layers = static_cast<std::int32_t>(r.uniform(1, 5));
    const std::int32_t page = 16;
    const std::int32_t max_pages = 64;
    page_table t(layers, page);
    replica copy(layers, page, max_pages);
    id_source ids;
    std::int64_t applied = 0;
    for (int step = 0; step < 600; ++step) {
      const auto op = r.uniform(0, 12);
      if (op == 0 || t.num_seqs() == 0) {
        if (t.num_seqs() < 6) t.add_sequence();
      } else {
        const auto s = static_cast<std::int32_t>(r.uniform(0, t.num_seqs() - 1));
        if (op <= 6) {
          const auto room = std::int64_t(max_pages) * page - t.seq_len(s);
          const auto tokens = r.uniform(0, std::min<std::int64_t>(room, 2 * page + 5));
          std::vector<std::int32_t> fresh(static_cast<std::size_t>(t.pages_needed(s, tokens) * layers));
          for (auto& id : fresh) id = ids.take();
          t.append(s, tokens, fresh);
        } else {
          for (auto id : t.pop(s, r.uniform(0, t.seq_len(s)))) ids.free.push_back(id);
        }
      }
      if (r.uniform(0, 7) == 0) {  // a device update point: apply what changed, then compare
        const auto c = t.take_changes();
        applied += static_cast<std::int64_t>(c.pages.size());
        copy.apply(c);
        for (std::int32_t l = 0; l < layers; ++l) check_same(copy.csr(l), t.export_csr(l));
      }
    }
    copy.apply(t.take_changes());
    for (std::int32_t l = 0; l < layers; ++l) check_same(copy.csr(l), t.export_csr(l));
    CHECK(applied > 100);  // the log really carried the work
  }
}

TEST_CASE("page_table: bad input throws invalid_argument naming the values, table unchanged") {
  expect_error<oomb::invalid_argument>([] { page_table(0, 16); }, {"layers", "0"});
  expect_error<oomb::invalid_argument>([] { page_table(2, 100); }, {"page_size", "100"});
  expect_error<oomb::invalid_argument>([] { page_table(2, 8); }, {"page_size", "8"});
  expect_error<oomb::invalid_argument>([] { page_table(2, -16); }, {"-16"});

  page_table t(2, 16);
  const auto s = t.add_sequence();
  t.append(s, 20, {1, 2, 3, 4});
  const snapshot before(t);

  expect_error<oomb::invalid_argument>([&] { t.seq_len(1); }, {"sequence 1", "[0, 1)"});
  expect_error<oomb::invalid_argument>([&] { t.num_pages(-1); }, {"sequence -1"});
  expect_error<oomb::invalid_argument>([&] { t.pages_needed(5, 1); }, {"sequence 5"});
  expect_error<oomb::invalid_argument>([&] { t.append(3, 16, {1, 2}); }, {"sequence 3"});
  expect_error<oomb::invalid_argument>([&] { t.append(s, -4, nullptr, 0); }, {"-4"});
  // 20 held + 40 = 60 tokens = 4 pages: 2 new per layer, 4 ids; give 3.
  expect_error<oomb::invalid_argument>([&] { t.append(s, 40, {5, 6, 7}); },
                                       {"40 tokens", "2 new pages", "2 layers", "4 ids, got 3"});
  expect_error<oomb::invalid_argument>([&] { t.append(s, 40, {5, 6, -3, 8}); }, {"page id -3", "layer 1"});
  expect_error<oomb::invalid_argument>([&] { t.append(s, 40, nullptr, 4); }, {"null"});
  expect_error<oomb::invalid_argument>([&] { t.append(s, std::int64_t(1) << 40, nullptr, 0); },
                                       {"1099511627776"});
  expect_error<oomb::invalid_argument>([&] { t.pop(s, 21); }, {"pop 21", "holds 20"});
  expect_error<oomb::invalid_argument>([&] { t.pop(s, -1); }, {"pop -1"});
  expect_error<oomb::invalid_argument>([&] { t.pop(2, 1); }, {"sequence 2"});
  expect_error<oomb::invalid_argument>([&] { t.pages_freed(s, 99); }, {"99"});
  expect_error<oomb::invalid_argument>([&] { t.page(s, 0, 2); }, {"page 2", "[0, 2)"});
  expect_error<oomb::invalid_argument>([&] { t.page(s, 2, 0); }, {"layer 2"});
  expect_error<oomb::invalid_argument>([&] { t.pages(s, -1); }, {"layer -1"});
  expect_error<oomb::invalid_argument>([&] { t.export_csr(7); }, {"layer 7"});
  expect_error<oomb::invalid_argument>(
      [&] { t.for_each_page(s, 0, 1, 3, [](std::int32_t, std::int32_t) {}); }, {"[1, 3)", "[0, 2]"});

  // A visitor that throws leaves the table as it was.
  CHECK_THROWS_AS(t.pop(s, 20, [](std::int32_t, std::int32_t, std::int32_t) { throw std::runtime_error("x"); }),
                  std::runtime_error);
  before.check_equal(t);

  // ...and usable.
  t.append(s, 12, {});
  CHECK(t.seq_len(s) == 32);
  CHECK(t.pop(s, 32) == std::vector<std::int32_t>{1, 2, 3, 4});
}
