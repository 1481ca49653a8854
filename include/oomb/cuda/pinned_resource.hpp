// oomb — pinned (page-locked, device-mapped) host memory slabs through cudaHostAlloc.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Page-locked host memory, mapped into every device's address space (portable + mapped). It is
/// the far tier's home: copy engines move it at full PCIe speed and asynchronously, and kernels
/// may read or write it directly (the gather/scatter path). With unified addressing (every 64-bit
/// platform CUDA supports) a kernel uses the host pointer itself; allocate() checks that and
/// refuses otherwise, so pointers from this resource are valid on both sides. Pinning is slow
/// (milliseconds per GiB) and takes RAM from the OS for good: pools call it rarely. Thread-safe.
class pinned_resource {
 public:
  static constexpr memory_kind kind = memory_kind::pinned;

  /// Alignments up to 4096 are honoured. cudaHostAlloc guarantees only 256 bytes (measured on the
  /// H200: small requests come back 512- but not 1024-aligned), so larger alignments over-allocate
  /// and keep the original pointer just below the aligned one.
  void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= 4096,
                 "pinned_resource: alignment must be a power of two <= 4096, got ", alignment);
    if (bytes == 0) return nullptr;
    if (alignment <= guaranteed_alignment) {
      void* p = pin(bytes);
      if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
        (void)cudaFreeHost(p);
        OOMB_FAIL(cuda_error, "pinned_resource: cudaHostAlloc returned ", p, ", not aligned to ",
                  alignment, " bytes");
      }
      return p;
    }
    void* raw = pin(bytes + alignment + sizeof(void*));
    const auto first = reinterpret_cast<std::uintptr_t>(raw) + sizeof(void*);
    auto* aligned = reinterpret_cast<void**>((first + alignment - 1) & ~(std::uintptr_t(alignment) - 1));
    aligned[-1] = raw;
    return aligned;
  }

  void deallocate(void* p, std::size_t /*bytes*/, std::size_t alignment = 256) noexcept {
    if (p == nullptr) return;
    (void)cudaFreeHost(alignment <= guaranteed_alignment ? p : static_cast<void**>(p)[-1]);
  }

  friend constexpr bool operator==(const pinned_resource&, const pinned_resource&) noexcept { return true; }
  friend constexpr bool operator!=(const pinned_resource&, const pinned_resource&) noexcept { return false; }

 private:
  static constexpr std::size_t guaranteed_alignment = 256;

  // Pins `bytes` and checks that kernels see them at the host address.
  static void* pin(std::size_t bytes) {
    void* p = nullptr;
    OOMB_CUDA_CHECK_ALLOC(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
                          "pinned_resource: pinning ", bytes, " bytes of host memory");
    void* on_device = nullptr;
    const cudaError_t e = cudaHostGetDevicePointer(&on_device, p, 0);
    if (e != cudaSuccess || on_device != p) {
      (void)cudaFreeHost(p);
      if (e != cudaSuccess)
        detail::raise_cuda<cuda_error>(__FILE__, __LINE__, e, "cudaHostGetDevicePointer",
                                       "pinned_resource: mapping ", bytes, " pinned bytes");
      OOMB_FAIL(cuda_error, "pinned_resource: the device sees pinned memory at another address (",
                on_device, " for host ", p, "); oomb needs unified addressing");
    }
    return p;
  }
};

static_assert(is_memory_resource_v<pinned_resource>);

OOMB_NAMESPACE_END
