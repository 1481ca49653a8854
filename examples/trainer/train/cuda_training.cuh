// oomb trainer — --device cuda: the whole training state on the GPU and the optimizer step there,
// for training_run (train/run.hpp) through device_trainer (train/device_trainer.hpp).
// SPDX-License-Identifier: Apache-2.0
//
// On the device: fp32 master weights, fp32 AdamW moments, bf16 compute weights, fp32 gradients
// (18 bytes per parameter), one chunk_recurrent over the CUDA backend (pages in place, or homes in
// pinned host memory streamed through device slots with --offload). A step zeroes the gradients,
// adds each sequence's (chunk_recurrent), scales by 1 / batch, takes the global norm and the
// clipping factor on the device (cuda/ops/grad_norm.cuh), reads back the norm (4 bytes; the
// losses come back from the head), stops if either is not finite, and runs the fused AdamW
// (cuda/ops/adamw.cuh), which writes the bf16 compute weights from the new masters. Weights and
// moments cross to the host only in save() / load() / load_weights(), through host staging of
// the whole model (3 floats per parameter while it lasts), and are the CPU's files.
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
#include <oomb/cuda/stream.hpp>

#include "trainer/backend/cuda_backend.cuh"
#include "trainer/backend/device_buffer.cuh"
#include "trainer/backend/device_init.cuh"
#include "trainer/backend/device_params.cuh"
#include "trainer/cuda/ops/adamw.cuh"
#include "trainer/cuda/ops/grad_norm.cuh"
#include "trainer/io/checkpoint.hpp"
#include "trainer/train/chunk_recurrent.hpp"
#include "trainer/train/device_trainer.hpp"

namespace oomb_trainer {

namespace gpu::detail {

template <int = 0>
__global__ void scale_kernel(std::int64_t n, float factor, float* __restrict__ x) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] *= factor;
}

}  // namespace gpu::detail

/// The training state of one model on the current GPU, loss and gradients by chunk_recurrent<B>
/// (B: cuda_backend or cuda_offload_backend).
template <class B>
class cuda_trainer final : public device_trainer {
 public:
  explicit cuda_trainer(const trainer_setup& s)
      : config_(s.config), adam_(s.adam), master_(s.config), exp_avg_(s.config), exp_avg_sq_(s.config),
        compute_(s.config), grads_(s.config), chunked_(s.config, s.chunk, s.max_tokens),
        partials_(gpu::ops::grad_norm_partials), norm_and_scale_(2) {}

  void init(std::uint64_t seed) override {
    gpu::init_qwen2(master_, compute_, seed, stream_);
    zero_moments();
    stream_.synchronize();
  }

  void load_weights(const std::string& path) override {
    qwen2_params<float> staged(config_);
    oomb_trainer::load_weights(path, staged.named());
    upload_weights(staged);
  }

  trainer_state load(const std::string& dir) override {
    qwen2_params<float> staged(config_);
    std::vector<float> m(staged.size()), v(staged.size());
    const trainer_state st = load_checkpoint(dir, config_, staged.named(), moment_tensors(staged.layout(), m.data(), v.data()));
    upload_weights(staged);
    copy_up(m, exp_avg_);
    copy_up(v, exp_avg_sq_);
    return st;
  }

  void save(const std::string& dir, const trainer_state& state) override {
    qwen2_params<float> staged = weights();
    std::vector<float> m = copy_down(exp_avg_), v = copy_down(exp_avg_sq_);
    save_checkpoint(dir, config_, staged.named(), moment_tensors(staged.layout(), m.data(), v.data()), state);
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
      gpu::detail::scale_kernel<><<<gpu::ops::detail::grid_for(n, 256, 4096), 256, 0, stream_.get()>>>(
          n, 1.0f / static_cast<float>(batch.size()), grads_.data());
      OOMB_CUDA_CHECK_LAUNCH("cuda_trainer: the batch mean");
    }
    if (!s.dump_grads.empty()) {
      qwen2_params<float> g = host_copy(grads_);
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
    for (const auto& e : master_.layout().entries()) {
      const bool decay = e.shape.size() >= 2 || adam_.decay_vectors;
      const auto c = gpu::ops::adamw_step_coefficients(adam_, s.lr, s.step + 1, decay);
      gpu::ops::adamw_update(static_cast<std::int64_t>(e.numel), master_.data() + e.offset, exp_avg_.data() + e.offset,
                        exp_avg_sq_.data() + e.offset, grads_.data() + e.offset, compute_.data() + e.offset, c, scale,
                        stream_);
    }
    stream_.synchronize();
    return r;
  }

  chunk_step_stats last_stats() const override { return stats_; }
  tier_memory memory() const override { return chunked_.memory(); }
  qwen2_params<float> weights() const override { return host_copy(master_); }
  std::string describe() const override {
    return "cuda (fp32 master weights, AdamW moments and gradients, bf16 compute weights; clip and AdamW on the GPU)";
  }

 private:
  qwen2_params<float> host_copy(const gpu::device_params<float>& d) const {
    qwen2_params<float> h(config_);
    gpu::copy_to_host(d, h);
    return h;
  }
  std::vector<float> copy_down(const gpu::device_params<float>& d) const {
    std::vector<float> h(d.size());
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "cuda_trainer: download");
    OOMB_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost), "cuda_trainer: download");
    return h;
  }
  void copy_up(const std::vector<float>& h, gpu::device_params<float>& d) {
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "cuda_trainer: upload");
    OOMB_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), "cuda_trainer: upload");
  }
  void upload_weights(const qwen2_params<float>& staged) {
    gpu::copy_to_device(staged, master_);
    gpu::refresh_compute(master_, compute_, stream_);
    stream_.synchronize();
  }
  void zero_moments() {
    OOMB_CUDA_CHECK(cudaMemsetAsync(exp_avg_.data(), 0, exp_avg_.size() * sizeof(float), stream_.get()), "cuda_trainer: moments");
    OOMB_CUDA_CHECK(cudaMemsetAsync(exp_avg_sq_.data(), 0, exp_avg_sq_.size() * sizeof(float), stream_.get()),
                    "cuda_trainer: moments");
  }

  model_config config_;
  adamw_options adam_;
  oomb::cuda_stream stream_;
  gpu::device_params<float> master_, exp_avg_, exp_avg_sq_;
  gpu::device_params<oomb::bf16> compute_;
  gpu::device_params<float> grads_;
  chunk_recurrent<B, oomb::belady_eviction> chunked_;  // the CPU's policy with --offload
  gpu::device_buffer<float> partials_, norm_and_scale_;
  chunk_step_stats stats_;
  std::optional<qwen2_params<float>> non_finite_grads_;  // the failure message's staging
};

/// Throws unless a GPU is visible, the attention kernels take the model's head_dim and, with
/// page-sparse attention, a selection tile fills whole query blocks.
inline void require_cuda_device(const trainer_setup& s) {
  const model_config& c = s.config;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  OOMB_EXPECTS(e == cudaSuccess && count > 0, "--device cuda: no CUDA GPU is visible (",
               e == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(e)),
               "); use --device cpu");
  OOMB_EXPECTS(c.head_dim == 64 || c.head_dim == 128, "--device cuda: head_dim ", c.head_dim,
               " is not supported (the attention kernels take 64 and 128); use --device cpu");
  OOMB_EXPECTS(!s.full_backprop, "--device cuda: --full-backprop runs on the CPU only");
  if (s.chunk.sparse) check_gpu_sparse_tile(s.chunk.tile, c.num_attention_heads, c.num_key_value_heads);
}

/// The current GPU's memory by cudaMemGetInfo.
inline device_memory_use cuda_memory_use() {
  std::size_t free = 0, total = 0;
  OOMB_CUDA_CHECK(cudaMemGetInfo(&free, &total), "--device cuda: cudaMemGetInfo");
  return {total - free, free, total};
}

/// What training_run takes for --device cuda: pages in place, or with --offload their homes in
/// pinned host memory streamed through device slots (cuda_offload_backend).
inline device_trainer_maker cuda_device_trainer() {
  device_trainer_maker m;
  m.name = "cuda";
  m.require = require_cuda_device;
  m.memory_use = cuda_memory_use;
  m.make = [](const trainer_setup& s) -> std::unique_ptr<device_trainer> {
    require_cuda_device(s);
    if (s.chunk.offload) return std::make_unique<cuda_trainer<cuda_offload_backend>>(s);
    return std::make_unique<cuda_trainer<cuda_backend>>(s);
  };
  return m;
}

}  // namespace oomb_trainer
