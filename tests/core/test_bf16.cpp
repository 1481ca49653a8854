#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "oomb/core/bf16.hpp"

namespace {
float from_u32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

TEST_CASE("bf16 keeps the upper half of a float's bits when exact") {
  CHECK(oomb::bf16(1.0f).bits == 0x3f80);
  CHECK(oomb::bf16(-2.0f).bits == 0xc000);
  CHECK(oomb::bf16(0.0f).bits == 0x0000);
  CHECK(oomb::bf16(-0.0f).bits == 0x8000);
  CHECK(static_cast<float>(oomb::bf16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("bf16 rounds to nearest, ties to even") {
  // 1.0 + half an ulp of bf16: tie, rounds down to the even mantissa 0x3f80.
  CHECK(oomb::bf16(from_u32(0x3f808000u)).bits == 0x3f80);
  // 0x3f81 is odd: its tie rounds up to 0x3f82.
  CHECK(oomb::bf16(from_u32(0x3f818000u)).bits == 0x3f82);
  // Just above a tie rounds up, just below rounds down.
  CHECK(oomb::bf16(from_u32(0x3f808001u)).bits == 0x3f81);
  CHECK(oomb::bf16(from_u32(0x3f807fffu)).bits == 0x3f80);
  // Rounding carries into the exponent: largest mantissa + tie rounds to the next power of two.
  CHECK(oomb::bf16(from_u32(0x3fffc000u)).bits == 0x4000);
}

TEST_CASE("bf16 infinities, overflow and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(oomb::bf16(inf).bits == 0x7f80);
  CHECK(oomb::bf16(-inf).bits == 0xff80);
  // The largest float rounds past bf16's largest finite value to infinity.
  CHECK(oomb::bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
  // bf16's own largest finite value stays finite.
  CHECK(oomb::bf16(from_u32(0x7f7f0000u)).bits == 0x7f7f);
  // A NaN whose payload sits only in the low bits must not round into infinity.
  const auto nan_low = oomb::bf16(from_u32(0x7f800001u));
  CHECK(nan_low.bits == 0x7fc0);
  CHECK(std::isnan(static_cast<float>(nan_low)));
  CHECK(oomb::bf16(from_u32(0xffc00000u)).bits == 0xffc0);  // sign kept
}

TEST_CASE("bf16 round trip of every bf16 value is exact") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto x = oomb::bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(x);
    if (std::isnan(f)) continue;
    REQUIRE(oomb::bf16(f).bits == b);
  }
}
