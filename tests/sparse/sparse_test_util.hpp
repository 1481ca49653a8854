// Shared helpers of the sparse tests: seeded random data and brute-force references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "oomb/sparse/page_summary_view.hpp"
#include "oomb/sparse/scoring.hpp"

namespace sparse_test {

/// Uniform in [-scale, -scale/64] U [scale/64, scale]: random, never zero.
inline float nonzero(std::mt19937_64& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> mag(scale / 64, scale);
  std::bernoulli_distribution neg(0.5);
  const float m = mag(rng);
  return neg(rng) ? -m : m;
}

inline std::vector<float> random_vector(std::mt19937_64& rng, std::size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = nonzero(rng, scale);
  return v;
}

/// Brute-force summary of keys [tokens][kv_heads][head_dim] (row-major float).
struct ref_summary {
  std::vector<float> min, max, mean;  // [kv_heads][head_dim]
};

inline ref_summary summarize(const std::vector<float>& keys, int tokens, int kv_heads, int head_dim) {
  const std::size_t row = std::size_t(kv_heads) * head_dim;
  ref_summary r;
  r.min.assign(row, std::numeric_limits<float>::infinity());
  r.max.assign(row, -std::numeric_limits<float>::infinity());
  std::vector<double> sum(row, 0.0);
  for (int t = 0; t < tokens; ++t)
    for (std::size_t i = 0; i < row; ++i) {
      const float k = keys[std::size_t(t) * row + i];
      r.min[i] = std::min(r.min[i], k);
      r.max[i] = std::max(r.max[i], k);
      sum[i] += k;
    }
  r.mean.resize(row);
  for (std::size_t i = 0; i < row; ++i) r.mean[i] = tokens ? float(sum[i] / tokens) : 0.0f;
  return r;
}

/// Double-precision q·k.
inline double dot_double(const float* q, const float* k, int n) {
  double s = 0;
  for (int d = 0; d < n; ++d) s += double(q[d]) * double(k[d]);
  return s;
}

/// Double-precision Quest bound.
inline double quest_double(const float* q, const float* lo, const float* hi, int n) {
  double s = 0;
  for (int d = 0; d < n; ++d) s += std::max(double(q[d]) * lo[d], double(q[d]) * hi[d]);
  return s;
}

/// Reference selection: sort the middle by (score desc, NaN last, index asc), keep `budget`,
/// add sink and local, sort.
inline std::vector<std::int32_t> ref_select(const std::vector<float>& scores, int n, int budget,
                                            int sink, int local) {
  std::vector<std::int32_t> out;
  if (n <= budget + sink + local) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::vector<std::int32_t> mid;
  for (int i = sink; i < n - local; ++i) mid.push_back(i);
  std::stable_sort(mid.begin(), mid.end(), [&](std::int32_t a, std::int32_t b) {
    const bool na = std::isnan(scores[a]), nb = std::isnan(scores[b]);
    if (na || nb) return !na && nb;
    return scores[a] > scores[b];
  });  // stable: equal scores keep ascending index
  for (int i = 0; i < sink; ++i) out.push_back(i);
  for (int i = 0; i < budget; ++i) out.push_back(mid[i]);
  for (int i = n - local; i < n; ++i) out.push_back(i);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sparse_test
