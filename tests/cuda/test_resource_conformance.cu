// The foundation's memory-resource conformance suite (tests/memory/resource_conformance.hpp) and
// block_pool conformance sequences (tests/memory/block_pool_conformance.hpp) over the CUDA
// resources. Device memory is written and read back through cudaMemcpy; pinned memory is written
// and read by a kernel through the very pointer the host uses (it must be mapped), and the suite
// also reads it directly on the host.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda_test_util.cuh"
#include "memory/block_pool_conformance.hpp"
#include "memory/resource_conformance.hpp"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/cuda/vmm_resource.hpp"
#include "oomb/memory/callback_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

namespace {

template <int = 0>
__global__ void copy_bytes_kernel(unsigned char* dst, const unsigned char* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// A device buffer kept for the whole run and grown on demand: the block_pool sequences read
// pinned memory thousands of times, and a cudaMalloc/cudaFree per read would dominate.
unsigned char* staging(std::size_t n) {
  static std::unique_ptr<oomb_cuda_test::device_buffer<unsigned char>> buf;
  if (!buf || buf->n < n) {
    buf.reset();
    buf = std::make_unique<oomb_cuda_test::device_buffer<unsigned char>>(n);
  }
  return buf->ptr;
}

void kernel_copy(void* dst, const void* src, std::size_t n, const char* what) {
  copy_bytes_kernel<><<<64, 256>>>(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), n);
  OOMB_CUDA_CHECK_LAUNCH(what);
  oomb_cuda_test::sync_device();
}

// Plain device memory: only cudaMemcpy reaches it from the host.
struct device_access {
  static void write(void* dst, const void* src, std::size_t n) {
    OOMB_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "conformance: writing ", n,
                    " bytes of device memory");
  }
  static void read(void* dst, const void* src, std::size_t n) {
    OOMB_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "conformance: reading ", n,
                    " bytes of device memory");
  }
};

// Mapped pinned memory: a kernel writes and reads it at the host pointer; cudaMemcpy only moves
// the bytes between the host vector and a device staging buffer.
struct pinned_access {
  static void write(void* dst, const void* src, std::size_t n) {
    unsigned char* s = staging(n);
    OOMB_CUDA_CHECK(cudaMemcpy(s, src, n, cudaMemcpyHostToDevice), "conformance: staging ", n, " bytes");
    kernel_copy(dst, s, n, "conformance: a kernel writing pinned memory");
  }
  static void read(void* dst, const void* src, std::size_t n) {
    unsigned char* s = staging(n);
    kernel_copy(s, src, n, "conformance: a kernel reading pinned memory");
    OOMB_CUDA_CHECK(cudaMemcpy(dst, s, n, cudaMemcpyDeviceToHost), "conformance: unstaging ", n, " bytes");
  }
};

// A framework's stream-ordered allocator, played by cudaMallocAsync / cudaFreeAsync on one stream:
// what the callback adaptor hands to block_pool when PyTorch's or RMM's allocator backs oomb.
using stream_ordered_resource = oomb::callback_resource<oomb::memory_kind::device, oomb::cuda_stream_view>;

inline stream_ordered_resource make_stream_ordered_resource(oomb::cuda_stream_view s) {
  return stream_ordered_resource(
      [](std::size_t bytes, std::size_t, oomb::cuda_stream_view st) -> void* {
        void* p = nullptr;
        if (cudaMallocAsync(&p, bytes, st.get()) != cudaSuccess) {
          (void)cudaGetLastError();
          return nullptr;  // the adaptor turns this into out_of_memory naming the bytes
        }
        return p;
      },
      [](void* p, std::size_t, std::size_t, oomb::cuda_stream_view st) { (void)cudaFreeAsync(p, st.get()); }, s);
}

// The suite's reads and writes use the legacy default stream: order them after the allocator's
// stream (where the blocks became valid) and let its frees complete.
struct stream_ordered_access {
  static void write(void* dst, const void* src, std::size_t n) {
    oomb_cuda_test::sync_device();
    device_access::write(dst, src, n);
  }
  static void read(void* dst, const void* src, std::size_t n) {
    oomb_cuda_test::sync_device();
    device_access::read(dst, src, n);
  }
};

}  // namespace

namespace oomb_test {

template <>
struct resource_traits<stream_ordered_resource> : stream_ordered_access {
  struct holder {
    oomb::cuda_stream stream;
    stream_ordered_resource r = make_stream_ordered_resource(stream);
    stream_ordered_resource& get() { return r; }
    ~holder() { oomb_cuda_test::sync_device(); }  // the frees run before the stream goes
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::device;
  static constexpr std::size_t max_alignment = 256;  // what cudaMallocAsync guarantees
  static constexpr bool refuses_above_max = false;   // the adaptor refuses misaligned blocks instead
  static constexpr const char* bad_alignment_text = "alignment must be a power of two, got 24";
  static constexpr std::size_t refused_bytes = std::size_t(1) << 50;  // 1 PiB
};

template <>
struct resource_traits<oomb::device_resource> : device_access {
  struct holder {
    oomb::device_resource r;
    oomb::device_resource& get() { return r; }
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::device;
  static constexpr std::size_t max_alignment = 256;  // what cudaMalloc guarantees; more is refused
  static constexpr bool refuses_above_max = true;
  static constexpr const char* bad_alignment_text = "alignment must be a power of two <= 256, got 24";
  static constexpr std::size_t refused_bytes = std::size_t(1) << 50;  // 1 PiB
};

template <>
struct resource_traits<oomb::pinned_resource> : pinned_access {
  struct holder {
    oomb::pinned_resource r;
    oomb::pinned_resource& get() { return r; }
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::pinned;
  static constexpr std::size_t max_alignment = 4096;  // cudaHostAlloc's page alignment
  static constexpr bool refuses_above_max = true;
  static constexpr const char* bad_alignment_text = "alignment must be a power of two <= 4096, got 24";
  static constexpr std::size_t refused_bytes = std::size_t(1) << 50;
};

template <>
struct resource_traits<oomb::vmm_device_resource> : device_access {
  struct holder {
    oomb::vmm_device_resource r;
    oomb::vmm_device_resource& get() { return r; }
  };
  static constexpr oomb::memory_kind kind = oomb::memory_kind::device;
  // Any power of two is honoured; the suite goes past the 2 MiB granularity, where the address
  // reservation itself must be aligned.
  static constexpr std::size_t max_alignment = std::size_t(4) << 20;
  static constexpr bool refuses_above_max = false;
  static constexpr const char* bad_alignment_text = "alignment must be a power of two, got 24";
  // 1 TiB: the address space is reserved, the physical memory (cuMemCreate) is not there.
  static constexpr std::size_t refused_bytes = std::size_t(1) << 40;
};

}  // namespace oomb_test

TYPE_TO_STRING_AS("device_resource", oomb::device_resource);
TYPE_TO_STRING_AS("callback_resource<device, cuda_stream_view>", stream_ordered_resource);
TYPE_TO_STRING_AS("statistics_adaptor<device_resource>", oomb::statistics_adaptor<oomb::device_resource>);
TYPE_TO_STRING_AS("limiting_adaptor<device_resource>", oomb::limiting_adaptor<oomb::device_resource>);
TYPE_TO_STRING_AS("pinned_resource", oomb::pinned_resource);
TYPE_TO_STRING_AS("vmm_device_resource", oomb::vmm_device_resource);

TEST_CASE_TEMPLATE_INVOKE(resource_conformance, oomb::device_resource,
                          oomb::statistics_adaptor<oomb::device_resource>,
                          oomb::limiting_adaptor<oomb::device_resource>, oomb::pinned_resource,
                          oomb::vmm_device_resource, stream_ordered_resource);
TEST_CASE_TEMPLATE_INVOKE(statistics_adaptor_conformance, oomb::device_resource, oomb::pinned_resource,
                          oomb::vmm_device_resource);
TEST_CASE_TEMPLATE_INVOKE(limiting_adaptor_conformance, oomb::device_resource, oomb::pinned_resource,
                          oomb::vmm_device_resource);

TEST_CASE_TEMPLATE("block_pool conformance: random operation sequences agree with a simple model", U,
                   oomb::device_resource, oomb::pinned_resource) {
  // Fewer seeds than the host run (each step reads the blocks in use back through the device);
  // OOMB_GPU_TEST_QUICK shrinks it further for compute-sanitizer.
  const std::uint64_t seeds = oomb_cuda_test::quick() ? 3 : 12;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    oomb_test::block_pool_sequence<U>(seed, false);
    if (seed % 3 == 0) oomb_test::block_pool_sequence<U>(seed, true);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}
