// oomb trainer — --device cuda: the training state on the GPU (the optimizer's where it fits) and
// the optimizer step there, for training_run (app/run.hpp) through trainer
// (trainers/trainer.hpp). training_run takes it from cuda_trainer_factory()
// (trainers/cuda_factory.hpp), which trainers/cuda_factory.cu compiles once for each of the three CUDA
// backends (pages in place, pinned homes, pageable homes).
// SPDX-License-Identifier: Apache-2.0
//
// On the device: bf16 compute weights and fp32 gradients (6 bytes per parameter), one
// chunk_recurrent over the CUDA backend (pages in place, or homes in pinned or pageable host memory
// streamed through device slots with --offload), and AdamW's state (fp32 masters and moments, 12
// bytes per parameter) of the first trainer_setup::optimizer_gpu_tensors tensors; the rest in
// pinned host memory, streamed through a device ring by the update (cuda/adamw_state.cuh; the
// memory plan decides the split). A step zeroes the gradients, adds each sequence's
// (chunk_recurrent), scales by 1 / batch, takes the global norm and the clipping factor on the
// device (cuda/ops/grad_norm.cuh), reads back the norm (4 bytes; the losses come back from the
// head), stops if either is not finite, and runs the fused AdamW over every tensor (cuda/ops/
// adamw.cuh), which writes the bf16 compute weights from the new masters. The gradient buffer
// doubles as the full fp32 masters on the device while weights are initialised or loaded (every
// step zeroes it first). Weights and moments cross to the host only in save() / load() /
// load_weights(), one tensor at a time through a host buffer of that tensor (--init stages the
// whole model's weights), and are the CPU's files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/page_transfer.cuh>
#include <oomb/cuda/stream.hpp>

#include "trainer/algo/chunk_recurrent.hpp"
#include "trainer/cuda/adamw_state.cuh"
#include "trainer/cuda/cuda_ops.cuh"
#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/device_init.cuh"
#include "trainer/cuda/device_params.cuh"
#include "trainer/cuda/ops/adamw.cuh"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/grad_norm.cuh"
#include "trainer/io/checkpoint.hpp"
#include "trainer/trainers/cuda_factory.hpp"
#include "trainer/trainers/memory_plan.hpp"
#include "trainer/trainers/trainer.hpp"

namespace oomb_trainer {

// The memory plan counts each staged transfer's pinned ring at the library's default size.
static_assert(detail::pageable_staging_bytes == oomb::cuda_transfer_options{}.pageable.chunk_bytes *
                                                     std::uint64_t(oomb::cuda_transfer_options{}.pageable.chunks));
// ... and each kernel-path transfer's descriptor slots (device and pinned) at theirs.
static_assert(detail::page_copy_staging_bytes == std::uint64_t(oomb::cuda_transfer_options{}.staging_slots) *
                                                      oomb::cuda_transfer_options{}.pages_per_launch *
                                                      sizeof(oomb::page_copy_desc));

/// The training state of one model on the current GPU, loss and gradients by chunk_recurrent<B>
/// (B: cuda_ops, cuda_offload_ops or cuda_pageable_offload_ops).
template <class B>
class cuda_trainer final : public trainer {
 public:
  explicit cuda_trainer(const trainer_setup& s)
      : config_(s.config), adam_(s.adam), state_(s.config, optimizer_gpu_tensors(s)), compute_(s.config), grads_(s.config),
        chunked_(s.config, s.chunk, s.max_tokens), partials_(gpu::ops::grad_norm_partials), norm_and_scale_(2) {}

  void init(std::uint64_t seed) override {
    gpu::init_hf(grads_, compute_, seed, stream_);
    state_.set_masters(grads_.data(), stream_);
    state_.zero_moments(stream_);
  }

  void load_weights(const std::string& path) override {
    model_params<float> staged(config_);
    oomb_trainer::load_weights(path, staged.named());
    gpu::copy_to_device(staged, grads_);
    gpu::refresh_compute(grads_, compute_, stream_);
    state_.set_masters(grads_.data(), stream_);
  }

  trainer_state load(const std::string& dir) override {
    const gpu::adamw_checkpoint_view view(state_);
    const trainer_state st = load_checkpoint(dir, config_, view.masters(), view.moments());
    state_.masters_to_device(grads_.data(), stream_);
    gpu::refresh_compute(grads_, compute_, stream_);
    stream_.synchronize();
    return st;
  }

  void save(const std::string& dir, const trainer_state& state) override {
    const gpu::adamw_checkpoint_view view(state_);
    save_checkpoint(dir, config_, view.masters(), view.moments(), state, save_options());
  }

  std::vector<double> evaluate(const sequence& seq, const std::function<void(const chunk_progress&)>& progress) override {
    return chunked_.evaluate(compute_, seq, progress);
  }

  step_measure step(const std::vector<sequence>& batch, const step_settings& s,
                    const std::function<void(const chunk_progress&)>& progress) override {
    OOMB_EXPECTS(!batch.empty(), "cuda_trainer: a step needs at least one sequence");
    grads_.zero();
    stats_ = {};
    step_measure r;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const double loss = chunked_.loss_and_grad(compute_, grads_, batch[i], progress);
      add_stats(stats_, chunked_.last_stats());
      check_loss(s, i, batch.size(), loss);
      r.loss += loss;
    }
    r.loss /= static_cast<double>(batch.size());
    // The backend's streams do not order themselves against ours: the gradients are done when
    // the device is idle.
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "cuda_trainer: the step's gradients");
    const auto n = static_cast<std::int64_t>(grads_.size());
    if (batch.size() > 1) {
      gpu::ops::scale(n, 1.0f / static_cast<float>(batch.size()), grads_.data(), stream_.view());
    }
    if (!s.dump_grads.empty()) {
      model_params<float> g = host_copy(grads_);
      dump_gradients(s.dump_grads, g.named(), {{"step", std::to_string(s.step)}, {"loss", fmt::format("{:.9g}", r.loss)}});
    }
    float* norm = norm_and_scale_.data();
    float* scale = norm + 1;
    gpu::ops::grad_norm_begin(partials_.data(), stream_);
    gpu::ops::grad_norm_accumulate(n, grads_.data(), partials_.data(), stream_);
    gpu::ops::grad_norm_finish(partials_.data(), static_cast<float>(s.clip), norm, scale, stream_);
    float host_norm = 0;
    OOMB_CUDA_CHECK(cudaMemcpyAsync(&host_norm, norm, sizeof(float), cudaMemcpyDeviceToHost, stream_.get()),
                    "cuda_trainer: reading the gradient norm");
    stream_.synchronize();
    r.grad_norm = host_norm;
    check_grad_norm<float>(s, r.loss, r.grad_norm, [&] {
      non_finite_grads_ = host_copy(grads_);
      return std::as_const(*non_finite_grads_).named();
    });
    std::vector<gpu::ops::adamw_coefficients> c;
    for (const auto& e : state_.layout().entries()) {
      const bool decay = e.shape.size() >= 2 || adam_.decay_vectors;
      c.push_back(gpu::ops::adamw_step_coefficients(adam_, s.lr, s.step + 1, decay));
    }
    state_.update(grads_.data(), compute_.data(), c, scale, stream_);
    stream_.synchronize();
    return r;
  }

  chunk_step_stats last_stats() const override { return stats_; }
  tier_memory memory() const override { return chunked_.memory(); }
  model_params<float> weights() const override {
    model_params<float> h(config_);
    state_.masters_to_host(h.data(), stream_);
    return h;
  }
  std::string describe() const override {
    const optimizer_split& sp = state_.split();
    const std::string where =
        sp.all_on_gpu() ? std::string("on the GPU")
                        : fmt::format("on the GPU for the first {} of {} tensors, the rest ({:.1f} MiB) in pinned host memory, "
                                      "streamed through a {:.0f} MiB device ring each step",
                                      sp.gpu_tensors, sp.tensors, double(sp.host_bytes()) / double(1 << 20),
                                      double(sp.ring_bytes()) / double(1 << 20));
    return "cuda (fp32 master weights, AdamW moments and gradients, bf16 compute weights; clip and AdamW on the GPU; "
           "optimizer state " + where + ")";
  }
  /// The last step's optimizer update: bytes each way between host and device, its time.
  gpu::adamw_update_stats last_optimizer_update() const { return state_.last_update(); }
  const optimizer_split& optimizer_state_split() const noexcept { return state_.split(); }

 private:
  model_params<float> host_copy(const gpu::device_params<float>& d) const {
    model_params<float> h(config_);
    gpu::copy_to_host(d, h);
    return h;
  }
  /// trainer_setup's split (-1: every tensor on the GPU), checked against the model.
  static std::size_t optimizer_gpu_tensors(const trainer_setup& s) {
    const std::size_t n = param_layout(s.config).entries().size();
    OOMB_EXPECTS(s.optimizer_gpu_tensors >= -1 && s.optimizer_gpu_tensors <= std::int64_t(n), "cuda_trainer: ",
                 s.optimizer_gpu_tensors, " tensors' optimizer state on the GPU, the model has ", n);
    return s.optimizer_gpu_tensors < 0 ? n : static_cast<std::size_t>(s.optimizer_gpu_tensors);
  }

  model_config config_;
  adamw_options adam_;
  oomb::cuda_stream stream_;
  gpu::adamw_state state_;
  gpu::device_params<oomb::bf16> compute_;
  gpu::device_params<float> grads_;
  chunk_recurrent<B, oomb::belady_eviction> chunked_;  // the CPU's policy with --offload
  gpu::device_buffer<float> partials_, norm_and_scale_;
  chunk_step_stats stats_;
  std::optional<model_params<float>> non_finite_grads_;  // the failure message's staging
};

}  // namespace oomb_trainer
