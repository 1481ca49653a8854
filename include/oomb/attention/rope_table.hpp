// oomb — a rotary-embedding table as the page writes read it: fp32 cos and sin per position.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention {

/// cos and sin [n][half] in device memory (row t: the rotation of position t of the chunk, any RoPE
/// variant's angles already folded in by whoever built the table); half = head_dim / 2.
struct rope_table_view {
  const float* cos = nullptr;
  const float* sin = nullptr;
  std::int64_t n = 0;
  std::int32_t half = 0;
};

}  // namespace attention
OOMB_NAMESPACE_END
