// The memory-resource conformance suite: what every memory resource must do, written once.
// SPDX-License-Identifier: Apache-2.0
//
// Instantiate it for resource types R with
//   TEST_CASE_TEMPLATE_INVOKE(resource_conformance, R, ...);
// after specialising oomb_test::resource_traits<R> (namespace oomb_test) for each base resource:
//   struct holder { R& get(); };               // default-constructible owner of an R
//   static constexpr oomb::memory_kind kind;   // what R::kind must say
//   static constexpr std::size_t max_alignment;   // largest alignment R must honour
//   static constexpr bool refuses_above_max;   // allocate(n, 2 * max_alignment) is invalid_argument
//   static constexpr const char* bad_alignment_text;  // part of the error for alignment 24
//   static constexpr std::size_t refused_bytes;  // a request R must refuse with out_of_memory whose
//                                                // message names the bytes; 0: none is reachable
//   static void write(void* dst, const void* host_src, std::size_t n);  // into R's memory
//   static void read(void* host_dst, const void* src, std::size_t n);   // out of R's memory
// write/read are the only way the suite touches the memory, so device memory is verified through
// cudaMemcpy (or a kernel). statistics_adaptor<U> and limiting_adaptor<U> (a 64 MiB limit) get
// their traits from U's here. The adaptor suites (statistics_adaptor_conformance,
// limiting_adaptor_conformance) are instantiated with the *upstream* type.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

namespace oomb_test {

template <class R>
struct resource_traits;

/// write/read for memory the host can touch directly.
struct host_access {
  static void write(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
  static void read(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
};

// The adaptors behave as their upstream for everything the suite checks, except the limit.
template <class U>
struct resource_traits<oomb::statistics_adaptor<U>> : resource_traits<U> {
  struct holder {
    typename resource_traits<U>::holder up;
    oomb::statistics_adaptor<U> r{up.get()};
    oomb::statistics_adaptor<U>& get() { return r; }
  };
};

template <class U>
struct resource_traits<oomb::limiting_adaptor<U>> : resource_traits<U> {
  static constexpr std::size_t limit = std::size_t(64) << 20;
  static constexpr std::size_t refused_bytes = limit + 1;
  struct holder {
    typename resource_traits<U>::holder up;
    oomb::limiting_adaptor<U> r{up.get(), limit};
    oomb::limiting_adaptor<U>& get() { return r; }
  };
};

/// Seeded bytes in [1, 255]: never zero, so unwritten or zeroed memory shows.
inline std::vector<unsigned char> conformance_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng() | 0x0101010101010101ull;  // every byte odd
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>((rng() & 0xfe) | 1);
  return v;
}

/// A block of the suite: where it is and what was written into it.
struct conformance_block {
  void* p;
  std::size_t bytes, alignment;
  std::vector<unsigned char> content;
};

template <class R>
bool holds_its_content(const conformance_block& b) {
  std::vector<unsigned char> back(b.bytes, 0);
  resource_traits<R>::read(back.data(), b.p, b.bytes);
  if (back != b.content) return false;
  if constexpr (oomb::host_accessible(R::kind))  // the host sees the same bytes directly
    return std::memcmp(b.p, b.content.data(), b.bytes) == 0;
  return true;
}

/// True when no two blocks' [p, p + bytes) ranges meet.
inline bool disjoint(std::vector<conformance_block>& blocks) {
  auto at = [](const conformance_block& b) { return reinterpret_cast<std::uintptr_t>(b.p); };
  std::sort(blocks.begin(), blocks.end(), [&](const auto& a, const auto& b) { return at(a) < at(b); });
  for (std::size_t i = 1; i < blocks.size(); ++i)
    if (at(blocks[i - 1]) + blocks[i - 1].bytes > at(blocks[i])) return false;
  return true;
}

inline std::size_t log2_of(std::size_t pow2) {
  std::size_t k = 0;
  while ((std::size_t(1) << k) < pow2) ++k;
  return k;
}

}  // namespace oomb_test

TEST_CASE_TEMPLATE_DEFINE("memory resource conformance", R, resource_conformance) {
  using traits = oomb_test::resource_traits<R>;
  static_assert(oomb::is_memory_resource_v<R>);
  static_assert(R::kind == traits::kind, "the resource declares the kind of memory it hands out");
  static_assert((traits::max_alignment & (traits::max_alignment - 1)) == 0);
  typename traits::holder h;
  R& r = h.get();

  SUBCASE("alignment is honoured and contents round-trip; blocks do not overlap") {
    std::mt19937_64 rng(7);
    std::vector<oomb_test::conformance_block> blocks;
    const std::size_t sizes[] = {1, 3, 64, 100, 4096, 65536, 1 << 20};
    std::uint64_t seed = 1;
    for (std::size_t alignment = 1; alignment <= traits::max_alignment; alignment *= 2)
      for (std::size_t bytes : sizes) {
        void* p = r.allocate(bytes, alignment);
        REQUIRE(p != nullptr);
        REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
        blocks.push_back({p, bytes, alignment, oomb_test::conformance_bytes(bytes, seed++)});
        traits::write(p, blocks.back().content.data(), bytes);
      }
    // Every block still holds its own bytes everywhere: nothing overlapped or was clobbered.
    bool intact = true;
    for (const auto& b : blocks) intact = intact && oomb_test::holds_its_content<R>(b);
    REQUIRE(intact);
    REQUIRE(oomb_test::disjoint(blocks));
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const auto& b : blocks) r.deallocate(b.p, b.bytes, b.alignment);
  }

  SUBCASE("a bad alignment is refused, naming it, and changes nothing") {
    CHECK_THROWS_WITH_AS(r.allocate(64, 24), doctest::Contains(traits::bad_alignment_text),
                         oomb::invalid_argument);
    CHECK_THROWS_AS(r.allocate(64, 0), oomb::invalid_argument);
    if constexpr (traits::refuses_above_max)
      CHECK_THROWS_WITH_AS(r.allocate(64, 2 * traits::max_alignment),
                           doctest::Contains(("got " + std::to_string(2 * traits::max_alignment)).c_str()),
                           oomb::invalid_argument);
    void* p = r.allocate(64, 64);  // still usable
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    const auto content = oomb_test::conformance_bytes(64, 3);
    traits::write(p, content.data(), 64);
    CHECK(oomb_test::holds_its_content<R>({p, 64, 64, content}));
    r.deallocate(p, 64, 64);
  }

  SUBCASE("property: random allocate/deallocate sequences keep every live block's contents") {
    const std::size_t max_shift = oomb_test::log2_of(traits::max_alignment);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(seed);
      std::mt19937_64 rng(seed * 1000 + 17);
      std::vector<oomb_test::conformance_block> live;
      bool intact = true;
      for (int step = 0; step < 150; ++step) {
        if (live.empty() || (live.size() < 48 && rng() % 3 != 0)) {
          const std::size_t scale = std::size_t(1) << (rng() % 19);  // sizes from 1 B to 256 KiB
          const std::size_t bytes = 1 + rng() % scale;
          const std::size_t alignment = std::size_t(1) << (rng() % (max_shift + 1));
          void* p = r.allocate(bytes, alignment);
          REQUIRE(p != nullptr);
          REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
          live.push_back({p, bytes, alignment, oomb_test::conformance_bytes(bytes, rng())});
          traits::write(p, live.back().content.data(), bytes);
        } else {  // free a random live block, after checking it kept its bytes
          const std::size_t i = rng() % live.size();
          intact = intact && oomb_test::holds_its_content<R>(live[i]);
          r.deallocate(live[i].p, live[i].bytes, live[i].alignment);
          live[i] = std::move(live.back());
          live.pop_back();
        }
      }
      for (const auto& b : live) intact = intact && oomb_test::holds_its_content<R>(b);
      CHECK(intact);
      CHECK(oomb_test::disjoint(live));
      for (const auto& b : live) r.deallocate(b.p, b.bytes, b.alignment);
    }
  }

  SUBCASE("a request past what the resource has is out_of_memory naming the bytes; it stays usable") {
    if constexpr (traits::refused_bytes != 0) {
      CHECK_THROWS_WITH_AS(r.allocate(traits::refused_bytes, 64),
                           doctest::Contains((std::to_string(traits::refused_bytes) + " bytes").c_str()),
                           oomb::out_of_memory);
      void* p = r.allocate(4096, 64);
      REQUIRE(p != nullptr);
      const auto content = oomb_test::conformance_bytes(4096, 5);
      traits::write(p, content.data(), 4096);
      CHECK(oomb_test::holds_its_content<R>({p, 4096, 64, content}));
      r.deallocate(p, 4096, 64);
    } else {
      MESSAGE("no unreachable request is safe for this resource (see its resource_traits)");
    }
  }
}

// --- the adaptors' own numbers, over any upstream U with resource_traits<U> ------------------------

TEST_CASE_TEMPLATE_DEFINE("statistics_adaptor counts bytes, allocations and the high water", U,
                          statistics_adaptor_conformance) {
  typename oomb_test::resource_traits<U>::holder h;
  U& up = h.get();
  oomb::statistics_adaptor<U> stats(up);
  static_assert(oomb::statistics_adaptor<U>::kind == U::kind);
  CHECK(&stats.upstream() == &up);
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

TEST_CASE_TEMPLATE_DEFINE("limiting_adaptor refuses past its limit, naming asked and left, and stays usable", U,
                          limiting_adaptor_conformance) {
  typename oomb_test::resource_traits<U>::holder h;
  oomb::statistics_adaptor<U> below(h.get());
  oomb::limiting_adaptor<oomb::statistics_adaptor<U>> limit(below, 1000);
  static_assert(oomb::limiting_adaptor<oomb::statistics_adaptor<U>>::kind == U::kind);
  const std::string kind = oomb::to_string(U::kind);
  CHECK(limit.limit() == 1000);
  void* a = limit.allocate(600, 8);
  CHECK(limit.bytes_in_use() == 600);
  CHECK_THROWS_WITH_AS(limit.allocate(500, 8),
                       doctest::Contains(("asked for 500 bytes, 400 of the 1000-byte " + kind + " limit left").c_str()),
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
