// SPDX-License-Identifier: Apache-2.0
// The converting residency tier: fp32 (or double) near slots over bf16 homes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "oomb/offload/bf16_codec.hpp"
#include "oomb/offload/converting_host_backend.hpp"
#include "oomb/offload/residency_scheduler.hpp"
#include "bf16_test_values.hpp"
#include "scheduler_fixture.hpp"

using oomb::access;
using oomb::bf16;
using oomb::bf16_rounding;
using oomb_test::random_values;

namespace {

using float_homes = oomb::converting_host_backend<oomb::bf16_codec<float>>;
using double_homes = oomb::converting_host_backend<oomb::bf16_codec<double>>;

static_assert(oomb::is_residency_backend_v<float_homes>);
static_assert(oomb::detail::has_backend_codec<float_homes>::value);
static_assert(!oomb::detail::has_backend_codec<oomb::host_backend>::value);

// Round to nearest even written out on the mantissa, apart from bf16's own carry trick.
std::uint16_t reference_rne(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  std::uint32_t upper = u >> 16;
  const std::uint32_t dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (upper & 1u))) ++upper;
  return static_cast<std::uint16_t>(upper);
}

float decoded(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float* slot_floats(oomb_test::tiers<oomb_test::fast_streams, float_homes>& t, std::int32_t s) {
  return reinterpret_cast<float*>(t.slot(s));
}
bf16* home_bf16(oomb_test::tiers<oomb_test::fast_streams, float_homes>& t, std::int32_t page) {
  return reinterpret_cast<bf16*>(t.home(page));
}

}  // namespace

TEST_CASE("bf16_codec: nearest-even encoding equals a plain reference bit for bit, decoding is exact") {
  const auto x = random_values<float>(1 << 16, 7);
  std::vector<bf16> enc(x.size());
  oomb::bf16_codec<float>{}.encode(x.data(), enc.data(), x.size(), 0);
  std::vector<float> back(x.size());
  oomb::bf16_codec<float>::decode(enc.data(), back.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(enc[i].bits == reference_rne(x[i]));
    if (!std::isnan(back[i])) REQUIRE(back[i] == decoded(enc[i].bits));
  }
}

TEST_CASE("bf16_codec: stochastic rounding lands on a neighbour, is unbiased on average, deterministic for a seed") {
  oomb::bf16_codec<float> c;
  c.rounding = bf16_rounding::stochastic;
  c.seed = 42;
  const float lo = decoded(0x3f80), hi = decoded(0x3f81);  // 1 and the next bf16
  const float x = lo + 0.3f * (hi - lo);
  const std::size_t n = 1 << 16;
  std::vector<float> src(n, x);
  std::vector<bf16> a(n), b(n), other_key(n), other_seed(n);
  c.encode(src.data(), a.data(), n, 5);
  c.encode(src.data(), b.data(), n, 5);
  c.encode(src.data(), other_key.data(), n, 6);
  oomb::bf16_codec<float> d = c;
  d.seed = 43;
  d.encode(src.data(), other_seed.data(), n, 5);
  double sum = 0;
  std::size_t ups = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(a[i]);
    REQUIRE((v == lo || v == hi));
    ups += v == hi;
    sum += v;
  }
  // Up with probability p = 0.3: the count is binomial, sd = sqrt(n p (1 - p)) ~ 117; allow 5 sd.
  CHECK(std::abs(double(ups) - 0.3 * n) < 5 * std::sqrt(n * 0.3 * 0.7));
  CHECK(std::abs(sum / n - x) < 5 * std::sqrt(0.3 * 0.7 / n) * (hi - lo));
  std::size_t same_key = 0, same_other_key = 0, same_other_seed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    same_key += a[i] == b[i];
    same_other_key += a[i] == other_key[i];
    same_other_seed += a[i] == other_seed[i];
  }
  CHECK(same_key == n);
  CHECK(same_other_key < n);  // independent draws agree with probability 0.58 each
  CHECK(same_other_seed < n);
  // Negative values round in magnitude the same way: unbiased too.
  std::vector<float> neg(n, -x);
  c.encode(neg.data(), a.data(), n, 9);
  double nsum = 0;
  for (const bf16& v : a) nsum += static_cast<float>(v);
  CHECK(std::abs(nsum / n + x) < 5 * std::sqrt(0.3 * 0.7 / n) * (hi - lo));
  // Infinities and NaN convert as bf16 does.
  CHECK(oomb::bf16_codec<float>::stochastic_bits(INFINITY, 0xffff) == 0x7f80);
  CHECK(std::isnan(decoded(oomb::bf16_codec<float>::stochastic_bits(NAN, 0xffff))));
}

TEST_CASE("converting tier: slots are fp32 over bf16 homes; pages round-trip, written pages go home rounded") {
  const std::int32_t pages = 8, slots = 4;
  const std::size_t home_bytes = 256, elems = home_bytes / 2;  // 128 values a page
  oomb_test::tiers<oomb_test::fast_streams, float_homes> t(pages, slots, home_bytes);
  CHECK(t.sched.page_bytes() == 2 * home_bytes);
  CHECK(t.sched.near_pool().block_bytes() == 2 * home_bytes);

  // Homes of random bf16 values (made from fresh random fp32) come near as exactly those values.
  const auto x = random_values<float>(pages * elems, 11);
  for (std::int32_t p = 0; p < pages; ++p)
    for (std::size_t i = 0; i < elems; ++i) home_bf16(t, p)[i] = bf16(x[p * elems + i]);
  t.sched.mark_written(t.ids);
  const std::vector<std::int32_t> want{1, 2, 6};
  t.sched.prefetch(want);
  const auto where = t.sched.acquire(t.compute, want, access::write);
  t.compute.synchronize();
  t.sched.drain();
  for (std::size_t k = 0; k < want.size(); ++k)
    for (std::size_t i = 0; i < elems; ++i) {
      const float h = static_cast<float>(home_bf16(t, want[k])[i]);
      const float s = slot_floats(t, where[k])[i];
      if (!std::isnan(h)) REQUIRE(s == h);
    }

  // Modified near in fp32, written back: each home holds the nearest-even bf16 of the slot's value.
  const auto y = random_values<float>(want.size() * elems, 12);
  for (std::size_t k = 0; k < want.size(); ++k) std::memcpy(slot_floats(t, where[k]), &y[k * elems], elems * 4);
  t.sched.release(t.compute, want);
  CHECK(t.sched.write_back(want) == want.size());
  t.sched.drain();
  for (std::size_t k = 0; k < want.size(); ++k)
    for (std::size_t i = 0; i < elems; ++i) REQUIRE(home_bf16(t, want[k])[i].bits == reference_rne(y[k * elems + i]));
  const auto st = t.sched.stats();
  CHECK(st.bytes_to_near == want.size() * home_bytes);  // the homes' bytes: what crosses the link
  CHECK(st.bytes_to_far == want.size() * home_bytes);
  CHECK(t.sched.backend().pages_written() == want.size());
}

TEST_CASE("converting tier: first touch is zeros in fp32; accumulating under eviction pressure matches a model") {
  const std::int32_t pages = 7, slots = 3;  // a cycle over 7 pages through 3 LRU slots misses every time
  const std::size_t home_bytes = 64, elems = home_bytes / 2;
  oomb_test::tiers<oomb_test::fast_streams, float_homes> t(pages, slots, home_bytes);
  std::vector<float> model(pages * elems, 0.f);  // what each home holds, as float
  std::mt19937 rng(3);
  std::normal_distribution<float> delta(0.f, 1.f);
  for (int round = 0; round < 5; ++round)
    for (std::int32_t p = 0; p < pages; ++p) {
      const std::vector<std::int32_t> one{p};
      const auto s = t.sched.acquire(t.compute, one, access::write);
      t.compute.synchronize();
      float* near = slot_floats(t, s[0]);
      for (std::size_t i = 0; i < elems; ++i) {
        REQUIRE(near[i] == model[p * elems + i]);  // round 0: the zero fill, later the decoded home
        const float add = delta(rng);
        near[i] += add;
        model[p * elems + i] = decoded(reference_rne(model[p * elems + i] + add));
      }
      t.sched.release(t.compute, one);
    }
  t.sched.flush();
  t.sched.drain();
  for (std::int32_t p = 0; p < pages; ++p)
    for (std::size_t i = 0; i < elems; ++i) REQUIRE(static_cast<float>(home_bf16(t, p)[i]) == model[p * elems + i]);
  const auto st = t.sched.stats();
  CHECK(st.zero_fills == pages);
  CHECK(st.hits == 0);
  CHECK(st.write_backs == 5 * pages);
  CHECK(st.evictions >= 5 * pages - slots);
}

TEST_CASE("converting tier: double slots over bf16 homes; the same seed gives the same homes") {
  const std::size_t home_bytes = 128, elems = home_bytes / 2;
  auto run = [&](std::uint64_t seed) {
    oomb::bf16_codec<double> c;
    c.rounding = bf16_rounding::stochastic;
    c.seed = seed;
    oomb_test::tiers<oomb_test::fast_streams, double_homes> t(4, 2, home_bytes, double_homes(c));
    REQUIRE(t.sched.page_bytes() == 4 * home_bytes);
    std::vector<std::uint16_t> homes;
    for (int round = 0; round < 3; ++round)
      for (std::int32_t p = 0; p < 4; ++p) {
        const std::vector<std::int32_t> one{p};
        const auto s = t.sched.acquire(t.compute, one, access::write);
        t.compute.synchronize();
        auto* near = reinterpret_cast<double*>(t.slot(s[0]));
        for (std::size_t i = 0; i < elems; ++i) near[i] += 1.0 / 3.0 + double(i) * 1e-3;
        t.sched.release(t.compute, one);
      }
    t.sched.flush();
    t.sched.drain();
    for (std::int32_t p = 0; p < 4; ++p)
      for (std::size_t i = 0; i < elems; ++i) homes.push_back(reinterpret_cast<bf16*>(t.home(p))[i].bits);
    return homes;
  };
  const auto a = run(1), b = run(1), c = run(2);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("converting tier: homes that are not whole bf16 elements are refused") {
  oomb::host_resource mem;
  auto far = oomb_test::far_pool::contiguous(mem, 63, 4);
  oomb::host_stream in, out;
  CHECK_THROWS_AS(oomb::residency_scheduler<float_homes>(far, mem, 2, in, out), oomb::invalid_argument);
}
