// A translation unit with bounds checks on, linked beside bounds_unchecked_tu.cpp (see
// test_vendoring.cpp): both instantiate tensor_view<float, 2>::operator() on the same types.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1
#include "oomb/core/tensor.hpp"

#include <vector>

namespace oomb_test {
/// Reads row 3 of a 2x2 view over a 16-float buffer: with checks on, that throws.
bool checked_tu_refuses_row_3() {
  std::vector<float> buf(16, 1.0f);
  const oomb::tensor_view<float, 2> v(buf.data(), {2, 2}, {2, 1});
  try {
    (void)v(3, 0);
  } catch (const oomb::invalid_argument&) {
    return true;
  }
  return false;
}
}  // namespace oomb_test
