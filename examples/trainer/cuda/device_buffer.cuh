// oomb trainer — an owning array in device memory: the CUDA backend's buffer<X>.
// SPDX-License-Identifier: Apache-2.0
//
// What block_acts and block_scratch need of a buffer (data, size, resize keeping the storage when
// it is large enough), over cudaMalloc. Growth frees the old storage with cudaFree, which waits
// for the device, so no kernel still reads it; the trainer sizes its buffers before a step, so
// growth happens at the edges, not per op. Contents are unspecified after growth.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include <oomb/cuda/error.hpp>

namespace oomb_trainer::gpu {

template <class X>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) { resize(n); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      free();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  ~device_buffer() { free(); }

  X* data() noexcept { return p_; }
  const X* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  /// Elements allocated (resize below it keeps the storage).
  std::size_t capacity() const noexcept { return cap_; }

  void resize(std::size_t n) {
    if (n > cap_) {
      void* p = nullptr;
      OOMB_CUDA_CHECK_ALLOC(cudaMalloc(&p, n * sizeof(X)), "device_buffer: ", n * sizeof(X), " bytes");
      free();
      p_ = static_cast<X*>(p);
      cap_ = n;
    }
    n_ = n;
  }

 private:
  void free() noexcept {
    if (p_ != nullptr) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = cap_ = 0;
  }

  X* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

}  // namespace oomb_trainer::gpu
