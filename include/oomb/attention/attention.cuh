// oomb — the GPU attention entry points: plan-driven launches of the paged attention kernels.
// SPDX-License-Identifier: Apache-2.0
//
//   current_device_facts()                          the device's immutable facts, queried once
//   plan_forward(shape, facts, options)             (plan.hpp) which kernel, which split
//   forward(plan, args, o, lse, stream)             o [sq][hq][d] (bf16 or float), lse [hq][sq]
//   merge(sq, hq, d, o_acc, lse_acc, o, lse, stream)   windows fold by log-sum-exp
//   backward_delta(sq, hq, d, o, d_o, delta, stream)   delta [hq][sq] = rowsum(dO o O)
//   plan_backward(shape, facts, options)            (plan.hpp) which kernel, split, sparse order, workspace
//   backward(plan, args, lse, delta, d_o, dq, dk_own, dv_own, dpast, workspace, stream)
// A launch checks its arguments (oomb exceptions naming the values) and that they are the shape the
// plan was made for, then enqueues on the caller's stream: no allocation, no host synchronisation,
// no process-wide state (the kernel choice is the plan's; device facts are cached per device).
// The backward of one window takes the GLOBAL lse (after all windows merged) and the delta of the
// global O; it adds into dq [sq][hq][d], dk_own / dv_own [sq][hkv][d] (row = position - q_start)
// and the fp32 gradient pages of past pages (dpast.grad_page[j] >= 0 for every past page entry j
// of the window's table that the window reads). Summing the backward over windows that partition
// the keys equals one pass.
// The forward may split a row block's keys over a cluster of 2-4 CTAs (merged in distributed
// shared memory), the backward may split a key block's query tiles over CTAs (dK/dV then added
// atomically). dq always goes through atomics, so the backward's fp32 sums are not bitwise
// reproducible run to run.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/args.hpp"
#include "oomb/attention/common.cuh"
#include "oomb/attention/plan.hpp"
#include "oomb/attention/variants.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention {

namespace detail {

/// Checks what both directions need and derives the kernels' parameters.
inline kernel_params make_params(const attention_args& a, int rows_per_tile_multiple) {
  OOMB_EXPECTS(a.q != nullptr, "attention: q is null");
  OOMB_EXPECTS(a.sq > 0, "attention: sq must be positive, got ", a.sq);
  OOMB_EXPECTS(a.hq > 0 && a.hkv > 0 && a.hq % a.hkv == 0, "attention: hq (", a.hq,
               ") must be a positive multiple of hkv (", a.hkv, ")");
  OOMB_EXPECTS(a.d == 64 || a.d == 128, "attention: head_dim must be 64 or 128, got ", a.d);
  OOMB_EXPECTS(a.q_start >= 0, "attention: q_start must be >= 0, got ", a.q_start);
  OOMB_EXPECTS(std::isfinite(a.scale) && a.scale > 0.0f, "attention: scale must be positive and finite, got ", a.scale);
  OOMB_EXPECTS(std::int64_t(a.sq) * a.hq * a.d < (std::int64_t(1) << 31) && std::int64_t(a.sq) * (a.hq / a.hkv) < (std::int64_t(1) << 30),
               "attention: sq * hq * d must be below 2^31, got sq = ", a.sq, ", hq = ", a.hq);
  const auto& pool = a.kv.pool;
  const auto& table = a.kv.table;
  OOMB_EXPECTS(pool.base != nullptr, "attention: kv.pool.base is null");
  OOMB_EXPECTS(table.indptr != nullptr && table.indices != nullptr && table.last_page_len != nullptr,
               "attention: kv.table has a null array");
  OOMB_EXPECTS(pool.page_size >= 16 && (pool.page_size & (pool.page_size - 1)) == 0,
               "attention: page_size must be a power of two >= 16, got ", pool.page_size);
  OOMB_EXPECTS(table.page_size == pool.page_size, "attention: kv.table.page_size (", table.page_size,
               ") differs from kv.pool.page_size (", pool.page_size, ")");
  OOMB_EXPECTS(pool.head_dim == a.d, "attention: kv.pool.head_dim (", pool.head_dim, ") differs from d (", a.d, ")");
  OOMB_EXPECTS(pool.kv_heads == a.hkv, "attention: kv.pool.kv_heads (", pool.kv_heads, ") differs from hkv (", a.hkv, ")");
  OOMB_EXPECTS(aligned16(pool.base) && aligned16(a.q), "attention: q and kv.pool.base must be 16-byte aligned");
  OOMB_EXPECTS(pool.pair_stride % 8 == 0 && pool.v_offset % 8 == 0 && pool.stride_token % 8 == 0 &&
                   pool.stride_head % 8 == 0,
               "attention: page strides must be multiples of 8 elements (16 bytes), got pair_stride ",
               pool.pair_stride, ", v_offset ", pool.v_offset, ", stride_token ", pool.stride_token,
               ", stride_head ", pool.stride_head);
  OOMB_EXPECTS(a.first_page >= 0, "attention: first_page must be >= 0, got ", a.first_page);
  OOMB_EXPECTS(a.window_pages >= 0 && std::int64_t(a.window_pages) * pool.page_size < (std::int64_t(1) << 31),
               "attention: window_pages out of range: ", a.window_pages);
  const int group = a.hq / a.hkv;
  if (a.tile_indptr != nullptr || a.tile_pages != nullptr) {
    OOMB_EXPECTS(a.tile_indptr != nullptr && a.tile_pages != nullptr,
                 "attention: sparse needs both tile_indptr and tile_pages");
    OOMB_EXPECTS(a.tile > 0 && (std::int64_t(a.tile) * group) % rows_per_tile_multiple == 0,
                 "attention: sparse tile (", a.tile, " queries) times group (", group, ") must be a multiple of ",
                 rows_per_tile_multiple, " rows");
    OOMB_EXPECTS(std::int64_t(a.tile) * group < (std::int64_t(1) << 30), "attention: sparse tile too large: ", a.tile);
    OOMB_EXPECTS((a.sq + a.tile - 1) / a.tile <= 4096, "attention: at most 4096 sparse query tiles per call, got ",
                 (a.sq + a.tile - 1) / a.tile);
  }
  OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(a.key_lower) & 7u) == 0, "attention: key_lower must be 8-byte aligned");
  kernel_params p{};
  p.q = reinterpret_cast<const std::uint16_t*>(a.q);
  p.q_start = a.q_start;
  p.sq = a.sq;
  p.hq = a.hq;
  p.hkv = a.hkv;
  p.group = group;
  p.group_div = fast_divmod(static_cast<std::uint32_t>(group));
  p.scale = a.scale;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.pool = pool;
  p.indptr = table.indptr;
  p.indices = table.indices;
  p.last_page_len = table.last_page_len;
  p.log_page = log2_exact(pool.page_size);
  p.first_page = a.first_page;
  p.tile_indptr = a.tile_indptr;
  p.tile_pages = a.tile_pages;
  p.tile = a.tile;
  p.key_lower = a.key_lower;
  p.stagger = false;
  p.heads_interleaved = false;
  p.trace = nullptr;
  p.dq_turns = nullptr;
  p.piece_turns = nullptr;
  p.tile_rows_div = fast_divmod(a.tile_indptr != nullptr ? static_cast<std::uint32_t>(a.tile * group) : 1u);
  return p;
}

template <class Kernel>
void allow_smem(Kernel k, int bytes) {
  // Idempotent and cheap; done on every launch so the first call on each device also gets it.
  const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess)
    OOMB_FAIL(cuda_error, "attention: cannot raise shared memory to ", bytes, " bytes: ", cudaGetErrorString(e));
}


/// A launch refuses a plan made for another call: the grid and the kernel come from the plan.
inline void check_plan(const call_shape& planned, const call_shape& call, const char* what) {
  OOMB_EXPECTS(planned == call, what, ": the plan was made for another call (sq ", planned.sq, ", q_start ",
               planned.q_start, ", window_pages ", planned.window_pages, ", sparse ", planned.sparse,
               "), this one has sq ", call.sq, ", q_start ", call.q_start, ", window_pages ", call.window_pages,
               ", sparse ", call.sparse, ": plan each call (plans are cheap host arithmetic)");
}

/// Launches a forward kernel over plan.row_blocks * plan.split CTAs per KV head, the plan.split CTAs of
/// a row block forming one thread-block cluster (no cluster attribute for a split of 1).
template <class Cfg, class Kernel, class... Args>
void launch_in_clusters(const char* what, Kernel kernel, const forward_plan& plan, int hkv, cudaStream_t stream,
                        Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.row_blocks * plan.split), static_cast<unsigned>(hkv));
  cfg.blockDim = dim3(Cfg::THREADS);
  cfg.dynamicSmemBytes = Cfg::smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(plan.split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = plan.split > 1 ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) OOMB_FAIL(cuda_error, what, ": launch failed: ", cudaGetErrorString(e));
  check_launch(what);
}

/// Launches the portable forward with tile shape Cfg as `plan` says.
template <class Cfg, class O>
void launch_forward(const forward_plan& plan, const attention_args& a, O* o, float* lse, cudaStream_t stream) {
  static_assert(std::is_same_v<O, bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  static_assert(Cfg::BM == 128, "the sparse-tile check assumes 128-row blocks");
  check_plan(plan.shape, call_shape::of(a), "attention forward");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_forward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  const kernel_params p = make_params(a, Cfg::BM);
  OOMB_EXPECTS(o != nullptr && lse != nullptr, "attention_forward: o and lse must not be null");
  OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(o) & 7u) == 0, "attention_forward: o must be 8-byte aligned");
  const auto kernel = attention_forward_kernel<Cfg, O>;
  allow_smem(kernel, Cfg::smem_bytes);
  launch_in_clusters<Cfg>("attention_forward", kernel, plan, a.hkv, stream, p, o, lse, plan.split);
}

using encode_tiled_fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
inline encode_tiled_fn tensor_map_encoder() {
  static const encode_tiled_fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<encode_tiled_fn>(nullptr);
    }
    return reinterpret_cast<encode_tiled_fn>(f);
  }();
  OOMB_EXPECTS(fn != nullptr, "attention: the driver offers no cuTensorMapEncodeTiled");
  return fn;
}

/// True when dim 1 of the K/V tensor maps is the token (else the head): dims 1 and 2 go in
/// increasing stride, so head- and token-major pages both map without overlapping dims.
template <class E>
bool kv_token_dim1(const page_pool_view<E>& pool) {
  return pool.stride_token <= pool.stride_head;
}

/// One tensor map over the whole pool, K (v == false) or V pages: dims (d, token | head,
/// head | token, page id), box (128 bytes of columns, one page tile of `rows` tokens, one head, one
/// page), 128-byte swizzle. The page id is a coordinate, so one map serves scattered pages. The
/// pool's length is not part of the view; ids are bounded by int32 (the kernels only read ids the
/// table names). E: the KV pool's const bf16, or the gradient pool's float (the Hopper backward's
/// dK/dV by TMA reductions).
template <class E>
CUtensorMap make_kv_tensor_map(const page_pool_view<E>& pool, int d, int rows, bool v) {
  using T = std::remove_const_t<E>;
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, float>, "bf16 or fp32 pages");
  constexpr cuuint64_t bytes = sizeof(T);
  const bool tok1 = kv_token_dim1(pool);
  void* base = const_cast<T*>(pool.base + (v ? pool.v_offset : 0));
  const cuuint64_t st = cuuint64_t(pool.stride_token) * bytes, sh = cuuint64_t(pool.stride_head) * bytes,
                   sp = cuuint64_t(pool.pair_stride) * bytes;
  const cuuint32_t box[4] = {cuuint32_t(128 / bytes), tok1 ? cuuint32_t(rows) : 1u, tok1 ? 1u : cuuint32_t(rows), 1};
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  const cuuint64_t strides[3] = {tok1 ? st : sh, tok1 ? sh : st, sp};
  CUtensorMap map{};
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  // Prefer the full int32 id range; fall back to a range whose byte extent stays under 2^48.
  const cuuint64_t small = std::min<cuuint64_t>(0x7fffffff, std::max<cuuint64_t>(1, (cuuint64_t(1) << 48) / sp));
  for (const cuuint64_t ids : {cuuint64_t(0x7fffffff), small}) {
    const cuuint64_t dims[4] = {cuuint64_t(d), tok1 ? cuuint64_t(pool.page_size) : cuuint64_t(pool.kv_heads),
                                tok1 ? cuuint64_t(pool.kv_heads) : cuuint64_t(pool.page_size), ids};
    r = tensor_map_encoder()(&map, bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                             base, dims, strides, box, estride,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return map;
  }
  OOMB_FAIL(cuda_error, "attention: cuTensorMapEncodeTiled failed (", int(r), ") for page_size ", pool.page_size,
            ", kv_heads ", pool.kv_heads, ", head_dim ", d, ", strides (token ", pool.stride_token, ", head ",
            pool.stride_head, ", pair ", pool.pair_stride, ")");
}

/// A tensor map over a [sq][hq][d] tensor (Q or dO in bf16; dq in fp32) as (d, head in group, KV
/// head, query): box (128 bytes of columns, `group` heads, `queries` queries), 128-byte swizzle. The
/// box's shared-memory image is the packed GQA rows query * group + head of whole queries, one
/// 128-byte row each (the Hopper backward's TMA_Q, and its dQ by TMA reductions); queries past sq
/// read as zeros and are not written.
template <class T>
CUtensorMap make_query_tensor_map(const T* t, int sq, int hq, int group, int d, int queries) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, float>, "bf16 or fp32");
  constexpr cuuint64_t bytes = sizeof(T);
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(group), cuuint64_t(hq / group), cuuint64_t(sq)};
  const cuuint64_t strides[3] = {cuuint64_t(d) * bytes, cuuint64_t(group) * d * bytes, cuuint64_t(hq) * d * bytes};
  const cuuint32_t box[4] = {cuuint32_t(128 / bytes), cuuint32_t(group), 1, cuuint32_t(queries)};
  const cuuint32_t estride[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = tensor_map_encoder()(
      &map, std::is_same_v<T, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
      const_cast<T*>(t), dims, strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    OOMB_FAIL(cuda_error, "attention: cuTensorMapEncodeTiled failed (", int(r), ") for a query tensor of sq ", sq,
              ", hq ", hq, ", group ", group, ", head_dim ", d, ", box of ", queries, " queries");
  return map;
}

/// Whether `kernel` holds real sm_90a code: only that build declares its mbarriers in static shared
/// memory (forward_sm90.cuh). Cached per instantiation; no launch, no synchronisation.
template <class Cfg, class O>
bool sm90_forward_built() {
  static const bool built = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, attention_forward_sm90_kernel<Cfg, O>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.sharedSizeBytes >= static_cast<std::size_t>(Cfg::BAR_BYTES);
  }();
  return built;
}

/// Whether the Hopper backward `Cfg` holds real sm_90a code (see sm90_forward_built).
template <class Cfg>
bool sm90_backward_built() {
  static const bool built = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, attention_backward_sm90_kernel<Cfg>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.sharedSizeBytes >= static_cast<std::size_t>(Cfg::BAR_BYTES);
  }();
  return built;
}

/// Compute capability 9.0 (Hopper) on the current device; cached per device.
inline bool current_device_is_sm90() {
  static std::atomic<int> cache[64] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    v = major == 9 && minor == 0 ? 2 : 1;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

/// Launches the Hopper forward (forward_sm90.cuh) with configuration Cfg as `plan` says; throws when
/// the shape or the binary does not support it (page_size < 128, no sm_90a code).
template <class Cfg, class O>
void launch_forward_sm90(const forward_plan& plan, const attention_args& a, O* o, float* lse, cudaStream_t stream) {
  check_plan(plan.shape, call_shape::of(a), "attention forward (sm90)");
  static_assert(std::is_same_v<O, bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_forward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  const kernel_params p = make_params(a, Cfg::BM);
  OOMB_EXPECTS(o != nullptr && lse != nullptr, "attention_forward: o and lse must not be null");
  OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(o) & 7u) == 0, "attention_forward: o must be 8-byte aligned");
  OOMB_EXPECTS(a.kv.pool.page_size >= Cfg::BN, "attention_forward (sm90): page_size must be >= ", Cfg::BN, ", got ",
               a.kv.pool.page_size);
  if (!sm90_forward_built<Cfg, O>())
    OOMB_FAIL(cuda_error, "attention_forward (sm90): this binary holds no sm_90a code for the kernel");
  const auto kernel = attention_forward_sm90_kernel<Cfg, O>;
  allow_smem(kernel, Cfg::smem_bytes);
  const bool tok1 = kv_token_dim1(a.kv.pool);
  const CUtensorMap tk = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, false);
  const CUtensorMap tv = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, true);
  launch_in_clusters<Cfg>("attention_forward (sm90)", kernel, plan, a.hkv, stream, p, tk, tv, o, lse, tok1 ? 1 : 0,
                          plan.split);
}

/// The backward's checks of its outputs and gradient pool (both kernels).
inline void check_backward_outputs(const attention_args& a, const float* lse, const float* delta,
                                   const bf16* d_o, float* dq, float* dk_own, float* dv_own,
                                   const window_grad_view<float>& dpast) {
  OOMB_EXPECTS(lse && delta && d_o && dq && dk_own && dv_own, "attention_backward: null pointer");
  OOMB_EXPECTS(aligned16(d_o), "attention_backward: d_o must be 16-byte aligned");
  OOMB_EXPECTS(((reinterpret_cast<std::uintptr_t>(dq) | reinterpret_cast<std::uintptr_t>(dk_own) |
                 reinterpret_cast<std::uintptr_t>(dv_own)) & 7u) == 0,
               "attention_backward: dq, dk_own, dv_own must be 8-byte aligned");
  const bool has_past = a.q_start > std::int64_t(a.first_page) * a.kv.pool.page_size;
  if (has_past) {
    OOMB_EXPECTS(dpast.grad_page != nullptr && dpast.pool.base != nullptr,
                 "attention_backward: the window holds past pages but dpast is empty");
    OOMB_EXPECTS(dpast.pages == a.window_pages, "attention_backward: dpast has ", dpast.pages,
                 " gradient page entries, the window's table ", a.window_pages);
    OOMB_EXPECTS(dpast.pool.page_size == a.kv.pool.page_size && dpast.pool.kv_heads == a.hkv &&
                     dpast.pool.head_dim == a.d,
                 "attention_backward: gradient pool shape (page ", dpast.pool.page_size, ", heads ",
                 dpast.pool.kv_heads, ", dim ", dpast.pool.head_dim, ") differs from the KV pool's");
    OOMB_EXPECTS(((reinterpret_cast<std::uintptr_t>(dpast.pool.base)) & 7u) == 0 && dpast.pool.pair_stride % 2 == 0 &&
                     dpast.pool.v_offset % 2 == 0 && dpast.pool.stride_token % 2 == 0 && dpast.pool.stride_head % 2 == 0,
                 "attention_backward: gradient pages must be 8-byte aligned");
  }
}

/// Launches the portable backward with tile shape Cfg as `plan` says.
template <class Cfg>
void launch_backward(const backward_plan& plan, const attention_args& a, const float* lse, const float* delta,
                     const bf16* d_o, float* dq, float* dk_own, float* dv_own, window_grad_view<float> dpast,
                     cudaStream_t stream) {
  check_plan(plan.shape, call_shape::of(a, dq), "attention backward");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_backward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  kernel_params p = make_params(a, Cfg::BM);
  // Query-walk order (plan.order: 1 lockstep, 2 staggered; 0 = lockstep, measured equal within
  // noise on the H200, docs/history/attention.md v4).
  p.stagger = plan.order == 2;
  OOMB_EXPECTS(!plan.deterministic, "attention_backward: the portable kernels have no deterministic order");
  check_backward_outputs(a, lse, delta, d_o, dq, dk_own, dv_own, dpast);
  const backward_outputs out{dq, dk_own, dv_own, dpast};
  const auto kernel = attention_backward_kernel<Cfg>;
  allow_smem(kernel, Cfg::smem_bytes);
  if (plan.key_blocks == 0) return;
  const int qsplit = plan.query_split;
  const dim3 grid(static_cast<unsigned>(plan.key_blocks), static_cast<unsigned>(a.hkv), static_cast<unsigned>(qsplit));
  kernel<<<grid, Cfg::THREADS, Cfg::smem_bytes, stream>>>(p, lse, delta, reinterpret_cast<const std::uint16_t*>(d_o),
                                                          out, qsplit);
  check_launch("attention_backward");
}

}  // namespace detail

/// Device scratch of a backward call, plan.workspace_ints ints (attention_backward_workspace_ints(args)
/// through the C ABI). Page-sparse calls: with it the Hopper backward launches only the past blocks
/// that some tile selects, the most selected first (detail::sparse_backward_order_kernel; hs2), so
/// the long walks start early and unselected blocks cost no CTA, and each CTA reads which tiles
/// select its page instead of searching their lists (hs3); without it, in the window-ends-first
/// order (hs1). Deterministic calls (plan_options::deterministic): the dQ turn counters (and the
/// sparse pieces'), required. Stream-ordered: one workspace serves the calls of one stream in turn.
struct backward_workspace {
  std::int32_t* data = nullptr;
  std::int64_t ints = 0;
};

namespace detail {

/// A workspace given to a call must be large enough (a smaller one is a caller's mistake, not a
/// reason to launch in another order); a deterministic call needs one.
inline void check_backward_workspace(const backward_plan& plan, const backward_workspace& ws) {
  OOMB_EXPECTS(!plan.deterministic || ws.data != nullptr,
               "attention_backward (deterministic): needs a workspace of backward_plan::workspace_ints (",
               plan.workspace_ints, ") ints for its dQ turns");
  if (ws.data == nullptr) return;
  OOMB_EXPECTS(ws.ints >= plan.workspace_ints, "attention_backward: the workspace holds ", ws.ints,
               " ints; this call needs ", plan.workspace_ints, " (backward_plan::workspace_ints)");
}

/// Launches the Hopper backward (backward_sm90.cuh) with configuration Cfg as `plan` says; throws
/// when the shape or the binary does not support it (page_size < 128, no sm_90a code). ws: see
/// backward_workspace. Trace (the benchmark's --trace): the kernel instance that records each
/// CTA's timeline into `trace`, backward_trace_record::WORDS words per CTA of the grid (x fastest,
/// then the KV head, then the query split); the product launches are untraced (nullptr).
template <class Cfg, bool Trace = false>
void launch_backward_sm90(const backward_plan& plan, const attention_args& a, const float* lse, const float* delta,
                          const bf16* d_o, float* dq, float* dk_own, float* dv_own,
                          window_grad_view<float> dpast, cudaStream_t stream, backward_workspace ws = {},
                          std::uint64_t* trace = nullptr) {
  check_plan(plan.shape, call_shape::of(a, dq), "attention backward (sm90)");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_backward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  kernel_params p = make_params(a, 128);
  p.heads_interleaved = plan.order == 2;
  OOMB_EXPECTS(Trace == (trace != nullptr), "attention_backward (sm90): a traced launch needs a trace buffer, an untraced one none");
  p.trace = trace;
  check_backward_outputs(a, lse, delta, d_o, dq, dk_own, dv_own, dpast);
  OOMB_EXPECTS(a.kv.pool.page_size >= Cfg::BN, "attention_backward (sm90): page_size must be >= ", Cfg::BN,
               ", got ", a.kv.pool.page_size);
  if (!sm90_backward_built<Cfg>())
    OOMB_FAIL(cuda_error, "attention_backward (sm90): this binary holds no sm_90a code for the kernel");
  if constexpr (Cfg::TMA_Q)
    OOMB_EXPECTS(p.group <= Cfg::BM, "attention_backward (sm90, TMA Q/dO): a step holds whole queries, so the group (",
                 p.group, ") must be <= ", Cfg::BM);
  if constexpr (Cfg::DQ != backward_dq::atomics)
    OOMB_EXPECTS(aligned16(dq), "attention_backward (sm90, bulk dQ): dq must be 16-byte aligned");
  backward_outputs out{dq, dk_own, dv_own, dpast};
  const auto kernel = attention_backward_sm90_kernel<Cfg, Trace>;
  allow_smem(kernel, Cfg::smem_bytes);
  if (plan.key_blocks == 0) return;
  const int ctas = plan.ctas_per_head;  // per KV head
  check_backward_workspace(plan, ws);
  if (plan.deterministic) {
    OOMB_EXPECTS(Cfg::DQ_WRITER && !Cfg::DQ_OWN && plan.query_split == 1 && plan.sparse.window_order == (a.tile_indptr != nullptr),
                 "attention_backward (sm90, deterministic): the plan's configuration cannot order dQ");
    const cudaError_t e = cudaMemsetAsync(ws.data, 0, static_cast<std::size_t>(plan.workspace_ints) * sizeof(std::int32_t), stream);
    if (e != cudaSuccess) OOMB_FAIL(cuda_error, "attention_backward (deterministic): zeroing the turns: ", cudaGetErrorString(e));
    p.dq_turns = ws.data;
    if (plan.piece_turns() > 0) p.piece_turns = ws.data + std::int64_t(a.hkv) * plan.turn_steps();
  }
  if (a.tile_indptr != nullptr) {
    p.plan = plan.sparse;
    const int past_blocks = p.plan.own_kb;
    if (!plan.deterministic && plan.workspace_ints > 0 && ws.data != nullptr) {  // deterministic: window order
      sparse_backward_order_kernel<><<<1, ORDER_THREADS, 0, stream>>>(p, past_blocks, a.kv.pool.page_size / Cfg::BN,
                                                                    ws.data);
      check_launch("attention_backward (sm90, sparse launch order)");
      p.plan.order = ws.data + past_blocks;
      p.plan.selected = ws.data + 2 * past_blocks;
      p.plan.tiles_of = reinterpret_cast<const std::uint32_t*>(ws.data + 2 * past_blocks + 1);
    }
  }
  const int qsplit = plan.query_split;
  const CUtensorMap tk = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, false);
  const CUtensorMap tv = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, true);
  // Without TMA_Q the kernel never reads the query maps: K's stands in.
  const CUtensorMap tq = Cfg::TMA_Q ? make_query_tensor_map(a.q, a.sq, a.hq, p.group, Cfg::D, Cfg::BM / p.group) : tk;
  const CUtensorMap tdo = Cfg::TMA_Q ? make_query_tensor_map(d_o, a.sq, a.hq, p.group, Cfg::D, Cfg::BM / p.group) : tk;
  // writer_tensor: dq receives the steps' tiles as TMA reductions of the same boxes (fp32).
  const CUtensorMap tdq = Cfg::DQ_TENSOR ? make_query_tensor_map(dq, a.sq, a.hq, p.group, Cfg::D, Cfg::BM / p.group) : tk;
  // dK/dV rows by TMA reductions (backward_rows_maps) where every row starts 16-byte aligned.
  backward_rows_maps rows{tk, tk, tk, tk};
  out.tensor_rows = rows16_aligned(out);
  if (out.tensor_rows) {
    rows.dk_own = make_query_tensor_map(dk_own, a.sq, a.hkv, 1, Cfg::D, Cfg::BN);
    rows.dv_own = make_query_tensor_map(dv_own, a.sq, a.hkv, 1, Cfg::D, Cfg::BN);
    if (dpast.pool.base != nullptr) {
      rows.dk_past = make_kv_tensor_map(dpast.pool, Cfg::D, Cfg::BN, false);
      rows.dv_past = make_kv_tensor_map(dpast.pool, Cfg::D, Cfg::BN, true);
      out.grad_token_dim1 = kv_token_dim1(dpast.pool);
    }
  }
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(a.hkv), static_cast<unsigned>(qsplit));
  kernel<<<grid, Cfg::THREADS, Cfg::smem_bytes, stream>>>(p, tk, tv, tq, tdo, tdq, rows, lse, delta,
                                                          reinterpret_cast<const std::uint16_t*>(d_o), out,
                                                          kv_token_dim1(a.kv.pool) ? 1 : 0, qsplit);
  check_launch("attention_backward (sm90)");
}

/// Resident blocks per SM of `kernel` on the current device (0: it cannot run there).
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, int smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return per_sm;
}

/// Resident CTAs per SM of configuration Cfg on the current device; 0 where it cannot run (a Hopper
/// configuration off sm_90, or without its sm_90a code in this binary).
template <class Cfg>
int config_blocks_per_sm(bool sm90) {
  if constexpr (is_forward(config_of<Cfg>())) {
    if constexpr (shape_of(config_of<Cfg>()).hopper) {
      if (!sm90 || !sm90_forward_built<Cfg, bf16>() || !sm90_forward_built<Cfg, float>()) return 0;
      allow_smem(attention_forward_sm90_kernel<Cfg, bf16>, Cfg::smem_bytes);
      return blocks_per_sm(attention_forward_sm90_kernel<Cfg, bf16>, Cfg::THREADS, Cfg::smem_bytes);
    } else {
      allow_smem(attention_forward_kernel<Cfg, bf16>, Cfg::smem_bytes);
      return blocks_per_sm(attention_forward_kernel<Cfg, bf16>, Cfg::THREADS, Cfg::smem_bytes);
    }
  } else if constexpr (shape_of(config_of<Cfg>()).hopper) {
    if (!sm90 || !sm90_backward_built<Cfg>()) return 0;
    allow_smem(attention_backward_sm90_kernel<Cfg>, Cfg::smem_bytes);
    return blocks_per_sm(attention_backward_sm90_kernel<Cfg>, Cfg::THREADS, Cfg::smem_bytes);
  } else {
    allow_smem(attention_backward_kernel<Cfg>, Cfg::smem_bytes);
    return blocks_per_sm(attention_backward_kernel<Cfg>, Cfg::THREADS, Cfg::smem_bytes);
  }
}

/// Every product kernel's launch, as explicit instantiations after `kw` (`template` or `extern
/// template`), inside namespace attention::detail of OOMB_NAMESPACE. Header-only users need none of
/// this: each translation unit that launches attention instantiates what it uses. A build that
/// launches it from many units compiles the kernels once instead: one unit writes
/// OOMB_ATTENTION_INSTANCES(template) there after including this header (src/attention/instances.cu),
/// the others are compiled with OOMB_ATTENTION_EXTERN_INSTANCES defined (oomb's own targets link
/// oomb::attention_kernels, which does both).
#define OOMB_ATTENTION_DETAIL_CFG(name) config_type<kernel_config::name>::type
#define OOMB_ATTENTION_DETAIL_FORWARD(kw, name, launcher, O)                                                  \
  kw void launcher<OOMB_ATTENTION_DETAIL_CFG(name), O>(const forward_plan&, const attention_args&, O*, float*, \
                                                       cudaStream_t);
#define OOMB_ATTENTION_DETAIL_PORTABLE_FORWARD(kw, name)                   \
  OOMB_ATTENTION_DETAIL_FORWARD(kw, name, launch_forward, bf16)      \
  OOMB_ATTENTION_DETAIL_FORWARD(kw, name, launch_forward, float)           \
  kw int config_blocks_per_sm<OOMB_ATTENTION_DETAIL_CFG(name)>(bool);
#define OOMB_ATTENTION_DETAIL_HOPPER_FORWARD(kw, name)                     \
  OOMB_ATTENTION_DETAIL_FORWARD(kw, name, launch_forward_sm90, bf16) \
  OOMB_ATTENTION_DETAIL_FORWARD(kw, name, launch_forward_sm90, float)      \
  kw bool sm90_forward_built<OOMB_ATTENTION_DETAIL_CFG(name), bf16>(); \
  kw bool sm90_forward_built<OOMB_ATTENTION_DETAIL_CFG(name), float>();      \
  kw int config_blocks_per_sm<OOMB_ATTENTION_DETAIL_CFG(name)>(bool);
#define OOMB_ATTENTION_DETAIL_PORTABLE_BACKWARD(kw, name)                                                       \
  kw void launch_backward<OOMB_ATTENTION_DETAIL_CFG(name)>(const backward_plan&, const attention_args&,          \
                                                           const float*, const float*, const bf16*, float*, \
                                                           float*, float*, window_grad_view<float>,         \
                                                           cudaStream_t);                                         \
  kw int config_blocks_per_sm<OOMB_ATTENTION_DETAIL_CFG(name)>(bool);
#define OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, name)                                                   \
  kw void launch_backward_sm90<OOMB_ATTENTION_DETAIL_CFG(name), false>(                                   \
      const backward_plan&, const attention_args&, const float*, const float*, const bf16*, float*, \
      float*, float*, window_grad_view<float>, cudaStream_t, backward_workspace, std::uint64_t*); \
  kw bool sm90_backward_built<OOMB_ATTENTION_DETAIL_CFG(name)>();                                         \
  kw int config_blocks_per_sm<OOMB_ATTENTION_DETAIL_CFG(name)>(bool);
#define OOMB_ATTENTION_INSTANCES(kw)                                              \
  OOMB_ATTENTION_DETAIL_PORTABLE_FORWARD(kw, forward_portable_d64)                \
  OOMB_ATTENTION_DETAIL_PORTABLE_FORWARD(kw, forward_portable_d128)               \
  OOMB_ATTENTION_DETAIL_HOPPER_FORWARD(kw, forward_hopper_d64)                    \
  OOMB_ATTENTION_DETAIL_HOPPER_FORWARD(kw, forward_hopper_d128)                   \
  OOMB_ATTENTION_DETAIL_PORTABLE_BACKWARD(kw, backward_portable_d64)              \
  OOMB_ATTENTION_DETAIL_PORTABLE_BACKWARD(kw, backward_portable_d128)             \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d64)                  \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d64_wide_group)       \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d64_unaligned)        \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d128)                 \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d128_wide_group)      \
  OOMB_ATTENTION_DETAIL_HOPPER_BACKWARD(kw, backward_hopper_d128_unaligned)

#if defined(OOMB_ATTENTION_EXTERN_INSTANCES)
OOMB_ATTENTION_INSTANCES(extern template)
#endif

/// Queries the facts of the current device (uncached: current_device_facts caches them).
inline device_facts query_device_facts() {
  device_facts f;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    OOMB_FAIL(cuda_error, "attention: cannot read the current device's multiprocessor count");
  }
  const bool sm90 = current_device_is_sm90();
  for (int i = 0; i < kernel_config_count; ++i)
    with_config(static_cast<kernel_config>(i),
                [&](auto cfg) { f.blocks_per_sm[i] = config_blocks_per_sm<decltype(cfg)>(sm90); });
  return f;
}

}  // namespace detail

/// The immutable facts of the current device (SMs, each configuration's occupancy, whether the
/// Hopper kernels run), queried on a device's first call and cached for the process: they cannot
/// change while it runs.
inline const device_facts& current_device_facts() {
  static constexpr int max_devices = 64;
  static std::atomic<const device_facts*> cache[max_devices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= max_devices) {
    (void)cudaGetLastError();
    OOMB_FAIL(cuda_error, "attention: no current CUDA device (or more than ", max_devices, ")");
  }
  const device_facts* f = cache[dev].load(std::memory_order_acquire);
  if (f == nullptr) {
    const device_facts* mine = new device_facts(detail::query_device_facts());  // kept for the process
    if (cache[dev].compare_exchange_strong(f, mine, std::memory_order_acq_rel))
      f = mine;
    else
      delete mine;  // another thread was first: f holds its facts
  }
  return *f;
}

/// Forward over one window as `plan` (plan_forward) says: o (O = oomb::bf16 or float) normalised
/// within the window, lse natural log (-inf, o = 0 for queries that see no key of the window).
template <class O>
void forward(const forward_plan& plan, const attention_args& a, O* o, float* lse, cudaStream_t stream) {
  OOMB_EXPECTS(is_forward(plan.config), "attention forward: the plan is not a forward plan");
  detail::with_config(plan.config, [&](auto cfg) {
    using Cfg = decltype(cfg);
    if constexpr (is_forward(detail::config_of<Cfg>())) {
      if constexpr (shape_of(detail::config_of<Cfg>()).hopper)
        detail::launch_forward_sm90<Cfg>(plan, a, o, lse, stream);
      else
        detail::launch_forward<Cfg>(plan, a, o, lse, stream);
    }
  });
}

/// o_acc, lse_acc (start: 0, -inf) absorb one window's o, lse. All fp32, [sq][hq][d] and [hq][sq].
inline void merge(std::int32_t sq, std::int32_t hq, std::int32_t d, float* o_acc, float* lse_acc,
                            const float* o, const float* lse, cudaStream_t stream) {
  OOMB_EXPECTS(sq > 0 && hq > 0 && d > 0, "attention merge: sizes must be positive, got sq ", sq, ", hq ", hq, ", d ", d);
  OOMB_EXPECTS(o_acc && lse_acc && o && lse, "attention merge: null pointer");
  const std::int64_t threads = std::int64_t(sq) * hq * 32;
  detail::attention_merge_kernel<><<<(threads + 255) / 256, 256, 0, stream>>>(sq, hq, d, o_acc, lse_acc, o, lse);
  detail::check_launch("attention merge");
}

/// delta [hq][sq] = rowsum(dO * O) of the global output; computed once, reused by every window.
template <class O>
void backward_delta(std::int32_t sq, std::int32_t hq, std::int32_t d, const O* o, const bf16* d_o,
                              float* delta, cudaStream_t stream) {
  static_assert(std::is_same_v<O, bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  OOMB_EXPECTS(sq > 0 && hq > 0 && d > 0, "attention_backward_delta: sizes must be positive, got sq ", sq, ", hq ", hq,
               ", d ", d);
  OOMB_EXPECTS(o && d_o && delta, "attention_backward_delta: null pointer");
  const std::int64_t threads = std::int64_t(sq) * hq * 32;
  detail::attention_delta_kernel<O><<<(threads + 255) / 256, 256, 0, stream>>>(
      sq, hq, d, o, reinterpret_cast<const std::uint16_t*>(d_o), delta);
  detail::check_launch("attention_backward_delta");
}

/// Backward over one window as `plan` (plan_backward) says; see the file comment. dq, dk_own, dv_own,
/// gradient pages: fp32, added to, 8-byte aligned (a 16-byte aligned dq lets the Hopper kernel use
/// its faster dQ path: plan with call_shape::of(args, dq)). ws: scratch of plan.workspace_ints ints
/// (backward_workspace): optional for sparse calls, required by deterministic ones.
inline void backward(const backward_plan& plan, const attention_args& a, const float* lse, const float* delta,
                     const bf16* d_o, float* dq, float* dk_own, float* dv_own, window_grad_view<float> dpast,
                     backward_workspace ws, cudaStream_t stream) {
  OOMB_EXPECTS(plan.config != kernel_config::count && !is_forward(plan.config),
               "attention backward: the plan is not a backward plan");
  detail::with_config(plan.config, [&](auto cfg) {
    using Cfg = decltype(cfg);
    if constexpr (!is_forward(detail::config_of<Cfg>())) {
      if constexpr (shape_of(detail::config_of<Cfg>()).hopper)
        detail::launch_backward_sm90<Cfg>(plan, a, lse, delta, d_o, dq, dk_own, dv_own, dpast, stream, ws);
      else
        detail::launch_backward<Cfg>(plan, a, lse, delta, d_o, dq, dk_own, dv_own, dpast, stream);
    }
  });
}

}  // namespace attention
OOMB_NAMESPACE_END
