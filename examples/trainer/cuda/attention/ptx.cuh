// oomb trainer — the few PTX instructions the attention kernels are built from (sm_80+):
// cp.async copies into shared memory, ldmatrix fragment loads, bf16 mma.sync m16n8k16, and the
// XOR swizzle that keeps ldmatrix free of bank conflicts.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace oomb_trainer::gpu::detail {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte global -> shared copy; `valid == false` writes 16 zero bytes and reads nothing (the
/// source must still be a mapped address, so callers pass a base pointer then).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
/// 4-byte global -> shared copy (per-row scalars: lse, delta).
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// d += a * b for one 16x8x16 bf16 tile with fp32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to nearest-even bf16 and packed, the lower index in the lower half (the order
/// mma fragments use).
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

/// Adds two (v2) consecutive floats to global memory atomically (sm_90 vector reduction).
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// A shared-memory tile of bf16 with C columns (C a multiple of 64): 16-byte chunk c of row r lives
/// at chunk c ^ (r & 7). The XOR changes only the low three bits, so a chunk stays inside its
/// 128-byte group, and the 8 rows one ldmatrix reads (same chunk, consecutive rows) hit 8 distinct
/// 16-byte bank groups.
template <int C>
struct swizzled {
  static_assert(C % 64 == 0, "swizzled tiles need rows of at least 128 bytes");
  static constexpr int row_bytes = C * 2;
  __device__ __forceinline__ static std::uint32_t offset(int r, int chunk) {
    return static_cast<std::uint32_t>(r * row_bytes + ((chunk ^ (r & 7)) << 4));
  }
};

// Fragment loads for mma m16n8k16 from swizzled tiles. `lane` is the thread's lane; (r0, c0) the
// tile corner in elements (multiples of 16 / 8 as noted). Each returns what one mma operand needs.

/// A (16 x 16) at rows m0.., cols k0.. of a tile stored [m][k].
template <int C>
__device__ __forceinline__ void load_a(std::uint32_t base, int m0, int k0, int lane, std::uint32_t (&a)[4]) {
  const int j = lane >> 3, i = lane & 7;
  ldsm_x4(base + swizzled<C>::offset(m0 + ((j & 1) << 3) + i, (k0 >> 3) + (j >> 1)), a);
}
/// A (16 x 16) at m0, k0 of a tile stored transposed, [k][m].
template <int C>
__device__ __forceinline__ void load_a_t(std::uint32_t base, int m0, int k0, int lane, std::uint32_t (&a)[4]) {
  const int j = lane >> 3, i = lane & 7;
  ldsm_x4_t(base + swizzled<C>::offset(k0 + ((j >> 1) << 3) + i, (m0 >> 3) + (j & 1)), a);
}
/// B for two n-tiles (n0 .. n0+15) at k0 of a tile stored [n][k]: b[0], b[1] for n-tile n0,
/// b[2], b[3] for n-tile n0+8.
template <int C>
__device__ __forceinline__ void load_b_nk(std::uint32_t base, int n0, int k0, int lane, std::uint32_t (&b)[4]) {
  const int j = lane >> 3, i = lane & 7;
  ldsm_x4(base + swizzled<C>::offset(n0 + ((j >> 1) << 3) + i, (k0 >> 3) + (j & 1)), b);
}
/// B for two n-tiles at k0 of a tile stored [k][n] (same output order as load_b_nk).
template <int C>
__device__ __forceinline__ void load_b_kn(std::uint32_t base, int n0, int k0, int lane, std::uint32_t (&b)[4]) {
  const int j = lane >> 3, i = lane & 7;
  ldsm_x4_t(base + swizzled<C>::offset(k0 + ((j & 1) << 3) + i, (n0 >> 3) + (j >> 1)), b);
}

}  // namespace oomb_trainer::gpu::detail
