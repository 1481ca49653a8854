// any_tensor_view and dtype: element type and rank at run time, checked on the way to a typed view.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/core file that includes oomb checks bounds alike

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "oomb/core/any_tensor_view.hpp"
#include "oomb/core/bf16.hpp"
#include "oomb/core/dtype.hpp"

TEST_CASE("dtype: every supported element type has its name and width") {
  static_assert(oomb::dtype_of<float>() == oomb::dtype{oomb::dtype_code::float_, 32});
  static_assert(oomb::dtype_of<const double>() == oomb::dtype{oomb::dtype_code::float_, 64});
  static_assert(oomb::dtype_of<oomb::bf16>() == oomb::dtype{oomb::dtype_code::bfloat, 16});
  static_assert(oomb::dtype_of<std::uint8_t>() == oomb::dtype{oomb::dtype_code::uint_, 8});
  static_assert(oomb::dtype_of<std::int32_t>() != oomb::dtype_of<std::uint32_t>());
  static_assert(!oomb::bf16_layout_compatible_v<std::uint16_t>);
  CHECK(oomb::to_string(oomb::dtype_of<oomb::bf16>()) == "bfloat16");
  CHECK(oomb::to_string(oomb::dtype_of<std::int64_t>()) == "int64");
}

TEST_CASE("any_tensor_view: a typed view goes out and comes back unchanged; mismatches are refused") {
  std::vector<float> buf(2 * 3 * 4);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = 0.5f + float(i);
  const auto v = oomb::tensor_view<float, 3>(buf.data(), {2, 3, 3}, {12, 4, 1}, oomb::memory_kind::pinned);
  const auto a = oomb::any_tensor_view::of(v, 1);
  CHECK(a.rank() == 3);
  CHECK(a.size() == 18);
  CHECK(a.device() == 1);
  CHECK(a.kind() == oomb::memory_kind::pinned);
  const auto w = a.as<const float, 3>();
  CHECK(w.data() == v.data());
  CHECK(w.strides() == v.strides());
  CHECK(w(1, 2, 2) == v(1, 2, 2));
  CHECK_THROWS_WITH_AS((a.as<double, 3>()), doctest::Contains("holds float32, the view asks for float64"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS((a.as<float, 1>()), doctest::Contains("has 3 dimensions, the view asks for 1"),
                       oomb::invalid_argument);
  const std::int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_THROWS_WITH_AS(oomb::any_tensor_view(buf.data(), oomb::dtype_of<float>(), 9, shape, shape,
                                             oomb::memory_kind::host),
                       doctest::Contains("rank 9 outside [0, 8]"), oomb::invalid_argument);
}
