// oomb — what the attention layer's host launchers share: alignment and size helpers, launch checks.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "oomb/core/error.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {

/// Throws oomb::cuda_error naming `what` when the launch just enqueued failed to configure (no
/// synchronisation: faults inside the kernel surface at the caller's next checked call).
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) OOMB_FAIL(cuda_error, what, ": ", cudaGetErrorString(e));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// log2 of a power of two.
inline int log2_exact(std::int32_t x) {
  int l = 0;
  while ((std::int32_t(1) << l) < x) ++l;
  return l;
}

/// Blocks of `threads` for a grid-stride loop over n items, at least 1 and at most `cap`.
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace attention::detail
OOMB_NAMESPACE_END
