// Seeded property test: random acquire / acquire(n) / release sequences, including bad releases
// and resource exhaustion, against a simple model. Plus the growable layout's address contract.
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

namespace {

using counted = oomb::statistics_adaptor<oomb::host_resource>;
using limited = oomb::limiting_adaptor<counted>;

// Stamp a block with its id and a generation so overlap or a lost block is detected on release.
void stamp(std::byte* p, std::size_t bytes, std::uint32_t tag) {
  for (std::size_t i = 0; i + sizeof tag <= bytes; i += sizeof tag) std::memcpy(p + i, &tag, sizeof tag);
}
bool stamped(const std::byte* p, std::size_t bytes, std::uint32_t tag) {
  for (std::size_t i = 0; i + sizeof tag <= bytes; i += sizeof tag) {
    std::uint32_t x;
    std::memcpy(&x, p + i, sizeof x);
    if (x != tag) return false;
  }
  return true;
}

// Plain loops and one REQUIRE per property: thousands of steps stay fast (and under sanitizers).
template <class Pool>
void check_model(const Pool& pool, const std::map<std::int32_t, std::uint32_t>& model) {
  REQUIRE(pool.in_use() == static_cast<std::int32_t>(model.size()));
  // free + used = capacity
  REQUIRE(pool.available() + pool.in_use() == pool.capacity());
  REQUIRE(pool.reserved() <= pool.capacity());
  REQUIRE(pool.stats().high_water >= pool.in_use());
  bool owners_agree = true;
  for (std::int32_t id = 0; id < pool.reserved(); ++id)
    owners_agree = owners_agree && pool.owns(id) == (model.count(id) == 1);
  REQUIRE(owners_agree);
  // Blocks in use occupy disjoint address ranges and keep their contents.
  std::vector<const std::byte*> starts;
  bool intact = true;
  for (const auto& [id, tag] : model) {
    starts.push_back(pool.address(id));
    intact = intact && stamped(pool.address(id), pool.block_bytes(), tag);
  }
  REQUIRE(intact);
  std::sort(starts.begin(), starts.end());
  bool disjoint = true;
  for (std::size_t i = 1; i < starts.size(); ++i)
    disjoint = disjoint && starts[i] >= starts[i - 1] + pool.block_bytes();
  REQUIRE(disjoint);
}

void run_sequence(std::uint64_t seed, bool contiguous) {
  CAPTURE(seed);
  CAPTURE(contiguous);
  std::mt19937_64 rng(seed);
  const std::size_t block = std::size_t(16) << (rng() % 4);  // 16..128 bytes
  const std::int32_t capacity = 1 + static_cast<std::int32_t>(rng() % 200);
  const std::int32_t per_slab = 1 + static_cast<std::int32_t>(rng() % 16);
  // The resource may run out before the pool's capacity: growth then fails mid-way.
  const std::size_t limit = block * (1 + rng() % (2 * std::size_t(capacity)));
  oomb::host_resource host;
  counted stats(host);
  {
    limited lim(stats, contiguous ? block * std::size_t(capacity) : limit);
    auto pool = contiguous ? oomb::block_pool<limited>::contiguous(lim, block, capacity, 64)
                           : oomb::block_pool<limited>::growing(lim, block, per_slab, capacity, 64);
    std::map<std::int32_t, std::uint32_t> model;  // id -> tag written into it
    std::uint32_t next_tag = 1;
    std::int32_t expected_fresh = 0;  // a fresh id is the lowest never handed out
    std::vector<std::int32_t> released;  // LIFO model of released ids
    std::vector<std::int32_t> out;
    for (int step = 0; step < 1500; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4) {  // acquire one
        const bool can = !released.empty() || pool.reserved() > expected_fresh ||
                         pool.reserved() < capacity;
        try {
          const auto id = pool.acquire();
          REQUIRE(can);
          REQUIRE(model.count(id) == 0);
          if (!released.empty()) {
            REQUIRE(id == released.back());
            released.pop_back();
          } else {
            REQUIRE(id == expected_fresh);
            ++expected_fresh;
          }
          stamp(pool.address(id), block, next_tag);
          model[id] = next_tag++;
        } catch (const oomb::out_of_memory&) {
          REQUIRE(released.empty());  // refused only with nothing free
        }
      } else if (op < 6) {  // acquire n, all or nothing
        const auto n = static_cast<std::int32_t>(rng() % 12);
        out.assign(std::size_t(n) + 1, -5);
        const auto before = model.size();
        try {
          pool.acquire(n, out.data());
          for (std::int32_t i = 0; i < n; ++i) {
            const auto id = out[std::size_t(i)];
            REQUIRE(model.count(id) == 0);
            if (!released.empty()) {
              REQUIRE(id == released.back());
              released.pop_back();
            } else {
              REQUIRE(id == expected_fresh);
              ++expected_fresh;
            }
            stamp(pool.address(id), block, next_tag);
            model[id] = next_tag++;
          }
          REQUIRE(out[std::size_t(n)] == -5);  // wrote exactly n ids
        } catch (const oomb::out_of_memory&) {
          REQUIRE(model.size() == before);
          REQUIRE(std::all_of(out.begin(), out.end(), [](std::int32_t x) { return x == -5; }));
        }
      } else if (op < 9) {  // release one in use
        if (model.empty()) continue;
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        REQUIRE(stamped(pool.address(it->first), block, it->second));
        pool.release(it->first);
        released.push_back(it->first);
        model.erase(it);
      } else {  // a bad release: twice, never acquired, or out of range
        const std::int32_t bad = static_cast<std::int32_t>(rng() % (std::uint64_t(capacity) + 10)) - 5;
        if (model.count(bad)) continue;
        CHECK_THROWS_AS(pool.release(bad), oomb::invalid_argument);
      }
      check_model(pool, model);
      REQUIRE(pool.stats().reserved_bytes == stats.statistics().bytes_in_use);
    }
  }
  // Nothing leaked: the pool gave every slab back.
  CHECK(stats.statistics().bytes_in_use == 0);
  CHECK(stats.statistics().allocations_in_use == 0);
}

}  // namespace

TEST_CASE("block_pool: random operation sequences agree with a simple model") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    run_sequence(seed, false);
    if (seed % 4 == 0) run_sequence(seed, true);
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
