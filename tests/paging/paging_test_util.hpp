// Helpers shared by the paging tests.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "oomb/core/error.hpp"

namespace paging_test {

/// Runs `f`, which must throw exactly `E` (not another oomb error) with every `parts` string in its
/// message; returns the message.
template <class E, class F>
std::string expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      CHECK_MESSAGE(what.find(p) != std::string::npos, "message \"", what, "\" lacks \"", p, "\"");
    return what;
  } catch (const std::exception& e) {
    FAIL("threw the wrong exception type: ", e.what());
    return {};
  }
  FAIL("did not throw");
  return {};
}

/// A small deterministic generator (splitmix64), so every run draws the same inputs.
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi].
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  /// Uniform in [-1, 1), never exactly zero in practice.
  float real() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0); }

 private:
  std::uint64_t state_;
};

}  // namespace paging_test
