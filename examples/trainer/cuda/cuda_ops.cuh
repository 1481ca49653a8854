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

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/cuda/device_resource.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/pinned_resource.hpp>
#include <oomb/cuda/stream_view.hpp>
#include <oomb/cuda/upload_ring.hpp>

#include "trainer/cpu/rope.hpp"
#include "trainer/cuda/cuda_attention_ops.cuh"
#include "trainer/cuda/cuda_ops_memory.hpp"
#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/device_params.cuh"
#include "trainer/cuda/huge_page_host_resource.hpp"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/embedding.cuh"
#include "trainer/cuda/ops/gemm.cuh"
#include "trainer/cuda/ops/linear.cuh"
#include "trainer/cuda/ops/lm_head_cross_entropy.cuh"
#include "trainer/cuda/ops/rmsnorm.cuh"
#include "trainer/cuda/ops/rope.cuh"
#include "trainer/cuda/ops/sum.cuh"
#include "trainer/cuda/ops/swiglu.cuh"
#include "trainer/ops/op_kind.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

/// The CUDA ops backend (see ops_backend.hpp for what each member guarantees, and the top
/// of this file for what this one does): the attention backend (cuda_attention_ops.cuh) and the
/// model's dense ops. Far: the resource of the pages' homes (device memory: in place; pinned or
/// pageable host memory: streamed). Uses the device current at construction.
template <class Far>
class basic_cuda_ops : public basic_cuda_attention_ops<Far> {
  using base = basic_cuda_attention_ops<Far>;
  using bf16 = oomb::bf16;
  using base::bad_;
  using base::compute_;
  using base::f32_;
  using base::ring;
  using base::widen;
  using base::bad_target;
  using base::bad_token;
  using base::delta_;
  using base::grow_to;
  using base::lse_w_;
  using base::o_w_;
  using base::reset_reports;
  using base::ring_;

 public:
  using typename base::op_scope;
  using base::compute;
  template <class X>
  using buffer = gpu::device_buffer<X>;
  using params_type = gpu::device_params<bf16>;
  using grads_type = gpu::device_params<float>;

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

  basic_cuda_ops() : gemm_(cuda_ops_memory::gemm_workspace), loss_(1) {
    OOMB_CUDA_CHECK(cudaMemsetAsync(loss_.data(), 0, sizeof(double), compute_.get()), "cuda_ops: loss");
  }
  ~basic_cuda_ops() { (void)cudaStreamSynchronize(compute_.get()); }  // this level's scratch outlives its last reader too

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
  static constexpr std::size_t head_budget = cuda_ops_memory::head_budget;

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

  gpu::ops::gemm_context gemm_;
  gpu::device_buffer<double> loss_;       // the loss added since the last take
  std::int32_t vocab_ = 0;                // of the last embedding_forward
  // Scratch of the dense ops, grown on first use or by reserve(): the head's normed rows, rstd and
  // per-row loss/lse, and the ops' shared workspace.
  gpu::device_buffer<float> rstd_, rows_;
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
