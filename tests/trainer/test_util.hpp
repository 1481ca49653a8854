// Helpers shared by the trainer tests: seeded random fills and norm-wise comparisons.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace trainer_test {

/// Uniform values in [lo, hi), never all zero.
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}

/// ||a - b|| / ||b|| (the norm-wise relative error the trainer's tests use); ||a|| when b is zero.
template <class A, class B>
double rel_err(const A* a, const B* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  return a.size() != b.size() ? INFINITY : rel_err(a.data(), b.data(), a.size());
}

/// Worst norm-wise relative error over the parameter tensors of `params`' layout (a and b hold
/// whole gradient vectors in that layout); `which` names the tensor.
template <class Params>
double worst_tensor_error(const Params& params, const std::vector<double>& a, const std::vector<double>& b,
                          std::string* which) {
  double worst = 0;
  for (const auto& e : params.layout().entries()) {
    const double err = rel_err(a.data() + e.offset, b.data() + e.offset, e.numel);
    if (err > worst) {
      worst = err;
      if (which) *which = e.name;
    }
  }
  return worst;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace trainer_test
