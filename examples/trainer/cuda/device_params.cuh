// oomb trainer — a model's tensors in device memory: the CUDA backend's params_type
// (bf16 compute weights) and grads_type (fp32 gradients), and the device trainer's fp32 master
// weights and AdamW moments.
// SPDX-License-Identifier: Apache-2.0
//
// The layout is the host's param_layout (HF order and names, 16-element alignment), so a tensor
// sits at the same offset on both sides and one copy moves the whole model. The accessors are
// model_params's, returning device pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

#include "trainer/cuda/device_buffer.cuh"
#include "trainer/model/params.hpp"

namespace oomb_trainer::gpu {

/// Every tensor of a model of config `c`, element X, in one zeroed device allocation.
template <class X>
class device_params {
 public:
  explicit device_params(const model_config& c) : config_(c), layout_(c), data_(layout_.total()) { zero(); }

  const model_config& config() const noexcept { return config_; }
  const param_layout& layout() const noexcept { return layout_; }
  X* data() noexcept { return data_.data(); }
  const X* data() const noexcept { return data_.data(); }
  std::size_t size() const noexcept { return data_.size(); }
  /// Zeroes every tensor. Synchronous (waits for the whole device: an edge of a step, and the
  /// backend's streams do not synchronise with the legacy stream).
  void zero() {
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "device_params: zero");
    OOMB_CUDA_CHECK(cudaMemset(data_.data(), 0, data_.size() * sizeof(X)), "device_params: zero");
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "device_params: zero");
  }

  X* embed() noexcept { return data_.data() + layout_.embed_offset(); }
  const X* embed() const noexcept { return data_.data() + layout_.embed_offset(); }
  X* lm_head() noexcept { return data_.data() + layout_.lm_head_offset(); }
  const X* lm_head() const noexcept { return data_.data() + layout_.lm_head_offset(); }
  X* final_norm() noexcept { return at(layout_.final_norm_entry()); }
  const X* final_norm() const noexcept { return const_cast<device_params*>(this)->final_norm(); }

  layer_params<X> layer(std::int32_t l) noexcept { return layout_.layer_at(data_.data(), l); }
  layer_params<const X> layer(std::int32_t l) const noexcept { return layout_.layer_at(data_.data(), l); }

 private:
  X* at(std::size_t entry) noexcept { return data_.data() + layout_.entries()[entry].offset; }

  model_config config_;
  param_layout layout_;
  device_buffer<X> data_;
};

// Both copies wait for the whole device first: the backend's streams do not order themselves
// against cudaMemcpy's legacy stream.

/// dev = host, converted element by element (to bf16: rounded to nearest even). Synchronous.
template <class X, class H>
void copy_to_device(const model_params<H>& host, device_params<X>& dev) {
  OOMB_EXPECTS(host.size() == dev.size(), "copy_to_device: the host model has ", host.size(), " elements, the device one ",
               dev.size());
  OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "copy_to_device");
  if constexpr (std::is_same_v<X, H>) {  // no conversion: no second host copy (a 7B's fp32 master is 28 GiB)
    OOMB_CUDA_CHECK(cudaMemcpy(dev.data(), host.data(), host.size() * sizeof(X), cudaMemcpyHostToDevice), "copy_to_device");
  } else {
    std::vector<X> staged(host.size());
    for (std::size_t i = 0; i < staged.size(); ++i) staged[i] = X(static_cast<float>(host.data()[i]));
    OOMB_CUDA_CHECK(cudaMemcpy(dev.data(), staged.data(), staged.size() * sizeof(X), cudaMemcpyHostToDevice),
                    "copy_to_device");
  }
}

/// host = dev, converted element by element. Synchronous (waits for the work that produced dev).
template <class X, class H>
void copy_to_host(const device_params<X>& dev, model_params<H>& host) {
  OOMB_EXPECTS(host.size() == dev.size(), "copy_to_host: the host model has ", host.size(), " elements, the device one ",
               dev.size());
  OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "copy_to_host");
  if constexpr (std::is_same_v<X, H>) {
    OOMB_CUDA_CHECK(cudaMemcpy(host.data(), dev.data(), dev.size() * sizeof(X), cudaMemcpyDeviceToHost), "copy_to_host");
  } else {
    std::vector<X> staged(dev.size());
    OOMB_CUDA_CHECK(cudaMemcpy(staged.data(), dev.data(), staged.size() * sizeof(X), cudaMemcpyDeviceToHost),
                    "copy_to_host");
    for (std::size_t i = 0; i < staged.size(); ++i) host.data()[i] = static_cast<H>(static_cast<float>(staged[i]));
  }
}

}  // namespace oomb_trainer::gpu
