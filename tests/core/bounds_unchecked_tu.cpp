// A translation unit with bounds checks off, linked beside bounds_checked_tu.cpp (see
// test_vendoring.cpp).
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 0
#include "oomb/core/tensor.hpp"

#include <vector>

namespace oomb_test {
/// Reads row 3 of a 2x2 view over a 16-float buffer: unchecked, it is element 6 of the buffer.
float unchecked_tu_reads_row_3() {
  std::vector<float> buf(16, 1.0f);
  buf[6] = 42.0f;
  const oomb::tensor_view<float, 2> v(buf.data(), {2, 2}, {2, 1});
  return v(3, 0);
}
}  // namespace oomb_test
