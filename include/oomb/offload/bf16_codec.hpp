// oomb — pages whose homes hold bf16 while their near slots compute in float or double.
// SPDX-License-Identifier: Apache-2.0
//
// A page codec says how one near page is encoded in its far home and decoded back. The residency
// scheduler needs it where the homes bound memory: gradient pages accumulate in fp32 near (many
// windows add into them) but wait at home between windows, and bf16 halves those homes.
//
// Encoding rounds each value to bf16: to nearest, ties to even (bf16's own conversion), or
// stochastically — up with probability equal to the dropped fraction, so a value that goes home
// and back many times is unbiased on average instead of drifting toward the nearer bf16 each time.
// The random bits are counter-based: a hash of (seed, the write's key, the element's index), so a
// run is reproducible for a seed with no generator state to carry. Decoding is exact (every bf16 is
// a float and a double). Double pages round to float (nearest) first, then to bf16: the second
// rounding can differ from a direct one only at a float-tie, by one bf16 ulp at most.
//
// The per-element functions are __host__ __device__ under nvcc (OOMB_HOST_DEVICE; plain C++
// otherwise): the CUDA conversion kernels (oomb/cuda/page_codec_kernels.cuh) call these same
// functions, so a page encoded on the GPU has the bits the CPU gives it for the same seed and key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "oomb/core/bf16.hpp"

OOMB_NAMESPACE_BEGIN

/// How a value is rounded to bf16 when its page goes home.
enum class bf16_rounding {
  nearest_even,  ///< bf16's conversion: deterministic, biased toward the nearer value each write
  stochastic,    ///< up with probability of the dropped fraction: unbiased; seeded, counter-based
};

/// Encodes near pages of `Near` (float or double) as bf16 homes.
template <class Near>
struct bf16_codec {
  static_assert(std::is_same_v<Near, float> || std::is_same_v<Near, double>, "bf16_codec encodes float or double pages");
  using near_type = Near;
  using far_type = bf16;

  bf16_rounding rounding = bf16_rounding::nearest_even;
  std::uint64_t seed = 0;  ///< stochastic rounding only

  /// dst[i] = bf16 of src[i], i < n. `key` names this write (stochastic rounding: a page written
  /// home twice must draw other bits, so callers pass a fresh key per page write).
  void encode(const Near* src, bf16* dst, std::size_t n, std::uint64_t key) const noexcept {
    const std::uint64_t stream = write_stream(key);
    for (std::size_t i = 0; i < n; ++i) dst[i] = encode_element(src[i], stream, i);
  }

  /// dst[i] = src[i] exactly, i < n.
  static void decode(const bf16* src, Near* dst, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) dst[i] = decode_element(src[i]);
  }

  /// The random stream of the page write named `key`: element i draws its bits from (stream, i).
  OOMB_HOST_DEVICE std::uint64_t write_stream(std::uint64_t key) const noexcept {
    return mix(seed ^ mix(key + 0x9e3779b97f4a7c15ull));
  }
  /// Element `i` of a page whose write_stream is `stream`, rounded as `rounding` says.
  OOMB_HOST_DEVICE bf16 encode_element(Near x, std::uint64_t stream, std::uint64_t i) const noexcept {
    const float f = static_cast<float>(x);
    if (rounding == bf16_rounding::nearest_even) return bf16(f);
    return bf16::from_bits(stochastic_bits(f, static_cast<std::uint16_t>(mix(stream + i))));
  }
  /// Exact: every bf16 is a float and a double.
  OOMB_HOST_DEVICE static Near decode_element(bf16 h) noexcept { return static_cast<Near>(static_cast<float>(h)); }

  /// The bf16 bits of `f` rounded up in magnitude when the 16 dropped bits plus `random` carry:
  /// with probability (dropped bits) / 2^16. NaN and infinities convert as bf16 does.
  OOMB_HOST_DEVICE static std::uint16_t stochastic_bits(float f, std::uint16_t random) noexcept {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return bf16::round_bits(f);
    u += random;  // a carry into bit 16 rounds the magnitude up; the largest finite may reach infinity
    return static_cast<std::uint16_t>(u >> 16);
  }

 private:
  // splitmix64's finaliser: a bijection whose outputs of neighbouring inputs look independent.
  OOMB_HOST_DEVICE static std::uint64_t mix(std::uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
};

OOMB_NAMESPACE_END
