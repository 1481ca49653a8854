// Random inputs for the bf16 codec tests, shared by the CPU tier's tests and the CUDA kernels' tests
// so both draw the same values from the same seed.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

namespace oomb_test {

// Random fp32 bit patterns (every exponent: NaN and infinities too), exact ties, subnormals and
// ordinary values; for double, doubles of them plus bits below float precision.
template <class Near>
std::vector<Near> random_values(std::size_t n, std::uint32_t seed) {
  static_assert(std::is_same_v<Near, float> || std::is_same_v<Near, double>);
  std::mt19937 rng(seed);
  std::vector<Near> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = rng();
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // an exact tie
    if (i % 4 == 2) u &= 0x807fffffu;                 // subnormal
    float f;
    std::memcpy(&f, &u, 4);
    if (i % 4 == 3) f = std::normal_distribution<float>(0.f, 1.f)(rng);
    v[i] = static_cast<Near>(f);
    if constexpr (std::is_same_v<Near, double>) {
      if (std::isnan(v[i])) v[i] = 0.5;  // float <-> double NaN payloads are the platform's, not the codec's
      else if (i % 8 == 3) v[i] *= 1.0 + std::ldexp(double(rng() % 1024), -40);  // below float's precision
    }
  }
  return v;
}

}  // namespace oomb_test
