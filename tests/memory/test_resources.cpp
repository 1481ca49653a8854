// The memory-resource concept over host memory: the conformance suite and the adaptors' own numbers
// (resource_conformance.hpp, shared with tests/cuda), plus what the concept trait rejects.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/memory file checks bounds alike

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "host_resource_traits.hpp"
#include "resource_conformance.hpp"

TYPE_TO_STRING_AS("host_resource", oomb::host_resource);
TYPE_TO_STRING_AS("statistics_adaptor<host_resource>", oomb::statistics_adaptor<oomb::host_resource>);
TYPE_TO_STRING_AS("limiting_adaptor<host_resource>", oomb::limiting_adaptor<oomb::host_resource>);

TEST_CASE_TEMPLATE_INVOKE(resource_conformance, oomb::host_resource,
                          oomb::statistics_adaptor<oomb::host_resource>,
                          oomb::limiting_adaptor<oomb::host_resource>);
TEST_CASE_TEMPLATE_INVOKE(statistics_adaptor_conformance, oomb::host_resource);
TEST_CASE_TEMPLATE_INVOKE(limiting_adaptor_conformance, oomb::host_resource);

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
