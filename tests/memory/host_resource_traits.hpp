// resource_traits<host_resource> for the conformance suites (resource_conformance.hpp,
// block_pool_conformance.hpp): shared by the tests/memory files that run them over host memory.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include "oomb/memory/host_resource.hpp"
#include "resource_conformance.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OOMB_TEST_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define OOMB_TEST_SANITIZED_ALLOCATOR 1
#endif
#endif
#ifndef OOMB_TEST_SANITIZED_ALLOCATOR
#define OOMB_TEST_SANITIZED_ALLOCATOR 0
#endif

// Host memory: write/read are plain memcpy; any power-of-two alignment is honoured (the suite
// goes up to a page).
namespace oomb_test {
template <>
struct resource_traits<oomb::host_resource> : host_access {
  struct holder {
    oomb::host_resource r;
    oomb::host_resource& get() { return r; }
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::host;
  static constexpr std::size_t max_alignment = 4096;
  static constexpr bool refuses_above_max = false;
  static constexpr const char* bad_alignment_text = "alignment must be a power of two, got 24";
  // 1 PiB is past any x86-64/AArch64 user address space, so operator new fails cleanly; a
  // sanitizer's allocator aborts on such a size instead of throwing, so none is asked there.
  static constexpr std::size_t refused_bytes = OOMB_TEST_SANITIZED_ALLOCATOR ? 0 : std::size_t(1) << 50;
};
}  // namespace oomb_test
