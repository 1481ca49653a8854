// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "stream_conformance.hpp"
#include "test_streams.hpp"

namespace {

using pool = oomb::block_pool<oomb::host_resource>;

// Fills block `id` with bytes derived from (tag, id): different for every page and never zero.
void stamp(const pool& p, std::int32_t id, std::uint32_t tag) {
  std::mt19937 rng(tag * 1000003u + static_cast<std::uint32_t>(id));
  std::byte* a = p.address(id);
  for (std::size_t i = 0; i < p.block_bytes(); ++i) a[i] = static_cast<std::byte>(1 + rng() % 255);
}

bool same_bytes(const pool& a, std::int32_t ia, const pool& b, std::int32_t ib) {
  return std::memcmp(a.address(ia), b.address(ib), a.block_bytes()) == 0;
}

std::vector<std::int32_t> acquire_all(pool& p) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.available()));
  p.acquire(static_cast<std::int32_t>(ids.size()), ids.data());
  return ids;
}

}  // namespace

TEST_CASE_TEMPLATE("page transfer merges runs and moves exact bytes", S, oomb::host_stream,
                   oomb_test::slow_host_stream) {
  oomb::host_resource r;
  auto far = pool::contiguous(r, 384, 64);
  auto near = pool::contiguous(r, 384, 16);
  acquire_all(far);
  acquire_all(near);
  for (std::int32_t i = 0; i < 64; ++i) stamp(far, i, 1);
  for (std::int32_t i = 0; i < 16; ++i) stamp(near, i, 2);
  S s = oomb_test::stream_factory<S>::make();

  SUBCASE("a run of neighbours on both sides is one copy") {
    const auto rep = oomb::transfer_pages(s, near, {4, 5, 6, 7, 8}, far, {20, 21, 22, 23, 24});
    CHECK(rep.pages == 5);
    CHECK(rep.copies == 1);
    CHECK(rep.bytes == 5 * 384);
    s.record().wait();
    for (int i = 0; i < 5; ++i) CHECK(same_bytes(near, 4 + i, far, 20 + i));
    CHECK_FALSE(same_bytes(near, 9, far, 25));  // one past the run: untouched
  }

  SUBCASE("runs are found in any order; breaks on either side split them") {
    // dst 0..3 <- src 10,11 | 30 | 31 ; dst 8,9 <- src 40,41; listed shuffled
    oomb::page_transfer<oomb::host_resource, oomb::host_resource> t(near, far);
    const std::vector<std::int32_t> d = {9, 2, 0, 8, 3, 1};
    const std::vector<std::int32_t> f = {41, 30, 10, 40, 31, 11};
    const auto rep = t.enqueue(s, d, f);
    CHECK(rep.pages == 6);
    CHECK(rep.copies == 3);  // {0,1}<-{10,11}, {2,3}<-{30,31}, {8,9}<-{40,41}
    CHECK(rep.bytes == 6 * 384);
    REQUIRE(t.ops().size() == 3);
    CHECK(t.ops()[0].bytes == 2 * 384);
    CHECK(t.ops()[0].dst == near.address(0));
    CHECK(t.ops()[0].src == far.address(10));
    s.record().wait();
    for (std::size_t i = 0; i < d.size(); ++i) CHECK(same_bytes(near, d[i], far, f[i]));
  }

  SUBCASE("scattered pages are one copy each, in one batch; far <- near works too") {
    const auto rep = oomb::transfer_pages(s, far, {1, 3, 5, 7}, near, {0, 1, 2, 3});
    CHECK(rep.copies == 4);
    s.record().wait();
    for (int i = 0; i < 4; ++i) CHECK(same_bytes(far, 1 + 2 * i, near, i));
  }

  SUBCASE("property: random batches land exactly, with as many copies as maximal runs") {
    std::mt19937 rng(77);
    for (int round = 0; round < 50; ++round) {
      std::vector<std::int32_t> all(64);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::size_t n = 1 + rng() % 16;
      std::vector<std::int32_t> slots(16);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(n);
      std::vector<std::int32_t> homes(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
      if (round % 3 == 0) {  // force runs: consecutive homes into consecutive slots
        const std::int32_t h0 = static_cast<std::int32_t>(rng() % (64 - n));
        const std::int32_t s0 = static_cast<std::int32_t>(rng() % (16 - n + 1));
        for (std::size_t i = 0; i < n; ++i) {
          homes[i] = h0 + static_cast<std::int32_t>(i);
          slots[i] = s0 + static_cast<std::int32_t>(i);
        }
      }
      for (std::int32_t h : homes) stamp(far, h, 100 + static_cast<std::uint32_t>(round));
      // The model: count maximal runs of (slot+1, home+1) after sorting by slot.
      std::vector<std::pair<std::int32_t, std::int32_t>> pairs;
      for (std::size_t i = 0; i < n; ++i) pairs.emplace_back(slots[i], homes[i]);
      std::sort(pairs.begin(), pairs.end());
      std::size_t runs = 1;
      for (std::size_t i = 1; i < n; ++i)
        if (pairs[i].first != pairs[i - 1].first + 1 || pairs[i].second != pairs[i - 1].second + 1) ++runs;
      const auto rep = oomb::transfer_pages(s, near, slots, far, homes);
      CHECK(rep.copies == runs);
      CHECK(rep.bytes == n * 384);
      s.record().wait();
      for (std::size_t i = 0; i < n; ++i) CHECK(same_bytes(near, slots[i], far, homes[i]));
    }
  }
}

namespace {
// Host memory handed out back to back from one buffer, so a growing pool's slabs touch: the layout
// small pinned allocations may have on a GPU host.
struct back_to_back_resource {
  static constexpr oomb::memory_kind kind = oomb::memory_kind::host;
  void* allocate(std::size_t bytes, std::size_t alignment) {
    used = (used + alignment - 1) / alignment * alignment;
    REQUIRE(used + bytes <= sizeof(buffer));
    void* p = buffer + used;
    used += bytes;
    return p;
  }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  alignas(256) std::byte buffer[1 << 14];
  std::size_t used = 0;
};
static_assert(oomb::is_memory_resource_v<back_to_back_resource>);
}  // namespace

TEST_CASE("page transfer never merges across slabs of a growing pool, even slabs that touch") {
  back_to_back_resource touching;
  oomb::host_resource r;
  auto grow = oomb::block_pool<back_to_back_resource>::growing(touching, 256, 4, 12);  // slabs of 4 blocks
  auto flat = pool::contiguous(r, 256, 12);
  std::vector<std::int32_t> ids(12);
  grow.acquire(12, ids.data());
  acquire_all(flat);
  REQUIRE(grow.address(3) + 256 == grow.address(4));  // slabs 0 and 1 touch
  for (std::int32_t i = 0; i < 12; ++i) stamp(flat, i, 9);
  oomb::host_stream s;
  SUBCASE("into the growing pool") {
    oomb::page_transfer<back_to_back_resource, oomb::host_resource> t(grow, flat);
    // 2,3 lie in slab 0 and 4,5 in slab 1: two copies, each inside its slab; 8..11 is one slab.
    CHECK(t.enqueue(s, {2, 3, 4, 5, 8, 9, 10, 11}, {2, 3, 4, 5, 8, 9, 10, 11}).copies == 3);
    REQUIRE(t.ops().size() == 3);
    CHECK(t.ops()[0].bytes == 2 * 256);
    CHECK(t.ops()[1].dst == grow.address(4));
    CHECK(t.ops()[1].bytes == 2 * 256);
    CHECK(t.ops()[2].bytes == 4 * 256);
    s.synchronize();
    for (std::int32_t i : {2, 3, 4, 5, 8, 9, 10, 11})
      CHECK(std::memcmp(grow.address(i), flat.address(i), 256) == 0);
  }
  SUBCASE("out of it: the source side splits the run as well") {
    oomb::page_transfer<oomb::host_resource, back_to_back_resource> t(flat, grow);
    CHECK(t.enqueue(s, {0, 1, 2, 3}, {2, 3, 4, 5}).copies == 2);
    CHECK(t.ops()[1].src == grow.address(4));
  }
}

TEST_CASE("page transfer rejects bad input before enqueuing anything") {
  oomb::host_resource r;
  auto a = pool::contiguous(r, 512, 8);
  auto b = pool::contiguous(r, 512, 8);
  auto small = pool::contiguous(r, 256, 8);
  std::int32_t ids[4];
  a.acquire(4, ids);  // a: 0..3 in use
  b.acquire(4, ids);  // b: 0..3 in use
  for (std::int32_t i = 0; i < 4; ++i) {
    stamp(a, i, 5);
    stamp(b, i, 6);
  }
  oomb::host_stream s(oomb::host_stream_options{std::chrono::microseconds(500)});

  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, small, {0}, a, {0}),
                       doctest::Contains("block sizes differ: destination pool 256 bytes, source pool 512"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, {0, 1}, a, {0}),
                       doctest::Contains("2 destination ids but 1 source ids"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, {0, 6}, a, {0, 1}),
                       doctest::Contains("destination page 6 (entry 1) is not in use"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, {0, 1}, a, {-1, 1}),
                       doctest::Contains("source page -1 (entry 0)"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, {2, 1, 2}, a, {0, 1, 3}),
                       doctest::Contains("destination page 2 appears twice (entries 0 and 2)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, a, {0, 1}, a, {2, 0}),
                       doctest::Contains("page 0 is both a source (entry 1) and a destination (entry 0)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, a, {1}, a, {1}),
                       doctest::Contains("page 1 is both a source"), oomb::invalid_argument);

  // Page formats: equal shapes and element sizes, fitting the blocks.
  const oomb::page_format bf16_fmt{oomb::page_shape{16, 2, 4}, 2};   // 2*16*2*4*2 = 512 bytes
  const oomb::page_format f32_fmt{oomb::page_shape{16, 2, 4}, 4};    // 1024 bytes
  const oomb::page_format other{oomb::page_shape{16, 1, 8, oomb::kv_layout::token_major}, 2};
  CHECK_NOTHROW(oomb::transfer_pages(s, b, bf16_fmt, {3}, a, bf16_fmt, {2}));
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, bf16_fmt, {0}, a, other, {0}),
                       doctest::Contains("page formats differ: destination {page_size 16, kv_heads 2, head_dim 4"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, f32_fmt, {0}, a, f32_fmt, {0}),
                       doctest::Contains("a page pair of 1024 bytes"), oomb::invalid_argument);
  const oomb::page_format bad{oomb::page_shape{12, 2, 4}, 2};
  CHECK_THROWS_WITH_AS(oomb::transfer_pages(s, b, bad, {0}, a, bad, {0}),
                       doctest::Contains("page_size must be a power of two >= 16, got 12"),
                       oomb::invalid_argument);

  // Nothing of the refused batches was enqueued: only the one good copy (a:2 -> b:3) landed.
  s.synchronize();
  CHECK(same_bytes(b, 3, a, 2));
  for (std::int32_t i = 0; i < 3; ++i) CHECK_FALSE(same_bytes(b, i, a, i));
  std::mt19937 check(6 * 1000003u + 0);
  CHECK(static_cast<int>(b.address(0)[0]) == static_cast<int>(1 + check() % 255));

  // An empty batch is fine and enqueues nothing.
  const auto rep = oomb::transfer_pages(s, b, oomb::id_span{}, a, oomb::id_span{});
  CHECK(rep.copies == 0);
  CHECK(s.pending() == 0);
}
