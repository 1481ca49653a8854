// oomb — page summaries computed on the GPU, from the K pages or from the rows they are written from.
// SPDX-License-Identifier: Apache-2.0
//
// The device twin of page_summaries (oomb/sparse/page_summaries.hpp): the same per-page, per-KV-head
// channel min / max / mean of K, the same [num_ids][kv_heads][head_dim] float layout, read by the
// scorers through the same page_summary_view. A launch re-summarises each listed page from its
// first token (a page holds at most page_size tokens, so recomputing a partial page costs no more
// than appending to it), summing in double in token order as the host store does: the GPU's
// summaries equal the host's bit for bit, however the page was filled. A store may live in the far
// tier (pinned host memory mapped into the device: it grows with the context, the device must
// not); gather_page_summaries then copies the entries a scorer needs into a small device store.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/paging/views.hpp"
#include "oomb/sparse/page_summary_view.hpp"
#include "oomb/sparse/scoring.hpp"

OOMB_NAMESPACE_BEGIN

/// Which statistics a device store keeps: quest scoring reads only min and max, mean scoring only
/// the mean, so a store for one kind can leave the other out (2/3 or 1/3 of the bytes).
enum class summary_stats { min_max_mean, min_max, mean };

/// The statistics scoring by `kind` reads.
constexpr summary_stats summary_stats_for(score_kind kind) noexcept {
  return kind == score_kind::quest ? summary_stats::min_max : summary_stats::mean;
}

/// Writable summaries in memory kernels address (device memory, or pinned host memory mapped into
/// the device: a far-tier home), carved from one caller-owned allocation by over(): the
/// kept statistics (min, max, mean, in that order) as [num_ids][kv_heads][head_dim] floats, then
/// num_ids int32 token counts; a statistic left out is nullptr. Never owns memory; trivially
/// copyable.
struct device_page_summaries {
  float* min = nullptr;
  float* max = nullptr;
  float* mean = nullptr;
  std::int32_t* tokens = nullptr;
  std::int32_t num_ids = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;

  /// Bytes of one page id's summary: kv_heads * head_dim floats per kept statistic plus its token
  /// count (Qwen2.5-7B's 4 KV heads of head_dim 128: 6,148 B for all three, 4,100 B for min/max,
  /// 2,052 B for the mean, per layer).
  static std::size_t bytes_per_id(std::int32_t kv_heads, std::int32_t head_dim,
                                  summary_stats stats = summary_stats::min_max_mean) noexcept {
    const std::size_t arrays = stats == summary_stats::min_max_mean ? 3 : stats == summary_stats::min_max ? 2 : 1;
    return arrays * std::size_t(kv_heads) * std::size_t(head_dim) * sizeof(float) + sizeof(std::int32_t);
  }
  /// Bytes over() needs for `num_ids` ids.
  static std::size_t bytes(std::int32_t num_ids, std::int32_t kv_heads, std::int32_t head_dim,
                           summary_stats stats = summary_stats::min_max_mean) noexcept {
    return std::size_t(num_ids) * bytes_per_id(kv_heads, head_dim, stats);
  }
  /// Lays the summaries out over `storage` (device-addressable memory, 4-byte aligned, bytes(...) long).
  /// The caller clears them (clear_page_summaries) before the first read.
  static device_page_summaries over(void* storage, std::int32_t num_ids, std::int32_t kv_heads, std::int32_t head_dim,
                                    summary_stats stats = summary_stats::min_max_mean) {
    OOMB_EXPECTS(num_ids >= 0 && kv_heads > 0 && head_dim > 0, "device_page_summaries: bad shape: ",
                 num_ids, " ids, ", kv_heads, " KV heads, head_dim ", head_dim);
    OOMB_EXPECTS(storage != nullptr || num_ids == 0, "device_page_summaries: null storage for ", num_ids, " ids");
    OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(storage) & 3) == 0,
                 "device_page_summaries: storage is not 4-byte aligned");
    const std::size_t row = std::size_t(num_ids) * std::size_t(kv_heads) * std::size_t(head_dim);
    device_page_summaries s;
    float* at = static_cast<float*>(storage);
    if (stats != summary_stats::mean) {
      s.min = at;
      s.max = at + row;
      at += 2 * row;
    }
    if (stats != summary_stats::min_max) {
      s.mean = at;
      at += row;
    }
    s.tokens = reinterpret_cast<std::int32_t*>(at);
    s.num_ids = num_ids;
    s.kv_heads = kv_heads;
    s.head_dim = head_dim;
    return s;
  }

  /// The read-only view the scorers take (host or device code; the memory stays where it is).
  OOMB_HOST_DEVICE page_summary_view view() const noexcept {
    page_summary_view v;
    v.min = min;
    v.max = max;
    v.mean = mean;
    v.tokens = tokens;
    v.num_ids = num_ids;
    v.kv_heads = kv_heads;
    v.head_dim = head_dim;
    return v;
  }
};

static_assert(std::is_trivially_copyable_v<device_page_summaries>, "views must be PODs for kernels");

namespace detail {

inline constexpr int page_summary_threads = 128;

OOMB_KERNEL_NAMESPACE_BEGIN

/// One block summarises page `id` over its first n tokens, whose keys key(t, h) points to (channel
/// 0 of KV head h); thread x owns (kv head, channel) pairs x, x + blockDim.x, ..., so a warp reads
/// contiguous channels of one token.
template <class E, class Key>
__device__ void summarize_one_page(Key key, std::int32_t n, std::int32_t id, const device_page_summaries& out) {
  const std::int32_t pairs = out.kv_heads * out.head_dim;
  for (std::int32_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const std::int32_t h = p / out.head_dim, c = p - h * out.head_dim;
    float mn = HUGE_VALF, mx = -HUGE_VALF;
    double sum = 0.0;
    for (std::int32_t t = 0; t < n; ++t) {  // token order: the host store's summation order
      const float f = static_cast<float>(key(t, h)[c]);
      mn = f < mn ? f : mn;
      mx = f > mx ? f : mx;
      sum += static_cast<double>(f);
    }
    const std::int64_t at = out.view().offset(id, h) + c;
    if (out.min != nullptr) {
      out.min[at] = mn;
      out.max[at] = mx;
    }
    if (out.mean != nullptr) out.mean[at] = n == 0 ? 0.0f : static_cast<float>(sum / n);
  }
  if (threadIdx.x == 0) out.tokens[id] = n;
}

/// Block i summarises page ids[i] of the pool over its first counts[i] tokens (clamped to
/// [0, page_size]); counts == nullptr means whole pages.
template <class E>
OOMB_KERNEL void __launch_bounds__(page_summary_threads)
    summarize_pages_kernel(page_pool_view<const E> pool, const std::int32_t* __restrict__ ids,
                           const std::int32_t* __restrict__ counts, device_page_summaries out) {
  const std::int32_t id = ids[blockIdx.x];
  std::int32_t n = counts == nullptr ? pool.page_size : counts[blockIdx.x];
  n = n < 0 ? 0 : n > pool.page_size ? pool.page_size : n;
  summarize_one_page<E>([&](std::int32_t t, std::int32_t h) { return pool.k(id, t, h); }, n, id, out);
}

/// Block i summarises page ids[i] as holding rows [i * page_size, min(rows, (i + 1) * page_size))
/// of keys [rows][kv_heads][head_dim] (contiguous).
template <class E>
OOMB_KERNEL void __launch_bounds__(page_summary_threads)
    summarize_key_rows_kernel(const E* __restrict__ keys, std::int64_t rows, std::int32_t page_size,
                              const std::int32_t* __restrict__ ids, device_page_summaries out) {
  const std::int64_t first = std::int64_t(blockIdx.x) * page_size;
  const std::int64_t left = rows - first;
  const std::int32_t n = left <= 0 ? 0 : left < page_size ? static_cast<std::int32_t>(left) : page_size;
  const std::int64_t row = std::int64_t(out.kv_heads) * out.head_dim;
  summarize_one_page<E>(
      [&](std::int32_t t, std::int32_t h) { return keys + (first + t) * row + std::int64_t(h) * out.head_dim; }, n,
      ids[blockIdx.x], out);
}

OOMB_KERNEL_NAMESPACE_END

}  // namespace detail

/// Enqueues on `stream` the summaries of `count` K pages of `pool` (device memory, element type
/// bf16 or float): page ids[i] summarised over its first counts[i] tokens, as the host's
/// page_summaries would after those tokens were appended. `ids` and `counts` are device arrays of
/// `count` entries (counts == nullptr: every page full); a count outside [0, page_size] is taken
/// as the nearest of the two, count 0 empties the summary (a released id). Ids must lie in
/// [0, out.num_ids) and be distinct within a launch. Allocates nothing, never synchronises: call
/// it behind the kernel that wrote the pages, on the same stream. Throws invalid_argument for
/// mismatched shapes, cuda_error if the launch fails.
template <class E>
void summarize_pages(const page_pool_view<const E>& pool, const std::int32_t* ids, const std::int32_t* counts,
                     std::int32_t count, const device_page_summaries& out, cuda_stream_view stream) {
  OOMB_EXPECTS(pool.kv_heads == out.kv_heads && pool.head_dim == out.head_dim,
               "summarize_pages: pool pages have ", pool.kv_heads, " KV heads of head_dim ", pool.head_dim,
               ", the summaries ", out.kv_heads, " of ", out.head_dim);
  OOMB_EXPECTS(count >= 0, "summarize_pages: negative page count ", count);
  if (count == 0) return;
  OOMB_EXPECTS(pool.base != nullptr && ids != nullptr && out.tokens != nullptr,
               "summarize_pages: null pool, ids or summaries for ", count, " pages");
  detail::summarize_pages_kernel<E><<<static_cast<unsigned>(count), detail::page_summary_threads, 0, stream>>>(
      pool, ids, counts, out);
  OOMB_CUDA_CHECK_LAUNCH("summarize_pages: launching for ", count, " pages");
}

/// Enqueues on `stream` the summaries of `count` pages written from rows of keys: page ids[i]
/// holds rows [i * page_size, min(rows, (i + 1) * page_size)) of `keys` ([rows][kv_heads][head_dim],
/// contiguous, device memory, bf16 or float), summarised from its first token as summarize_pages
/// does from the pool (the same bits, when the pool holds the same values); a page past the last
/// row is emptied, so rows == 0 empties all `count` (keys may then be null). What a trainer calls
/// where a chunk's keys are still in device memory and its pages may not be (offload). `ids`:
/// device, `count` distinct entries in [0, out.num_ids). Allocates nothing, never synchronises.
/// Throws invalid_argument for a bad size, cuda_error if the launch fails.
template <class E>
void summarize_key_rows(const E* keys, std::int64_t rows, std::int32_t page_size, const std::int32_t* ids,
                        std::int32_t count, const device_page_summaries& out, cuda_stream_view stream) {
  OOMB_EXPECTS(rows >= 0 && page_size > 0 && count >= 0, "summarize_key_rows: ", rows, " rows, page size ",
               page_size, ", ", count, " pages");
  if (count == 0) return;
  OOMB_EXPECTS((keys != nullptr || rows == 0) && ids != nullptr && out.tokens != nullptr,
               "summarize_key_rows: null keys, ids or summaries for ", count, " pages");
  detail::summarize_key_rows_kernel<E><<<static_cast<unsigned>(count), detail::page_summary_threads, 0, stream>>>(
      keys, rows, page_size, ids, out);
  OOMB_CUDA_CHECK_LAUNCH("summarize_key_rows: launching for ", count, " pages");
}

namespace detail {
OOMB_KERNEL_NAMESPACE_BEGIN
template <int = 0>
OOMB_KERNEL void clear_page_summaries_kernel(device_page_summaries s) {
  const std::int64_t row = std::int64_t(s.num_ids) * s.kv_heads * s.head_dim;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < row;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    if (s.min != nullptr) {
      s.min[i] = HUGE_VALF;
      s.max[i] = -HUGE_VALF;
    }
    if (s.mean != nullptr) s.mean[i] = 0.0f;
    if (i < s.num_ids) s.tokens[i] = 0;
  }
}
OOMB_KERNEL_NAMESPACE_END
}  // namespace detail

/// Enqueues on `stream` the emptying of every summary (what a fresh host page_summaries holds:
/// min +infinity, max -infinity, mean 0, no tokens). Throws cuda_error if the launch fails.
inline void clear_page_summaries(const device_page_summaries& s, cuda_stream_view stream) {
  if (s.num_ids == 0) return;
  detail::clear_page_summaries_kernel<0><<<1024, 256, 0, stream>>>(s);
  OOMB_CUDA_CHECK_LAUNCH("clear_page_summaries: launching for ", s.num_ids, " ids");
}

namespace detail {
OOMB_KERNEL_NAMESPACE_BEGIN
/// Block i copies summary ids[i] of `src` into entry i of `dst`: each statistic `dst` keeps, its
/// [kv_heads][head_dim] row (contiguous, so a block's reads are too), and the token count.
template <int = 0>
OOMB_KERNEL void __launch_bounds__(page_summary_threads)
    gather_page_summaries_kernel(page_summary_view src, const std::int32_t* __restrict__ ids,
                                 device_page_summaries dst) {
  const std::int32_t id = ids[blockIdx.x];
  const std::int64_t row = std::int64_t(src.kv_heads) * src.head_dim;
  const std::int64_t from = std::int64_t(id) * row, to = std::int64_t(blockIdx.x) * row;
  for (std::int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    if (dst.min != nullptr) {
      dst.min[to + c] = src.min[from + c];
      dst.max[to + c] = src.max[from + c];
    }
    if (dst.mean != nullptr) dst.mean[to + c] = src.mean[from + c];
  }
  if (threadIdx.x == 0) dst.tokens[blockIdx.x] = src.tokens[id];
}
OOMB_KERNEL_NAMESPACE_END
}  // namespace detail

/// Enqueues on `stream` the copy of summaries ids[0 .. count) of `src` into entries 0 .. count of
/// `dst`, bit for bit: what a scorer needs of a far-tier store (`src` in mapped pinned memory,
/// read once over the bus) gathered into a compact device store it then reads as often as it
/// likes. Both stores have the same shape; `dst` keeps a subset of the statistics `src` keeps
/// (only those are copied: a store for one scoring kind from a store of all three); `ids` is a
/// device array of `count` entries in [0, src.num_ids) (repeats allowed); count <= dst.num_ids.
/// Allocates nothing, never synchronises. Throws invalid_argument for mismatched stores or a bad
/// count, cuda_error if the launch fails.
inline void gather_page_summaries(const page_summary_view& src, const std::int32_t* ids, std::int32_t count,
                                  const device_page_summaries& dst, cuda_stream_view stream) {
  OOMB_EXPECTS(src.kv_heads == dst.kv_heads && src.head_dim == dst.head_dim, "gather_page_summaries: the source has ",
               src.kv_heads, " KV heads of head_dim ", src.head_dim, ", the destination ", dst.kv_heads, " of ",
               dst.head_dim);
  OOMB_EXPECTS((dst.min == nullptr || (src.min != nullptr && src.max != nullptr)) &&
                   (dst.mean == nullptr || src.mean != nullptr),
               "gather_page_summaries: the destination keeps statistics the source does not");
  OOMB_EXPECTS(count >= 0 && count <= dst.num_ids, "gather_page_summaries: ", count,
               " summaries into a store of ", dst.num_ids);
  if (count == 0) return;
  OOMB_EXPECTS(ids != nullptr && src.tokens != nullptr && dst.tokens != nullptr,
               "gather_page_summaries: null ids or stores for ", count, " summaries");
  detail::gather_page_summaries_kernel<0><<<static_cast<unsigned>(count), detail::page_summary_threads, 0, stream>>>(
      src, ids, dst);
  OOMB_CUDA_CHECK_LAUNCH("gather_page_summaries: launching for ", count, " summaries");
}

/// As above from a writable store.
inline void gather_page_summaries(const device_page_summaries& src, const std::int32_t* ids, std::int32_t count,
                                  const device_page_summaries& dst, cuda_stream_view stream) {
  gather_page_summaries(src.view(), ids, count, dst, stream);
}

OOMB_NAMESPACE_END
