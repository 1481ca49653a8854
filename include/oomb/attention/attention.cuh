// oomb — the GPU attention entry points: argument checks (oomb exceptions naming the
// values), then one launch on the caller's stream. No allocation, no host synchronisation.
// SPDX-License-Identifier: Apache-2.0
//
//   attention_forward(args, o, lse, stream)        o [sq][hq][d] (bf16 or float), lse [hq][sq]
//       (Hopper kernel on sm_90 when supported, else the portable one: see forward_kernels)
//   attention_merge(sq, hq, d, o_acc, lse_acc, o, lse, stream)   windows fold by log-sum-exp
//   attention_backward_delta(sq, hq, d, o, d_o, delta, stream)   delta [hq][sq] = rowsum(dO o O)
//   attention_backward(args, lse, delta, d_o, dq, dk_own, dv_own, dpast, stream [, workspace])
//       (Hopper kernel on sm_90 when supported, else the portable one: see backward_kernels; the
//       optional workspace, attention_backward_workspace_ints(args) ints, orders sparse calls'
//       blocks and lists each one's tiles)
// The backward of one window takes the GLOBAL lse (after all windows merged) and the delta of the
// global O; it adds into dq [sq][hq][d], dk_own / dv_own [sq][hkv][d] (row = position - q_start)
// and the fp32 gradient pages of past pages (dpast.grad_id[id] >= 0 for every past page of the
// window). Summing the backward over windows that partition the keys equals one pass.
// Launch shapes are chosen here (variants.cuh lists every compiled kernel): the forward may split a
// row block's keys over a cluster of 2-4 CTAs (merged in distributed shared memory), the backward
// may split a key block's query tiles over blocks (dK/dV then added atomically). dq always goes
// through atomics, so the backward's fp32 sums are not bitwise reproducible run to run.
// Sparse calls need tile * (hq / hkv) to be a multiple of 128.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include <cuda_runtime.h>

#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/args.hpp"
#include "oomb/attention/common.cuh"
#include "oomb/attention/variants.cuh"

namespace oomb::attention {

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
  p.stagger = false;
  p.heads_interleaved = false;
  p.trace = nullptr;
  p.tile_rows_div = fast_divmod(a.tile_indptr != nullptr ? static_cast<std::uint32_t>(a.tile * group) : 1u);
  return p;
}

template <class Kernel>
void allow_smem(Kernel k, int bytes) {
  // Idempotent and cheap; done on every launch so the first call on each device also gets it.
  const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess)
    OOMB_FAIL(oomb::cuda_error, "attention: cannot raise shared memory to ", bytes, " bytes: ", cudaGetErrorString(e));
}

}  // namespace detail

namespace detail {

/// Resident blocks of `kernel` on the current device (SMs x blocks per SM), computed once per
/// instantiation (the first device that asks decides).
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, int smem) {
  static std::atomic<int> cached{0};
  int n = cached.load(std::memory_order_relaxed);
  if (n == 0) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 1;
    }
    n = sms * (per_sm > 0 ? per_sm : 1);
    cached.store(n, std::memory_order_relaxed);
  }
  return n;
}

/// How many CTAs (one thread-block cluster) share each row block of the forward, each taking a
/// contiguous part of its key tiles. Measured on the H200 (docs/attention-notes.md): 2 beats 1
/// by ~12% on long windows (896 blocks on 264 slots fill 85% of the last wave; split 2 fills 97%
/// and balances the causal tail), 3 and 4 lose to 2. A grid far smaller than the GPU splits 4
/// ways; short windows do not split. hint > 0 forces a split (tests and benchmark).
inline int forward_split(int blocks, int slots, std::int64_t key_tiles, int hint) {
  if (hint > 0) return hint;
  if (key_tiles < 8) return 1;
  if (2 * blocks < slots / 2 && key_tiles >= 16) return 4;
  return 2;
}

/// How many blocks share one key block's query tiles in the backward: enough to fill the last
/// wave (e.g. 320 blocks on 132 SMs run 2.4 waves, 81% busy; 640 run 4.85, 97%), at least two
/// query tiles each. hint > 0 forces it.
inline int backward_split(int blocks, int slots, int query_tiles, int hint) {
  if (hint > 0) return hint;
  double best_eff = 0;
  int best = 1;
  for (int s = 1; s <= 4 && (s == 1 || query_tiles >= 2 * s); ++s) {
    const std::int64_t n = std::int64_t(blocks) * s;
    const double eff = double(n) / double((n + slots - 1) / slots * slots);
    if (eff > best_eff + 0.03) {  // a split costs atomics and K/V loads: take it for a clear gain
      best_eff = eff;
      best = s;
    }
  }
  return best;
}

/// Launches the forward with tile shape Cfg (the public entry picks Cfg from variants.cuh).
template <class Cfg, class O>
void launch_forward(const attention_args& a, O* o, float* lse, cudaStream_t stream, int split_hint = 0) {
  static_assert(std::is_same_v<O, oomb::bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  static_assert(Cfg::BM == 128, "the sparse-tile check assumes 128-row blocks");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_forward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  const kernel_params p = make_params(a, Cfg::BM);
  OOMB_EXPECTS(o != nullptr && lse != nullptr, "attention_forward: o and lse must not be null");
  OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(o) & 7u) == 0, "attention_forward: o must be 8-byte aligned");
  const auto kernel = attention_forward_kernel<Cfg, O>;
  allow_smem(kernel, Cfg::smem_bytes);
  const int blocks = static_cast<int>((std::int64_t(a.sq) * p.group + Cfg::BM - 1) / Cfg::BM) * a.hkv;
  const int split = forward_split(blocks, resident_blocks(kernel, Cfg::THREADS, Cfg::smem_bytes),
                                  std::int64_t(a.window_pages) * a.kv.pool.page_size / Cfg::BN, split_hint);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks / a.hkv * split), static_cast<unsigned>(a.hkv));
  cfg.blockDim = dim3(Cfg::THREADS);
  cfg.dynamicSmemBytes = Cfg::smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = split > 1 ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p, o, lse, split);
  if (e != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "attention_forward: launch failed: ", cudaGetErrorString(e));
  check_launch("attention_forward");
}

}  // namespace detail

/// Which forward kernels attention_forward may use. `automatic`: the Hopper kernel
/// (forward_sm90.cuh: TMA, wgmma, warp specialisation) on a compute-capability 9.0 device when the
/// binary holds its sm_90a code and page_size >= 128, the portable mma.sync kernel otherwise.
/// `portable`: always the latter. The default is `automatic` unless the environment variable
/// OOMB_ATTENTION_FORWARD=portable is set when the first forward runs. Process-wide.
enum class forward_kernels { automatic, portable };

namespace detail {
inline std::atomic<int>& forward_kernels_state() {
  static std::atomic<int> state{[] {
    const char* e = std::getenv("OOMB_ATTENTION_FORWARD");
    return e != nullptr && std::string_view(e) == "portable" ? 1 : 0;
  }()};
  return state;
}
}  // namespace detail

inline void set_forward_kernels(forward_kernels k) {
  detail::forward_kernels_state().store(k == forward_kernels::portable ? 1 : 0, std::memory_order_relaxed);
}
inline forward_kernels get_forward_kernels() {
  return detail::forward_kernels_state().load(std::memory_order_relaxed) == 1 ? forward_kernels::portable
                                                                              : forward_kernels::automatic;
}

namespace detail {

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
bool kv_token_dim1(const oomb::page_pool_view<E>& pool) {
  return pool.stride_token <= pool.stride_head;
}

/// One tensor map over the whole pool, K (v == false) or V pages: dims (d, token | head,
/// head | token, page id), box (128 bytes of columns, one page tile of `rows` tokens, one head, one
/// page), 128-byte swizzle. The page id is a coordinate, so one map serves scattered pages. The
/// pool's length is not part of the view; ids are bounded by int32 (the kernels only read ids the
/// table names). E: the KV pool's const bf16, or the gradient pool's float (the Hopper backward's
/// dK/dV by TMA reductions).
template <class E>
CUtensorMap make_kv_tensor_map(const oomb::page_pool_view<E>& pool, int d, int rows, bool v) {
  using T = std::remove_const_t<E>;
  static_assert(std::is_same_v<T, oomb::bf16> || std::is_same_v<T, float>, "bf16 or fp32 pages");
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
  OOMB_FAIL(oomb::cuda_error, "attention: cuTensorMapEncodeTiled failed (", int(r), ") for page_size ", pool.page_size,
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
  static_assert(std::is_same_v<T, oomb::bf16> || std::is_same_v<T, float>, "bf16 or fp32");
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
    OOMB_FAIL(oomb::cuda_error, "attention: cuTensorMapEncodeTiled failed (", int(r), ") for a query tensor of sq ", sq,
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

/// The public forward's choice (see forward_kernels).
template <class Cfg, class O>
bool use_sm90_forward(const attention_args& a) {
  return get_forward_kernels() == forward_kernels::automatic && a.kv.pool.page_size >= Cfg::BN &&
         current_device_is_sm90() && sm90_forward_built<Cfg, O>();
}

/// Cluster split of the Hopper forward (one CTA per SM): 2 when it fills the last wave clearly
/// better (e.g. 448 row blocks on 132 SMs: 85% -> 97%), else 1; each rank keeps >= 8 key tiles.
/// hint > 0 forces it (tests and benchmark).
inline int forward_sm90_split(int blocks, int slots, std::int64_t key_tiles, int hint) {
  if (hint > 0) return hint;
  auto eff = [&](int s) {
    const std::int64_t n = std::int64_t(blocks) * s;
    return double(n) / double((n + slots - 1) / slots * slots);
  };
  return key_tiles >= 16 && eff(2) > eff(1) + 0.05 ? 2 : 1;
}

/// Launches the Hopper forward (forward_sm90.cuh) with configuration Cfg; throws when the shape or
/// the binary does not support it (page_size < 128, no sm_90a code).
template <class Cfg, class O>
void launch_forward_sm90(const attention_args& a, O* o, float* lse, cudaStream_t stream, int split_hint = 0) {
  static_assert(std::is_same_v<O, oomb::bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  OOMB_EXPECTS(a.d == Cfg::D, "attention_forward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  const kernel_params p = make_params(a, Cfg::BM);
  OOMB_EXPECTS(o != nullptr && lse != nullptr, "attention_forward: o and lse must not be null");
  OOMB_EXPECTS((reinterpret_cast<std::uintptr_t>(o) & 7u) == 0, "attention_forward: o must be 8-byte aligned");
  OOMB_EXPECTS(a.kv.pool.page_size >= Cfg::BN, "attention_forward (sm90): page_size must be >= ", Cfg::BN, ", got ",
               a.kv.pool.page_size);
  if (!sm90_forward_built<Cfg, O>())
    OOMB_FAIL(oomb::cuda_error, "attention_forward (sm90): this binary holds no sm_90a code for the kernel");
  const auto kernel = attention_forward_sm90_kernel<Cfg, O>;
  allow_smem(kernel, Cfg::smem_bytes);
  const bool tok1 = kv_token_dim1(a.kv.pool);
  const CUtensorMap tk = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, false);
  const CUtensorMap tv = make_kv_tensor_map(a.kv.pool, Cfg::D, Cfg::BN, true);
  OOMB_EXPECTS(split_hint >= 0 && split_hint <= 4, "attention_forward (sm90): split must be 1..4, got ", split_hint);
  const int row_blocks = static_cast<int>((std::int64_t(a.sq) * p.group + Cfg::BM - 1) / Cfg::BM);
  const int split = forward_sm90_split(row_blocks * a.hkv, resident_blocks(kernel, Cfg::THREADS, Cfg::smem_bytes),
                                       std::int64_t(a.window_pages) * a.kv.pool.page_size / Cfg::BN, split_hint);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(row_blocks * split), static_cast<unsigned>(a.hkv));
  cfg.blockDim = dim3(Cfg::THREADS);
  cfg.dynamicSmemBytes = Cfg::smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = split > 1 ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p, tk, tv, o, lse, tok1 ? 1 : 0, split);
  if (e != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "attention_forward (sm90): launch failed: ", cudaGetErrorString(e));
  check_launch("attention_forward (sm90)");
}

}  // namespace detail

/// Forward over one window: o (O = oomb::bf16 or float) normalised within the window, lse natural
/// log (-inf, o = 0 for queries that see no key of the window). Kernel choice: forward_kernels.
template <class O>
void attention_forward(const attention_args& a, O* o, float* lse, cudaStream_t stream) {
  dispatch_head_dim(a.d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    using hopper = typename forward_sm90_config<D>::type;
    if (detail::use_sm90_forward<hopper, O>(a))
      detail::launch_forward_sm90<hopper>(a, o, lse, stream);
    else
      detail::launch_forward<typename forward_config<D>::type>(a, o, lse, stream);
  });
}

/// o_acc, lse_acc (start: 0, -inf) absorb one window's o, lse. All fp32, [sq][hq][d] and [hq][sq].
inline void attention_merge(std::int32_t sq, std::int32_t hq, std::int32_t d, float* o_acc, float* lse_acc,
                            const float* o, const float* lse, cudaStream_t stream) {
  OOMB_EXPECTS(sq > 0 && hq > 0 && d > 0, "attention_merge: sizes must be positive, got sq ", sq, ", hq ", hq, ", d ", d);
  OOMB_EXPECTS(o_acc && lse_acc && o && lse, "attention_merge: null pointer");
  const std::int64_t threads = std::int64_t(sq) * hq * 32;
  detail::attention_merge_kernel<><<<(threads + 255) / 256, 256, 0, stream>>>(sq, hq, d, o_acc, lse_acc, o, lse);
  detail::check_launch("attention_merge");
}

/// delta [hq][sq] = rowsum(dO * O) of the global output; computed once, reused by every window.
template <class O>
void attention_backward_delta(std::int32_t sq, std::int32_t hq, std::int32_t d, const O* o, const oomb::bf16* d_o,
                              float* delta, cudaStream_t stream) {
  static_assert(std::is_same_v<O, oomb::bf16> || std::is_same_v<O, float>, "o is bf16 or float");
  OOMB_EXPECTS(sq > 0 && hq > 0 && d > 0, "attention_backward_delta: sizes must be positive, got sq ", sq, ", hq ", hq,
               ", d ", d);
  OOMB_EXPECTS(o && d_o && delta, "attention_backward_delta: null pointer");
  const std::int64_t threads = std::int64_t(sq) * hq * 32;
  detail::attention_delta_kernel<O><<<(threads + 255) / 256, 256, 0, stream>>>(
      sq, hq, d, o, reinterpret_cast<const std::uint16_t*>(d_o), delta);
  detail::check_launch("attention_backward_delta");
}

namespace detail {

/// The backward's checks of its outputs and gradient pool (both kernels).
inline void check_backward_outputs(const attention_args& a, const float* lse, const float* delta,
                                   const oomb::bf16* d_o, float* dq, float* dk_own, float* dv_own,
                                   const oomb::grad_mirror_view<float>& dpast) {
  OOMB_EXPECTS(lse && delta && d_o && dq && dk_own && dv_own, "attention_backward: null pointer");
  OOMB_EXPECTS(aligned16(d_o), "attention_backward: d_o must be 16-byte aligned");
  OOMB_EXPECTS(((reinterpret_cast<std::uintptr_t>(dq) | reinterpret_cast<std::uintptr_t>(dk_own) |
                 reinterpret_cast<std::uintptr_t>(dv_own)) & 7u) == 0,
               "attention_backward: dq, dk_own, dv_own must be 8-byte aligned");
  const bool has_past = a.q_start > std::int64_t(a.first_page) * a.kv.pool.page_size;
  if (has_past) {
    OOMB_EXPECTS(dpast.grad_id != nullptr && dpast.pool.base != nullptr,
                 "attention_backward: the window holds past pages but dpast is empty");
    OOMB_EXPECTS(dpast.pool.page_size == a.kv.pool.page_size && dpast.pool.kv_heads == a.hkv &&
                     dpast.pool.head_dim == a.d,
                 "attention_backward: gradient pool shape (page ", dpast.pool.page_size, ", heads ",
                 dpast.pool.kv_heads, ", dim ", dpast.pool.head_dim, ") differs from the KV pool's");
    OOMB_EXPECTS(((reinterpret_cast<std::uintptr_t>(dpast.pool.base)) & 7u) == 0 && dpast.pool.pair_stride % 2 == 0 &&
                     dpast.pool.v_offset % 2 == 0 && dpast.pool.stride_token % 2 == 0 && dpast.pool.stride_head % 2 == 0,
                 "attention_backward: gradient pages must be 8-byte aligned");
  }
}

/// Launches the backward with tile shape Cfg (the public entry picks Cfg from variants.cuh).
template <class Cfg>
void launch_backward(const attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                     float* dq, float* dk_own, float* dv_own, oomb::grad_mirror_view<float> dpast,
                     cudaStream_t stream, int split_hint = 0, int order_hint = 0) {
  OOMB_EXPECTS(a.d == Cfg::D, "attention_backward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  kernel_params p = make_params(a, Cfg::BM);
  // Query-walk order (order_hint: 1 lockstep, 2 staggered; 0 = lockstep, measured equal within
  // noise on the H200, docs/attention-notes.md v4).
  p.stagger = order_hint == 2;
  check_backward_outputs(a, lse, delta, d_o, dq, dk_own, dv_own, dpast);
  const backward_outputs out{dq, dk_own, dv_own, dpast};
  const auto kernel = attention_backward_kernel<Cfg>;
  allow_smem(kernel, Cfg::smem_bytes);
  const std::int64_t keys = std::int64_t(a.window_pages) * a.kv.pool.page_size;
  const int key_blocks = static_cast<int>((keys + Cfg::BN - 1) / Cfg::BN);
  if (key_blocks == 0) return;
  const int query_tiles = static_cast<int>((std::int64_t(a.sq) * p.group + Cfg::BM - 1) / Cfg::BM);
  const int qsplit = backward_split(key_blocks * a.hkv, resident_blocks(kernel, Cfg::THREADS, Cfg::smem_bytes),
                                    query_tiles, split_hint);
  const dim3 grid(static_cast<unsigned>(key_blocks), static_cast<unsigned>(a.hkv), static_cast<unsigned>(qsplit));
  kernel<<<grid, Cfg::THREADS, Cfg::smem_bytes, stream>>>(p, lse, delta, reinterpret_cast<const std::uint16_t*>(d_o),
                                                          out, qsplit);
  check_launch("attention_backward");
}

}  // namespace detail

/// Which backward kernels attention_backward may use. `automatic`: the Hopper kernel
/// (backward_sm90.cuh: wgmma, warp specialisation) on a compute-capability 9.0 device when the
/// binary holds its sm_90a code and page_size >= 128, the portable mma.sync kernel otherwise.
/// `portable`: always the latter. The default is `automatic` (the Hopper backward passed every
/// GPU test and is 1.35-1.43x the portable one on the H200: docs/attention-notes.md, hb2-hb4);
/// OOMB_ATTENTION_BACKWARD=portable (or =automatic), set when the first backward runs, overrides
/// it. Process-wide.
enum class backward_kernels { automatic, portable };

namespace detail {
inline constexpr bool backward_sm90_default = true;
inline std::atomic<int>& backward_kernels_state() {
  static std::atomic<int> state{[] {
    const char* e = std::getenv("OOMB_ATTENTION_BACKWARD");
    if (e != nullptr && std::string_view(e) == "portable") return 1;
    if (e != nullptr && std::string_view(e) == "automatic") return 0;
    return backward_sm90_default ? 0 : 1;
  }()};
  return state;
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
}  // namespace detail

inline void set_backward_kernels(backward_kernels k) {
  detail::backward_kernels_state().store(k == backward_kernels::portable ? 1 : 0, std::memory_order_relaxed);
}
inline backward_kernels get_backward_kernels() {
  return detail::backward_kernels_state().load(std::memory_order_relaxed) == 1 ? backward_kernels::portable
                                                                               : backward_kernels::automatic;
}

namespace detail {

/// The public backward's choice (see backward_kernels).
template <class Cfg>
bool use_sm90_backward(const attention_args& a) {
  return get_backward_kernels() == backward_kernels::automatic && a.kv.pool.page_size >= Cfg::BN &&
         current_device_is_sm90() && sm90_backward_built<Cfg>();
}

}  // namespace detail

/// Device scratch for page-sparse backward calls, attention_backward_workspace_ints(args) ints: with
/// it the Hopper backward launches only the past blocks that some tile selects, the most selected
/// first (detail::sparse_backward_order_kernel; hs2), so the long walks start early and unselected
/// blocks cost no CTA, and each CTA reads which tiles select its page instead of searching their
/// lists (hs3); without it, in the window-ends-first order (hs1). Stream-ordered: one
/// workspace serves the calls of one stream in turn.
struct sparse_backward_workspace {
  std::int32_t* data = nullptr;
  std::int64_t ints = 0;
};

/// The ints of workspace a backward call on `a` uses (0: a dense call, nothing to order).
inline std::int64_t attention_backward_workspace_ints(const attention_args& a) {
  if (a.tile_indptr == nullptr) return 0;
  OOMB_EXPECTS(a.tile > 0 && a.sq >= 0, "attention_backward_workspace_ints: sparse tile (", a.tile,
               " queries) must be positive and sq (", a.sq, ") not negative");
  const std::int64_t key_blocks = std::int64_t(a.window_pages) * a.kv.pool.page_size / 128;
  const std::int64_t tile_words = (std::int64_t(a.sq) + a.tile - 1) / a.tile + 31 >> 5;
  // a count and an order slot per past block, the number selected, and per page the bits of the
  // query tiles that select it
  return 2 * key_blocks + 1 + std::int64_t(a.window_pages) * tile_words;
}

namespace detail {
/// A workspace given to a sparse call must be large enough (a smaller one is a caller's mistake, not
/// a reason to launch in another order).
inline void check_sparse_backward_workspace(const attention_args& a, const sparse_backward_workspace& ws) {
  if (a.tile_indptr == nullptr || ws.data == nullptr) return;
  OOMB_EXPECTS(ws.ints >= attention_backward_workspace_ints(a), "attention_backward: the sparse workspace holds ",
               ws.ints, " ints; this call needs ", attention_backward_workspace_ints(a),
               " (attention_backward_workspace_ints)");
}
}  // namespace detail

namespace detail {

/// The Hopper backward's launch order for a page-sparse call of `key_blocks` blocks of bn keys
/// (sparse_backward_plan, hs2). cut = false: hs1's order, no block in pieces. Otherwise a block that
/// every tile may attend (the own blocks; the window's first and last backward_sparse_end_pages pages)
/// is cut into pieces of at most backward_sparse_piece_tiles query tiles: with one CTA per SM a walk
/// longer than the SM's share of the call, started late (the last KV head's own and sink/local
/// blocks), ended ~10% after the rest (docs/attention-notes.md hs1, hs2).
inline constexpr int backward_sparse_piece_tiles = 8;
inline constexpr int backward_sparse_end_pages = 8;
inline sparse_backward_plan make_sparse_backward_plan(const attention_args& a, int key_blocks, int bn, bool cut) {
  const std::int64_t ps = a.kv.pool.page_size;
  const std::int64_t own_page = std::clamp<std::int64_t>(a.q_start / ps - a.first_page, 0, a.window_pages);
  sparse_backward_plan plan;
  plan.own_kb = static_cast<std::int32_t>(own_page * ps / bn);
  plan.own = key_blocks - plan.own_kb;
  const int tiles = (a.sq + a.tile - 1) / a.tile;
  if (cut && tiles > backward_sparse_piece_tiles) {
    plan.pieces = (tiles + backward_sparse_piece_tiles - 1) / backward_sparse_piece_tiles;
    plan.piece_tiles = (tiles + plan.pieces - 1) / plan.pieces;
    plan.ends = static_cast<std::int32_t>(std::min<std::int64_t>(plan.own_kb, 2 * backward_sparse_end_pages * ps / bn));
  }
  return plan;
}

/// Launches the Hopper backward (backward_sm90.cuh) with configuration Cfg; throws when the shape
/// or the binary does not support it (page_size < 128, no sm_90a code). order_hint (sparse calls):
/// 0 or 1 the KV heads one after another (each head's own blocks first, then its past blocks from
/// both window ends, the long walks in pieces: make_sparse_backward_plan), 2 the same block order
/// with the KV heads taken in turn (hs1: better balance with 4 KV heads, but every head's Q/dO and
/// dq in L2 at once), 3 hs1's order (heads one after another, no pieces); the bench times them.
/// ws (sparse calls but order_hint 3): the past blocks in order of selection (sparse_backward_workspace).
/// trace: device memory for backward_trace_record::WORDS words per CTA of the grid (x fastest, then
/// the KV head, then the query split), or nullptr (bench --trace).
template <class Cfg>
void launch_backward_sm90(const attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                          float* dq, float* dk_own, float* dv_own, oomb::grad_mirror_view<float> dpast,
                          cudaStream_t stream, int split_hint = 0, int order_hint = 0,
                          sparse_backward_workspace ws = {}, std::uint64_t* trace = nullptr) {
  OOMB_EXPECTS(a.d == Cfg::D, "attention_backward: head_dim ", a.d, " does not match the kernel's ", Cfg::D);
  kernel_params p = make_params(a, 128);
  p.heads_interleaved = order_hint == 2;
  p.trace = trace;
  check_backward_outputs(a, lse, delta, d_o, dq, dk_own, dv_own, dpast);
  OOMB_EXPECTS(a.kv.pool.page_size >= Cfg::BN, "attention_backward (sm90): page_size must be >= ", Cfg::BN,
               ", got ", a.kv.pool.page_size);
  if (!sm90_backward_built<Cfg>())
    OOMB_FAIL(oomb::cuda_error, "attention_backward (sm90): this binary holds no sm_90a code for the kernel");
  OOMB_EXPECTS(split_hint >= 0 && split_hint <= 4, "attention_backward (sm90): split must be 0..4, got ", split_hint);
  if constexpr (Cfg::TMA_Q)
    OOMB_EXPECTS(p.group <= Cfg::BM, "attention_backward (sm90, TMA Q/dO): a step holds whole queries, so the group (",
                 p.group, ") must be <= ", Cfg::BM);
  // TMA_Q: a step is BM / group whole queries (see backward_sm90_tile).
  const int step_rows = Cfg::TMA_Q ? Cfg::BM / p.group * p.group : Cfg::BM;
  if constexpr (Cfg::DQ != backward_dq::atomics)
    OOMB_EXPECTS(aligned16(dq), "attention_backward (sm90, bulk dQ): dq must be 16-byte aligned");
  backward_outputs out{dq, dk_own, dv_own, dpast};
  const auto kernel = attention_backward_sm90_kernel<Cfg>;
  allow_smem(kernel, Cfg::smem_bytes);
  const std::int64_t keys = std::int64_t(a.window_pages) * a.kv.pool.page_size;
  const int key_blocks = static_cast<int>((keys + Cfg::BN - 1) / Cfg::BN);
  if (key_blocks == 0) return;
  int ctas = key_blocks;  // per KV head
  if (a.tile_indptr != nullptr) {
    p.plan = make_sparse_backward_plan(a, key_blocks, Cfg::BN, order_hint != 3);
    ctas = p.plan.ctas_per_head(key_blocks);
    const int past_blocks = p.plan.own_kb;
    check_sparse_backward_workspace(a, ws);
    if (order_hint != 3 && past_blocks > 0 && ws.data != nullptr) {
      sparse_backward_order_kernel<><<<1, ORDER_THREADS, 0, stream>>>(p, past_blocks, a.kv.pool.page_size / Cfg::BN,
                                                                    ws.data);
      check_launch("attention_backward (sm90, sparse launch order)");
      p.plan.order = ws.data + past_blocks;
      p.plan.selected = ws.data + 2 * past_blocks;
      p.plan.tiles_of = reinterpret_cast<const std::uint32_t*>(ws.data + 2 * past_blocks + 1);
    }
  }
  const int query_tiles = static_cast<int>((std::int64_t(a.sq) * p.group + step_rows - 1) / step_rows);
  const int qsplit = backward_split(key_blocks * a.hkv, resident_blocks(kernel, Cfg::THREADS, Cfg::smem_bytes),
                                    query_tiles, split_hint);
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

}  // namespace detail

namespace detail {

/// Which of backward_sm90_config<D>'s configurations the public backward takes on Hopper. Dense and
/// page-sparse calls alike (every configuration walks the sparse tiles without straddling them, hs1).
enum class backward_sm90_call { dense, wide_group, unaligned };

template <int D>
backward_sm90_call choose_backward_sm90(const attention_args& a, const float* dq) {
  if (!aligned16(dq)) return backward_sm90_call::unaligned;  // the writer warp's bulk reductions need 16 bytes
  // the TMA Q/dO steps hold whole queries (a bad hkv is left to the launcher's checks)
  const bool wide = a.hkv > 0 && a.hq / a.hkv > backward_sm90_config<D>::type::BM;
  return wide ? backward_sm90_call::wide_group : backward_sm90_call::dense;
}

/// Calls f(Cfg{}) with the configuration of backward_sm90_config<D> for `call`.
template <int D, class F>
decltype(auto) with_backward_sm90_config(backward_sm90_call call, F&& f) {
  using C = backward_sm90_config<D>;
  switch (call) {
    case backward_sm90_call::dense: return f(typename C::type{});
    case backward_sm90_call::wide_group: return f(typename C::wide_group{});
    default: return f(typename C::unaligned{});
  }
}

}  // namespace detail

/// Backward over one window (see the file comment). dq, dk_own, dv_own, gradient pages: fp32, added
/// to, 8-byte aligned (a 16-byte aligned dq lets the Hopper kernel use its faster dQ path). Kernel choice: backward_kernels; on Hopper, the configuration for the kind of call
/// (choose_backward_sm90). ws: optional scratch for sparse calls (sparse_backward_workspace).
inline void attention_backward(const attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                               float* dq, float* dk_own, float* dv_own, oomb::grad_mirror_view<float> dpast,
                               cudaStream_t stream, sparse_backward_workspace ws = {}) {
  detail::check_sparse_backward_workspace(a, ws);
  dispatch_head_dim(a.d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    const bool hopper = detail::with_backward_sm90_config<D>(detail::choose_backward_sm90<D>(a, dq), [&](auto cfg) {
      using Cfg = decltype(cfg);
      if (!detail::use_sm90_backward<Cfg>(a)) return false;
      detail::launch_backward_sm90<Cfg>(a, lse, delta, d_o, dq, dk_own, dv_own, dpast, stream, 0, 0, ws);
      return true;
    });
    if (!hopper)
      detail::launch_backward<typename backward_config<D>::type>(a, lse, delta, d_o, dq, dk_own, dv_own, dpast,
                                                                 stream);
  });
}

}  // namespace oomb::attention
