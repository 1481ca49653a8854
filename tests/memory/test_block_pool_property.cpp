// Seeded property test: random acquire / acquire(n) / release sequences, including bad releases
// and resource exhaustion, against a simple model (block_pool_conformance.hpp, shared with
// tests/cuda), over host memory. Plus the growable layout's address contract.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "block_pool_conformance.hpp"
#include "host_resource_traits.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/host_resource.hpp"

TEST_CASE("block_pool: random operation sequences agree with a simple model") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    oomb_test::block_pool_sequence<oomb::host_resource>(seed, false);
    if (seed % 4 == 0) oomb_test::block_pool_sequence<oomb::host_resource>(seed, true);
  }
}

TEST_CASE("block_pool: the growable layout keeps base + id * block_bytes while it commits") {
  oomb::host_growable_resource grow(10 * 512);  // commit limit: 10 blocks
  {
    auto pool = oomb::block_pool<oomb::host_growable_resource>::growable(grow, 512, 4, 16);
    CHECK(pool.is_contiguous());
    CHECK(pool.is_growable());
    CHECK(pool.reserved() == 0);
    CHECK(grow.committed_bytes() == 0);
    std::int32_t ids[6];
    CHECK(pool.acquire() == 0);
    CHECK(grow.committed_bytes() == 4 * 512);
    pool.acquire(6, ids);  // grows by two steps mid-call; ids stay ascending
    CHECK(std::vector<std::int32_t>(ids, ids + 6) == std::vector<std::int32_t>{1, 2, 3, 4, 5, 6});
    CHECK(pool.reserved() == 8);
    CHECK(pool.stats().reserved_bytes == grow.committed_bytes());
    for (std::int32_t id = 0; id < 7; ++id) {
      REQUIRE(pool.address(id) == pool.base() + std::int64_t(id) * 512);
      std::memset(pool.address(id), id, 512);
    }
    // The next step would commit past the resource's limit: out_of_memory, pool unchanged.
    std::int32_t more[4] = {-1, -1, -1, -1};
    CHECK_THROWS_AS(pool.acquire(4, more), oomb::out_of_memory);
    CHECK(more[0] == -1);
    CHECK(pool.in_use() == 7);
    CHECK(pool.acquire() == 7);
  }
  CHECK(grow.committed_bytes() == 0);
}
