// block_pool: both layouts, ids, addresses, growth, limits, errors, stats, moves.
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

namespace {

using counted = oomb::statistics_adaptor<oomb::host_resource>;
using pool_t = oomb::block_pool<counted>;

enum class layout { contiguous, growing };

pool_t make(counted& r, layout l, std::size_t block_bytes, std::int32_t capacity, std::int32_t per_slab = 4) {
  return l == layout::contiguous ? pool_t::contiguous(r, block_bytes, capacity)
                                 : pool_t::growing(r, block_bytes, per_slab, capacity);
}

const char* name(layout l) { return l == layout::contiguous ? "contiguous" : "growing"; }

}  // namespace

TEST_CASE("block_pool: a fresh pool hands out ascending ids; released ids come back first") {
  for (auto l : {layout::contiguous, layout::growing}) {
    CAPTURE(name(l));
    oomb::host_resource host;
    counted r(host);
    auto pool = make(r, l, 96, 13, 4);
    for (std::int32_t want = 0; want < 13; ++want) REQUIRE(pool.acquire() == want);
    pool.release(5);
    pool.release(9);
    CHECK(pool.acquire() == 9);  // LIFO
    CHECK(pool.acquire() == 5);
    CHECK(pool.in_use() == 13);
  }
}

TEST_CASE("block_pool: contiguous addresses are base + id * block_bytes, aligned") {
  oomb::host_resource host;
  counted r(host);
  const std::size_t block = 3 * 1024;  // not a power of two: blocks aligned to 1024 (gcd with 4096)
  auto pool = pool_t::contiguous(r, block, 10, 4096);
  CHECK(pool.is_contiguous());
  CHECK(pool.capacity() == 10);
  CHECK(pool.reserved() == 10);  // all memory taken up front
  CHECK(r.statistics().allocations_in_use == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(pool.base()) % 4096 == 0);
  std::int32_t ids[10];
  pool.acquire(10, ids);
  for (std::int32_t id : ids) {
    REQUIRE(pool.address(id) == pool.base() + std::int64_t(id) * std::int64_t(block));
    REQUIRE(reinterpret_cast<std::uintptr_t>(pool.address(id)) % 1024 == 0);
    std::memset(pool.address(id), id + 1, block);  // the whole block is writable
  }
  for (std::int32_t id : ids) CHECK(static_cast<int>(*(pool.address(id) + block - 1)) == id + 1);
  CHECK_THROWS_WITH_AS((void)pool.address(10), doctest::Contains("block id 10 out of range [0, 10)"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS((void)pool.address(-1), oomb::invalid_argument);
}

TEST_CASE("block_pool: a growing pool takes slabs on demand") {
  oomb::host_resource host;
  counted r(host);
  auto pool = pool_t::growing(r, 64, 4, 10);
  CHECK(!pool.is_contiguous());
  CHECK(pool.blocks_per_slab() == 4);
  CHECK(pool.reserved() == 0);
  CHECK(r.statistics().allocations_in_use == 0);
  CHECK_THROWS_WITH_AS((void)pool.base(), doctest::Contains("only for a contiguous pool"),
                       oomb::invalid_argument);
  CHECK(pool.acquire() == 0);
  CHECK(pool.reserved() == 4);
  CHECK(r.statistics().allocations_in_use == 1);
  std::int32_t ids[4];
  pool.acquire(4, ids);
  CHECK(std::vector<std::int32_t>(ids, ids + 4) == std::vector<std::int32_t>{1, 2, 3, 4});
  CHECK(pool.reserved() == 8);
  CHECK(r.statistics().allocations_in_use == 2);
  // Blocks inside a slab are block_bytes apart; slabs may lie anywhere.
  CHECK(pool.address(3) == pool.address(0) + 3 * 64);
  CHECK(pool.address(5) == pool.address(4) + 64);
  std::int32_t more[5];
  pool.acquire(5, more);  // grows to capacity 10: the last slab holds only 2 blocks
  CHECK(pool.reserved() == 10);
  CHECK(pool.available() == 0);
  CHECK(r.statistics().allocations_in_use == 3);
  CHECK(pool.stats().reserved_bytes == r.statistics().bytes_in_use);
}

TEST_CASE("block_pool: the capacity limit raises out_of_memory naming asked and left") {
  for (auto l : {layout::contiguous, layout::growing}) {
    CAPTURE(name(l));
    oomb::host_resource host;
    counted r(host);
    auto pool = make(r, l, 64, 10, 3);
    std::int32_t ids[8];
    pool.acquire(8, ids);
    std::int32_t out[4] = {-7, -7, -7, -7};
    CHECK_THROWS_WITH_AS(pool.acquire(3, out),
                         doctest::Contains("asked for 3 blocks of 64 bytes, 2 left of capacity 10 (8 in use)"),
                         oomb::out_of_memory);
    CHECK(std::all_of(out, out + 4, [](std::int32_t x) { return x == -7; }));  // all or nothing
    CHECK(pool.in_use() == 8);
    pool.acquire(2, out);
    CHECK(pool.in_use() == 10);
    CHECK_THROWS_WITH_AS(pool.acquire(),
                         doctest::Contains("asked for 1 block of 64 bytes, 0 left of capacity 10 (10 in use)"),
                         oomb::out_of_memory);
    CHECK_THROWS_WITH_AS(pool.acquire(-1, out), doctest::Contains("negative count (-1)"), oomb::invalid_argument);
    pool.acquire(0, nullptr);  // asking for nothing is fine
    pool.release(4);
    CHECK(pool.acquire() == 4);  // usable after the errors
  }
}

TEST_CASE("block_pool: acquire(n) is all or nothing when the resource runs out mid-growth") {
  oomb::host_resource host;
  counted r(host);
  oomb::limiting_adaptor<counted> limit(r, 3 * 4 * 128);  // room for 3 slabs of 4 blocks of 128 B
  auto pool = oomb::block_pool<oomb::limiting_adaptor<counted>>::growing(limit, 128, 4);
  CHECK(pool.capacity() == oomb::block_pool<oomb::limiting_adaptor<counted>>::unlimited);
  std::int32_t first[6];
  pool.acquire(6, first);  // 2 slabs
  std::int32_t out[10];
  std::fill(out, out + 10, -1);
  CHECK_THROWS_WITH_AS(pool.acquire(10, out), doctest::Contains("asked for 512 bytes, 0 of the 1536-byte"),
                       oomb::out_of_memory);
  CHECK(pool.in_use() == 6);
  CHECK(std::all_of(out, out + 10, [](std::int32_t x) { return x == -1; }));
  std::int32_t six[6];
  pool.acquire(6, six);  // exactly what the grown slabs hold
  CHECK(pool.in_use() == 12);
  CHECK_THROWS_AS(pool.acquire(), oomb::out_of_memory);
  CHECK(pool.in_use() == 12);
  pool.release(six[0]);
  CHECK(pool.acquire() == six[0]);
}

TEST_CASE("block_pool: bad releases raise invalid_argument and leave the pool usable") {
  for (auto l : {layout::contiguous, layout::growing}) {
    CAPTURE(name(l));
    oomb::host_resource host;
    counted r(host);
    auto pool = make(r, l, 32, 8, 4);
    const auto a = pool.acquire(), b = pool.acquire();
    pool.release(a);
    const auto before = pool.stats();
    CHECK_THROWS_WITH_AS(pool.release(a), doctest::Contains("release of block 0 which is not in use (released twice?)"),
                         oomb::invalid_argument);
    CHECK_THROWS_WITH_AS(pool.release(3), doctest::Contains("release of block 3 which is not in use"),
                         oomb::invalid_argument);  // reserved, never acquired
    CHECK_THROWS_WITH_AS(pool.release(8), doctest::Contains("release of block 8 which this pool never handed out"),
                         oomb::invalid_argument);
    CHECK_THROWS_WITH_AS(pool.release(-2), doctest::Contains("block -2 which this pool never handed out"),
                         oomb::invalid_argument);
    CHECK_THROWS_AS(pool.release(1000000), oomb::invalid_argument);
    const auto after = pool.stats();
    CHECK(after.in_use == before.in_use);
    CHECK(after.reserved == before.reserved);
    CHECK(pool.owns(b));
    CHECK(!pool.owns(a));
    CHECK(!pool.owns(-1));
    CHECK(!pool.owns(99));
    // The free list was not corrupted: the next acquisitions are distinct and fill the pool.
    std::vector<std::int32_t> ids;
    while (pool.available() > 0) ids.push_back(pool.acquire());
    ids.push_back(b);
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }
}

TEST_CASE("block_pool: bad construction names the value") {
  oomb::host_resource host;
  counted r(host);
  CHECK_THROWS_WITH_AS(pool_t::contiguous(r, 64, 0), doctest::Contains("capacity must be positive, got 0"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(pool_t::growing(r, 64, 0), doctest::Contains("blocks_per_slab must be positive, got 0"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(pool_t::growing(r, 64, 4, -5), doctest::Contains("capacity must be positive, got -5"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(pool_t::contiguous(r, 64, 4, 48), doctest::Contains("power of two, got 48"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(pool_t::contiguous(r, 0, 4), oomb::invalid_argument);
  CHECK(r.statistics().bytes_in_use == 0);
  // A contiguous pool the resource cannot hold: the resource's error, nothing leaked.
  oomb::limiting_adaptor<counted> small(r, 1000);
  CHECK_THROWS_WITH_AS(oomb::block_pool<oomb::limiting_adaptor<counted>>::contiguous(small, 64, 100),
                       doctest::Contains("asked for 6400 bytes, 1000 of the 1000-byte"), oomb::out_of_memory);
  CHECK(r.statistics().bytes_in_use == 0);
}

TEST_CASE("block_pool: stats report in use, high water, reserved and bytes") {
  oomb::host_resource host;
  counted r(host);
  auto pool = pool_t::growing(r, 256, 8, 20);
  auto s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.high_water == 0);
  CHECK(s.reserved == 0);
  CHECK(s.capacity == 20);
  CHECK(s.block_bytes == 256);
  CHECK(s.reserved_bytes == 0);
  std::int32_t ids[11];
  pool.acquire(11, ids);
  for (int i = 0; i < 6; ++i) pool.release(ids[i]);
  s = pool.stats();
  CHECK(s.in_use == 5);
  CHECK(s.high_water == 11);
  CHECK(s.reserved == 16);
  CHECK(s.reserved_bytes == 16 * 256);
  CHECK(s.reserved_bytes == r.statistics().bytes_in_use);
  CHECK(pool.available() == 15);
  pool.acquire(3, ids);
  CHECK(pool.stats().high_water == 11);
  CHECK(pool.stats().in_use == 8);
}

TEST_CASE("block_pool: moves transfer the blocks; destruction returns every byte") {
  for (auto l : {layout::contiguous, layout::growing}) {
    CAPTURE(name(l));
    oomb::host_resource host;
    counted r(host);
    {
      auto a = make(r, l, 128, 12, 4);
      const auto id = a.acquire();
      std::byte* addr = a.address(id);
      const auto bytes = r.statistics().bytes_in_use;
      CHECK(bytes > 0);

      pool_t b(std::move(a));
      CHECK(b.owns(id));
      CHECK(b.address(id) == addr);  // no copy, no move of memory
      CHECK(b.in_use() == 1);
      CHECK(a.reserved() == 0);      // NOLINT(bugprone-use-after-move): moved-from is empty
      CHECK(a.in_use() == 0);
      CHECK(!a.owns(id));
      CHECK(r.statistics().bytes_in_use == bytes);

      auto c = make(r, l, 64, 4, 4);
      c.acquire();
      CHECK(r.statistics().allocations_in_use == 2 + (l == layout::growing ? 0 : 0));
      c = std::move(b);  // c's old memory goes back now
      CHECK(r.statistics().bytes_in_use == bytes);
      CHECK(c.owns(id));
      CHECK(c.block_bytes() == 128);
      c.release(id);
      CHECK(c.acquire() == id);
    }
    CHECK(r.statistics().bytes_in_use == 0);
    CHECK(r.statistics().allocations_in_use == 0);
  }
}

TEST_CASE("block_pool: generation(id) counts releases, so a reused id is told from its past") {
  oomb::host_resource host;
  counted r(host);
  auto pool = pool_t::growing(r, 64, 2, 8);
  const std::int32_t a = pool.acquire();
  CHECK(pool.generation(a) == 0);
  pool.release(a);
  CHECK(pool.generation(a) == 1);
  REQUIRE(pool.acquire() == a);  // LIFO: the same id comes back ...
  CHECK(pool.generation(a) == 1);  // ... with a new generation than the one before its release
  pool.release(a);
  pool.acquire();
  CHECK(pool.generation(a) == 2);
  CHECK(pool.generation(-1) == 0);
  CHECK(pool.generation(100) == 0);
  CHECK_THROWS_AS(pool.release(a + 1), oomb::invalid_argument);  // a failed release counts nothing
  CHECK(pool.generation(a + 1) == 0);
}

TEST_CASE("block_pool: 4096 ascending grows reallocate the id bookkeeping O(log n) times") {
  oomb::host_resource host;
  counted r(host);
  auto pool = pool_t::growing(r, 16, 1, 8192);  // one block per slab: a grow per acquire
  for (std::int32_t want = 0; want < 4096; ++want) REQUIRE(pool.acquire() == want);
  const auto st = pool.stats();
  CHECK(st.reserved == 4096);
  CHECK(st.index_growths <= 14);  // geometric: log2(4096) + a few; reserving exactly was 4096
  MESSAGE("index reallocations for 4096 grows: " << st.index_growths);
  std::vector<std::int32_t> ids(4096);
  auto pool2 = pool_t::growing(r, 16, 1, 8192);
  pool2.acquire(4096, ids.data());  // acquire(n) growing one slab at a time, ids still ascending
  for (std::int32_t i = 0; i < 4096; ++i) REQUIRE(ids[static_cast<std::size_t>(i)] == i);
  CHECK(pool2.stats().index_growths <= 14);
}
