// The memory-resource concept: one conformance suite run against every implementation, plus the
// adaptors' own numbers.
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

namespace {

// Builds a resource of type R together with whatever upstream it needs.
template <class R>
struct holder;

template <>
struct holder<oomb::host_resource> {
  oomb::host_resource r;
  oomb::host_resource& get() { return r; }
};

template <>
struct holder<oomb::statistics_adaptor<oomb::host_resource>> {
  oomb::host_resource up;
  oomb::statistics_adaptor<oomb::host_resource> r{up};
  oomb::statistics_adaptor<oomb::host_resource>& get() { return r; }
};

template <>
struct holder<oomb::limiting_adaptor<oomb::host_resource>> {
  oomb::host_resource up;
  oomb::limiting_adaptor<oomb::host_resource> r{up, std::size_t(64) << 20};
  oomb::limiting_adaptor<oomb::host_resource>& get() { return r; }
};

struct block {
  void* p;
  std::size_t bytes, alignment;
  std::uint8_t tag;
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("memory resource conformance", R, resource_conformance) {
  static_assert(oomb::is_memory_resource_v<R>);
  static_assert(R::kind == oomb::memory_kind::host);
  static_assert(oomb::host_accessible(R::kind));
  holder<R> h;
  R& r = h.get();

  SUBCASE("alignment is honoured and contents round-trip; blocks do not overlap") {
    std::mt19937_64 rng(7);
    std::vector<block> blocks;
    const std::size_t sizes[] = {1, 3, 64, 100, 4096, 65536, 1 << 20};
    std::uint8_t tag = 1;
    for (std::size_t alignment = 1; alignment <= 4096; alignment *= 2)
      for (std::size_t bytes : sizes) {
        void* p = r.allocate(bytes, alignment);
        REQUIRE(p != nullptr);
        REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
        std::memset(p, tag, bytes);
        blocks.push_back({p, bytes, alignment, tag});
        tag = static_cast<std::uint8_t>(tag % 250 + 1);
      }
    // Every block still holds its own tag everywhere: nothing overlapped or was clobbered.
    for (const auto& b : blocks) {
      const auto* c = static_cast<const std::uint8_t*>(b.p);
      REQUIRE(std::all_of(c, c + b.bytes, [&](std::uint8_t x) { return x == b.tag; }));
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const auto& b : blocks) r.deallocate(b.p, b.bytes, b.alignment);
  }

  SUBCASE("a bad alignment is refused, naming it, and changes nothing") {
    CHECK_THROWS_WITH_AS(r.allocate(64, 24), doctest::Contains("alignment must be a power of two, got 24"),
                         oomb::invalid_argument);
    CHECK_THROWS_AS(r.allocate(64, 0), oomb::invalid_argument);
    void* p = r.allocate(64, 64);  // still usable
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    r.deallocate(p, 64, 64);
  }
}

TEST_CASE_TEMPLATE_INVOKE(resource_conformance, oomb::host_resource,
                          oomb::statistics_adaptor<oomb::host_resource>,
                          oomb::limiting_adaptor<oomb::host_resource>);

namespace {
struct no_kind {
  void* allocate(std::size_t, std::size_t);
  void deallocate(void*, std::size_t, std::size_t) noexcept;
};
struct throwing_deallocate {
  static constexpr oomb::memory_kind kind = oomb::memory_kind::device;
  void* allocate(std::size_t, std::size_t);
  void deallocate(void*, std::size_t, std::size_t);
};
struct wrong_allocate {
  static constexpr oomb::memory_kind kind = oomb::memory_kind::pinned;
  int* allocate(std::size_t, std::size_t);
  void deallocate(void*, std::size_t, std::size_t) noexcept;
};
struct int_kind {
  static constexpr int kind = 0;
  void* allocate(std::size_t, std::size_t);
  void deallocate(void*, std::size_t, std::size_t) noexcept;
};
struct minimal_device {
  static constexpr oomb::memory_kind kind = oomb::memory_kind::device;
  void* allocate(std::size_t, std::size_t);
  void deallocate(void*, std::size_t, std::size_t) noexcept;
};
}  // namespace

TEST_CASE("is_memory_resource_v rejects types that break the concept") {
  static_assert(!oomb::is_memory_resource_v<int>);
  static_assert(!oomb::is_memory_resource_v<no_kind>);
  static_assert(!oomb::is_memory_resource_v<throwing_deallocate>);
  static_assert(!oomb::is_memory_resource_v<wrong_allocate>);
  static_assert(!oomb::is_memory_resource_v<int_kind>);
  static_assert(oomb::is_memory_resource_v<minimal_device>);
  static_assert(oomb::statistics_adaptor<oomb::host_resource>::kind == oomb::memory_kind::host);
  static_assert(!oomb::host_accessible(minimal_device::kind));
  static_assert(oomb::device_accessible(oomb::memory_kind::pinned));
  CHECK(std::string(oomb::to_string(oomb::memory_kind::pinned)) == "pinned");
}

TEST_CASE("statistics_adaptor counts bytes, allocations and the high water") {
  oomb::host_resource host;
  oomb::statistics_adaptor<oomb::host_resource> stats(host);
  CHECK(&stats.upstream() == &host);
  void* a = stats.allocate(100, 16);
  void* b = stats.allocate(200, 64);
  auto s = stats.statistics();
  CHECK(s.bytes_in_use == 300);
  CHECK(s.bytes_high_water == 300);
  CHECK(s.allocations_in_use == 2);
  CHECK(s.total_allocations == 2);
  stats.deallocate(a, 100, 16);
  void* c = stats.allocate(50, 8);
  s = stats.statistics();
  CHECK(s.bytes_in_use == 250);
  CHECK(s.bytes_high_water == 300);
  CHECK(s.allocations_in_use == 2);
  CHECK(s.total_allocations == 3);
  void* d = stats.allocate(1000, 8);
  CHECK(stats.statistics().bytes_high_water == 1250);
  // A failed allocation counts nothing.
  CHECK_THROWS_AS(stats.allocate(10, 3), oomb::invalid_argument);
  CHECK(stats.statistics().total_allocations == 4);
  CHECK(stats.statistics().bytes_in_use == 1250);
  stats.deallocate(b, 200, 64);
  stats.deallocate(c, 50, 8);
  stats.deallocate(d, 1000, 8);
  s = stats.statistics();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.allocations_in_use == 0);
  CHECK(s.bytes_high_water == 1250);
}

TEST_CASE("limiting_adaptor refuses past its limit, naming asked and left, and stays usable") {
  oomb::host_resource host;
  oomb::statistics_adaptor<oomb::host_resource> below(host);
  oomb::limiting_adaptor<oomb::statistics_adaptor<oomb::host_resource>> limit(below, 1000);
  CHECK(limit.limit() == 1000);
  void* a = limit.allocate(600, 8);
  CHECK(limit.bytes_in_use() == 600);
  CHECK_THROWS_WITH_AS(limit.allocate(500, 8),
                       doctest::Contains("asked for 500 bytes, 400 of the 1000-byte host limit left"),
                       oomb::out_of_memory);
  CHECK(limit.bytes_in_use() == 600);
  CHECK(below.statistics().total_allocations == 1);  // the upstream was never asked
  // An upstream failure gives its bytes back.
  CHECK_THROWS_AS(limit.allocate(100, 3), oomb::invalid_argument);
  CHECK(limit.bytes_in_use() == 600);
  void* b = limit.allocate(400, 8);  // exactly up to the limit
  CHECK(limit.bytes_in_use() == 1000);
  CHECK_THROWS_WITH_AS(limit.allocate(1, 1), doctest::Contains("asked for 1 bytes, 0 of the 1000-byte"),
                       oomb::out_of_memory);
  limit.deallocate(a, 600, 8);
  void* c = limit.allocate(550, 8);
  CHECK(limit.bytes_in_use() == 950);
  limit.deallocate(b, 400, 8);
  limit.deallocate(c, 550, 8);
  CHECK(limit.bytes_in_use() == 0);
  CHECK(below.statistics().bytes_in_use == 0);
  CHECK(below.statistics().total_allocations == 3);
}
