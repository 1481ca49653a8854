// The memory-resource concept over host memory: the conformance suite and the adaptors' own numbers
// (resource_conformance.hpp, shared with tests/cuda), plus what the concept trait rejects.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/callback_resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "host_resource_traits.hpp"
#include "resource_conformance.hpp"

namespace oomb_test {
using host_callback_resource = oomb::callback_resource<oomb::memory_kind::host>;

/// A user's allocator as two callbacks: aligned operator new, refusing (nullptr) past 1 GiB.
inline host_callback_resource make_host_callback_resource() {
  return host_callback_resource(
      [](std::size_t bytes, std::size_t alignment) -> void* {
        if (bytes > (std::size_t(1) << 30)) return nullptr;
        return ::operator new(bytes, std::align_val_t{alignment});
      },
      [](void* p, std::size_t bytes, std::size_t alignment) {
        ::operator delete(p, bytes, std::align_val_t{alignment});
      });
}

template <>
struct resource_traits<host_callback_resource> : host_access {
  struct holder {
    host_callback_resource r = make_host_callback_resource();
    host_callback_resource& get() { return r; }
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::host;
  static constexpr std::size_t max_alignment = 4096;
  static constexpr bool refuses_above_max = false;
  static constexpr const char* bad_alignment_text = "alignment must be a power of two, got 24";
  static constexpr std::size_t refused_bytes = (std::size_t(1) << 30) + 1;
};
}  // namespace oomb_test

TYPE_TO_STRING_AS("host_resource", oomb::host_resource);
TYPE_TO_STRING_AS("callback_resource<host>", oomb_test::host_callback_resource);
TYPE_TO_STRING_AS("statistics_adaptor<host_resource>", oomb::statistics_adaptor<oomb::host_resource>);
TYPE_TO_STRING_AS("limiting_adaptor<host_resource>", oomb::limiting_adaptor<oomb::host_resource>);

TEST_CASE_TEMPLATE_INVOKE(resource_conformance, oomb::host_resource, oomb_test::host_callback_resource,
                          oomb::statistics_adaptor<oomb::host_resource>,
                          oomb::limiting_adaptor<oomb::host_resource>);
TEST_CASE_TEMPLATE_INVOKE(statistics_adaptor_conformance, oomb::host_resource);
TEST_CASE_TEMPLATE_INVOKE(limiting_adaptor_conformance, oomb::host_resource);
TEST_CASE_TEMPLATE_INVOKE(statistics_adaptor_conformance, oomb_test::host_callback_resource);

namespace {
/// A stand-in for a framework's stream handle: the callbacks must receive the resource's own.
struct fake_stream {
  int id = 0;
};
}  // namespace

TEST_CASE("callback_resource: the callbacks get every request with the resource's stream; pools sit on it") {
  std::vector<std::size_t> asked;
  std::vector<int> streams;
  int live = 0;
  using R = oomb::callback_resource<oomb::memory_kind::pinned, fake_stream>;
  static_assert(R::kind == oomb::memory_kind::pinned);
  R r(
      [&](std::size_t bytes, std::size_t alignment, fake_stream s) -> void* {
        asked.push_back(bytes);
        streams.push_back(s.id);
        ++live;
        return ::operator new(bytes, std::align_val_t{alignment});
      },
      [&](void* p, std::size_t bytes, std::size_t alignment, fake_stream s) {
        streams.push_back(s.id);
        --live;
        ::operator delete(p, bytes, std::align_val_t{alignment});
      },
      fake_stream{7});
  CHECK(r.stream().id == 7);
  {
    auto pool = oomb::block_pool<R>::growing(r, 256, 8);  // slabs of 8 pages, from the callbacks
    std::int32_t ids[20];
    pool.acquire(20, ids);
    CHECK(live == 3);
    CHECK(asked == std::vector<std::size_t>(3, 8 * 256));
  }
  CHECK(live == 0);  // the pool gave every slab back through the deallocate callback
  CHECK(streams == std::vector<int>(6, 7));
}

TEST_CASE("callback_resource: failures of the user's allocator become clear oomb errors") {
  using R = oomb::callback_resource<oomb::memory_kind::host>;
  auto release = [](void* p, std::size_t, std::size_t) { ::operator delete(p); };
  CHECK_THROWS_WITH_AS(R(nullptr, release), doctest::Contains("both callbacks must be set (allocate empty"),
                       oomb::invalid_argument);
  R throws_bad_alloc([](std::size_t, std::size_t) -> void* { throw std::bad_alloc(); }, release);
  CHECK_THROWS_WITH_AS(throws_bad_alloc.allocate(4096, 64),
                       doctest::Contains("host allocator failed for 4096 bytes (alignment 64)"), oomb::out_of_memory);
  R throws_oomb([](std::size_t, std::size_t) -> void* { OOMB_FAIL(oomb::format_error, "user says no"); }, release);
  CHECK_THROWS_WITH_AS(throws_oomb.allocate(8, 8), doctest::Contains("user says no"), oomb::format_error);
  // A block the allocator returns misaligned is given back, and the request refused.
  int given_back = 0;
  alignas(64) static unsigned char arena[256];
  R misaligned([](std::size_t, std::size_t) -> void* { return arena + 8; },
               [&](void* p, std::size_t, std::size_t) { given_back += p == arena + 8; });
  CHECK_THROWS_WITH_AS(misaligned.allocate(64, 64), doctest::Contains("not aligned to the 64 bytes asked"),
                       oomb::invalid_argument);
  CHECK(given_back == 1);
  CHECK(misaligned.allocate(64, 8) == arena + 8);
}

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
