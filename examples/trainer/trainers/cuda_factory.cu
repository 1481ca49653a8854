// oomb trainer — --device cuda (trainers/cuda_factory.hpp), compiled once: the oomb::trainer_cuda library.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/trainers/cuda_factory.hpp"

#include <cuda_runtime.h>

#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>

#include "trainer/trainers/cuda_trainer.cuh"

namespace oomb_trainer {

namespace {

void require_cuda_device(const trainer_setup& s) {
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

}  // namespace

device_memory_use cuda_memory_use() {
  std::size_t free = 0, total = 0;
  OOMB_CUDA_CHECK(cudaMemGetInfo(&free, &total), "--device cuda: cudaMemGetInfo");
  return {total - free, free, total};
}

trainer_factory cuda_trainer_factory() {
  trainer_factory m;
  m.name = "cuda";
  m.require = require_cuda_device;
  m.memory_use = cuda_memory_use;
  m.make = [](const trainer_setup& s) -> std::unique_ptr<trainer> {
    require_cuda_device(s);
    if (s.chunk.offload && s.chunk.homes == home_memory::pageable)
      return std::make_unique<cuda_trainer<cuda_pageable_offload_ops>>(s);
    if (s.chunk.offload) return std::make_unique<cuda_trainer<cuda_offload_ops>>(s);
    return std::make_unique<cuda_trainer<cuda_ops>>(s);
  };
  return m;
}

}  // namespace oomb_trainer
