// Vendoring hygiene: renamed copies of oomb (OOMB_NAMESPACE) and translation units that disagree
// on the bounds-check switch live in one program without breaking the one-definition rule.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/core file that includes oomb checks bounds alike

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "oomb/core/error.hpp"

namespace oomb_test {
std::int64_t oomb_vendor_a_use_pool(std::int32_t n);  // vendored_copy_a.cpp
std::int64_t oomb_vendor_b_use_pool(std::int32_t n);  // vendored_copy_b.cpp
std::string oomb_vendor_a_error_name();
std::string oomb_vendor_b_error_name();
bool checked_tu_refuses_row_3();    // bounds_checked_tu.cpp
float unchecked_tu_reads_row_3();   // bounds_unchecked_tu.cpp
}  // namespace oomb_test

TEST_CASE("vendoring: two renamed copies of one oomb version work side by side in one program") {
  // ids 0..9 from each copy's own pool: both copies' pools, views and checks ran.
  CHECK(oomb_test::oomb_vendor_a_use_pool(10) == 45);
  CHECK(oomb_test::oomb_vendor_b_use_pool(10) == 45);
  // Their types are distinct from each other and from this translation unit's oomb.
  const std::string a = oomb_test::oomb_vendor_a_error_name(), b = oomb_test::oomb_vendor_b_error_name();
  CHECK(a != b);
  CHECK(a != typeid(oomb::error).name());
  CHECK(a.find("oomb_vendor_a") != std::string::npos);
  // A copy's error is not this copy's oomb::error, but is still a std::runtime_error.
  bool caught_as_ours = false, caught_as_runtime_error = false;
  try {
    (void)oomb_test::oomb_vendor_a_use_pool(-1);
  } catch (const oomb::error&) {
    caught_as_ours = true;
  } catch (const std::runtime_error& e) {
    caught_as_runtime_error = std::string(e.what()).find("n must not be negative, got -1") != std::string::npos;
  }
  CHECK_FALSE(caught_as_ours);
  CHECK(caught_as_runtime_error);
}

TEST_CASE("vendoring: translation units with bounds checks on and off keep their own behaviour") {
  // Without a namespace per setting both would share one tensor_view<float, 2>::operator() symbol
  // and the linker would keep either body (at -O0, where it is not inlined), so one of these fails.
  CHECK(oomb_test::checked_tu_refuses_row_3());
  CHECK(oomb_test::unchecked_tu_reads_row_3() == 42.0f);
}
