// Token files: round trip, windows, and every bad header / out-of-range id named.
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
  b = good; put32(b, 8, 2); bad(b, {"version 2"});
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
