// oomb — a 2-byte host bfloat16 with the bit layout of CUDA's __nv_bfloat16.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <cstring>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN

/// bfloat16: the upper 16 bits of an IEEE-754 binary32 (1 sign, 8 exponent, 7 mantissa bits), so
/// a page of bf16 written on the host is read unchanged by kernels as __nv_bfloat16.
/// Conversion from float rounds to nearest, ties to even; NaN stays NaN (quietened, sign kept).
struct bf16 {
  std::uint16_t bits;

  bf16() = default;  // trivial, so arrays of bf16 are PODs that memcpy and pages can hold
  OOMB_HOST_DEVICE explicit bf16(float f) noexcept : bits(round_bits(f)) {}

  OOMB_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r{};
    r.bits = b;
    return r;
  }

  OOMB_HOST_DEVICE explicit operator float() const noexcept {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  OOMB_HOST_DEVICE static std::uint16_t round_bits(float f) noexcept {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)                        // NaN: keep sign, force quiet
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);                             // round half to even
    return static_cast<std::uint16_t>(u >> 16);                  // overflow rounds to infinity
  }

  friend OOMB_HOST_DEVICE constexpr bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
  friend OOMB_HOST_DEVICE constexpr bool operator!=(bf16 a, bf16 b) noexcept { return a.bits != b.bits; }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2, "bf16 must match __nv_bfloat16's layout");

OOMB_NAMESPACE_END
