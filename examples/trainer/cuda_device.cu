// oomb-train's --device cuda: the CUDA translation unit main.cpp links when CUDA is on.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/train/cuda_training.cuh"

oomb_trainer::device_trainer_maker oomb_train_cuda_device() { return oomb_trainer::cuda_device_trainer(); }
