// oomb trainer — --device cuda: one sequence's loss and gradient by chunk_recurrent<cuda_backend>
// for training_run (train/run.hpp), the optimizer step staying on the host.
// SPDX-License-Identifier: Apache-2.0
//
// Each step uploads the host's float master weights rounded to bf16, runs both stages on the GPU
// (fp32 gradients) and copies the gradients back, where clipping, AdamW and checkpoints run as
// on the CPU. A first version: the fused AdamW and the device-side gradient norm
// (cuda/ops/adamw.cuh, grad_norm.cuh) are not wired in yet, so every step moves the model across
// PCIe twice (bf16 up, fp32 down).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include <oomb/core/error.hpp>

#include "trainer/backend/cuda_backend.cuh"
#include "trainer/backend/device_params.cuh"
#include "trainer/train/chunk_recurrent.hpp"
#include "trainer/train/run.hpp"

namespace oomb_trainer {

/// chunk_recurrent<cuda_backend> behind training_run's device_loss.
class cuda_device_loss_impl final : public device_loss {
 public:
  cuda_device_loss_impl(const model_config& c, const chunk_options& o, std::int64_t max_tokens)
      : weights_(c), grads_(c), trainer_(c, o, max_tokens) {}

  double loss_and_grad(const qwen2_params<float>& p, qwen2_params<float>& grads, const sequence& seq,
                       const std::function<void(const chunk_progress&)>& progress) override {
    gpu::copy_to_device(p, weights_);
    grads_.zero();
    const double loss = trainer_.loss_and_grad(weights_, grads_, seq, progress);
    gpu::copy_to_host(grads_, grads);
    return loss;
  }
  chunk_step_stats last_stats() const override { return trainer_.last_stats(); }
  tier_memory memory() const override { return trainer_.memory(); }

 private:
  gpu::device_params<oomb::bf16> weights_;
  gpu::device_params<float> grads_;
  chunk_recurrent<cuda_backend> trainer_;
};

/// Throws unless a GPU is visible and the attention kernels take c's head_dim.
inline void require_cuda_device(const model_config& c) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  OOMB_EXPECTS(e == cudaSuccess && count > 0, "--device cuda: no CUDA GPU is visible (",
               e == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(e)),
               "); use --device cpu");
  OOMB_EXPECTS(c.head_dim == 64 || c.head_dim == 128, "--device cuda: head_dim ", c.head_dim,
               " is not supported (the attention kernels take 64 and 128); use --device cpu");
}

/// What training_run takes for --device cuda.
inline device_loss_maker cuda_device_loss() {
  device_loss_maker m;
  m.name = "cuda";
  m.require = require_cuda_device;
  m.make = [](const model_config& c, const chunk_options& o, std::int64_t max_tokens) -> std::unique_ptr<device_loss> {
    return std::make_unique<cuda_device_loss_impl>(c, o, max_tokens);
  };
  return m;
}

}  // namespace oomb_trainer
