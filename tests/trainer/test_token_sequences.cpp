// The training sequences of a token file (data/token_sequences.hpp): consecutive windows carrying
// the file's loss mask, windows without a counted target skipped; --packing documents: whole
// documents (long ones cut into windows) in a seeded shuffled order, packed while the next fits,
// padded, the targets at document starts and in the padding left out, resumable from position().
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "trainer/data/token_sequences.hpp"

using namespace oomb_trainer;
using io_test::expect_error;

namespace {

/// A version 2 file whose token at position p is id p (so a sequence's tokens say where they came
/// from), documents of the given sizes, and (when `masked`) a mask that is 0 at every position
/// divisible by 5.
struct doc_file {
  std::string bytes;
  std::vector<std::uint64_t> starts;
  std::vector<std::uint8_t> mask;
  doc_file(const std::vector<std::uint64_t>& sizes, bool masked) {
    const std::uint64_t n = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
    std::vector<std::uint32_t> toks(static_cast<std::size_t>(n));
    std::iota(toks.begin(), toks.end(), 0u);
    std::uint64_t s = 0;
    for (const auto k : sizes) {
      starts.push_back(s);
      s += k;
    }
    if (masked)
      for (std::uint64_t p = 0; p < n; ++p) mask.push_back(p % 5 != 0);
    bytes = token_file_bytes(toks.data(), toks.size(), 0, starts, masked ? mask.data() : nullptr);
  }
  token_reader reader() const { return token_reader::from_memory("docs.tokens", bytes.data(), bytes.size()); }
};

}  // namespace

TEST_CASE("seeded_permutation: a permutation, fixed for a seed on every platform, another for another seed") {
  const auto p = seeded_permutation(10, 1234);
  // The order itself (std::mt19937_64's outputs are fixed by the standard, the draw is ours): a
  // change here changes every packed run's data order.
  CHECK(p == std::vector<std::uint64_t>{0, 3, 4, 7, 9, 8, 5, 6, 1, 2});
  std::vector<std::uint64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint64_t> iota(10);
  std::iota(iota.begin(), iota.end(), 0u);
  CHECK(sorted == iota);
  CHECK(seeded_permutation(10, 1234) == p);
  CHECK(seeded_permutation(10, 1235) != p);
  CHECK(seeded_permutation(0, 1).empty());
  CHECK(seeded_permutation(1, 1) == std::vector<std::uint64_t>{0});
}

TEST_CASE("token sequences, consecutive windows: the file's mask, windows without a counted target skipped, resumable") {
  // Documents of 10; mask 0 at positions divisible by 5, and 0 everywhere in [20, 30).
  doc_file f({10, 10, 10, 10, 10}, true);
  for (std::size_t p = 20; p < 30; ++p) f.mask[p] = 0;
  std::vector<std::uint32_t> toks(50);
  std::iota(toks.begin(), toks.end(), 0u);
  const std::string bytes = token_file_bytes(toks.data(), toks.size(), 0, f.starts, f.mask.data());
  const auto r = token_reader::from_memory("w.tokens", bytes.data(), bytes.size());
  token_sequences w(r, 10, packing_kind::none, 7);
  std::vector<std::int32_t> firsts;
  for (int k = 0; k < 6; ++k) {
    const sequence s = w.next();
    REQUIRE(s.size() == 10);
    REQUIRE(s.mask.size() == 10);
    CHECK(s.doc_starts.empty());  // one stream: documents run into each other
    firsts.push_back(s.tokens[0]);
    for (std::size_t i = 0; i < 10; ++i) {
      CHECK(s.tokens[i] == s.tokens[0] + std::int32_t(i));
      CHECK(s.mask[i] == f.mask[std::size_t(s.tokens[i])]);
    }
    CHECK(w.last_padding() == 0);
    CHECK(w.last_skipped() == (s.tokens[0] == 30 ? 1 : 0));  // [20, 30) counts nothing
  }
  CHECK(firsts == std::vector<std::int32_t>{0, 10, 30, 40, 0, 10});
  CHECK(w.position() == 20);
  token_sequences resumed(r, 10, packing_kind::none, 7, w.position());
  CHECK(resumed.next().tokens == w.next().tokens);  // both skip [20, 30)
  CHECK(w.describe().find("50 tokens in 5 documents; loss mask: 64.0% of the tokens count; consecutive windows of 10") !=
        std::string::npos);

  // A version 1 file: no mask, every target counts.
  const std::string v1 = token_file_bytes(toks.data(), toks.size(), 0);
  token_sequences plain(token_reader::from_memory("v1", v1.data(), v1.size()), 16, packing_kind::none, 7, 40);
  const sequence s = plain.next();  // 40 + 16 > 50: starts over
  CHECK(s.tokens[0] == 0);
  CHECK(s.mask.empty());
  CHECK(plain.position() == 16);

  // Nothing counts anywhere: refused, not an endless loop.
  const std::vector<std::uint8_t> none(50, 0);
  const std::string silent = token_file_bytes(toks.data(), toks.size(), 0, f.starts, none.data());
  token_sequences z(token_reader::from_memory("silent.tokens", silent.data(), silent.size()), 10, packing_kind::none, 7);
  expect_error<oomb::invalid_argument>([&] { (void)z.next(); }, {"silent.tokens", "no training sequence has a target that counts"});
  expect_error<oomb::invalid_argument>([&] { token_sequences t(r, 51, packing_kind::none, 7); }, {"fewer than one sequence"});
  expect_error<oomb::invalid_argument>([&] { token_sequences t(r, 10, packing_kind::none, 7, 51); }, {"data position 51"});
}

TEST_CASE("token sequences, --packing documents: whole documents, seeded order, padding, long ones cut, resumable") {
  // Units at --seq-len 8: 3, 5, 8 + 4 (a document of 12 cut), 2, 7, 1, 4, 8 (exactly one window).
  const std::vector<std::uint64_t> sizes = {3, 5, 12, 2, 7, 1, 4, 8};
  for (const bool masked : {false, true}) {
    CAPTURE(masked);
    const doc_file f(sizes, masked);
    const std::int64_t L = 8;
    token_sequences p(f.reader(), L, packing_kind::documents, 99);
    CHECK(p.units() == 9);
    CHECK(p.long_documents() == 1);
    // The units, as (start, size), in the order the seed gives each epoch.
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> units = {{0, 3},  {3, 5},  {8, 8},  {16, 4}, {20, 2},
                                                                        {22, 7}, {29, 1}, {30, 4}, {34, 8}};
    std::vector<std::pair<std::uint64_t, std::uint64_t>> expected_order;
    for (std::uint64_t e = 0; e < 3; ++e)
      for (const auto i : seeded_permutation(9, 99 * 0x9E3779B97F4A7C15ull + e)) expected_order.push_back(units[i]);

    std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
    std::vector<sequence> seqs;
    while (taken.size() < 18) {
      const sequence s = p.next();
      s.validate();
      REQUIRE(s.size() == L);
      REQUIRE(s.mask.size() == std::size_t(L));
      REQUIRE_FALSE(s.doc_starts.empty());
      for (std::size_t d = 0; d < s.doc_starts.size(); ++d) {
        const std::int32_t a = s.doc_starts[d], b = d + 1 < s.doc_starts.size() ? s.doc_starts[d + 1] : std::int32_t(L);
        if (d + 1 == s.doc_starts.size() && p.last_padding() > 0) {  // the padding: a segment of its own
          CHECK(b - a == p.last_padding());
          for (std::int32_t j = a; j < b; ++j) {
            CHECK(s.tokens[std::size_t(j)] == 0);
            CHECK(s.mask[std::size_t(j)] == 0);
          }
          // Greedy: the next unit in the order did not fit in the padding.
          CHECK(expected_order[taken.size()].second > std::uint64_t(b - a));
          continue;
        }
        const auto start = std::uint64_t(s.tokens[std::size_t(a)]);
        taken.push_back({start, std::uint64_t(b - a)});
        CHECK(taken.back() == expected_order[taken.size() - 1]);
        CHECK(s.mask[std::size_t(a)] == 0);  // a document's first target is never counted
        for (std::int32_t j = a + 1; j < b; ++j) {
          CHECK(std::uint64_t(s.tokens[std::size_t(j)]) == start + std::uint64_t(j - a));
          CHECK(s.mask[std::size_t(j)] == (masked ? f.mask[start + std::uint64_t(j - a)] : 1));
        }
      }
      CHECK(p.position() == taken.size());
      seqs.push_back(s);
    }
    // Every unit once per epoch.
    std::multiset<std::pair<std::uint64_t, std::uint64_t>> e0(taken.begin(), taken.begin() + 9),
        e1(taken.begin() + 9, taken.begin() + 18);
    CHECK(e0 == std::multiset<std::pair<std::uint64_t, std::uint64_t>>(units.begin(), units.end()));
    CHECK(e0 == e1);
    // Resumed at any sequence's position, the same sequences follow.
    token_sequences again(f.reader(), L, packing_kind::documents, 99);
    std::vector<std::uint64_t> positions;
    for (const auto& s : seqs) {
      positions.push_back(again.position());
      const sequence t = again.next();
      CHECK(t.tokens == s.tokens);
      CHECK(t.mask == s.mask);
      CHECK(t.doc_starts == s.doc_starts);
    }
    for (std::size_t k = 0; k < seqs.size(); k += 3) {
      token_sequences from(f.reader(), L, packing_kind::documents, 99, positions[k]);
      CHECK(from.next().tokens == seqs[k].tokens);
    }
    // Another seed, another order.
    token_sequences other(f.reader(), L, packing_kind::documents, 100);
    std::vector<std::vector<std::int32_t>> a, b;
    for (int k = 0; k < 6; ++k) {
      a.push_back(seqs[std::size_t(k)].tokens);
      b.push_back(other.next().tokens);
    }
    CHECK(a != b);
    CHECK(p.describe().find("42 tokens in 8 documents") != std::string::npos);
    CHECK(p.describe().find("1 longer than 8 cut into windows: 9 units") != std::string::npos);
  }
}

TEST_CASE("token sequences, --packing documents: refused without document starts; a file that counts nothing refused") {
  std::vector<std::uint32_t> toks(40);
  std::iota(toks.begin(), toks.end(), 0u);
  const std::string v1 = token_file_bytes(toks.data(), toks.size(), 0);
  expect_error<oomb::invalid_argument>(
      [&] { token_sequences t(token_reader::from_memory("v1.tokens", v1.data(), v1.size()), 8, packing_kind::documents, 1); },
      {"--packing documents", "v1.tokens is a version 1 token file", "tools/prepare_data.py"});
  // Documents of one token each have no target once their first is left out.
  std::vector<std::uint64_t> starts(40);
  std::iota(starts.begin(), starts.end(), 0u);
  const std::string ones = token_file_bytes(toks.data(), toks.size(), 0, starts, nullptr);
  token_sequences t(token_reader::from_memory("ones.tokens", ones.data(), ones.size()), 8, packing_kind::documents, 1);
  expect_error<oomb::invalid_argument>([&] { (void)t.next(); }, {"ones.tokens", "no training sequence", "packed sequence"});
  expect_error<oomb::invalid_argument>([] { (void)parse_packing("--packing", "greedy"); }, {"unknown packing 'greedy'", "none, documents"});
  CHECK(parse_packing("--packing", "documents") == packing_kind::documents);
}

TEST_CASE("sequence::doc_starts is validated: 0 first, strictly increasing, inside the sequence") {
  sequence s;
  s.tokens = {1, 2, 3, 4};
  s.doc_starts = {0, 2};
  s.validate();
  for (const auto& bad : std::vector<std::pair<std::vector<std::int32_t>, std::string>>{
           {{1}, "the first is 1, expected 0"}, {{0, 2, 2}, "document 2 starts at 2, not after document 1's start 2"},
           {{0, 4}, "document 1 starts at 4, past its 4 tokens"}}) {
    s.doc_starts = bad.first;
    expect_error<oomb::invalid_argument>([&] { s.validate(); }, {bad.second});
  }
}
