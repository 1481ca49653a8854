// oomb — the chunk's own dK/dV: what later chunks added into the gradient pages of the
// chunk's own K/V pages, added to the chunk-local dK/dV the attention backward wrote, as the end
// of chunk_recurrent.hpp's attend_backward does on the CPU ("dK_c = local + mirror").
// SPDX-License-Identifier: Apache-2.0
//
// The converse direction, dK/dV of attended past pages into their gradient pages, is not here:
// attention_backward adds it itself (its dpast argument, the same grad_mirror_view). The inverse
// RoPE of the summed dK stays with ops::rope_backward.
//
// One thread adds 4 fp32 (16 bytes) of one (token, head) row of dK and of dV. Each element is one
// fp32 add of the same two values as on the CPU, so the result equals the CPU path's bit for bit.
#pragma once

#include <cstdint>

#include "oomb/attention/chunk_pages.cuh"
#include "oomb/cuda/kernel_linkage.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention {

namespace detail {
OOMB_KERNEL_NAMESPACE_BEGIN

/// Item (t, h, j): row t of the chunk, kv head h, dims [4j, 4j + 4). A template, so that every
/// translation unit may include it (one definition each).
template <int = 0>
OOMB_KERNEL void add_own_page_grads_kernel(std::int64_t n, std::int32_t heads, std::int32_t d, int log_page,
                                          const std::int32_t* __restrict__ pages, grad_mirror_view<float> mirror,
                                          float* __restrict__ dk, float* __restrict__ dv, std::int32_t* bad_page) {
  const std::int32_t groups = d / 4;
  const std::int64_t count = n * heads * groups;
  for (std::int64_t item = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; item < count;
       item += std::int64_t(gridDim.x) * blockDim.x) {
    const auto j = static_cast<std::int32_t>(item % groups);
    const std::int64_t row = item / groups;  // t * heads + h
    const auto h = static_cast<std::int32_t>(row % heads);
    const std::int64_t t = row / heads;
    const std::int64_t page = t >> log_page;
    const std::int32_t id = pages[page];
    if (id < 0 || id >= mirror.num_kv_ids) {
      report_bad_page(bad_page, page);
      continue;
    }
    if (mirror.grad_id[id] < 0) continue;  // no later chunk attended this page: nothing to add
    const auto tok = static_cast<std::int32_t>(t & ((std::int64_t(1) << log_page) - 1));
    const float4 gk = *reinterpret_cast<const float4*>(mirror.dk(id, tok, h) + 4 * j);
    const float4 gv = *reinterpret_cast<const float4*>(mirror.dv(id, tok, h) + 4 * j);
    float4* lk = reinterpret_cast<float4*>(dk + row * d + 4 * j);
    float4* lv = reinterpret_cast<float4*>(dv + row * d + 4 * j);
    float4 a = *lk, b = *lv;
    a.x += gk.x;
    a.y += gk.y;
    a.z += gk.z;
    a.w += gk.w;
    b.x += gv.x;
    b.y += gv.y;
    b.z += gv.z;
    b.w += gv.w;
    *lk = a;
    *lv = b;
  }
}

OOMB_KERNEL_NAMESPACE_END
}  // namespace detail

/// dk, dv [n][heads][d] (fp32, the chunk's local gradients) += the gradient pages of the chunk's
/// own K/V pages: token t reads row t % page_size of the gradient pair mirror.grad_id[pages[t /
/// page_size]]; a page whose grad_id is -1 has no gradient and adds nothing. pages: device,
/// chunk_page_count(n, page_size) entries in the id space mirror.grad_id is indexed by (far K/V
/// ids, or near slots with offload). An entry outside [0, mirror.num_kv_ids): that page is
/// skipped and its index recorded in *bad_page (device; the caller sets it to -1). The gradient
/// pages are only read. d: a multiple of 4; dk, dv and the gradient pool 16-byte aligned.
inline void add_own_page_grads(std::int64_t n, std::int32_t heads, std::int32_t d, const std::int32_t* pages,
                               const grad_mirror_view<float>& mirror, float* dk, float* dv, std::int32_t* bad_page,
                               stream_view stream) {
  const char* what = "add_own_page_grads";
  detail::check_chunk(what, n, heads, d, 4, pages, mirror.pool, bad_page);
  OOMB_EXPECTS(d % 4 == 0, what, ": head_dim must be a multiple of 4, got ", d);
  OOMB_EXPECTS(mirror.grad_id != nullptr && mirror.num_kv_ids > 0, what, ": the mirror view has no grad_id table");
  OOMB_EXPECTS(dk != nullptr && dv != nullptr && dk != dv, what, ": dk and dv must be distinct, non-null arrays");
  OOMB_EXPECTS(detail::aligned16(dk) && detail::aligned16(dv), what, ": dk and dv must be 16-byte aligned");
  const std::int64_t count = n * heads * (d / 4);
  detail::add_own_page_grads_kernel<><<<detail::grid_for(count, 256), 256, 0, stream.get()>>>(
      n, heads, d, detail::log2_exact(mirror.pool.page_size), pages, mirror, dk, dv, bad_page);
  OOMB_CUDA_CHECK_LAUNCH(what, ": kernel launch");
}

}  // namespace attention
OOMB_NAMESPACE_END
