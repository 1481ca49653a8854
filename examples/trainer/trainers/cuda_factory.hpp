// oomb trainer — --device cuda as training_run (app/run.hpp) takes it: the maker of
// cuda_trainer (trainers/cuda_trainer.cuh) and the GPU's memory. Host C++, declarations only:
// trainers/cuda_factory.cu (the oomb::trainer_cuda library) compiles both trainers once, and
// oomb-train's main.cpp, a host C++ file, reaches the GPU through this header.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "trainer/trainers/trainer.hpp"

namespace oomb_trainer {

/// What training_run takes for --device cuda: `require` throws unless a GPU is visible, the
/// attention kernels take the model's head_dim and, with page-sparse attention, a selection tile
/// fills whole query blocks; `make` builds cuda_trainer<cuda_ops> (pages in place), or with
/// --offload cuda_trainer<cuda_offload_ops> (their homes in pinned host memory streamed
/// through device slots), with --home-memory pageable cuda_trainer<cuda_pageable_offload_ops>.
trainer_factory cuda_trainer_factory();

/// The current GPU's memory by cudaMemGetInfo.
device_memory_use cuda_memory_use();

}  // namespace oomb_trainer
