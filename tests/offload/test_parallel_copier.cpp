// parallel_copier: every byte of many lists (shares cut inside copies, across copies, below the
// split size), several callers at once, construction refused for bad thread counts.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/offload/parallel_copier.hpp"

namespace {

// A source of `bytes` random bytes cut into copies of random sizes (some empty) into a destination
// of the same size, in a shuffled order; copies the list and checks every byte (and that nothing
// past the end was touched).
void check_list(oomb::parallel_copier& c, std::size_t bytes, std::size_t max_piece, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> src(bytes), dst(bytes + 64, 0);
  for (auto& b : src) b = static_cast<unsigned char>(rng() | 1);
  std::vector<oomb::copy_op> ops;
  for (std::size_t at = 0; at < bytes;) {
    const std::size_t n = std::min<std::size_t>(bytes - at, rng() % (max_piece + 1));
    ops.push_back({dst.data() + at, src.data() + at, n});
    at += n;
  }
  std::shuffle(ops.begin(), ops.end(), rng);
  c.copy(ops.data(), ops.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < bytes; ++i) wrong += dst[i] != src[i];
  for (std::size_t i = bytes; i < dst.size(); ++i) wrong += dst[i] != 0;
  CHECK_MESSAGE(wrong == 0, wrong, " bytes wrong of ", bytes, " (", ops.size(), " copies, ", c.threads(), " threads)");
}

}  // namespace

TEST_CASE("parallel_copier: every byte, shares cut inside and across copies") {
  std::uint32_t seed = 1;
  for (int threads : {1, 2, 3, 7}) {
    oomb::parallel_copier c(threads);
    CHECK(c.threads() == threads);
    check_list(c, 0, 10, seed++);                                       // nothing
    check_list(c, 1000, 100, seed++);                                   // below the split: the caller alone
    check_list(c, oomb::parallel_copier::min_split_bytes + 1, 1 << 20, seed++);  // just above it
    check_list(c, 5 << 20, 3 << 20, seed++);                            // few long copies: cut inside them
    check_list(c, 3 << 20, 5000, seed++);                               // many short ones: cut across them
  }
}

TEST_CASE("parallel_copier: callers on several threads share the workers, each waits for its own") {
  oomb::parallel_copier c(3);
  std::vector<std::thread> callers;
  for (std::uint32_t t = 0; t < 4; ++t)
    callers.emplace_back([&c, t] {
      for (std::uint32_t round = 0; round < 6; ++round) check_list(c, (2 << 20) + round * 4099, 300000, 100 * t + round);
    });
  for (auto& t : callers) t.join();
}

TEST_CASE("parallel_copier: thread counts outside [1, 256] are refused") {
  CHECK_THROWS_AS(oomb::parallel_copier(0), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb::parallel_copier(257), oomb::invalid_argument);
}

TEST_CASE("parallel_copier: the shared copier is one per process, a thread per hardware thread, and copies") {
  const int n = oomb::parallel_copier::default_threads();
  CHECK(n >= 1);
  CHECK(n <= 256);
  if (std::thread::hardware_concurrency() != 0) CHECK(n == int(std::min(std::thread::hardware_concurrency(), 256u)));
  oomb::parallel_copier& a = oomb::parallel_copier::shared();
  CHECK(&a == &oomb::parallel_copier::shared());
  CHECK(a.threads() == n);
  check_list(a, 3 << 20, 70000, 4242);
}
