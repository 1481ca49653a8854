// Token files: round trip, windows, and every bad header / out-of-range id named; version 2's
// document starts and loss mask, each field of a bad file named with its position.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "io_test_util.hpp"
#include "trainer/io/tokens.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using io_test::temp_dir;

namespace {

std::vector<std::uint32_t> random_tokens(std::size_t n, std::uint32_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> u(0, vocab - 1);
  std::vector<std::uint32_t> v(n);
  for (auto& t : v) t = u(rng);
  return v;
}

void put32(std::string& b, std::size_t at, std::uint32_t v) { std::memcpy(&b[at], &v, 4); }
void put64(std::string& b, std::size_t at, std::uint64_t v) { std::memcpy(&b[at], &v, 8); }

}  // namespace

TEST_CASE("token file round trip: header fields, ids, file and memory") {
  temp_dir dir;
  const auto toks = random_tokens(1000, 777, 1);
  const std::string path = dir / "t.tokens";
  write_token_file(path, toks.data(), toks.size(), 777);
  CHECK(dir.entries() == std::vector<std::string>{"t.tokens"});
  const std::string bytes = io_test::read_bytes(path);
  REQUIRE(bytes.size() == 32 + 4 * 1000);
  CHECK(bytes.substr(0, 8) == "OOMBTOKS");
  CHECK(bytes == token_file_bytes(toks.data(), toks.size(), 777));
  std::uint32_t u;
  std::memcpy(&u, &bytes[8], 4);
  CHECK(u == 1);
  std::memcpy(&u, &bytes[12], 4);
  CHECK(u == 32);
  std::uint64_t count;
  std::memcpy(&count, &bytes[16], 8);
  CHECK(count == 1000);
  std::memcpy(&u, &bytes[24], 4);
  CHECK(u == 777);
  std::memcpy(&u, &bytes[28], 4);
  CHECK(u == 0);
  std::memcpy(&u, &bytes[32 + 4 * 17], 4);
  CHECK(u == toks[17]);

  for (const auto& r : {token_reader::open(path, 777), token_reader::from_memory("m", bytes.data(), bytes.size())}) {
    CHECK(r.size() == 1000);
    CHECK(r.vocab_size() == 777);
    const auto all = r.read(0, 1000);
    for (std::size_t i = 0; i < toks.size(); ++i) REQUIRE(all[i] == static_cast<std::int32_t>(toks[i]));
    CHECK(r.read(995, 5) == std::vector<std::int32_t>(all.begin() + 995, all.end()));
    expect_error<oomb::invalid_argument>([&] { (void)r.read(996, 5); }, {"[996, 1001)", "holds 1000"});
  }

  // int32 input and an unknown vocabulary.
  const std::vector<std::int32_t> small = {5, 0, 2147483647};
  const auto b2 = token_file_bytes(small.data(), small.size(), 0);
  CHECK(token_reader::from_memory("m", b2.data(), b2.size()).read(0, 3) == small);
  CHECK(token_reader::from_memory("m", b2.data(), b2.size()).vocab_size() == 0);
}

TEST_CASE("token windows: consecutive, with the label token, wrapping, resumable") {
  const auto toks = random_tokens(1050, 50000, 2);
  const auto bytes = token_file_bytes(toks.data(), toks.size(), 50000);
  const auto r = token_reader::from_memory("w", bytes.data(), bytes.size());
  token_windows w(r, 100, true);
  CHECK(w.window() == 101);
  for (std::uint64_t k = 0; k < 10; ++k) {
    CHECK(w.position() == 100 * k);
    const auto v = w.next();
    REQUIRE(v.size() == 101);
    for (std::size_t i = 0; i < 101; ++i) REQUIRE(v[i] == static_cast<std::int32_t>(toks[100 * k + i]));
  }
  // 1000 + 101 > 1050: the next window starts over.
  CHECK(w.position() == 1000);
  token_windows resumed(r, 100, true, w.position());
  const auto a = w.next(), b = resumed.next();
  CHECK(a == b);
  CHECK(a[0] == static_cast<std::int32_t>(toks[0]));
  CHECK(w.position() == 100);

  token_windows plain(r, 1050, false);
  CHECK(plain.next().size() == 1050);
  CHECK(plain.next()[3] == static_cast<std::int32_t>(toks[3]));
  expect_error<oomb::invalid_argument>([&] { token_windows t(r, 1050, true); }, {"1050 tokens", "window of 1051"});
  expect_error<oomb::invalid_argument>([&] { token_windows t(r, 0, true); }, {"seq_len"});
  expect_error<oomb::invalid_argument>([&] { token_windows t(r, 10, true, 1051); }, {"position 1051"});
}

TEST_CASE("token files with a bad header are format_errors naming the file") {
  const std::vector<std::uint32_t> toks = {1, 2, 3, 4};
  const std::string good = token_file_bytes(toks.data(), toks.size(), 10);
  temp_dir dir;
  auto bad = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    const std::string path = dir / "bad.tokens";
    io_test::write_bytes(path, bytes);
    const auto msg = expect_error([&] { (void)token_reader::open(path); }, parts);
    CHECK_MESSAGE(msg.find(path) != std::string::npos, msg);
  };
  std::string b;
  bad(good.substr(0, 31), {"truncated", "31 bytes"});
  bad("", {"truncated", "0 bytes"});
  b = good; b[3] = 'X'; bad(b, {"bad magic", "make-tokens --input"});
  b = good; put32(b, 8, 3); bad(b, {"unsupported version 3", "versions 1 and 2"});
  b = good; put32(b, 8, 2); bad(b, {"header size 32, expected 64 (version 2)"});
  b = good; put32(b, 12, 64); bad(b, {"header size 64"});
  b = good; put64(b, 16, 5); bad(b, {"says 5 tokens", "16 bytes"});
  b = good; put64(b, 16, 3); bad(b, {"says 3 tokens"});
  b = good; put64(b, 16, ~std::uint64_t{0}); bad(b, {"says 18446744073709551615 tokens"});
  b = good; put64(b, 16, (std::uint64_t{1} << 62) + 4); bad(b, {"tokens but the file holds 16 bytes"});  // 4 * count wraps
  bad(good + "xy", {"says 4 tokens", "18 bytes", "partial"});
  b = good; put32(b, 28, 7); bad(b, {"reserved", "7"});
}

TEST_CASE("token ids out of range name their position") {
  std::vector<std::uint32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  std::string bytes = token_file_bytes(toks.data(), toks.size(), 10);
  put32(bytes, 32 + 4 * 6, 10);  // id 10 at position 6, vocab 10
  expect_error([&] { (void)token_reader::from_memory("ids.tokens", bytes.data(), bytes.size()); },
               {"ids.tokens", "position 6", "id 10", "file's vocabulary size 10"});
  // Unchecked at open, the read that reaches it throws.
  const auto lazy = token_reader::from_memory("ids.tokens", bytes.data(), bytes.size(), 0, false);
  CHECK(lazy.read(0, 6).size() == 6);
  expect_error([&] { (void)lazy.read(4, 4); }, {"position 6", "id 10"});

  // The model's vocabulary is checked too.
  const std::string ok = token_file_bytes(toks.data(), toks.size(), 0);
  CHECK(token_reader::from_memory("m", ok.data(), ok.size(), 9).size() == 8);
  expect_error([&] { (void)token_reader::from_memory("m.tokens", ok.data(), ok.size(), 8); },
               {"m.tokens", "position 7", "id 8", "model's vocabulary size 8"});
  std::string huge = ok;
  put32(huge, 32, 0x80000000u);
  expect_error([&] { (void)token_reader::from_memory("h.tokens", huge.data(), huge.size()); },
               {"position 0", "id 2147483648", "int32"});
}

TEST_CASE("token file writer refuses ids outside the vocabulary, naming the position, and writes nothing") {
  temp_dir dir;
  const std::vector<std::int32_t> toks = {0, 4, -1, 2};
  expect_error<oomb::invalid_argument>([&] { write_token_file(dir / "t", toks.data(), toks.size(), 5); },
                                       {"position 2", "id -1"});
  const std::vector<std::uint32_t> big = {0, 4, 5};
  expect_error<oomb::invalid_argument>([&] { (void)token_file_bytes(big.data(), big.size(), 5); },
                                       {"position 2", "id 5", "[0, 5)"});
  CHECK(dir.entries().empty());
}

TEST_CASE("convert_raw_tokens (make-tokens): raw little-endian uint32 ids to a token file") {
  temp_dir dir;
  const auto toks = random_tokens(300000, 151936, 3);  // more than one conversion chunk
  io_test::write_bytes(dir / "raw.u32", std::string(reinterpret_cast<const char*>(toks.data()), 4 * toks.size()));
  CHECK(convert_raw_tokens(dir / "raw.u32", dir / "t.tokens", 151936) == toks.size());
  CHECK(io_test::read_bytes(dir / "t.tokens") == token_file_bytes(toks.data(), toks.size(), 151936));
  const auto r = token_reader::open(dir / "t.tokens", 151936);
  CHECK(r.read(299990, 10).back() == static_cast<std::int32_t>(toks.back()));

  expect_error<oomb::invalid_argument>([&] { (void)convert_raw_tokens(dir / "raw.u32", dir / "small.tokens", 1000); },
                                       {"position "});
  io_test::write_bytes(dir / "odd.u32", "abcdefg");
  expect_error([&] { (void)convert_raw_tokens(dir / "odd.u32", dir / "o.tokens", 0); }, {"odd.u32", "7 bytes"});
  expect_error<oomb::error>([&] { (void)convert_raw_tokens(dir / "none.u32", dir / "o.tokens", 0); }, {"none.u32"});
  CHECK(dir.entries() == std::vector<std::string>{"odd.u32", "raw.u32", "t.tokens"});  // nothing half written
}

namespace {

/// Version 2 bytes of `toks` in documents starting at `starts`, with `mask` (empty: none).
std::string v2_bytes(const std::vector<std::uint32_t>& toks, std::uint32_t vocab, const std::vector<std::uint64_t>& starts,
                     const std::vector<std::uint8_t>& mask) {
  return token_file_bytes(toks.data(), toks.size(), vocab, starts, mask.empty() ? nullptr : mask.data());
}

std::uint64_t get64(const std::string& b, std::size_t at) {
  std::uint64_t v;
  std::memcpy(&v, &b[at], 8);
  return v;
}
std::uint32_t get32(const std::string& b, std::size_t at) {
  std::uint32_t v;
  std::memcpy(&v, &b[at], 4);
  return v;
}

}  // namespace

TEST_CASE("token files version 2: the header, tokens, padding, document starts and loss mask, byte for byte") {
  temp_dir dir;
  for (const std::size_t n : {std::size_t{7}, std::size_t{8}}) {  // odd: 4 padding bytes; even: none
    CAPTURE(n);
    const auto toks = random_tokens(n, 100, 5);
    const std::vector<std::uint64_t> starts = {0, 3, 5};
    std::vector<std::uint8_t> mask(n, 1);
    mask[0] = mask[3] = 0;
    const std::string path = dir / "v2.tokens";
    write_token_file(path, toks.data(), toks.size(), 100, starts, mask.data());
    const std::string b = io_test::read_bytes(path);
    CHECK(b == v2_bytes(toks, 100, starts, mask));
    const std::size_t pad = n % 2 ? 4 : 0;
    REQUIRE(b.size() == 64 + 4 * n + pad + 8 * 3 + n);
    CHECK(b.substr(0, 8) == "OOMBTOKS");
    CHECK(get32(b, 8) == 2);
    CHECK(get32(b, 12) == 64);
    CHECK(get64(b, 16) == n);
    CHECK(get32(b, 24) == 100);
    CHECK(get32(b, 28) == 1);  // flags: a loss mask
    CHECK(get64(b, 32) == 3);
    CHECK(b.substr(40, 24) == std::string(24, '\0'));
    CHECK(get32(b, 64 + 4 * 2) == toks[2]);
    CHECK(b.substr(64 + 4 * n, pad) == std::string(pad, '\0'));
    const std::size_t at = 64 + 4 * n + pad;
    CHECK(get64(b, at) == 0);
    CHECK(get64(b, at + 8) == 3);
    CHECK(get64(b, at + 16) == 5);
    CHECK(b.substr(at + 24) == std::string(reinterpret_cast<const char*>(mask.data()), n));

    for (const auto& r : {token_reader::open(path, 100), token_reader::from_memory("m", b.data(), b.size())}) {
      CHECK(r.version() == 2);
      CHECK(r.has_documents());
      CHECK(r.has_mask());
      CHECK(r.size() == n);
      CHECK(r.vocab_size() == 100);
      CHECK(r.document_starts() == starts);
      CHECK(r.document_count() == 3);
      CHECK(r.document_size(0) == 3);
      CHECK(r.document_size(2) == n - 5);
      CHECK(r.mask_ones() == n - 2);
      CHECK(r.read(0, n) == std::vector<std::int32_t>(toks.begin(), toks.end()));
      CHECK(r.read_mask(0, n) == mask);
      CHECK(r.read_mask(2, 3) == std::vector<std::uint8_t>{1, 0, 1});
      expect_error<oomb::invalid_argument>([&] { (void)r.read_mask(n - 1, 2); }, {"holds"});
      expect_error<oomb::invalid_argument>([&] { (void)r.document_size(3); }, {"document 3", "holds 3"});
    }
  }
  // No mask: flags 0, nothing after the starts, read_mask all 1; one document; zero tokens.
  const std::vector<std::uint32_t> toks = {1, 2, 3, 4};
  const std::string nomask = v2_bytes(toks, 0, {0}, {});
  CHECK(nomask.size() == 64 + 16 + 8);
  CHECK(get32(nomask, 28) == 0);
  const auto r = token_reader::from_memory("m", nomask.data(), nomask.size());
  CHECK_FALSE(r.has_mask());
  CHECK(r.read_mask(0, 4) == std::vector<std::uint8_t>(4, 1));
  CHECK(r.mask_ones() == 4);
  const std::string empty = v2_bytes({}, 0, {}, {});
  CHECK(empty.size() == 64);
  CHECK(token_reader::from_memory("e", empty.data(), empty.size()).document_count() == 0);
  // Version 1 has neither.
  const std::string v1 = token_file_bytes(toks.data(), toks.size(), 0);
  const auto r1 = token_reader::from_memory("v1", v1.data(), v1.size());
  CHECK(r1.version() == 1);
  CHECK_FALSE(r1.has_documents());
  CHECK(r1.document_starts().empty());
  CHECK(r1.read_mask(1, 2) == std::vector<std::uint8_t>{1, 1});
}

TEST_CASE("token files version 2: every malformed field is a format_error naming it and its position") {
  const std::vector<std::uint32_t> toks = {1, 2, 3, 4, 5, 6, 7};  // 7 tokens: 4 padding bytes
  const std::vector<std::uint64_t> starts = {0, 2, 6};
  const std::vector<std::uint8_t> mask = {0, 1, 0, 1, 1, 1, 1};
  const std::string good = v2_bytes(toks, 10, starts, mask);
  const std::size_t pad_at = 64 + 28, starts_at = pad_at + 4, mask_at = starts_at + 24;
  REQUIRE(good.size() == mask_at + 7);
  auto bad = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    return expect_error([&] { (void)token_reader::from_memory("v2.tokens", bytes.data(), bytes.size()); }, parts);
  };
  std::string b;
  bad(good.substr(0, 40), {"v2.tokens", "truncated", "40 bytes", "version 2's 64-byte header"});
  b = good; put32(b, 12, 32); bad(b, {"header size 32, expected 64 (version 2)"});
  b = good; put32(b, 28, 3); bad(b, {"header flags 3", "unknown bits"});
  b = good; b[41] = 1; bad(b, {"reserved header byte 41 is 1"});
  b = good; b[63] = 9; bad(b, {"reserved header byte 63 is 9"});
  b = good; put64(b, 32, 0); bad(b, {"7 tokens in 0 documents"});
  b = good; put64(b, 32, 8); bad(b, {"8 documents of 7 tokens"});
  b = good; put64(b, 32, 2); bad(b, {"says 7 tokens, 2 documents and a loss mask", "should be", "it holds"});
  b = good; put64(b, 32, ~std::uint64_t{0} >> 1); put64(b, 16, ~std::uint64_t{0}); bad(b, {"over 2^64"});
  b = good; put32(b, 28, 0); bad(b, {"and no loss mask", "should be 120 bytes", "it holds 127"});
  bad(good.substr(0, good.size() - 1), {"should be 127 bytes", "it holds 126"});
  bad(good + "x", {"it holds 128"});
  b = good; b[pad_at + 2] = 1; bad(b, {"padding byte 2 after the tokens", "offset 94"});
  b = good; put64(b, starts_at, 1); bad(b, {"document starts", "document 0 starts at token 1, expected 0"});
  b = good; put64(b, starts_at + 8, 0); bad(b, {"document 1 starts at token 0, not after document 0's start 0"});
  b = good; put64(b, starts_at + 16, 2); bad(b, {"document 2 starts at token 2, not after document 1's start 2"});
  b = good; put64(b, starts_at + 16, 7); bad(b, {"document 2 starts at token 7, past the last token", "holds 7"});
  b = good; put64(b, starts_at + 16, ~std::uint64_t{0}); bad(b, {"document 2 starts at token 18446744073709551615"});
  b = good; b[mask_at + 4] = 2; bad(b, {"loss mask at token position 4 is 2, expected 0 or 1"});
  b = good; put32(b, 64 + 4 * 5, 10); bad(b, {"token at position 5 has id 10", "file's vocabulary size 10"});
  // Checked lazily, the read that reaches a bad mask byte throws; the starts are checked at open anyway.
  b = good; b[mask_at + 4] = static_cast<char>(0xff);
  const auto lazy = token_reader::from_memory("v2.tokens", b.data(), b.size(), 0, false);
  CHECK(lazy.read_mask(0, 4).size() == 4);
  CHECK_FALSE(lazy.mask_ones().has_value());
  expect_error([&] { (void)lazy.read_mask(3, 3); }, {"loss mask at token position 4 is 255"});
  b = good; put64(b, starts_at + 8, 9);
  expect_error([&] { (void)token_reader::from_memory("v2.tokens", b.data(), b.size(), 0, false); }, {"document 1 starts at token 9"});
}

TEST_CASE("token file writer version 2 refuses bad document starts and mask bytes, naming them, and writes nothing") {
  temp_dir dir;
  const std::vector<std::int32_t> toks = {0, 1, 2, 3};
  const std::vector<std::uint8_t> mask = {1, 1, 3, 1};
  auto refused = [&](const std::vector<std::uint64_t>& starts, const std::uint8_t* m, std::initializer_list<std::string> parts) {
    expect_error<oomb::invalid_argument>([&] { write_token_file(dir / "t", toks.data(), toks.size(), 5, starts, m); }, parts);
  };
  refused({1, 2}, nullptr, {"document 0 starts at token 1, expected 0"});
  refused({0, 2, 2}, nullptr, {"document 2 starts at token 2, not after the previous document's start 2"});
  refused({0, 4}, nullptr, {"document 1 starts at token 4, past the last of 4 tokens"});
  refused({}, nullptr, {"0 document starts for 4 tokens"});
  refused({0}, mask.data(), {"loss mask at token position 2 is 3"});
  const std::vector<std::int32_t> neg = {0, -1};
  expect_error<oomb::invalid_argument>([&] { write_token_file(dir / "t", neg.data(), neg.size(), 5, {0}, nullptr); },
                                       {"position 1", "id -1"});
  CHECK(dir.entries().empty());
}

TEST_CASE("convert_raw_documents (make-tokens --documents --mask): raw arrays to a version 2 token file") {
  temp_dir dir;
  const auto toks = random_tokens(300001, 1000, 4);  // odd, more than one chunk
  std::vector<std::uint64_t> starts = {0};
  for (std::uint64_t s = 17; s < toks.size(); s += 1 + s % 5000) starts.push_back(s);
  std::vector<std::uint8_t> mask(toks.size());
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<std::uint8_t>(i % 3 != 0);
  auto raw = [](const auto& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
  };
  io_test::write_bytes(dir / "ids.u32", raw(toks));
  io_test::write_bytes(dir / "starts.u64", raw(starts));
  io_test::write_bytes(dir / "mask.u8", raw(mask));
  CHECK(convert_raw_documents(dir / "ids.u32", dir / "starts.u64", dir / "mask.u8", dir / "t.tokens", 1000) == toks.size());
  CHECK(io_test::read_bytes(dir / "t.tokens") == v2_bytes(toks, 1000, starts, mask));
  CHECK(convert_raw_documents(dir / "ids.u32", dir / "starts.u64", "", dir / "n.tokens", 0) == toks.size());
  CHECK(io_test::read_bytes(dir / "n.tokens") == v2_bytes(toks, 0, starts, {}));

  io_test::write_bytes(dir / "short.u8", raw(std::vector<std::uint8_t>(5, 1)));
  expect_error([&] { (void)convert_raw_documents(dir / "ids.u32", dir / "starts.u64", dir / "short.u8", dir / "o", 0); },
               {"short.u8", "5 mask bytes for 300001 tokens"});
  io_test::write_bytes(dir / "odd.u64", "abcdefghi");
  expect_error([&] { (void)convert_raw_documents(dir / "ids.u32", dir / "odd.u64", "", dir / "o", 0); },
               {"odd.u64", "9 bytes"});
  std::vector<std::uint64_t> unsorted = starts;
  std::swap(unsorted[5], unsorted[6]);
  io_test::write_bytes(dir / "unsorted.u64", raw(unsorted));
  expect_error<oomb::invalid_argument>(
      [&] { (void)convert_raw_documents(dir / "ids.u32", dir / "unsorted.u64", "", dir / "o", 0); }, {"not after"});
  mask[123456] = 7;
  io_test::write_bytes(dir / "bad.u8", raw(mask));
  expect_error<oomb::invalid_argument>(
      [&] { (void)convert_raw_documents(dir / "ids.u32", dir / "starts.u64", dir / "bad.u8", dir / "o", 0); },
      {"loss mask at token position 123456 is 7"});
  CHECK(dir.entries() == std::vector<std::string>{"bad.u8", "ids.u32", "mask.u8", "n.tokens", "odd.u64", "short.u8",
                                                  "starts.u64", "t.tokens", "unsorted.u64"});  // nothing half written
}
