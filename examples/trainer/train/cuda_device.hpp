// oomb trainer — --device cuda as training_run (train/run.hpp) takes it: the maker of
// cuda_trainer (train/cuda_training.cuh) and the GPU's memory. Host C++, declarations only:
// train/cuda_device.cu (the oomb::trainer_cuda library) compiles both trainers once, and
// oomb-train's main.cpp, a host C++ file, reaches the GPU through this header.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "trainer/train/device_trainer.hpp"

namespace oomb_trainer {

/// What training_run takes for --device cuda: `require` throws unless a GPU is visible, the
/// attention kernels take the model's head_dim and, with page-sparse attention, a selection tile
/// fills whole query blocks; `make` builds cuda_trainer<cuda_backend> (pages in place), or with
/// --offload cuda_trainer<cuda_offload_backend> (their homes in pinned host memory streamed
/// through device slots), with --home-memory pageable cuda_trainer<cuda_pageable_offload_backend>.
device_trainer_maker cuda_device_trainer();

/// The current GPU's memory by cudaMemGetInfo.
device_memory_use cuda_memory_use();

}  // namespace oomb_trainer
