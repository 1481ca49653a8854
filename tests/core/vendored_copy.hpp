// The body of vendored_copy_{a,b}.cpp: a library that vendors oomb under OOMB_NAMESPACE uses a
// pool, a view and an error of its copy, and exports functions named after the copy.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <oomb/oomb.hpp>

#include <cstdint>
#include <string>
#include <typeinfo>

#define OOMB_TEST_CAT2(a, b) a##b
#define OOMB_TEST_CAT(a, b) OOMB_TEST_CAT2(a, b)

namespace oomb_test {

/// Takes `n` pages from a pool of this copy, writes each page's id through a view, releases them,
/// and returns the sum of what it read back; throws this copy's invalid_argument for n < 0.
std::int64_t OOMB_TEST_CAT(OOMB_NAMESPACE, _use_pool)(std::int32_t n) {
  OOMB_EXPECTS(n >= 0, "vendored copy: n must not be negative, got ", n);
  ::OOMB_NAMESPACE::host_resource host;
  auto pool = ::OOMB_NAMESPACE::block_pool<::OOMB_NAMESPACE::host_resource>::growing(host, 64, 4);
  std::int64_t sum = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    std::int32_t id = -1;
    pool.acquire(1, &id);
    auto v = ::OOMB_NAMESPACE::tensor_view<std::int32_t, 1>::contiguous(
        reinterpret_cast<std::int32_t*>(pool.address(id)), {16});
    v(15) = id;
    sum += v(15);
  }
  return sum;
}

/// The mangled name of this copy's error type.
std::string OOMB_TEST_CAT(OOMB_NAMESPACE, _error_name)() { return typeid(::OOMB_NAMESPACE::error).name(); }

}  // namespace oomb_test
