// oomb — a chunk's projected K and V into its K/V pages, as chunk_recurrent.hpp's
// write_kv does on the CPU, through the library's page_pool_view (head_major or token_major: only
// the strides differ). Optionally applies RoPE to K on the way (k straight from its projection),
// which saves the separate pass over K that ops::rope_forward would make.
// SPDX-License-Identifier: Apache-2.0
//
// One thread moves 2 x 8 elements of one (token, head) row of K and of V: dims [8j, 8j + 8) and
// the RoPE partners [d/2 + 8j, d/2 + 8j + 8), as 16-byte loads and stores. The rotation is
// rounded step by step (no fused multiply-add), exactly as cpu::rope_forward computes it in float,
// so pages written here equal the CPU path's bit for bit.
#pragma once

#include <cstdint>

#include "oomb/attention/rope_table.hpp"
#include "oomb/attention/chunk_pages.cuh"
#include "oomb/cuda/kernel_linkage.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention {

namespace detail {
OOMB_KERNEL_NAMESPACE_BEGIN

__device__ __forceinline__ void unpack8(const uint4& w, float (&x)[8]) {
  const std::uint32_t u[4] = {w.x, w.y, w.z, w.w};
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(u[i] << 16);
    x[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  std::uint32_t u[4];
  for (int i = 0; i < 4; ++i)
    u[i] = std::uint32_t(bf16(x[2 * i]).bits) | (std::uint32_t(bf16(x[2 * i + 1]).bits) << 16);
  return make_uint4(u[0], u[1], u[2], u[3]);
}

/// Item (t, h, j): row t of the chunk, kv head h, dims 8j.. and d/2 + 8j.. of K and V.
template <bool Rotate>
OOMB_KERNEL void write_kv_pages_kernel(std::int64_t n, std::int32_t heads, std::int32_t d, int log_page,
                                      const bf16* __restrict__ k, const bf16* __restrict__ v,
                                      const std::int32_t* __restrict__ pages, std::int32_t pool_pages,
                                      page_pool_view<bf16> pool, const float* __restrict__ cos_t,
                                      const float* __restrict__ sin_t, std::int32_t* bad_page) {
  const std::int32_t half = d / 2, groups = d / 16;
  const std::int64_t count = n * heads * groups;
  for (std::int64_t item = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; item < count;
       item += std::int64_t(gridDim.x) * blockDim.x) {
    const auto j = static_cast<std::int32_t>(item % groups);
    const std::int64_t row = item / groups;  // t * heads + h
    const auto h = static_cast<std::int32_t>(row % heads);
    const std::int64_t t = row / heads;
    const std::int64_t page = t >> log_page;
    const std::int32_t id = pages[page];
    if (id < 0 || id >= pool_pages) {
      report_bad_page(bad_page, page);
      continue;
    }
    const auto tok = static_cast<std::int32_t>(t & ((std::int64_t(1) << log_page) - 1));
    const std::int64_t src = row * d + 8 * j;
    bf16* kd = pool.k(id, tok, h) + 8 * j;
    bf16* vd = pool.v(id, tok, h) + 8 * j;
    const uint4 ka = *reinterpret_cast<const uint4*>(k + src), kb = *reinterpret_cast<const uint4*>(k + src + half);
    const uint4 va = *reinterpret_cast<const uint4*>(v + src), vb = *reinterpret_cast<const uint4*>(v + src + half);
    if constexpr (Rotate) {
      float a[8], b[8], ra[8], rb[8];
      unpack8(ka, a);
      unpack8(kb, b);
      const float* c = cos_t + t * half + 8 * j;
      const float* s = sin_t + t * half + 8 * j;
      for (int e = 0; e < 8; ++e) {
        ra[e] = __fsub_rn(__fmul_rn(a[e], c[e]), __fmul_rn(b[e], s[e]));
        rb[e] = __fadd_rn(__fmul_rn(b[e], c[e]), __fmul_rn(a[e], s[e]));
      }
      *reinterpret_cast<uint4*>(kd) = pack8(ra);
      *reinterpret_cast<uint4*>(kd + half) = pack8(rb);
    } else {
      *reinterpret_cast<uint4*>(kd) = ka;
      *reinterpret_cast<uint4*>(kd + half) = kb;
    }
    *reinterpret_cast<uint4*>(vd) = va;
    *reinterpret_cast<uint4*>(vd + half) = vb;
  }
}

template <bool Rotate>
void write_kv_pages_launch(const char* what, std::int64_t n, std::int32_t heads, std::int32_t d, const bf16* k,
                           const bf16* v, const std::int32_t* pages, std::int32_t pool_pages,
                           const page_pool_view<bf16>& pool, const rope_table_view* rope,
                           std::int32_t* bad_page, stream_view stream) {
  check_chunk(what, n, heads, d, 8, pages, pool, bad_page);
  OOMB_EXPECTS(d % 16 == 0, what, ": head_dim must be a multiple of 16, got ", d);
  OOMB_EXPECTS(k != nullptr && v != nullptr, what, ": null pointer");
  OOMB_EXPECTS(aligned16(k) && aligned16(v), what, ": k and v must be 16-byte aligned");
  OOMB_EXPECTS(pool_pages > 0, what, ": pool_pages must be positive, got ", pool_pages);
  if (rope != nullptr) {
    OOMB_EXPECTS(rope->cos != nullptr && rope->sin != nullptr, what, ": null rope table");
    OOMB_EXPECTS(rope->half == d / 2, what, ": the rope table is for head_dim ", 2 * rope->half, ", k has head_dim ", d);
    OOMB_EXPECTS(rope->n >= n, what, ": the rope table holds ", rope->n, " positions, the chunk has ", n, " tokens");
  }
  const std::int64_t count = n * heads * (d / 16);
  write_kv_pages_kernel<Rotate><<<grid_for(count, 256), 256, 0, stream.get()>>>(
      n, heads, d, log2_exact(pool.page_size), k, v, pages, pool_pages, pool, rope ? rope->cos : nullptr,
      rope ? rope->sin : nullptr, bad_page);
  OOMB_CUDA_CHECK_LAUNCH(what, ": kernel launch");
}

OOMB_KERNEL_NAMESPACE_END
}  // namespace detail

/// Writes k and v [n][heads][d] (bf16, k already rotated) into the pages of a chunk of n tokens:
/// token t into page pages[t / page_size] (an id or slot of `pool`, in [0, pool_pages)), row
/// t % page_size. pages: device, chunk_page_count(n, page_size) entries, distinct. Rows past n in
/// the last page are left as they are. A list entry out of range: that page is skipped and its
/// index recorded in *bad_page (device; the caller sets it to -1). d: a multiple of 16.
inline void write_kv_pages(std::int64_t n, std::int32_t heads, std::int32_t d, const bf16* k, const bf16* v,
                           const std::int32_t* pages, std::int32_t pool_pages, const page_pool_view<bf16>& pool,
                           std::int32_t* bad_page, stream_view stream) {
  detail::write_kv_pages_launch<false>("write_kv_pages", n, heads, d, k, v, pages, pool_pages, pool, nullptr, bad_page,
                                       stream);
}

/// As write_kv_pages, with k straight from its projection: the pages receive k rotated by
/// `rope` (row t at the table's position t; the fp32 cos/sin of ops::rope_forward), rounded to
/// bf16 once. k itself is not changed.
inline void write_kv_pages_rotating_k(std::int64_t n, std::int32_t heads, std::int32_t d, const bf16* k, const bf16* v,
                                      const rope_table_view& rope, const std::int32_t* pages,
                                      std::int32_t pool_pages, const page_pool_view<bf16>& pool,
                                      std::int32_t* bad_page, stream_view stream) {
  detail::write_kv_pages_launch<true>("write_kv_pages_rotating_k", n, heads, d, k, v, pages, pool_pages, pool, &rope,
                                      bad_page, stream);
}

}  // namespace attention
OOMB_NAMESPACE_END
