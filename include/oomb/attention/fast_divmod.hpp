// oomb — division by a run-time divisor as a multiply and a shift, for the attention kernels' row
// arithmetic (packed rows to queries and heads, rows to sparse tiles).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {

/// n / d and n % d for a run-time divisor by one multiply-high (Granlund-Montgomery, round up):
/// exact for 0 <= n < 2^31 and 1 <= d < 2^31. Host and device, so tests check it on the host.
struct fast_divmod {
  std::uint32_t d = 1, m = 0, s = 0;
  fast_divmod() = default;
  explicit fast_divmod(std::uint32_t div) : d(div) {
    if (d == 1) return;
    std::uint32_t l = 0;
    while ((std::uint64_t(1) << l) < d) ++l;  // ceil(log2 d)
    const std::uint64_t p = std::uint64_t(1) << (31 + l);
    m = static_cast<std::uint32_t>((p + d - 1) / d);
    s = l - 1;
  }
  OOMB_HOST_DEVICE OOMB_FORCEINLINE std::uint32_t div(std::uint32_t n) const {
    return d == 1 ? n : static_cast<std::uint32_t>((std::uint64_t(n) * m) >> 32) >> s;
  }
};

}  // namespace attention::detail
OOMB_NAMESPACE_END
