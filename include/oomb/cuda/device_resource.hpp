// oomb — device memory slabs through cudaMalloc.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Device memory of one device, slab by slab (cudaMalloc costs tens of microseconds and may
/// synchronise the device: pools call it rarely, never per page). Copyable and cheap: it holds only
/// the device ordinal. Thread-safe.
class device_resource {
 public:
  static constexpr memory_kind kind = memory_kind::device;

  /// Memory of the current device.
  device_resource() : device_(detail::current_device()) {}
  explicit device_resource(int device) : device_(device) {
    int count = 0;
    OOMB_CUDA_CHECK(cudaGetDeviceCount(&count), "device_resource: counting devices");
    OOMB_EXPECTS(device >= 0 && device < count, "device_resource: device ", device,
                 " does not exist (", count, " devices)");
  }

  /// cudaMalloc aligns to at least 256 bytes; larger alignments are refused, not faked.
  void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= 256,
                 "device_resource: alignment must be a power of two <= 256, got ", alignment);
    if (bytes == 0) return nullptr;
    detail::device_guard guard(device_);
    void* p = nullptr;
    OOMB_CUDA_CHECK_ALLOC(cudaMalloc(&p, bytes), "device_resource: allocating ", bytes,
                          " bytes on device ", device_);
    return p;
  }

  void deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/ = 256) noexcept {
    if (p == nullptr) return;
    int previous = device_;
    (void)cudaGetDevice(&previous);
    if (previous != device_) (void)cudaSetDevice(device_);
    (void)cudaFree(p);  // an error here (a sticky fault from earlier work) has no one to report to
    if (previous != device_) (void)cudaSetDevice(previous);
  }

  int device() const noexcept { return device_; }

  friend bool operator==(const device_resource& a, const device_resource& b) noexcept {
    return a.device_ == b.device_;
  }
  friend bool operator!=(const device_resource& a, const device_resource& b) noexcept { return !(a == b); }

 private:
  int device_;
};

static_assert(is_memory_resource_v<device_resource>);

OOMB_NAMESPACE_END
