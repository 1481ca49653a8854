// safetensors: round trips in every dtype, sharded checkpoints, and every malformed-file case
// giving an oomb::format_error that names the file and the tensor.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "io_test_util.hpp"
#include "trainer/io/checkpoint_reader.hpp"
#include "trainer/io/safetensors.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using io_test::safetensors_bytes;
using io_test::temp_dir;

namespace {

std::uint16_t bf16_bits(float f) { return oomb::bf16(f).bits; }

// The correctly rounded bf16 of d (nearest, ties to even), found by comparing d with the two
// neighbouring bf16 values in double (exact: they differ from d by less than d).
std::uint16_t reference_bf16(double d) {
  const float f = static_cast<float>(d);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto lo_bits = static_cast<std::uint16_t>(u >> 16);  // truncation of f: at or below |d| or one above
  for (int delta = -1; delta <= 1; ++delta) {
    const auto a = static_cast<std::uint16_t>(lo_bits + delta), b = static_cast<std::uint16_t>(lo_bits + delta + 1);
    const double va = static_cast<float>(oomb::bf16::from_bits(a)), vb = static_cast<float>(oomb::bf16::from_bits(b));
    const double lo = std::min(va, vb), hi = std::max(va, vb);
    if (d >= lo && d <= hi) {
      const double da = std::fabs(d - va), db = std::fabs(d - vb);
      if (da < db) return a;
      if (db < da) return b;
      return (a & 1) == 0 ? a : b;
    }
  }
  FAIL("no bracketing bf16 pair for ", d);
  return 0;
}

}  // namespace

TEST_CASE("safetensors round trip: F32, F64, BF16 from float and double, file and memory") {
  temp_dir dir;
  const auto a = io_test::random_vector<float>(6 * 7, 1);
  const auto b = io_test::random_vector<double>(5, 2);
  const auto c = io_test::random_vector<float>(3 * 4 * 2, 3);
  auto d = io_test::random_vector<double>(33, 4, -1e3, 1e3);
  d[0] = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);  // rounding through float would round twice
  const double scalar = 0.7853981633974483;
  safetensors_writer w;
  w.add("model.layers.0.mlp.up_proj.weight", {6, 7}, a.data(), dtype::f32);
  w.add("b", {5}, b.data(), dtype::f64);
  w.add("c.bf16", {3, 4, 2}, c.data(), dtype::bf16);
  w.add("d.bf16", {33}, d.data(), dtype::bf16);
  w.add("d.f32", {33}, d.data(), dtype::f32);
  w.add("scalar", {}, &scalar, dtype::f64);
  w.add("empty", {0, 3}, static_cast<const float*>(nullptr), dtype::f32);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "hello");
  const std::string path = dir / "m.safetensors";
  w.write(path);
  const std::string bytes = w.to_bytes();
  CHECK(io_test::read_bytes(path) == bytes);
  CHECK(dir.entries() == std::vector<std::string>{"m.safetensors"});  // no temporary left

  for (const auto& f : {safetensors_file::open(path), safetensors_file::from_memory("mem", bytes.data(), bytes.size())}) {
    REQUIRE(f.tensors().size() == 7);
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.metadata().at("note") == "hello");
    CHECK(f.info("c.bf16").type == dtype::bf16);
    CHECK(f.info("c.bf16").shape == std::vector<std::int64_t>{3, 4, 2});
    CHECK(f.read<float>("model.layers.0.mlp.up_proj.weight", {6, 7}) == a);
    const auto a64 = f.read<double>("model.layers.0.mlp.up_proj.weight", {6, 7});
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a64[i] == static_cast<double>(a[i]));
    CHECK(f.read<double>("b", {5}) == b);
    const auto b32 = f.read<float>("b", {5});
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(b32[i] == static_cast<float>(b[i]));
    const auto cr = f.read<float>("c.bf16", {3, 4, 2});
    for (std::size_t i = 0; i < c.size(); ++i) {
      CHECK(bf16_bits(cr[i]) == bf16_bits(c[i]));
      CHECK(cr[i] == static_cast<float>(oomb::bf16(c[i])));
    }
    const auto dr = f.read<double>("d.bf16", {33});
    for (std::size_t i = 0; i < d.size(); ++i) CHECK(bf16_bits(static_cast<float>(dr[i])) == reference_bf16(d[i]));
    CHECK(bf16_bits(static_cast<float>(dr[0])) == 0x3f81);  // 1 + 2^-7: rounded once, upwards
    const auto d32 = f.read<float>("d.f32", {33});
    for (std::size_t i = 0; i < d.size(); ++i) CHECK(d32[i] == static_cast<float>(d[i]));
    CHECK(f.read<double>("scalar", {}) == std::vector<double>{scalar});
    CHECK(f.read<float>("empty", {0, 3}).empty());
  }
}

TEST_CASE("double -> bf16 is rounded once, to nearest even, across magnitudes and specials") {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> ex(-130, 127);
  std::uniform_real_distribution<double> m(1.0, 2.0);
  std::vector<double> v;
  for (int i = 0; i < 5000; ++i) v.push_back((i % 2 ? -1 : 1) * std::ldexp(m(rng), ex(rng)));
  // Exact ties and ties perturbed below float's precision.
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x40490000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
    v.push_back(static_cast<double>(f) * (1 + 1e-12));
    v.push_back(static_cast<double>(f) * (1 - 1e-12));
  }
  for (double x : v) CHECK(oomb_trainer::detail::double_to_bf16(x).bits == reference_bf16(x));
  CHECK(oomb_trainer::detail::double_to_bf16(1e300).bits == 0x7f80);
  CHECK(oomb_trainer::detail::double_to_bf16(-1e300).bits == 0xff80);
  CHECK(std::isnan(static_cast<float>(oomb_trainer::detail::double_to_bf16(std::nan("")))));
}

TEST_CASE("safetensors reads F16 tensors (normal, subnormal, infinite) as float and double") {
  const std::uint16_t h[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x8000};
  std::string data(reinterpret_cast<const char*>(h), sizeof h);
  const auto bytes = safetensors_bytes(R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]}})", data);
  const auto f = safetensors_file::from_memory("half.safetensors", bytes.data(), bytes.size());
  const auto v = f.read<double>("h", {2, 3});
  CHECK(v[0] == 1.0);
  CHECK(v[1] == -2.0);
  CHECK(v[2] == 65504.0);
  CHECK(v[3] == std::ldexp(1.0, -24));
  CHECK(std::isinf(v[4]));
  CHECK((v[5] == 0.0 && std::signbit(v[5])));
}

TEST_CASE("safetensors writer refuses bad tensors") {
  const float x[2] = {1, 2};
  safetensors_writer w;
  w.add("x", {2}, x, dtype::f32);
  expect_error<oomb::invalid_argument>([&] { w.add("x", {2}, x, dtype::f32); }, {"'x'", "twice"});
  expect_error<oomb::invalid_argument>([&] { w.add("__metadata__", {2}, x, dtype::f32); }, {"reserved"});
  expect_error<oomb::invalid_argument>([&] { w.add("y", {-1}, x, dtype::f32); }, {"negative"});
  expect_error<oomb::invalid_argument>([&] { w.add("y", {2}, x, dtype::i32); }, {"'y'", "I32"});
  expect_error<oomb::invalid_argument>([&] { w.add("y", {2}, static_cast<const float*>(nullptr), dtype::f32); },
                                       {"'y'", "null"});
  temp_dir dir;
  expect_error<oomb::error>([&] { w.write(dir / "no/such/folder/x.safetensors"); }, {"no/such/folder"});
  CHECK(dir.entries().empty());
}

namespace {

// Writes `bytes` to a file named like the case and checks opening it fails with all of `parts`
// plus the file's path in the message.
void expect_bad_file(const std::string& bytes, std::initializer_list<std::string> parts) {
  temp_dir dir;
  const std::string path = dir / "bad.safetensors";
  io_test::write_bytes(path, bytes);
  const std::string msg = expect_error([&] { (void)safetensors_file::open(path); }, parts);
  CHECK_MESSAGE(msg.find(path) != std::string::npos, "path not named: ", msg);
  // The same bytes from memory give the same verdict, named by the buffer's name.
  const std::string mem = expect_error([&] { (void)safetensors_file::from_memory("buf", bytes.data(), bytes.size()); }, parts);
  CHECK(mem.find("buf") != std::string::npos);
}

const std::string good_data(24, '\x01');  // 6 floats

}  // namespace

TEST_CASE("safetensors bad files: each a format_error naming the file and the tensor") {
  SUBCASE("truncated below the 8-byte length") { expect_bad_file("\x10\x00\x00", {"truncated"}); }
  SUBCASE("header length past the end") {
    auto bytes = safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", good_data);
    bytes[0] = '\x7f';
    bytes[1] = '\x7f';
    expect_bad_file(bytes, {"header length", "past the end"});
  }
  SUBCASE("header length absurd") {
    std::string bytes(8, '\xff');
    expect_bad_file(bytes, {"header length 18446744073709551615"});
  }
  SUBCASE("malformed JSON") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]})", good_data),
                    {"malformed JSON"});
  }
  SUBCASE("header not an object") { expect_bad_file(safetensors_bytes("[1, 2]", ""), {"JSON object"}); }
  SUBCASE("nesting too deep") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":[[[[["F32"]]]]]}})", ""), {"deeper"});
  }
  SUBCASE("unknown dtype") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F33","shape":[6],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "unknown dtype \"F33\""});
  }
  SUBCASE("dtype missing or not a string") {
    expect_bad_file(safetensors_bytes(R"({"w":{"shape":[6],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "'dtype' is missing"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":4,"shape":[6],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "'dtype' must be a string"});
  }
  SUBCASE("shape bad") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-6],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "dimension -6"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "dimension 2.5"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":6,"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "'shape' must be an array"});
    expect_bad_file(safetensors_bytes(
                        R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "too many elements"});
  }
  SUBCASE("shape and offsets disagree with the dtype size") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "span 24 bytes", "needs 20"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F64","shape":[6],"data_offsets":[0,24]}})", good_data),
                    {"tensor 'w'", "F64", "needs 48"});
  }
  SUBCASE("offsets out of range (or the file truncated)") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", good_data),
                    {"tensor 'w'", "run past the data buffer (24 bytes)"});
    const auto full = safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", good_data);
    expect_bad_file(full.substr(0, full.size() - 1), {"tensor 'w'", "truncated"});
  }
  SUBCASE("offsets malformed") {
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[24,0]}})", good_data),
                    {"tensor 'w'", "end before they begin"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0]}})", good_data),
                    {"tensor 'w'", "[begin, end]"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[-1,23]}})", good_data),
                    {"tensor 'w'", "non-negative"});
    expect_bad_file(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[6]}})", good_data),
                    {"tensor 'w'", "'data_offsets' is missing"});
  }
  SUBCASE("overlapping tensors") {
    expect_bad_file(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}})",
                                      good_data),
                    {"tensor 'b'", "overlap tensor 'a'"});
  }
  SUBCASE("metadata not strings") {
    expect_bad_file(safetensors_bytes(R"({"__metadata__":{"step":3}})", ""), {"'__metadata__' entry 'step'"});
    expect_bad_file(safetensors_bytes(R"({"__metadata__":[]})", ""), {"'__metadata__' must be an object"});
  }
  SUBCASE("entry not an object") {
    expect_bad_file(safetensors_bytes(R"({"w":[1,2]})", ""), {"tensor 'w'", "must be an object"});
  }
}

TEST_CASE("safetensors reading: missing tensor, wrong shape, non-floating dtype name file and tensor") {
  temp_dir dir;
  const auto v = io_test::random_vector<float>(6, 5);
  const std::int64_t ints[2] = {1, 2};
  std::string data(reinterpret_cast<const char*>(v.data()), 24);
  data.append(reinterpret_cast<const char*>(ints), 16);
  const std::string path = dir / "w.safetensors";
  io_test::write_bytes(path, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                               R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]}})",
                                               data));
  const auto f = safetensors_file::open(path);
  CHECK(f.read<float>("w", {2, 3}) == v);
  expect_error([&] { (void)f.read<float>("model.norm.weight", {2, 3}); }, {path, "tensor 'model.norm.weight' is missing"});
  expect_error([&] { (void)f.read<float>("w", {3, 2}); }, {path, "tensor 'w'", "shape [2, 3], expected [3, 2]"});
  expect_error([&] { (void)f.read<double>("ids", {2}); }, {path, "tensor 'ids'", "I64"});
  std::int64_t raw[2] = {};
  f.read_raw("ids", raw);
  CHECK(raw[1] == 2);
}

TEST_CASE("sharded checkpoints: index + shards read transparently; bad indexes named") {
  temp_dir dir;
  const auto w0 = io_test::random_vector<float>(12, 21);
  const auto w1 = io_test::random_vector<double>(8, 22);
  const auto w2 = io_test::random_vector<float>(5, 23);
  safetensors_writer s1, s2;
  s1.add("model.embed_tokens.weight", {3, 4}, w0.data(), dtype::f32);
  s1.add("model.norm.weight", {5}, w2.data(), dtype::bf16);
  s2.add("lm_head.weight", {2, 4}, w1.data(), dtype::f64);
  s1.write(dir / "model-00001-of-00002.safetensors");
  s2.write(dir / "model-00002-of-00002.safetensors");
  const std::string index = dir / "model.safetensors.index.json";
  io_test::write_bytes(index, R"({"metadata":{"total_size":100},"weight_map":{
      "model.embed_tokens.weight":"model-00001-of-00002.safetensors",
      "model.norm.weight":"model-00001-of-00002.safetensors",
      "lm_head.weight":"model-00002-of-00002.safetensors"}})");

  for (const std::string& p : {dir.path(), index}) {
    checkpoint_reader r(p);
    CHECK(r.shard_count() == 2);
    CHECK(r.names() == std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"});
    CHECK(r.read<float>("model.embed_tokens.weight", {3, 4}) == w0);
    CHECK(r.read<double>("lm_head.weight", {2, 4}) == w1);
    const auto n = r.read<float>("model.norm.weight", {5});
    for (std::size_t i = 0; i < 5; ++i) CHECK(n[i] == static_cast<float>(oomb::bf16(w2[i])));
    CHECK(r.file_of("lm_head.weight") == dir / "model-00002-of-00002.safetensors");
    expect_error([&] { (void)r.read<float>("model.layers.0.mlp.up_proj.weight", {1}); },
                 {index, "tensor 'model.layers.0.mlp.up_proj.weight' is missing"});
    expect_error([&] { (void)r.read<float>("lm_head.weight", {4, 2}); },
                 {"model-00002-of-00002.safetensors", "tensor 'lm_head.weight'", "expected [4, 2]"});
  }

  // A single-file folder and a plain file are read the same way.
  temp_dir single;
  s2.write(single / "model.safetensors");
  CHECK(checkpoint_reader(single.path()).names() == std::vector<std::string>{"lm_head.weight"});
  CHECK(checkpoint_reader(single / "model.safetensors").shard_count() == 1);

  temp_dir empty;
  expect_error([&] { checkpoint_reader r(empty.path()); }, {empty.path(), "neither"});

  auto bad_index = [&](const std::string& text, std::initializer_list<std::string> parts) {
    io_test::write_bytes(index, text);
    const std::string msg = expect_error([&] { checkpoint_reader r(dir.path()); }, parts);
    CHECK(msg.find("model") != std::string::npos);
  };
  bad_index(R"({"metadata":{}})", {index, "'weight_map' is missing"});
  bad_index(R"({"weight_map":[]})", {index, "'weight_map' must be an object"});
  bad_index(R"({"weight_map":{"x":"model-00001-of-00002.safetensors"}})",
            {index, "tensor 'x'", "does not contain it"});
  bad_index(R"({"weight_map":{"x":"../etc/passwd"}})", {index, "tensor 'x'", "not a plain file name"});
  bad_index(R"({"weight_map":{"x":3}})", {index, "tensor 'x'", "must be a file name"});
  io_test::write_bytes(index, R"({"weight_map":{"x":"model-00003-of-00002.safetensors"}})");
  expect_error<oomb::error>([&] { checkpoint_reader r(dir.path()); }, {"model-00003-of-00002.safetensors", "cannot open"});
  bad_index(R"({"weight_map":)", {index, "malformed JSON"});
}

TEST_CASE("atomic_file: an uncommitted write leaves the previous file and no temporary") {
  temp_dir dir;
  const std::string path = dir / "f.bin";
  write_file_atomically(path, "first", 5);
  {
    atomic_file f(path);
    f.write("second, half written", 20);
    CHECK(dir.entries().size() == 2);  // the temporary exists while writing
    // no commit: as if the writer failed here
  }
  CHECK(io_test::read_bytes(path) == "first");
  CHECK(dir.entries() == std::vector<std::string>{"f.bin"});
  write_file_atomically(path, "third", 5);
  CHECK(io_test::read_bytes(path) == "third");
  CHECK(dir.entries() == std::vector<std::string>{"f.bin"});
}
