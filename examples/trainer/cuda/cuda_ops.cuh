// oomb trainer — the CUDA backend: the trainer's ops on one GPU, with the pages in place in device
// memory (cuda_ops) or at home in pinned host memory, streamed through device slots
// (cuda_offload_ops).
// SPDX-License-Identifier: Apache-2.0
//
// The ops of examples/trainer/cuda/ (cuBLASLt GEMMs, the layer kernels, the fused LM head +
// cross-entropy, the paged attention kernels, the page kernels) behind the seam of
// ops_backend.hpp, every one enqueued on the backend's compute stream in call order; the host
// waits only in take_loss(), once per step. Precision: bf16 compute weights, activations and K/V
// pages; fp32 statistics (norm rstd, attention lse), scalars, gradient pages and parameter
// gradients; fp32 accumulation in every GEMM and reduction. Activation gradients are value_type
// (bf16) as the seam has them: the kernels that add in fp32 (RMSNorm's dx, the attention's dq, dk,
// dv, the own-page gradients, the window merge) work on an fp32 copy that is rounded back once
// per call.
//
// Host tables (tokens, targets, window page lists with their gradient pages, the RoPE cos/sin)
// reach the device through an upload_ring on the compute stream: each is released after its last
// reader is enqueued, so no table a kernel may still read is overwritten, and the host never waits.
// Bad data on the device (a token or target outside the vocabulary, a page id outside the pool)
// cannot throw where it is found; take_loss() reads the kernels' reports and throws.
//
// Where the pages live is the one template parameter, the far tier's resource:
//  - cuda_ops (oomb::device_resource): every K/V and gradient page in device memory, read in
//    place; the far pools are contiguous. Refuses offload (near_memory() throws: streaming device
//    memory through device slots buys nothing).
//  - cuda_pageable_offload_ops (huge_page_host_resource): as cuda_offload_ops, with the homes in
//    pageable host memory (transparent huge pages where the host has them): each batch crosses a
//    pinned staging ring, the host's copies in stream order (oomb/cuda/staged_page_transfer.cuh),
//    so no device memory grows with the homes.
//  - cuda_offload_ops (oomb::pinned_resource): homes in pinned host memory, written once right
//    after their projection; the kernels address a fixed set of device slots (near_memory()) that
//    the residency scheduler fills on the copy-in stream and writes back on the copy-out stream,
//    both ordered against the compute stream by events, never by a host wait. Needs offload:
//    page_tier refuses to read pinned pages in place. With bf16 gradient homes (--grad-homes
//    bf16), the gradient tier's residency backend is bf16_home_residency: bf16 crosses PCIe and
//    the device converts to and from the fp32 slots.
// Page-sparse attention (--sparse): selector_type is cuda_page_selector (cuda/page_selector.cuh:
// summaries and selection on the GPU, the table back on the host for stage 2); each window call
// uploads the chunk-layer's selection with its window table and the kernels read only the
// selected past pages. Scratch grows on first use (the first step) and is kept.
// Each op opens an NVTX range named "<kind>/<op>" (gemm/, attention/, head/, elementwise/,
// embedding/, pages/, and the selector's selection/) in the "oomb_trainer" domain (NVTX3's scoped
// ranges), so Nsight Systems attributes the GPU time of a step to its parts
// (bench/trainer/split.sh); with no profiler attached a range costs a branch. With time_ops(true)
// each op's time on the compute stream is also summed by op_kind on the device (interval_clock.cuh;
// bench_trainer --split).
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
#include <oomb/cuda/pinned_resource.hpp>
#include <oomb/cuda/residency.cuh>
#include <oomb/cuda/stream.hpp>
#include <oomb/cuda/stream_view.hpp>
#include <oomb/cuda/upload_ring.hpp>
#include <oomb/offload/bf16_codec.hpp>
#include <oomb/paging/views.hpp>
#include <oomb/sparse/sparse_page_table.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/cpu/rope.hpp"
#include "trainer/cuda/cuda_ops_memory.hpp"
#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/device_params.cuh"
#include "trainer/cuda/huge_page_host_resource.hpp"
#include "trainer/cuda/interval_clock.cuh"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/embedding.cuh"
#include "trainer/cuda/ops/gemm.cuh"
#include "trainer/cuda/ops/linear.cuh"
#include "trainer/cuda/ops/lm_head_cross_entropy.cuh"
#include "trainer/cuda/ops/rmsnorm.cuh"
#include "trainer/cuda/ops/rope.cuh"
#include "trainer/cuda/ops/sum.cuh"
#include "trainer/cuda/ops/swiglu.cuh"
#include "trainer/cuda/page_selector.cuh"
#include "trainer/ops/op_kind.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

/// The NVTX domain of the trainer's ranges.
struct nvtx_domain {
  static constexpr const char* name{"oomb_trainer"};
};

/// The CUDA ops backend (see ops_backend.hpp for what each member guarantees, and the top
/// of this file for what this one does); Far: the resource of the pages' homes (device memory:
/// in place; pinned or pageable host memory: streamed). Uses the device current at construction.
template <class Far>
class basic_cuda_ops {
  using bf16 = oomb::bf16;
  static constexpr bool streamed = Far::kind != oomb::memory_kind::device;

 public:
  using value_type = bf16;
  using stat_type = float;
  using kv_type = bf16;
  using grad_type = float;
  template <class X>
  using buffer = gpu::device_buffer<X>;
  using params_type = gpu::device_params<bf16>;
  using grads_type = gpu::device_params<float>;
  /// Near slots in device memory; homes in Far.
  using residency_backend = oomb::cuda_backend<oomb::device_resource, oomb::cuda_stream, Far>;
  /// The residency backend of a tier of X pages over bf16 homes (page_tier, --grad-homes bf16):
  /// the homes cross PCIe as bf16 and convert on the device (oomb/cuda/converting_residency.cuh).
  template <class X>
  using bf16_home_residency = oomb::cuda_converting_backend<oomb::bf16_codec<X>, oomb::device_resource, oomb::cuda_stream, Far>;
  using selector_type = cuda_page_selector<basic_cuda_ops>;

  /// fp32 cos/sin of rows at host `positions` on the device (computed on the host in double, as the
  /// CPU does), held in the upload ring until the object dies: every op that reads it is enqueued by then.
  class rope_type {
   public:
    rope_type(oomb::upload_ring& ring, oomb::cuda_stream_view stream, const std::int64_t* positions, std::int64_t count,
              const rope_frequencies& f)
        : ring_(&ring), stream_(stream) {
      const auto host = cpu::rope_table<float>::at_positions(positions, count, f);
      std::vector<float> both(host.cos);
      both.insert(both.end(), host.sin.begin(), host.sin.end());
      table_ = ring.upload(both.data(), both.size(), stream);
      view_.cos = table_.data;
      view_.sin = table_.data + host.cos.size();
      view_.n = count;
      view_.half = host.half;
    }
    rope_type(const rope_type&) = delete;
    rope_type& operator=(const rope_type&) = delete;
    ~rope_type() {
      try {
        ring_->release(table_, stream_);
      } catch (...) {  // a failed event record: the next checked call on the stream reports the fault
      }
    }
    const gpu::ops::rope_table_view& view() const noexcept { return view_; }

   private:
    oomb::upload_ring* ring_;
    oomb::cuda_stream_view stream_;
    oomb::upload_ring::uploaded<float> table_;
    gpu::ops::rope_table_view view_;
  };

  basic_cuda_ops()
      : copy_in_(oomb::cuda_stream::greatest_priority()), copy_out_(oomb::cuda_stream::greatest_priority()),
        gemm_(cuda_ops_memory::gemm_workspace), bad_(3), loss_(1) {
    OOMB_CUDA_CHECK(cudaMemsetAsync(loss_.data(), 0, sizeof(double), compute_.get()), "cuda_ops: loss");
    stalls_.reset(compute());
    op_clock_.reset(compute());
    reset_reports();
  }
  basic_cuda_ops(const basic_cuda_ops&) = delete;
  basic_cuda_ops& operator=(const basic_cuda_ops&) = delete;
  ~basic_cuda_ops() { (void)cudaStreamSynchronize(compute_.get()); }  // scratch is freed after its last reader

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

  // ---- dense ops ----
  void embedding_forward(std::int64_t n, std::int32_t H, std::int32_t vocab, const std::int32_t* tokens, const bf16* table,
                         bf16* x) {
    const op_scope scope(*this, op_kind::embedding, "embedding/forward");
    vocab_ = vocab;
    const auto t = ring().upload(tokens, static_cast<std::size_t>(n), compute());
    gpu::ops::embedding_forward(n, H, vocab, t.data, table, x, bad_.data() + bad_token, compute());
    ring().release(t, compute());
  }
  /// The vocabulary is the last embedding_forward's (the seam does not pass it here).
  void embedding_backward(std::int64_t n, std::int32_t H, const std::int32_t* tokens, const bf16* dx, float* dtable) {
    const op_scope scope(*this, op_kind::embedding, "embedding/backward");
    OOMB_EXPECTS(vocab_ > 0, "cuda_ops::embedding_backward before any embedding_forward");
    const auto t = ring().upload(tokens, static_cast<std::size_t>(n), compute());
    const std::size_t bytes = gpu::ops::embedding_backward_workspace_bytes(n, vocab_);
    gpu::ops::embedding_backward(n, H, vocab_, t.data, dx, dtable, workspace(bytes), bytes, compute());
    ring().release(t, compute());
  }
  rope_type rope(const std::int64_t* positions, std::int64_t count, const rope_frequencies& f) {
    return rope_type(ring(), compute(), positions, count, f);
  }
  void rope_forward(std::int64_t n, std::int32_t heads, std::int32_t d, bf16* x, const rope_type& r) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/rope_forward");
    gpu::ops::rope_forward(n, heads, d, x, r.view(), compute());
  }
  void rope_backward(std::int64_t n, std::int32_t heads, std::int32_t d, bf16* dx, const rope_type& r) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/rope_backward");
    gpu::ops::rope_backward(n, heads, d, dx, r.view(), compute());
  }
  void rmsnorm_forward(std::int64_t n, std::int32_t H, const bf16* x, const bf16* w, float eps, bf16* y, float* rstd) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/rmsnorm_forward");
    gpu::ops::rmsnorm_forward(n, H, x, w, eps, y, rstd, compute());
  }
  void rmsnorm_backward(std::int64_t n, std::int32_t H, const bf16* x, const bf16* w, const float* rstd, const bf16* dy,
                        bf16* dx, float* dw) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/rmsnorm_backward");
    float* dx32 = widen(f32_[0], n * H, dx);
    const std::size_t bytes = gpu::ops::rmsnorm_backward_workspace_bytes(n, H);
    gpu::ops::rmsnorm_backward(n, H, x, w, rstd, dy, dx32, dw, workspace(bytes), bytes, compute());
    gpu::ops::convert(n * H, static_cast<const float*>(dx32), dx, compute());
  }
  void linear_forward(std::int64_t n, std::int32_t in, std::int32_t out, const bf16* x, const bf16* W, const bf16* b,
                      bf16* y) {
    const op_scope scope(*this, op_kind::gemm, "gemm/linear_forward");
    gpu::ops::linear_forward(gemm_, n, in, out, x, W, b, y, compute());
  }
  void linear_backward(std::int64_t n, std::int32_t in, std::int32_t out, const bf16* x, const bf16* W, const bf16* dy,
                       bf16* dx, float* dW, float* db) {
    const op_scope scope(*this, op_kind::gemm, "gemm/linear_backward");
    if (dx != nullptr) gpu::ops::linear_backward_input(gemm_, n, in, out, dy, W, dx, /*accumulate=*/true, compute());
    if (dW != nullptr) gpu::ops::linear_backward_weight(gemm_, n, in, out, x, dy, dW, compute());
    if (db != nullptr) gpu::ops::bias_backward(n, out, dy, db, compute());
  }
  void swiglu_forward(std::int64_t n, const bf16* g, const bf16* u, bf16* h) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/swiglu_forward");
    gpu::ops::swiglu_forward(n, g, u, h, compute());
  }
  void swiglu_backward(std::int64_t n, const bf16* g, const bf16* u, const bf16* dh, bf16* dg, bf16* du) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/swiglu_backward");
    gpu::ops::swiglu_backward(n, g, u, dh, dg, du, compute());
  }
  template <class X>
  void copy(std::int64_t n, const X* src, X* dst) {
    OOMB_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(X), cudaMemcpyDeviceToDevice,
                                    compute_.get()),
                    "cuda_ops::copy of ", n, " elements");
  }
  /// copy() into or out of memory an acquire just handed out: stream order puts it after the copies.
  template <class X>
  void copy_block(std::int64_t n, const X* src, X* dst) {
    copy(n, src, dst);
  }
  void add(std::int64_t n, const bf16* src, bf16* dst) {
    const op_scope scope(*this, op_kind::elementwise, "elementwise/add");
    gpu::ops::add_into(n, src, dst, compute());
  }
  template <class X>
  void fill(std::int64_t n, X value, X* dst) {
    if (n <= 0) return;
    gpu::ops::fill(n, value, dst, compute());
  }
  void head_loss_and_grad(const params_type& p, grads_type* grads, std::int64_t n, const bf16* x,
                          const std::int32_t* targets, float scale, bf16* dx) {
    const op_scope scope(*this, op_kind::head, "head/loss_and_grad");
    head(p, grads, n, x, targets, scale, dx);
  }
  /// Forward only: each row's loss into the host array `out` (0 where targets[t] < 0); the step's
  /// loss is unchanged. Waits for the compute stream.
  void head_row_losses(const params_type& p, std::int64_t n, const bf16* x, const std::int32_t* targets, double* out) {
    {
      const op_scope scope(*this, op_kind::head, "head/row_losses");
      head(p, nullptr, n, x, targets, 1.0f, nullptr, /*add_to_loss=*/false);
    }
    std::vector<float> rows(static_cast<std::size_t>(n));
    OOMB_CUDA_CHECK(cudaMemcpyAsync(rows.data(), rows_.data(), rows.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                    compute_.get()),
                    "cuda_ops: reading the row losses");
    OOMB_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), "cuda_ops: the row losses");
    for (std::int64_t t = 0; t < n; ++t) out[t] = targets[t] < 0 ? 0.0 : double(rows[static_cast<std::size_t>(t)]);
  }
  /// The loss added since the last take; waits for the compute stream, and throws if a kernel
  /// reported a token, target or page it could not use.
  double take_loss() {
    double loss = 0;
    std::int32_t bad[3] = {-1, -1, -1};
    OOMB_CUDA_CHECK(cudaMemcpyAsync(&loss, loss_.data(), sizeof(double), cudaMemcpyDeviceToHost, compute_.get()),
                    "cuda_ops: reading the loss");
    OOMB_CUDA_CHECK(cudaMemcpyAsync(bad, bad_.data(), sizeof(bad), cudaMemcpyDeviceToHost, compute_.get()),
                    "cuda_ops: reading the reports");
    OOMB_CUDA_CHECK(cudaMemsetAsync(loss_.data(), 0, sizeof(double), compute_.get()), "cuda_ops: loss");
    OOMB_CUDA_CHECK(cudaStreamSynchronize(compute_.get()), "cuda_ops: the step");
    if (bad[0] >= 0 || bad[1] >= 0 || bad[2] >= 0) {
      reset_reports();
      OOMB_FAIL(oomb::invalid_argument, "cuda_ops: ",
                bad[0] >= 0 ? "a token outside the vocabulary (chunk row " : bad[1] >= 0 ? "a target outside the vocabulary (chunk row "
                                                                                         : "a page id outside its pool (chunk page ",
                bad[0] >= 0 ? bad[0] : bad[1] >= 0 ? bad[1] : bad[2], ")");
    }
    return loss;
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

  // ---- scratch up front (ops_backend.hpp's reserve) ----
  /// Allocates what a chunk of shape s needs: the scratch cuda_ops_memory::scratch_for states, the
  /// ops' workspace at the head's budget and the upload ring at cuda_ops_memory::upload_ring_bytes,
  /// so that no op of a step of that shape allocates.
  void reserve(const chunk_shape& s) {
    const cuda_ops_memory::scratch want = cuda_ops_memory::scratch_for(s);
    for (int i = 0; i < 3; ++i) grow_to(f32_[i], want.f32[i]);
    grow_to(o_w_, want.o_w);
    grow_to(lse_w_, want.lse_w);
    grow_to(delta_, want.delta);
    grow_to(rstd_, want.rstd);
    grow_to(rows_, want.rows);
    grow_to(xf_, want.xf);
    grow_to(work_, std::int64_t(head_budget));
    const std::size_t ring_bytes = cuda_ops_memory::upload_ring_bytes(s);
    if (!ring_ || ring_->capacity() < ring_bytes) {
      ring_.reset();  // waits for any table still in flight
      ring_.emplace(ring_bytes);
    }
  }
  /// The scratch held now, in bytes as cuda_ops_memory::scratch::bytes counts it (the op
  /// workspace and the ring apart): equal to the plan's after reserve(), unless an op grew it.
  std::uint64_t scratch_bytes() const noexcept {
    std::uint64_t f = f32_[0].capacity() + f32_[1].capacity() + f32_[2].capacity() + o_w_.capacity() + lse_w_.capacity() +
                      delta_.capacity() + rstd_.capacity() + rows_.capacity();
    return 4 * f + 2 * std::uint64_t(xf_.capacity());
  }
  /// Bytes of the ops' shared workspace and of the upload ring's current buffer (each side).
  std::size_t workspace_bytes() const noexcept { return work_.capacity(); }
  std::size_t upload_ring_bytes() const noexcept { return ring_ ? ring_->held_bytes() : 0; }

  /// An op's NVTX range and, with time_ops(true), its compute-stream time into its kind's slot;
  /// public for the selector, whose device work is an op of kind selection.
  class op_scope {
   public:
    op_scope(basic_cuda_ops& b, op_kind k, const char* name) : range_(name), b_(b), kind_(k) {
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
    basic_cuda_ops& b_;
    op_kind kind_;
  };

 private:
  /// The fused head: final norm, LM head, cross-entropy (the loss of each row in rows_[0, n)).
  void head(const params_type& p, grads_type* grads, std::int64_t n, const bf16* x, const std::int32_t* targets,
            float scale, bf16* dx, bool add_to_loss = true) {
    const auto& c = p.config();
    const std::int32_t H = c.hidden_size, V = c.vocab_size;
    const auto eps = static_cast<float>(c.rms_norm_eps);
    xf_.resize(static_cast<std::size_t>(n * H));
    rstd_.resize(static_cast<std::size_t>(n));
    rows_.resize(static_cast<std::size_t>(2 * n));
    gpu::ops::rmsnorm_forward(n, H, x, p.final_norm(), eps, xf_.data(), rstd_.data(), compute());
    const auto t = ring().upload(targets, static_cast<std::size_t>(n), compute());
    gpu::ops::lm_head_ce_args a;
    a.n = n;
    a.H = H;
    a.V = V;
    a.x = xf_.data();
    a.W = p.lm_head();
    a.targets = t.data;
    a.loss = rows_.data();
    a.lse = rows_.data() + n;
    a.bad_position = bad_.data() + bad_target;
    a.scale = scale;
    if (grads != nullptr) {
      f32_[1].resize(static_cast<std::size_t>(n * H));
      a.dx = f32_[1].data();
      a.dW = grads->lm_head();
    }
    const auto plan = gpu::ops::plan_lm_head_ce(n, V, head_budget);
    const std::size_t bytes = gpu::ops::lm_head_ce_workspace_bytes(plan);
    gpu::ops::lm_head_cross_entropy(gemm_, plan, a, workspace(bytes), bytes, compute());
    ring().release(t, compute());
    if (add_to_loss) gpu::ops::add_sum(n, rows_.data(), loss_.data(), compute());
    if (grads == nullptr) return;
    float* dx32 = zeroed(f32_[0], n * H);
    const std::size_t nbytes = gpu::ops::rmsnorm_backward_workspace_bytes(n, H);
    gpu::ops::rmsnorm_backward(n, H, x, p.final_norm(), rstd_.data(), static_cast<const float*>(a.dx), dx32,
                               grads->final_norm(), workspace(nbytes), nbytes, compute());
    gpu::ops::convert(n * H, static_cast<const float*>(dx32), dx, compute());
  }
  // Slots of bad_: where each kind of kernel reports what it could not use (-1: nothing).
  static constexpr int bad_token = 0, bad_target = 1, bad_page = 2;
  // The page kernels' bound on ids: the seam's pool views do not carry the pool's size, and every
  // id comes from the trainer's own pools (checked on the host there).
  static constexpr std::int32_t any_page = std::numeric_limits<std::int32_t>::max();
  static constexpr std::size_t head_budget = cuda_ops_memory::head_budget;
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

  void* workspace(std::size_t bytes) {
    work_.resize(bytes);
    return work_.data();
  }
  float* zeroed(gpu::device_buffer<float>& b, std::int64_t n) {
    b.resize(static_cast<std::size_t>(n));
    OOMB_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, static_cast<std::size_t>(n) * sizeof(float), compute_.get()),
                    "cuda_ops: zeroing scratch");
    return b.data();
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
  gpu::ops::gemm_context gemm_;
  std::optional<oomb::upload_ring> ring_;  // made by reserve(), or at its smallest on first use
  gpu::device_buffer<std::int32_t> bad_;  // [3] device reports: bad token, target, page (-1: none)
  gpu::device_buffer<double> loss_;       // the loss added since the last take
  gpu::interval_clock stalls_;            // compute-stream time spent waiting for transfers
  gpu::interval_clock op_clock_{op_kinds};  // compute-stream time per op_kind (time_ops)
  bool time_ops_ = false;
  std::int32_t vocab_ = 0;                // of the last embedding_forward
  std::vector<std::int32_t> host_ints_;   // the table being uploaded
  // Scratch, grown on first use: fp32 copies of activation gradients and accumulators, the
  // window's partial attention output, the attention delta, the head's normed rows, rstd and
  // per-row loss/lse, and the ops' workspace.
  gpu::device_buffer<float> f32_[3], o_w_, lse_w_, delta_, rstd_, rows_;
  gpu::device_buffer<std::int32_t> order_ws_;  // the backward's workspace: sparse launch order, or dQ turns
  const oomb::attention::device_facts& facts_ = oomb::attention::current_device_facts();
  oomb::attention::plan_options attention_plan_;
  gpu::device_buffer<bf16> xf_;
  gpu::device_buffer<unsigned char> work_;
};

/// Every page in device memory, read in place.
using cuda_ops = basic_cuda_ops<oomb::device_resource>;
/// Homes in pinned host memory, streamed through device slots (chunk_options::offload).
using cuda_offload_ops = basic_cuda_ops<oomb::pinned_resource>;
/// Homes in pageable host memory, streamed through device slots by way of pinned staging
/// (chunk_options::offload with home_memory::pageable; oomb/cuda/staged_page_transfer.cuh).
using cuda_pageable_offload_ops = basic_cuda_ops<huge_page_host_resource>;

static_assert(is_ops_backend_v<cuda_ops>);
static_assert(is_ops_backend_v<cuda_offload_ops>);
static_assert(is_ops_backend_v<cuda_pageable_offload_ops>);

}  // namespace oomb_trainer
