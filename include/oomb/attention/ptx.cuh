// oomb — the few PTX instructions the attention kernels are built from (sm_80+):
// cp.async copies into shared memory, ldmatrix fragment loads, bf16 mma.sync m16n8k16, and the
// XOR swizzle that keeps ldmatrix free of bank conflicts.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {

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

/// The GPU's global nanosecond clock (the same on every SM; timelines across CTAs).
__device__ __forceinline__ std::uint64_t globaltimer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
/// The SM this thread runs on.
__device__ __forceinline__ int smid() {
  std::uint32_t id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return static_cast<int>(id);
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

/// Thread-block cluster (sm_90): barrier across the cluster's CTAs (release/acquire orders shared
/// memory writes before it against distributed-shared-memory reads after it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/// The address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ std::uint32_t cluster_map(std::uint32_t addr, std::uint32_t rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_cluster_v4(std::uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
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

// Fragment loads for mma m16n8k16 from swizzled tiles. An x4 ldmatrix reads four 8x8 matrices;
// lane l gives the address of row (l & 7) of matrix j = l >> 3, and which 8-row block and which
// 16-byte chunk matrix j covers depends on the operand (bit 0 or bit 1 of j). Everything that
// depends on the lane is folded into one register per (tile, pattern) up front; a fragment at
// (row0, chunk0) (row0 a multiple of 8, chunk0 even) is then that register XOR a compile-time
// constant plus a compile-time offset, because the swizzle only permutes address bits 4..6 and
// tiles start 128-byte aligned.
//
//   pattern  row block  chunk    used for
//   a_like   j & 1      j >> 1   A from [m][k] (ldmatrix), B from [k][n] (ldmatrix.trans)
//   b_like   j >> 1     j & 1    B from [n][k] (ldmatrix), A from [k][m] (ldmatrix.trans)
template <int C>
struct frag_addr {
  std::uint32_t base;
  __device__ __forceinline__ frag_addr(std::uint32_t tile, int lane, bool a_like) {
    const int j = lane >> 3, i = lane & 7;
    const int rb = a_like ? (j & 1) : (j >> 1), cb = a_like ? (j >> 1) : (j & 1);
    base = tile + static_cast<std::uint32_t>((8 * rb + i) * swizzled<C>::row_bytes + ((cb ^ i) << 4));
  }
  /// Address of the fragment whose first row is row0 and first chunk chunk0.
  __device__ __forceinline__ std::uint32_t at(int row0, int chunk0) const {
    return (base ^ static_cast<std::uint32_t>((chunk0 & 7) << 4)) +
           static_cast<std::uint32_t>(row0 * swizzled<C>::row_bytes + ((chunk0 >> 3) << 7));
  }
};

/// A (16 x 16) at (m0, k0) of a tile stored [m][k]; f: a_like.
template <int C>
__device__ __forceinline__ void load_a(const frag_addr<C>& f, int m0, int k0, std::uint32_t (&a)[4]) {
  ldsm_x4(f.at(m0, k0 >> 3), a);
}
/// A (16 x 16) at (m0, k0) of a tile stored transposed, [k][m]; f: b_like.
template <int C>
__device__ __forceinline__ void load_a_t(const frag_addr<C>& f, int m0, int k0, std::uint32_t (&a)[4]) {
  ldsm_x4_t(f.at(k0, m0 >> 3), a);
}
/// B for two n-tiles (n0 .. n0+15) at k0 of a tile stored [n][k]: b[0], b[1] for n-tile n0,
/// b[2], b[3] for n-tile n0 + 8; f: b_like.
template <int C>
__device__ __forceinline__ void load_b_nk(const frag_addr<C>& f, int n0, int k0, std::uint32_t (&b)[4]) {
  ldsm_x4(f.at(n0, k0 >> 3), b);
}
/// B for two n-tiles at k0 of a tile stored [k][n] (same output order as load_b_nk); f: a_like.
template <int C>
__device__ __forceinline__ void load_b_kn(const frag_addr<C>& f, int n0, int k0, std::uint32_t (&b)[4]) {
  ldsm_x4_t(f.at(k0, n0 >> 3), b);
}


}  // namespace attention::detail
OOMB_NAMESPACE_END
