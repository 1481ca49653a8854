// oomb — compiler glue shared by every header: host/device annotations and debug checks.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "oomb/core/version.hpp"

// Kernels see small POD views whose accessors run on both sides. Under g++ the macro is empty, so
// the CPU-only core never needs a CUDA include path.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define OOMB_HOST_DEVICE __host__ __device__
#else
#define OOMB_HOST_DEVICE
#endif

// Index checks in views cost a branch per access: on in debug builds (no NDEBUG), or when the
// user defines OOMB_ENABLE_BOUNDS_CHECKS. They throw on the host; device code never checks.
#if !defined(OOMB_ENABLE_BOUNDS_CHECKS) && !defined(NDEBUG)
#define OOMB_ENABLE_BOUNDS_CHECKS 1
#endif
