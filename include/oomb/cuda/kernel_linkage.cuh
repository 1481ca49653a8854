// oomb — how kernels defined in oomb's headers link: hidden, and keyed by the target architectures.
// SPDX-License-Identifier: Apache-2.0
//
// A kernel template in a header is instantiated in every translation unit that launches it. Two
// shared libraries of one program (say, a framework's extension and oomb's own user) may both
// contain it, compiled for different architectures: if the symbol were exported, the dynamic
// linker would bind every launch to one copy, whose fatbinary may lack the caller's GPU. So, as
// CUB does, kernels are declared with hidden visibility (never exported from a shared library)
// inside an inline namespace named after the architectures nvcc compiles for
// (__CUDA_ARCH_LIST__, e.g. sm_800_900), so copies for different targets are different symbols
// even within one library. sm_90 and sm_90a share a name (nvcc lists both as 900).
#pragma once

#include "oomb/core/config.hpp"

#define OOMB_DETAIL_PP_CAT2(a, b) a##b
#define OOMB_DETAIL_PP_CAT(a, b) OOMB_DETAIL_PP_CAT2(a, b)
#define OOMB_DETAIL_PP_COUNT(...) OOMB_DETAIL_PP_COUNT_I(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define OOMB_DETAIL_PP_COUNT_I(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define OOMB_DETAIL_ARCH_NS_1(a) sm_##a
#define OOMB_DETAIL_ARCH_NS_2(a, b) sm_##a##_##b
#define OOMB_DETAIL_ARCH_NS_3(a, b, c) sm_##a##_##b##_##c
#define OOMB_DETAIL_ARCH_NS_4(a, b, c, d) sm_##a##_##b##_##c##_##d
#define OOMB_DETAIL_ARCH_NS_5(a, b, c, d, e) sm_##a##_##b##_##c##_##d##_##e
#define OOMB_DETAIL_ARCH_NS_6(a, b, c, d, e, f) sm_##a##_##b##_##c##_##d##_##e##_##f
#define OOMB_DETAIL_ARCH_NS_7(a, b, c, d, e, f, g) sm_##a##_##b##_##c##_##d##_##e##_##f##_##g
#define OOMB_DETAIL_ARCH_NS_8(a, b, c, d, e, f, g, h) sm_##a##_##b##_##c##_##d##_##e##_##f##_##g##_##h
#define OOMB_DETAIL_ARCH_NS(...) OOMB_DETAIL_PP_CAT(OOMB_DETAIL_ARCH_NS_, OOMB_DETAIL_PP_COUNT(__VA_ARGS__))(__VA_ARGS__)

/// The inline namespace oomb's kernels live in: sm_<arch>_<arch>... from __CUDA_ARCH_LIST__ (up
/// to eight architectures), or sm_host where nvcc does not say (a host compiler: no kernels).
#if defined(__CUDA_ARCH_LIST__)
#define OOMB_KERNEL_ARCH_NAMESPACE OOMB_DETAIL_ARCH_NS(__CUDA_ARCH_LIST__)
#else
#define OOMB_KERNEL_ARCH_NAMESPACE sm_host
#endif

/// Opens and closes the architecture-keyed namespace around kernels (inside OOMB_NAMESPACE_BEGIN).
#define OOMB_KERNEL_NAMESPACE_BEGIN inline namespace OOMB_KERNEL_ARCH_NAMESPACE {
#define OOMB_KERNEL_NAMESPACE_END }

/// Declares a kernel that no shared library exports: `template <...> OOMB_KERNEL void k(...)`.
#if defined(_MSC_VER)
#define OOMB_KERNEL __global__
#else
#define OOMB_KERNEL __global__ __attribute__((visibility("hidden")))
#endif
