// oomb-train's --device cuda: the CUDA translation unit main.cpp links when CUDA is on.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/train/cuda_loss.cuh"

oomb_trainer::device_loss_maker oomb_train_cuda_device() { return oomb_trainer::cuda_device_loss(); }
