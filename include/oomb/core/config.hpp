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
// For the few host-device helpers on a kernel's hot path (oomb/attention/query_walk.hpp): inlined
// under nvcc as its __forceinline__ does; plain inline for the host compiler.
#if defined(__CUDACC__)
#define OOMB_FORCEINLINE __forceinline__
#else
#define OOMB_FORCEINLINE inline
#endif

// The bounds-check switch (OOMB_ENABLE_BOUNDS_CHECKS) is decided in version.hpp: it selects the
// inline namespace, so translation units that disagree on it cannot break the one-definition rule.
