// oomb trainer — AdamW's state of a model on a GPU, where it fits: fp32 master weights and both
// moments of the layout's first tensors in device memory, those of the rest in pinned host memory
// (the cut: optim/optimizer_split.hpp, decided by the memory plan), and the update over both.
// SPDX-License-Identifier: Apache-2.0
//
// Every tensor is updated by the same fused kernel (cuda/ops/adamw.cuh) with the same
// coefficients wherever its state lives, so a split changes no bit. The device part is updated in
// place; the host part in pieces through a ring of three device slots on two copy streams, ordered
// by events only: piece i+1 comes up while piece i is updated on the compute stream and piece i-1
// goes back down. The gradients and the bf16 compute weights are full-model device arrays and
// never move. The device part's kernels are enqueued between the pieces, so they run while the
// copies stream. The host never waits inside update(): the compute stream waits for the last
// download, so one synchronisation with it (the step's end) covers the whole update.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/event.hpp>
#include <oomb/cuda/staging_ring.hpp>
#include <oomb/cuda/stream.hpp>

#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/ops/adamw.cuh"
#include "trainer/io/named_tensor.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/optimizer_split.hpp"

namespace oomb_trainer::gpu {

/// What the last update moved and how long it took on the compute stream.
struct adamw_update_stats {
  std::uint64_t bytes_to_device = 0, bytes_to_host = 0;
  double seconds = 0;  ///< from before the first kernel to after the last download
};

/// The state of a model of config `c` with its first `gpu_tensors` tensors on the device (see the
/// file comment). `piece` elements per ring slot (tests make it small to cross tensors and wrap
/// the ring). Moments start at zero, masters unset.
class adamw_state {
 public:
  /// The three arrays of the state.
  enum part : int { master = 0, exp_avg = 1, exp_avg_sq = 2 };

  adamw_state(const model_config& c, std::size_t gpu_tensors, std::size_t piece = optimizer_piece_elements)
      : layout_(c), split_(split_after(layout_, gpu_tensors)), piece_(split_.piece_elements(piece)) {
    OOMB_EXPECTS(piece > 0, "adamw_state: a ring piece needs at least one element");
    for (auto& d : device_) d.resize(split_.host_offset);
    if (!split_.all_on_gpu()) {
      for (auto& h : host_) h = oomb::make_pinned_staging<float>(split_.host_elements(), cudaHostAllocPortable, "adamw_state");
      ring_.resize(optimizer_ring_slots * 3 * piece_);
      for (auto* events : {&uploaded_, &updated_, &downloaded_})
        for (auto& e : *events) e = oomb::cuda_event::create();
    }
  }

  const param_layout& layout() const noexcept { return layout_; }
  const optimizer_split& split() const noexcept { return split_; }
  /// Elements [0, split().host_offset) of array p, in device memory.
  float* on_device(part p) noexcept { return device_[p].data(); }
  const float* on_device(part p) const noexcept { return device_[p].data(); }
  /// Elements [split().host_offset, total) of array p, in pinned host memory (index 0 is the
  /// element at host_offset); null when everything is on the device.
  float* on_host(part p) noexcept { return host_[p].get(); }
  const float* on_host(part p) const noexcept { return host_[p].get(); }

  /// Masters = `full` (device memory, the layout's size). Synchronous.
  void set_masters(const float* full, oomb::cuda_stream_view stream) {
    stream.enqueue_copy(on_device(master), full, split_.host_offset * sizeof(float));
    stream.enqueue_copy(on_host(master), full + split_.host_offset, split_.host_elements() * sizeof(float));
    stream.synchronize();
  }
  /// Both moments zero. Synchronous.
  void zero_moments(oomb::cuda_stream_view stream) {
    for (part p : {exp_avg, exp_avg_sq}) {
      stream.enqueue_memset(on_device(p), 0, split_.host_offset * sizeof(float));
      if (!split_.all_on_gpu()) std::memset(on_host(p), 0, split_.host_elements() * sizeof(float));
    }
    stream.synchronize();
  }
  /// `full` (device memory, the layout's size) = the masters. Enqueued on `stream`.
  void masters_to_device(float* full, oomb::cuda_stream_view stream) {
    stream.enqueue_copy(full, on_device(master), split_.host_offset * sizeof(float));
    stream.enqueue_copy(full + split_.host_offset, on_host(master), split_.host_elements() * sizeof(float));
  }
  /// `out` (host memory, the layout's size) = the masters. Synchronous.
  void masters_to_host(float* out, oomb::cuda_stream_view stream) const {
    stream.enqueue_copy(out, on_device(master), split_.host_offset * sizeof(float));
    stream.synchronize();
    if (!split_.all_on_gpu()) std::memcpy(out + split_.host_offset, on_host(master), split_.host_elements() * sizeof(float));
  }

  /// One AdamW update of every tensor: `c[i]` the coefficients of layout entry i, `grads` (fp32)
  /// and `compute` (bf16, written from the new masters) full-model device arrays, `grad_scale` a
  /// device scalar or null (see ops::adamw_update). Enqueued on `stream` (see the file comment).
  void update(const float* grads, oomb::bf16* compute, const std::vector<ops::adamw_coefficients>& c, const float* grad_scale,
              oomb::cuda_stream_view stream) {
    const auto& entries = layout_.entries();
    OOMB_EXPECTS(c.size() == entries.size(), "adamw_state: ", c.size(), " coefficient sets for ", entries.size(), " tensors");
    stream.record(start_);
    std::size_t next_on_device = 0;  // device tensors [0, next_on_device) are enqueued
    const auto device_tensors_until = [&](std::size_t end) {
      for (; next_on_device < end; ++next_on_device) {
        const param_entry& e = entries[next_on_device];
        ops::adamw_update(static_cast<std::int64_t>(e.numel), on_device(master) + e.offset, on_device(exp_avg) + e.offset,
                          on_device(exp_avg_sq) + e.offset, grads + e.offset, compute + e.offset, c[next_on_device],
                          grad_scale, stream);
      }
    };
    stats_ = {};
    const std::size_t pieces = split_.all_on_gpu() ? 0 : (split_.host_elements() + piece_ - 1) / piece_;
    if (pieces > 0) up_.wait(downloaded_[(pieces - 1) % optimizer_ring_slots]);  // the last update's last piece is home
    std::size_t tensor = split_.gpu_tensors;  // the first host tensor a piece may still cover
    for (std::size_t i = 0; i < pieces; ++i) {
      const std::size_t s = i % optimizer_ring_slots, first = i * piece_, n = std::min(piece_, split_.host_elements() - first);
      if (i >= optimizer_ring_slots) up_.wait(downloaded_[s]);  // the slot's previous piece is home
      for (part p : {master, exp_avg, exp_avg_sq}) up_.enqueue_copy(slot(s, p), on_host(p) + first, n * sizeof(float));
      up_.record(uploaded_[s]);
      stream.wait(uploaded_[s]);
      // The host tensors overlapping [first, first + n) of the host part, each clipped to it.
      const std::size_t lo = split_.host_offset + first, hi = lo + n;
      while (tensor < entries.size() && entries[tensor].offset + entries[tensor].numel <= lo) ++tensor;
      for (std::size_t t = tensor; t < entries.size() && entries[t].offset < hi; ++t) {
        const param_entry& e = entries[t];
        const std::size_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
        if (a >= b) continue;
        float* at = slot(s, master) + (a - lo);
        ops::adamw_update(static_cast<std::int64_t>(b - a), at, slot(s, exp_avg) + (a - lo), slot(s, exp_avg_sq) + (a - lo),
                          grads + a, compute + a, c[t], grad_scale, stream);
      }
      stream.record(updated_[s]);
      down_.wait(updated_[s]);
      for (part p : {master, exp_avg, exp_avg_sq}) down_.enqueue_copy(on_host(p) + first, slot(s, p), n * sizeof(float));
      down_.record(downloaded_[s]);
      device_tensors_until(split_.gpu_tensors * (i + 1) / pieces);
      stats_.bytes_to_device += 3 * n * sizeof(float);
      stats_.bytes_to_host += 3 * n * sizeof(float);
    }
    device_tensors_until(split_.gpu_tensors);
    if (pieces > 0) stream.wait(downloaded_[(pieces - 1) % optimizer_ring_slots]);  // down_ is in order: all are home
    stream.record(stop_);
  }

  /// The last update's bytes and time; call once the compute stream has passed it.
  adamw_update_stats last_update() const {
    adamw_update_stats s = stats_;
    s.seconds = double(oomb::elapsed_ms(start_, stop_)) / 1e3;
    return s;
  }

 private:
  float* slot(std::size_t s, part p) noexcept { return ring_.data() + (s * 3 + std::size_t(p)) * piece_; }

  param_layout layout_;
  optimizer_split split_;
  std::size_t piece_;
  device_buffer<float> device_[3];
  oomb::pinned_staging<float> host_[3];
  device_buffer<float> ring_;  // optimizer_ring_slots slots of (master, exp_avg, exp_avg_sq) pieces
  oomb::cuda_stream up_{oomb::cuda_stream::greatest_priority()}, down_{oomb::cuda_stream::greatest_priority()};
  oomb::cuda_event uploaded_[optimizer_ring_slots], updated_[optimizer_ring_slots], downloaded_[optimizer_ring_slots];
  oomb::cuda_event start_{oomb::cuda_event::timing}, stop_{oomb::cuda_event::timing};
  adamw_update_stats stats_;
};

/// The state as tensors for a checkpoint: masters under the model's names, moments as
/// optimizer.safetensors names and orders them (moment_tensors: "<name>.exp_avg", "<name>.exp_avg_sq"
/// per tensor). Each is streamed: the checkpoint code copies it out of (or into) the device or the
/// pinned host part one tensor at a time, so saving takes host memory for the largest tensor (the
/// memory plan's checkpoint staging), not for the device part. Construct it with the device idle
/// (the copies are synchronous and ordered against no stream of the trainer's).
class adamw_checkpoint_view {
 public:
  explicit adamw_checkpoint_view(adamw_state& s) {
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "adamw_checkpoint_view: the state's last update");
    for (const param_entry& e : s.layout().entries()) {
      masters_.push_back(streamed(e.name, e, s, adamw_state::master));
      moments_.push_back(streamed(e.name + ".exp_avg", e, s, adamw_state::exp_avg));
      moments_.push_back(streamed(e.name + ".exp_avg_sq", e, s, adamw_state::exp_avg_sq));
    }
  }

  const std::vector<streamed_tensor<float>>& masters() const noexcept { return masters_; }
  const std::vector<streamed_tensor<float>>& moments() const noexcept { return moments_; }

 private:
  static streamed_tensor<float> streamed(std::string name, const param_entry& e, adamw_state& s, adamw_state::part p) {
    const std::size_t h = s.split().host_offset;
    const bool on_device = e.offset < h;
    float* at = on_device ? s.on_device(p) + e.offset : s.on_host(p) + (e.offset - h);
    const std::size_t bytes = e.numel * sizeof(float);
    const cudaMemcpyKind out = on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
    const cudaMemcpyKind in = on_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
    streamed_tensor<float> t{std::move(name), e.shape, {}, {}};
    t.copy_out = [at, bytes, out, n = t.name](float* host) {
      OOMB_CUDA_CHECK(cudaMemcpy(host, at, bytes, out), "adamw_checkpoint_view: copying '", n, "' out");
    };
    t.copy_in = [at, bytes, in, n = t.name](const float* host) {
      OOMB_CUDA_CHECK(cudaMemcpy(at, host, bytes, in), "adamw_checkpoint_view: copying '", n, "' in");
    };
    return t;
  }

  std::vector<streamed_tensor<float>> masters_, moments_;
};

}  // namespace oomb_trainer::gpu
