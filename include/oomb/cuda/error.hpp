// oomb — CUDA runtime errors as oomb exceptions, and a scoped device switch.
// SPDX-License-Identifier: Apache-2.0
//
// Every CUDA runtime call the library makes goes through OOMB_CUDA_CHECK, which throws
// oomb::cuda_error carrying CUDA's own text, the call, and what was asked:
//   OOMB_CUDA_CHECK(cudaMalloc(&p, n), "device_resource: allocating ", n, " bytes");
// -> "oomb: device_resource: allocating 1024 bytes: cudaMalloc(&p, n) failed: out of memory
//     (cudaErrorMemoryAllocation) [file:line]"
// Allocation failures that mean "no memory left" are raised as out_of_memory by the resources
// themselves (OOMB_CUDA_CHECK_ALLOC), so callers catch exhaustion the same way on CPU and GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "oomb/core/error.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// Throws E with "<parts>: <call> failed: <CUDA text> (<CUDA name>)". Clears the runtime's
/// last-error slot first, so a non-sticky error does not resurface at an unrelated later check.
template <class E, class... Args>
[[noreturn]] void raise_cuda(const char* file, int line, cudaError_t status, const char* call,
                             Args&&... parts) {
  (void)cudaGetLastError();
  raise<E>(file, line, std::forward<Args>(parts)..., ": ", call, " failed: ",
           cudaGetErrorString(status), " (", cudaGetErrorName(status), ")");
}

/// Makes `device` current for the scope and restores the previous device after; a no-op (two
/// cheap runtime queries) when it is current already. Resources use it so that a slab is freed on
/// the device it came from whatever the caller's current device is.
class device_guard {
 public:
  explicit device_guard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    if (previous_ != device) {
      const cudaError_t e = cudaSetDevice(device);
      if (e != cudaSuccess) raise_cuda<cuda_error>(__FILE__, __LINE__, e, "cudaSetDevice", "switching to device ", device);
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }

 private:
  int device_;
  int previous_ = 0;
};

/// The current device, checked.
inline int current_device() {
  int d = 0;
  const cudaError_t e = cudaGetDevice(&d);
  if (e != cudaSuccess) raise_cuda<cuda_error>(__FILE__, __LINE__, e, "cudaGetDevice", "querying the current device");
  return d;
}

}  // namespace detail

OOMB_NAMESPACE_END

/// Throws oomb::cuda_error when the CUDA runtime call does not return cudaSuccess; the message
/// parts after the call say what was asked (at least one part).
#define OOMB_CUDA_CHECK(call, ...)                                                               \
  do {                                                                                           \
    const cudaError_t oomb_cuda_status_ = (call);                                                \
    if (oomb_cuda_status_ != cudaSuccess)                                                        \
      ::OOMB_NAMESPACE::detail::raise_cuda<::OOMB_NAMESPACE::cuda_error>(__FILE__, __LINE__, oomb_cuda_status_, #call, \
                                                     __VA_ARGS__);                               \
  } while (false)

/// As OOMB_CUDA_CHECK, but an allocation failure (cudaErrorMemoryAllocation) is raised as
/// oomb::out_of_memory, every other failure as oomb::cuda_error.
#define OOMB_CUDA_CHECK_ALLOC(call, ...)                                                         \
  do {                                                                                           \
    const cudaError_t oomb_cuda_status_ = (call);                                                \
    if (oomb_cuda_status_ == cudaErrorMemoryAllocation)                                          \
      ::OOMB_NAMESPACE::detail::raise_cuda<::OOMB_NAMESPACE::out_of_memory>(__FILE__, __LINE__, oomb_cuda_status_,   \
                                                        #call, __VA_ARGS__);                     \
    if (oomb_cuda_status_ != cudaSuccess)                                                        \
      ::OOMB_NAMESPACE::detail::raise_cuda<::OOMB_NAMESPACE::cuda_error>(__FILE__, __LINE__, oomb_cuda_status_, #call, \
                                                     __VA_ARGS__);                               \
  } while (false)

/// Checks the launch of the kernel just enqueued (bad configuration, missing image) without
/// synchronising: launch errors are reported at once, faults inside the kernel later, by the
/// next checked call that observes them.
#define OOMB_CUDA_CHECK_LAUNCH(...) OOMB_CUDA_CHECK(cudaGetLastError(), __VA_ARGS__)
