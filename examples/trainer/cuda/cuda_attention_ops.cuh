// oomb trainer — the attention half of the CUDA backend: page tiers' memory and streams, the page
// kernels, the paged attention over windows and page-sparse selection, on one GPU.
// SPDX-License-Identifier: Apache-2.0
//
// What algo/paged_attention.hpp and algo/page_tier.hpp need from a device (ops_backend.hpp's
// is_attention_backend_v), and nothing of the model's dense ops: the trainer's CUDA backend
// (cuda_ops.cuh) adds those on top, and the Python package's GPU path (python/csrc/oomb_cuda.cu)
// runs the same paged attention with this alone, so offload and page-sparse attention are one
// algorithm for both. Every op is enqueued on the backend's compute stream in call order; host
// tables reach the device through an upload ring on that stream (each released after its last
// reader is enqueued, so the host never waits). A page id outside its pool cannot throw where a
// kernel finds it: the kernels report it on the device, and take_page_report() (or the trainer's
// take_loss()) throws.
//
// Where the pages live is the one template parameter, the far tier's resource (see cuda_ops.cuh:
// device memory in place, pinned or pageable host homes streamed through device slots).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <cuda_runtime.h>
#include <nvtx3/nvtx3.hpp>

#include <oomb/attention/attention.cuh>
#include <oomb/attention/own_page_grads.cuh>
#include <oomb/attention/write_kv_pages.cuh>
#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/core/id_span.hpp>
#include <oomb/cuda/converting_residency.cuh>
#include <oomb/cuda/device_resource.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/residency.cuh>
#include <oomb/cuda/stream.hpp>
#include <oomb/cuda/stream_view.hpp>
#include <oomb/cuda/upload_ring.hpp>
#include <oomb/offload/bf16_codec.hpp>
#include <oomb/paging/views.hpp>
#include <oomb/sparse/sparse_page_table.hpp>

#include "trainer/cuda/cuda_ops_memory.hpp"
#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/interval_clock.cuh"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/page_selector.cuh"
#include "trainer/ops/op_kind.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {
/// The NVTX domain of the trainer's ranges.
struct nvtx_domain {
  static constexpr const char* name{"oomb_trainer"};
};

/// The attention backend on CUDA (ops_backend.hpp's is_attention_backend_v); Far: the resource of
/// the pages' homes. Uses the device current at construction.
template <class Far>
class basic_cuda_attention_ops {
 protected:
  using bf16 = oomb::bf16;
  static constexpr bool streamed = Far::kind != oomb::memory_kind::device;

 public:
  using value_type = bf16;
  using stat_type = float;
  using kv_type = bf16;
  using grad_type = float;
  /// Near slots in device memory; homes in Far.
  using residency_backend = oomb::cuda_backend<oomb::device_resource, oomb::cuda_stream, Far>;
  /// The residency backend of a tier of X pages over bf16 homes (page_tier, --grad-homes bf16):
  /// the homes cross PCIe as bf16 and convert on the device (oomb/cuda/converting_residency.cuh).
  template <class X>
  using bf16_home_residency = oomb::cuda_converting_backend<oomb::bf16_codec<X>, oomb::device_resource, oomb::cuda_stream, Far>;
  using selector_type = cuda_page_selector<basic_cuda_attention_ops>;

  basic_cuda_attention_ops()
      : copy_in_(oomb::cuda_stream::greatest_priority()), copy_out_(oomb::cuda_stream::greatest_priority()), bad_(3) {
    stalls_.reset(compute());
    op_clock_.reset(compute());
    reset_reports();
  }
  basic_cuda_attention_ops(const basic_cuda_attention_ops&) = delete;
  basic_cuda_attention_ops& operator=(const basic_cuda_attention_ops&) = delete;
  ~basic_cuda_attention_ops() { (void)cudaStreamSynchronize(compute_.get()); }  // scratch is freed after its last reader

  // ---- residency ----
  Far& far_memory() noexcept { return far_; }
  oomb::device_resource& near_memory() {
    OOMB_EXPECTS(streamed, "cuda_ops: offload with the pages' homes in device memory streams nothing; use "
                           "cuda_offload_ops (homes in pinned host memory) for offload");
    return near_;
  }
  oomb::cuda_stream& copy_in() noexcept { return copy_in_; }
  oomb::cuda_stream& copy_out() noexcept { return copy_out_; }
  oomb::cuda_stream_view compute() const { return compute_.view(); }

  template <class X>
  void fill(std::int64_t n, X value, X* dst) {
    if (n <= 0) return;
    gpu::ops::fill(n, value, dst, compute());
  }

  /// Throws if a page kernel reported a page id outside its pool since the last check (and clears
  /// the report); waits for the compute stream.
  void take_page_report() {
    std::int32_t bad[3] = {-1, -1, -1};
    OOMB_CUDA_CHECK(cudaMemcpyAsync(bad, bad_.data(), sizeof(bad), cudaMemcpyDeviceToHost, compute_.get()),
                    "cuda_ops: reading the reports");
    OOMB_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), "cuda_ops: the reports");
    if (bad[bad_page] < 0) return;
    reset_reports();
    OOMB_FAIL(oomb::invalid_argument, "cuda_ops: a page id outside its pool (chunk page ", bad[bad_page], ")");
  }

  // ---- exposed transfer time (ops_backend.hpp's optional probe) ----
  void transfer_wait_begin() { stalls_.begin(compute()); }
  void transfer_wait_end() { stalls_.end(compute()); }
  /// The time the compute stream waited for transfers since the last take; waits for the stream.
  double take_transfer_wait_seconds() {
    std::uint64_t ns = 0;
    OOMB_CUDA_CHECK(cudaMemcpyAsync(&ns, stalls_.totals_ns(), sizeof(ns), cudaMemcpyDeviceToHost, compute_.get()),
                    "cuda_ops: reading the transfer waits");
    stalls_.reset(compute());
    OOMB_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), "cuda_ops: the transfer waits");
    return static_cast<double>(ns) * 1e-9;
  }

  // ---- GPU time per kind of op (ops_backend.hpp's optional op clock) ----
  void time_ops(bool on) { time_ops_ = on; }
  /// What the attention calls plan with (chunk_options::attention_kernels and ::deterministic).
  void attention_plan(const oomb::attention::plan_options& o) noexcept { attention_plan_ = o; }
  /// The compute stream's time in each kind of op since the last take (zeros unless time_ops(true));
  /// waits for the stream.
  op_seconds take_op_seconds() {
    if (!time_ops_) return {};  // nothing was timed: no copy, no wait
    std::uint64_t ns[op_kinds] = {};
    OOMB_CUDA_CHECK(cudaMemcpyAsync(ns, op_clock_.totals_ns(), sizeof(ns), cudaMemcpyDeviceToHost, compute_.get()),
                    "cuda_ops: reading the op clock");
    op_clock_.reset(compute());
    OOMB_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), "cuda_ops: the op clock");
    op_seconds s{};
    for (int k = 0; k < op_kinds; ++k) s[static_cast<std::size_t>(k)] = static_cast<double>(ns[k]) * 1e-9;
    return s;
  }

  // ---- page ops ----
  void write_pages(const oomb::page_pool_view<bf16>& pool, oomb::id_span where, std::int64_t n, const bf16* k,
                   const bf16* v) {
    const op_scope scope(*this, op_kind::pages, "pages/write");
    const auto pages = page_list(where, n, pool.page_size, "write_pages");
    oomb::attention::write_kv_pages(n, pool.kv_heads, pool.head_dim, k, v, pages.data, any_page, pool,
                                bad_.data() + bad_page, compute());
    ring().release(pages, compute());
  }
  void add_from_pages(const oomb::page_pool_view<const float>& pool, oomb::id_span where, std::int64_t n, bf16* dk,
                      bf16* dv) {
    const op_scope scope(*this, op_kind::pages, "pages/add_own_grads");
    const std::int32_t P = pool.page_size;
    const std::int64_t count = check_rows(where, n, P, "add_from_pages");
    // The kernel maps page i of the chunk through grad_id[i]: the list is 0 .. count-1, the map `where`.
    host_ints_.resize(static_cast<std::size_t>(2 * count));
    for (std::int64_t i = 0; i < count; ++i) {
      host_ints_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      host_ints_[static_cast<std::size_t>(count + i)] = where[static_cast<std::size_t>(i)];
    }
    const auto t = ring().upload(host_ints_.data(), host_ints_.size(), compute());
    oomb::grad_mirror_view<float> mirror;
    mirror.pool = mutable_view(pool);
    mirror.grad_id = t.data + count;
    mirror.num_kv_ids = static_cast<std::int32_t>(count);
    const std::int64_t rows = n * pool.kv_heads * pool.head_dim;
    float* dk32 = widen(f32_[0], rows, dk);
    float* dv32 = widen(f32_[1], rows, dv);
    oomb::attention::add_own_page_grads(n, pool.kv_heads, pool.head_dim, t.data, mirror, dk32, dv32, bad_.data() + bad_page,
                                    compute());
    ring().release(t, compute());
    gpu::ops::convert(rows, static_cast<const float*>(dk32), dk, compute());
    gpu::ops::convert(rows, static_cast<const float*>(dv32), dv, compute());
  }
  void zero_page(const oomb::page_pool_view<float>& pool, std::int32_t id) {
    OOMB_CUDA_CHECK(cudaMemsetAsync(pool.k(id, 0, 0), 0, static_cast<std::size_t>(pool.pair_stride) * sizeof(float),
                                    compute_.get()),
                    "cuda_ops::zero_page ", id);
  }

  // ---- attention over one window ----
  void attention_forward(const attention_chunk<bf16>& c, const oomb::page_pool_view<const bf16>& kv, const window_table& w,
                         bf16* o_acc, float* lse_acc) {
    const op_scope scope(*this, op_kind::attention_forward, "attention/forward");
    const auto t = upload_window(c, w, false);
    const auto a = args(c, kv, w, t.data, false);
    const std::int64_t od = std::int64_t(c.sq) * c.hq * c.d;
    o_w_.resize(static_cast<std::size_t>(od));
    lse_w_.resize(static_cast<std::size_t>(std::int64_t(c.sq) * c.hq));
    const auto plan = oomb::attention::plan_forward(oomb::attention::call_shape::of(a), facts_, attention_plan_);
    oomb::attention::forward(plan, a, o_w_.data(), lse_w_.data(), compute_.get());
    ring().release(t, compute());
    float* o32 = widen(f32_[0], od, o_acc);
    oomb::attention::merge(c.sq, c.hq, c.d, o32, lse_acc, o_w_.data(), lse_w_.data(), compute_.get());
    gpu::ops::convert(od, static_cast<const float*>(o32), o_acc, compute());
  }
  void attention_backward_begin(const attention_chunk<bf16>& c, const bf16* o, const bf16* d_o) {
    const op_scope scope(*this, op_kind::attention_backward, "attention/backward_delta");
    delta_.resize(static_cast<std::size_t>(std::int64_t(c.sq) * c.hq));
    oomb::attention::backward_delta(c.sq, c.hq, c.d, o, d_o, delta_.data(), compute_.get());
  }
  void attention_backward(const attention_chunk<bf16>& c, const oomb::page_pool_view<const bf16>& kv,
                          const window_table& w, const oomb::page_pool_view<float>& grads, const bf16*, const float* lse,
                          const bf16* d_o, bf16* dq, bf16* dk, bf16* dv) {
    const op_scope scope(*this, op_kind::attention_backward, "attention/backward");
    OOMB_EXPECTS(w.grad_ids != nullptr, "cuda_ops::attention_backward: the window has no grad_ids");
    const auto t = upload_window(c, w, true);
    const auto a = args(c, kv, w, t.data, true);
    oomb::window_grad_view<float> dpast;
    dpast.pool = grads;
    dpast.grad_page = t.data + window_ids + w.pages;
    dpast.pages = w.pages;
    const std::int64_t qd = std::int64_t(c.sq) * c.hq * c.d, kvd = std::int64_t(c.sq) * c.hkv * c.d;
    float* dq32 = widen(f32_[0], qd, dq);
    float* dk32 = widen(f32_[1], kvd, dk);
    float* dv32 = widen(f32_[2], kvd, dv);
    const auto plan =
        oomb::attention::plan_backward(oomb::attention::call_shape::of(a, dq32), facts_, attention_plan_);
    order_ws_.resize(static_cast<std::size_t>(plan.workspace_ints));
    oomb::attention::backward(plan, a, lse, delta_.data(), d_o, dq32, dk32, dv32, dpast,
                              {order_ws_.data(), static_cast<std::int64_t>(order_ws_.size())}, compute_.get());
    ring().release(t, compute());
    gpu::ops::convert(qd, static_cast<const float*>(dq32), dq, compute());
    gpu::ops::convert(kvd, static_cast<const float*>(dk32), dk, compute());
    gpu::ops::convert(kvd, static_cast<const float*>(dv32), dv, compute());
  }

  /// An op's NVTX range and, with time_ops(true), its compute-stream time into its kind's slot;
  /// public for the selector, whose device work is an op of kind selection.
  class op_scope {
   public:
    op_scope(basic_cuda_attention_ops& b, op_kind k, const char* name) : range_(name), b_(b), kind_(k) {
      if (b_.time_ops_) b_.op_clock_.begin(b_.compute());
    }
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;
    ~op_scope() {
      if (!b_.time_ops_) return;
      try {
        b_.op_clock_.end(b_.compute(), static_cast<int>(kind_));
      } catch (...) {  // a launch that fails here fails the stream's next check too (take_loss)
      }
    }

   private:
    nvtx3::scoped_range_in<nvtx_domain> range_;
    basic_cuda_attention_ops& b_;
    op_kind kind_;
  };

 protected:
  // Slots of bad_: where each kind of kernel reports what it could not use (-1: nothing).
  static constexpr int bad_token = 0, bad_target = 1, bad_page = 2;
  // The page kernels' bound on ids: the seam's pool views do not carry the pool's size, and every
  // id comes from the trainer's own pools (checked on the host there).
  static constexpr std::int32_t any_page = std::numeric_limits<std::int32_t>::max();
  static constexpr std::size_t window_ids = cuda_ops_memory::window_header_ints;

  void reset_reports() {
    OOMB_CUDA_CHECK(cudaMemsetAsync(bad_.data(), 0xff, 3 * sizeof(std::int32_t), compute_.get()),
                    "cuda_ops: resetting the reports");
  }

  /// The upload ring: as reserve() sized it, else at its smallest (it grows when it must).
  oomb::upload_ring& ring() {
    if (!ring_) ring_.emplace(cuda_ops_memory::upload_ring_start);
    return *ring_;
  }
  template <class X>
  static void grow_to(gpu::device_buffer<X>& b, std::int64_t n) {
    if (static_cast<std::size_t>(n) > b.capacity()) b.resize(static_cast<std::size_t>(n));
  }

  /// b = src in fp32 (the kernels that add in fp32 work on it; the caller rounds it back).
  float* widen(gpu::device_buffer<float>& b, std::int64_t n, const bf16* src) {
    b.resize(static_cast<std::size_t>(n));
    gpu::ops::convert(n, src, b.data(), compute());
    return b.data();
  }

  static std::int64_t check_rows(oomb::id_span where, std::int64_t n, std::int32_t P, const char* what) {
    const std::int64_t count = (n + P - 1) / P;
    OOMB_EXPECTS(n > 0 && count <= static_cast<std::int64_t>(where.size()), "cuda_ops::", what, ": ", n,
                 " rows need ", count, " pages, given ", where.size());
    return count;
  }
  oomb::upload_ring::uploaded<std::int32_t> page_list(oomb::id_span where, std::int64_t n, std::int32_t P,
                                                      const char* what) {
    const std::int64_t count = check_rows(where, n, P, what);
    return ring().upload(where.data(), static_cast<std::size_t>(count), compute());
  }

  static oomb::page_pool_view<float> mutable_view(const oomb::page_pool_view<const float>& v) {
    oomb::page_pool_view<float> m;
    m.base = const_cast<float*>(v.base);  // the kernel only reads the gradient pages
    m.pair_stride = v.pair_stride;
    m.v_offset = v.v_offset;
    m.stride_token = v.stride_token;
    m.stride_head = v.stride_head;
    m.page_size = v.page_size;
    m.kv_heads = v.kv_heads;
    m.head_dim = v.head_dim;
    return m;
  }

  /// Where a window's upload holds the chunk-layer's selection (after the ids and the gradient pages).
  static std::size_t selection_at(const window_table& w, bool grad_pages) {
    return window_ids + static_cast<std::size_t>(w.pages) * (grad_pages ? 2 : 1);
  }
  /// Where it holds the chunk's per-document bounds (packed documents: after the selection, as int64,
  /// 8-byte aligned).
  static std::size_t bounds_at(const attention_chunk<bf16>& c, const window_table& w, bool grad_pages) {
    std::size_t at = selection_at(w, grad_pages);
    if (const oomb::sparse_page_table* sel = c.selection) at += sel->indptr().size() + sel->indices().size();
    return (at + 1) & ~std::size_t(1);
  }

  /// One upload per window: [indptr 0, pages, last_page_len, (pad), ids ...] (the ids 16-byte
  /// aligned), for the backward each entry's gradient page (window_table::grad_ids, -1: none),
  /// sparse, the selection's tile_indptr and tile_pages, and with packed documents each query's
  /// key_lower. (The selection and bounds are the same for every window of a chunk and layer;
  /// staging them per window costs a few KiB of copy each.)
  oomb::upload_ring::uploaded<std::int32_t> upload_window(const attention_chunk<bf16>& c, const window_table& w,
                                                          bool grad_pages) {
    OOMB_EXPECTS(w.pages > 0 && w.ids != nullptr, "cuda_ops: a window of ", w.pages, " pages needs ids");
    const std::size_t head = window_ids + static_cast<std::size_t>(w.pages);
    const std::size_t at = selection_at(w, grad_pages);
    std::size_t size = at;
    if (const oomb::sparse_page_table* sel = c.selection) {
      check_gpu_sparse_tile(c.tile, c.hq, c.hkv);
      const std::int64_t tiles = (std::int64_t(c.sq) + c.tile - 1) / c.tile;
      OOMB_EXPECTS(sel->num_tiles() == tiles, "cuda_ops: the selection has ", sel->num_tiles(), " tiles, the chunk's ",
                   c.sq, " queries make ", tiles, " tiles of ", c.tile);
      size += sel->indptr().size() + sel->indices().size();
    }
    const std::size_t bounds = bounds_at(c, w, grad_pages);
    if (c.key_lower != nullptr) size = bounds + 2 * static_cast<std::size_t>(c.sq);
    host_ints_.assign(size, -1);
    host_ints_[0] = 0;
    host_ints_[1] = w.pages;
    host_ints_[2] = w.last_page_len;
    for (std::int32_t i = 0; i < w.pages; ++i) {
      host_ints_[window_ids + static_cast<std::size_t>(i)] = w.ids[i];
      if (grad_pages) host_ints_[head + static_cast<std::size_t>(i)] = w.grad_ids[i];
    }
    if (const oomb::sparse_page_table* sel = c.selection) {
      const auto tail = std::copy(sel->indptr().begin(), sel->indptr().end(), host_ints_.begin() + std::ptrdiff_t(at));
      std::copy(sel->indices().begin(), sel->indices().end(), tail);
    }
    if (c.key_lower != nullptr)
      std::memcpy(host_ints_.data() + bounds, c.key_lower, static_cast<std::size_t>(c.sq) * sizeof(std::int64_t));
    return ring().upload(host_ints_.data(), host_ints_.size(), compute());
  }

  /// The kernels' arguments over a window's upload (`grad_pages`: it holds the backward's gradient pages).
  static oomb::attention::attention_args args(const attention_chunk<bf16>& c, const oomb::page_pool_view<const bf16>& kv,
                                  const window_table& w, const std::int32_t* table, bool grad_pages) {
    oomb::attention::attention_args a;
    a.q = c.q;
    a.q_start = c.q_start;
    a.sq = c.sq;
    a.hq = c.hq;
    a.hkv = c.hkv;
    a.d = c.d;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    a.kv.pool = kv;
    a.kv.table.indptr = table;
    a.kv.table.last_page_len = table + 2;
    a.kv.table.indices = table + window_ids;
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = kv.page_size;
    a.first_page = w.first_page;
    a.window_pages = w.pages;
    if (c.selection != nullptr) {
      a.tile_indptr = table + selection_at(w, grad_pages);
      a.tile_pages = a.tile_indptr + c.selection->indptr().size();
      a.tile = c.tile;
    }
    if (c.key_lower != nullptr) a.key_lower = reinterpret_cast<const std::int64_t*>(table + bounds_at(c, w, grad_pages));
    return a;
  }

  oomb::cuda_stream compute_, copy_in_, copy_out_;
  Far far_;
  oomb::device_resource near_;
  std::optional<oomb::upload_ring> ring_;  // made by reserve(), or at its smallest on first use
  gpu::device_buffer<std::int32_t> bad_;  // [3] device reports: bad token, target, page (-1: none)
  gpu::interval_clock stalls_;            // compute-stream time spent waiting for transfers
  gpu::interval_clock op_clock_{op_kinds};  // compute-stream time per op_kind (time_ops)
  bool time_ops_ = false;
  std::vector<std::int32_t> host_ints_;   // the table being uploaded
  // Scratch, grown on first use (or reserved by the trainer's backend): fp32 copies of activation
  // gradients and accumulators, the window's partial attention output and the attention delta.
  gpu::device_buffer<float> f32_[3], o_w_, lse_w_, delta_;
  gpu::device_buffer<std::int32_t> order_ws_;  // the backward's workspace: sparse launch order, or dQ turns
  const oomb::attention::device_facts& facts_ = oomb::attention::current_device_facts();
  oomb::attention::plan_options attention_plan_;
};

}  // namespace oomb_trainer
