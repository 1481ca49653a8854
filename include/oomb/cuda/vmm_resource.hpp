// oomb — device memory through CUDA's virtual-memory API: ranges that grow without moving.
// SPDX-License-Identifier: Apache-2.0
//
// Needs the driver API: link CUDA::cuda_driver (libcuda) besides the runtime.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

inline const char* cu_error_text(CUresult r) noexcept {
  const char* s = nullptr;
  return cuGetErrorString(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "unknown driver error";
}
inline const char* cu_error_name(CUresult r) noexcept {
  const char* s = nullptr;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "CUDA_ERROR_?";
}

/// As raise_cuda, for driver API results.
template <class E, class... Args>
[[noreturn]] void raise_cu(const char* file, int line, CUresult status, const char* call, Args&&... parts) {
  raise<E>(file, line, std::forward<Args>(parts)..., ": ", call, " failed: ", cu_error_text(status),
           " (", cu_error_name(status), ")");
}

}  // namespace detail

OOMB_NAMESPACE_END

/// Driver-API twin of OOMB_CUDA_CHECK_ALLOC: CUDA_ERROR_OUT_OF_MEMORY becomes oomb::out_of_memory,
/// every other failure oomb::cuda_error, each with the driver's text and what was asked.
#define OOMB_CU_CHECK(call, ...)                                                                  \
  do {                                                                                            \
    const CUresult oomb_cu_status_ = (call);                                                      \
    if (oomb_cu_status_ == CUDA_ERROR_OUT_OF_MEMORY)                                              \
      ::OOMB_NAMESPACE::detail::raise_cu<::OOMB_NAMESPACE::out_of_memory>(__FILE__, __LINE__, oomb_cu_status_, #call, \
                                                      __VA_ARGS__);                               \
    if (oomb_cu_status_ != CUDA_SUCCESS)                                                          \
      ::OOMB_NAMESPACE::detail::raise_cu<::OOMB_NAMESPACE::cuda_error>(__FILE__, __LINE__, oomb_cu_status_, #call,    \
                                                   __VA_ARGS__);                                  \
  } while (false)

OOMB_NAMESPACE_BEGIN

/// Device memory of one device as a growable resource (memory/growable_resource.hpp): reserve()
/// takes virtual address space (cuMemAddressReserve), commit() backs more of it with physical
/// chunks (cuMemCreate + cuMemMap + cuMemSetAccess), so a pool's base address never moves while
/// it grows and kernels keep addressing `base + id * page_bytes`. Sizes round up to the
/// allocation granularity (cuMemGetAllocationGranularity, 2 MiB on current GPUs). Reserving
/// costs no memory: reserve the most a pool may ever need. allocate() is reserve + commit of
/// the whole size, so it is a plain memory resource too.
///
/// Not copyable or movable (pools hold it by reference). Thread-safe. Committing maps new memory
/// into the range while kernels may be reading its older part; that is allowed (the mapping of
/// the old part is untouched), but a block's memory exists only after the commit that covers it
/// returned.
class vmm_device_resource {
 public:
  static constexpr memory_kind kind = memory_kind::device;

  /// Memory of the current device.
  vmm_device_resource() : vmm_device_resource(detail::current_device()) {}
  explicit vmm_device_resource(int device) : device_(device) {
    detail::device_guard guard(device);
    OOMB_CUDA_CHECK(cudaFree(nullptr), "vmm_device_resource: initialising device ", device);
    OOMB_CU_CHECK(cuInit(0), "vmm_device_resource: initialising the driver API");
    int supported = 0;
    OOMB_CU_CHECK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
                  "vmm_device_resource: querying virtual-memory support of device ", device);
    OOMB_CHECK(supported != 0, cuda_error, "vmm_device_resource: device ", device,
               " does not support CUDA's virtual-memory management");
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    OOMB_CU_CHECK(cuMemGetAllocationGranularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  "vmm_device_resource: querying the allocation granularity of device ", device);
  }
  vmm_device_resource(const vmm_device_resource&) = delete;
  vmm_device_resource& operator=(const vmm_device_resource&) = delete;
  /// Releases whatever ranges are still reserved (their pools must be gone).
  ~vmm_device_resource() {
    for (auto& kv : ranges_) release(kv.first, kv.second);
  }

  // --- memory resource ---------------------------------------------------------------------------

  void* allocate(std::size_t bytes, std::size_t alignment = 256) {
    if (bytes == 0) return nullptr;
    void* p = reserve(bytes, alignment);
    try {
      commit(p, bytes);
    } catch (...) {
      unreserve(p, bytes);
      throw;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t /*alignment*/ = 256) noexcept { unreserve(p, bytes); }

  // --- growable resource -------------------------------------------------------------------------

  /// Address space for `max_bytes` (rounded up to the granularity); no memory behind it yet.
  void* reserve(std::size_t max_bytes, std::size_t alignment = 256) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "vmm_device_resource: alignment must be a power of two, got ", alignment);
    OOMB_EXPECTS(max_bytes > 0, "vmm_device_resource: cannot reserve 0 bytes");
    const std::size_t size = round_up(max_bytes);
    CUdeviceptr ptr = 0;
    OOMB_CU_CHECK(cuMemAddressReserve(&ptr, size, alignment > granularity_ ? alignment : 0, 0, 0),
                  "vmm_device_resource: reserving ", size, " bytes of address space on device ", device_);
    std::lock_guard<std::mutex> lock(m_);
    try {
      ranges_.emplace(reinterpret_cast<void*>(ptr), range{size, 0, {}});
    } catch (...) {
      (void)cuMemAddressFree(ptr, size);
      throw;
    }
    return reinterpret_cast<void*>(ptr);
  }

  /// Backs the first `bytes` of the range at `base` (rounded up to the granularity) with device
  /// memory. Strong guarantee: on failure (out_of_memory when the device is full) nothing changed.
  void commit(void* base, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = ranges_.find(base);
    OOMB_EXPECTS(it != ranges_.end(), "vmm_device_resource: commit on ", base,
                 " which is no range of this resource");
    range& r = it->second;
    OOMB_EXPECTS(bytes <= r.reserved, "vmm_device_resource: commit of ", bytes,
                 " bytes past the range's reservation of ", r.reserved);
    const std::size_t want = round_up(bytes);
    if (want <= r.mapped) return;
    const std::size_t size = want - r.mapped;
    r.chunks.reserve(r.chunks.size() + 1);
    detail::device_guard guard(device_);
    CUmemGenericAllocationHandle handle{};
    OOMB_CU_CHECK(cuMemCreate(&handle, size, &prop_, 0), "vmm_device_resource: creating ", size,
                  " bytes of device memory on device ", device_, " (", r.mapped, " of ", r.reserved,
                  " committed in this range)");
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(base) + r.mapped;
    CUresult e = cuMemMap(at, size, 0, handle, 0);
    if (e == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location = prop_.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      e = cuMemSetAccess(at, size, &access, 1);
      if (e != CUDA_SUCCESS) (void)cuMemUnmap(at, size);
    }
    if (e != CUDA_SUCCESS) {
      (void)cuMemRelease(handle);
      OOMB_CU_CHECK(e, "vmm_device_resource: mapping ", size, " bytes at offset ", r.mapped,
                    " of a range on device ", device_);
    }
    r.chunks.push_back(chunk{handle, r.mapped, size});
    r.mapped = want;
  }

  /// Unmaps and frees everything behind the range at `base`, then its address space.
  void unreserve(void* base, std::size_t /*max_bytes*/) noexcept {
    if (base == nullptr) return;
    std::lock_guard<std::mutex> lock(m_);
    auto it = ranges_.find(base);
    if (it == ranges_.end()) return;
    release(it->first, it->second);
    ranges_.erase(it);
  }

  /// Bytes of the range at `base` that have memory behind them (0 for an unknown base).
  std::size_t committed(const void* base) const {
    std::lock_guard<std::mutex> lock(m_);
    auto it = ranges_.find(const_cast<void*>(base));
    return it == ranges_.end() ? 0 : it->second.mapped;
  }

  std::size_t granularity() const noexcept { return granularity_; }
  int device() const noexcept { return device_; }

 private:
  struct chunk {
    CUmemGenericAllocationHandle handle;
    std::size_t offset, bytes;
  };
  struct range {
    std::size_t reserved, mapped;
    std::vector<chunk> chunks;
  };

  std::size_t round_up(std::size_t bytes) const noexcept {
    return (bytes + granularity_ - 1) / granularity_ * granularity_;
  }

  // Errors here come from a context already broken by an earlier fault; nothing can be done.
  void release(void* base, range& r) noexcept {
    int previous = device_;
    (void)cudaGetDevice(&previous);
    if (previous != device_) (void)cudaSetDevice(device_);
    const CUdeviceptr b = reinterpret_cast<CUdeviceptr>(base);
    for (const chunk& c : r.chunks) {
      (void)cuMemUnmap(b + c.offset, c.bytes);
      (void)cuMemRelease(c.handle);
    }
    (void)cuMemAddressFree(b, r.reserved);
    r.chunks.clear();
    r.mapped = 0;
    if (previous != device_) (void)cudaSetDevice(previous);
  }

  int device_;
  CUmemAllocationProp prop_{};
  std::size_t granularity_ = 0;
  mutable std::mutex m_;
  std::unordered_map<void*, range> ranges_;
};

static_assert(is_memory_resource_v<vmm_device_resource>);
static_assert(is_growable_resource_v<vmm_device_resource>);

OOMB_NAMESPACE_END
