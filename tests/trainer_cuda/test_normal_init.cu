// normal_init against a host Philox4x32-10 (checked on Random123's known answers) + Box-Muller in
// double; its statistics over 1M samples; the same values for any launch shape and any split of a
// tensor into calls; independent numbers for distinct tensors and seeds.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <array>
#include <cmath>

#include "trainer/cuda/ops/normal_init.cuh"

#include "device_util.cuh"

namespace {

using namespace ops_test;
namespace ops = oomb_trainer::gpu::ops;

// Philox4x32-10 as Salmon et al. (SC'11) define it: 10 rounds of two 32x32 -> 64-bit products,
// the key bumped by the Weyl constants between rounds.
std::array<std::uint32_t, 4> philox(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c[0], p1 = std::uint64_t(0xCD9E8D57u) * c[2];
    c = {std::uint32_t(p1 >> 32) ^ c[1] ^ k[0], std::uint32_t(p1), std::uint32_t(p0 >> 32) ^ c[3] ^ k[1], std::uint32_t(p0)};
  }
  return c;
}

// The value normal_init gives parameter g (the file comment of normal_init.cuh), in double.
double reference(std::uint64_t g, std::uint64_t seed, double std_dev) {
  const std::uint64_t c = g / 4;
  const auto r = philox({std::uint32_t(c), std::uint32_t(c >> 32), 0, 0}, {std::uint32_t(seed), std::uint32_t(seed >> 32)});
  const int pair = int(g % 4) / 2;
  const double u = (double(r[std::size_t(2 * pair)] >> 8) + 1.0) * 0x1p-24;
  const double w = double(r[std::size_t(2 * pair + 1)] >> 8) * 0x1p-24;
  const double radius = std::sqrt(-2.0 * std::log(u)), angle = 2.0 * M_PI * w;
  return std_dev * radius * (g % 2 == 0 ? std::cos(angle) : std::sin(angle));
}

struct init_result {
  std::vector<float> master;
  std::vector<bf16> compute;
};

init_result run(std::int64_t n, std::uint64_t offset, std::uint64_t seed, float std_dev, unsigned blocks = 0,
                unsigned threads = 0) {
  test_stream stream;
  device_array<float> master(static_cast<std::size_t>(n));
  device_array<bf16> compute(static_cast<std::size_t>(n));
  if (blocks == 0)
    ops::normal_init(n, offset, seed, std_dev, master.get(), compute.get(), stream.view());
  else
    ops::detail::normal_init_launch(n, offset, seed, std_dev, master.get(), compute.get(), blocks, threads, stream.view());
  return {master.download(), compute.download()};
}

}  // namespace

TEST_CASE("normal_init: the host Philox reproduces Random123's known answers") {
  CHECK(philox({0, 0, 0, 0}, {0, 0}) == std::array<std::uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}) ==
        std::array<std::uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
}

TEST_CASE("normal_init: values equal the reference, statistics of 1M samples, bf16 = rounded master") {
  const std::int64_t n = 1 << 20;
  const std::uint64_t seed = 0x5eed'0000'1234ull, offset = 3;  // an offset that is no multiple of 4
  const float std_dev = 0.02f;
  const init_result r = run(n, offset, seed, std_dev);

  std::vector<double> want(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) want[std::size_t(i)] = reference(offset + std::uint64_t(i), seed, std_dev);
  double max_abs = 0;
  for (std::size_t i = 0; i < want.size(); ++i) max_abs = std::max(max_abs, std::fabs(r.master[i] - want[i]));
  // fp32 logf / sqrtf / sincospif against double: a few ulp of values below 6 std.
  expect_close("normal_init master vs double reference", trainer_test::rel_err(r.master, want), 1e-6);
  MESSAGE("normal_init largest abs error " << max_abs << " (tolerance " << 1e-5 * std_dev << ")");
  CHECK(max_abs < 1e-5 * std_dev);

  bool rounded = true;
  for (std::size_t i = 0; i < r.master.size(); ++i) rounded = rounded && r.compute[i] == bf16(r.master[i]);
  CHECK(rounded);

  double sum = 0, sq = 0;
  std::int64_t beyond3 = 0;
  for (float x : r.master) {
    sum += x;
    sq += double(x) * x;
    beyond3 += std::fabs(x) > 3 * std_dev;
  }
  const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
  MESSAGE("1M samples: mean " << mean << ", std " << sd << ", beyond 3 std " << double(beyond3) / double(n));
  CHECK(std::fabs(mean) < 5 * std_dev / std::sqrt(double(n)));  // 5 standard errors
  CHECK(std::fabs(sd / std_dev - 1) < 0.005);                    // ~7 standard errors of a sample std
  CHECK(double(beyond3) / double(n) > 0.0022);                   // normal: 0.0027
  CHECK(double(beyond3) / double(n) < 0.0032);
}

TEST_CASE("normal_init: any launch shape and any split into calls give the same bits") {
  const std::int64_t n = 100'003;
  const std::uint64_t seed = 42, offset = 1'000'001;
  const init_result a = run(n, offset, seed, 1.0f);
  const init_result b = run(n, offset, seed, 1.0f, 1, 32);     // one warp walks everything
  const init_result c = run(n, offset, seed, 1.0f, 977, 96);   // odd shapes
  CHECK(trainer_test::same_bits(a.master, b.master));
  CHECK(trainer_test::same_bits(a.master, c.master));
  CHECK(a.compute == b.compute);
  // The same tensor initialised in two calls, split at a parameter that is no multiple of 4.
  const std::int64_t head = 12'345;
  const init_result h = run(head, offset, seed, 1.0f), t = run(n - head, offset + head, seed, 1.0f);
  std::vector<float> joined = h.master;
  joined.insert(joined.end(), t.master.begin(), t.master.end());
  CHECK(trainer_test::same_bits(joined, a.master));
}

TEST_CASE("normal_init: distinct tensors and seeds draw independent numbers; bad arguments are refused") {
  const std::int64_t n = 1 << 20;
  const init_result a = run(n, 0, 7, 1.0f), b = run(n, std::uint64_t(n), 7, 1.0f), c = run(n, 0, 8, 1.0f);
  auto correlation = [&](const std::vector<float>& x, const std::vector<float>& y) {
    double sxy = 0, sxx = 0, syy = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      sxy += double(x[i]) * y[i];
      sxx += double(x[i]) * x[i];
      syy += double(y[i]) * y[i];
    }
    return sxy / std::sqrt(sxx * syy);
  };
  const double ab = correlation(a.master, b.master), ac = correlation(a.master, c.master);
  MESSAGE("correlation: next tensor " << ab << ", next seed " << ac << " (1M samples: standard error 0.001)");
  CHECK(std::fabs(ab) < 0.006);
  CHECK(std::fabs(ac) < 0.006);
  std::int64_t equal = 0;
  for (std::size_t i = 0; i < a.master.size(); ++i) equal += a.master[i] == b.master[i] || a.master[i] == c.master[i];
  CHECK(equal < 8);

  test_stream stream;
  device_array<float> m(16);
  device_array<bf16> w(16);
  CHECK_THROWS_AS(ops::normal_init(0, 0, 1, 1.0f, m.get(), w.get(), stream.view()), oomb::invalid_argument);
  CHECK_THROWS_AS(ops::normal_init(16, 0, 1, -1.0f, m.get(), w.get(), stream.view()), oomb::invalid_argument);
  CHECK_THROWS_AS(ops::normal_init(16, 0, 1, 1.0f, nullptr, w.get(), stream.view()), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(ops::normal_init(16, std::uint64_t(1) << 62, 1, 1.0f, m.get(), w.get(), stream.view()),
                       doctest::Contains("leaves the 2^62 index space"), oomb::invalid_argument);
}
