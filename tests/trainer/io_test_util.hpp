// Helpers for the trainer's I/O and optimizer tests: temporary folders, error-message checks,
// hand-made safetensors bytes, seeded random data.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "test_util.hpp"
#include "trainer/io/named_tensor.hpp"

namespace io_test {

/// A fresh folder under the system temporary folder, removed with everything in it at scope end.
class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "oomb-io-test-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  /// Names of the entries in the folder (sorted).
  std::vector<std::string> entries() const { return list(path_); }
  static std::vector<std::string> list(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Runs f, which must throw exactly an E whose message contains every one of `parts`; returns the
/// message. Fails the test otherwise.
template <class E = oomb::format_error, class F>
std::string expect_error(F&& f, std::initializer_list<std::string> parts) {
  std::string msg;
  bool thrown = false;
  try {
    f();
  } catch (const E& e) {
    thrown = true;
    msg = e.what();
  } catch (const std::exception& e) {
    const std::string what = std::string("wrong exception type: ") + e.what();
    FAIL_CHECK(what);
    return {};
  }
  CHECK_MESSAGE(thrown, "nothing was thrown; expected a message with: ", *parts.begin());
  for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, "'", p, "' not in: ", msg);
  return msg;
}

/// A safetensors file from a header text and a data buffer (for hand-made bad files).
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

/// Seeded uniform values in [lo, hi); the I/O tests default to [-2, 2).
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return trainer_test::random_vector<T>(n, seed, lo, hi);
}

// A stand-in model for the checkpoint tests: HF-named tensors of 80, 64, 8, 8 and 80 elements
// carved from one allocation, as the trainer does.
template <class T>
struct fake_model {
  std::vector<T> storage;
  std::vector<oomb_trainer::named_tensor<T>> params;

  explicit fake_model(std::uint64_t seed) {
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>> spec = {
        {"model.embed_tokens.weight", {10, 8}},
        {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
        {"model.layers.0.self_attn.q_proj.bias", {8}},
        {"model.norm.weight", {8}},
        {"lm_head.weight", {10, 8}}};
    std::size_t total = 0;
    for (const auto& s : spec) total += static_cast<std::size_t>(oomb_trainer::shape_numel(s.second));
    storage = random_vector<T>(total, seed);
    std::size_t off = 0;
    for (const auto& s : spec) {
      params.push_back({s.first, s.second, storage.data() + off});
      off += static_cast<std::size_t>(oomb_trainer::shape_numel(s.second));
    }
  }
};

}  // namespace io_test
