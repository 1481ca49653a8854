// Helpers shared by the CUDA tests: seeded byte patterns, checksum and delay kernels, a slow stream.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "oomb/cuda/error.hpp"
#include "oomb/cuda/stream.hpp"

namespace oomb_cuda_test {

/// OOMB_GPU_TEST_QUICK=1 shrinks the big tests (same code paths, fewer pages and steps), for runs
/// under compute-sanitizer, which slows kernels by one or two orders of magnitude.
inline bool quick() { return std::getenv("OOMB_GPU_TEST_QUICK") != nullptr; }

/// Random bytes in [1, 255]: never zero, so an unwritten or zeroed buffer shows.
inline void fill_random(void* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng() | 0x0101010101010101ull;  // every byte odd, so non-zero
    std::memcpy(b + i, &x, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>((rng() & 0xfe) | 1);
}

/// FNV-style 64-bit checksum of `n` bytes (n a multiple of 8), same on host and device.
__host__ __device__ inline std::uint64_t mix64(std::uint64_t h, std::uint64_t w) {
  h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

inline std::uint64_t host_checksum(const void* p, std::size_t n) {
  std::uint64_t h = 0x84222325cbf29ce4ull;
  const auto* w = static_cast<const std::uint64_t*>(p);
  for (std::size_t i = 0; i < n / 8; ++i) h = mix64(h, w[i] * (i + 1));
  return h;
}

/// One block per page: out[i] = checksum of page i (order-dependent, so it is folded serially by
/// thread 0 from per-thread partial hashes over fixed slices).
template <int = 0>
__global__ void checksum_pages_kernel(const std::byte* base, std::size_t page_bytes,
                                             const std::int32_t* slots, int count, std::uint64_t* out) {
  const int i = blockIdx.x;
  if (i >= count) return;
  const auto* w = reinterpret_cast<const std::uint64_t*>(base + std::size_t(slots[i]) * page_bytes);
  if (threadIdx.x == 0) {
    std::uint64_t h = 0x84222325cbf29ce4ull;
    for (std::size_t k = 0; k < page_bytes / 8; ++k) h = mix64(h, w[k] * (k + 1));
    out[i] = h;
  }
}

/// Adds `delta` to every 64-bit word of each listed page (so write-backs carry new content).
template <int = 0>
__global__ void bump_pages_kernel(std::byte* base, std::size_t page_bytes, const std::int32_t* slots,
                                         int count, std::uint64_t delta) {
  const int i = blockIdx.x;
  if (i >= count) return;
  auto* w = reinterpret_cast<std::uint64_t*>(base + std::size_t(slots[i]) * page_bytes);
  for (std::size_t k = threadIdx.x; k < page_bytes / 8; k += blockDim.x) w[k] += delta;
}

// Test kernels are templates so that every test file may include them (one definition each).

/// Spins for about `ns` nanoseconds: makes a stream slow, so a reader that skipped an event wait
/// reads before the copy lands.
// out[0] += sum_i table[i] * (i + 1) (integer adds: order-free, so exact on both sides).
template <int = 0>
__global__ void weighted_sum_kernel(const std::int32_t* table, int n, unsigned long long* out) {
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<unsigned long long>(std::uint32_t(table[i])) * (i + 1);
  atomicAdd(out, s);
}

/// Its host twin.
inline unsigned long long host_weighted_sum(const std::vector<std::int32_t>& t) {
  unsigned long long s = 0;
  for (std::size_t i = 0; i < t.size(); ++i) s += static_cast<unsigned long long>(std::uint32_t(t[i])) * (i + 1);
  return s;
}

template <int = 0>
__global__ void delay_kernel(std::uint64_t ns) {
  std::uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    std::uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 >= ns) break;
    __nanosleep(1000);
  }
}

inline void enqueue_delay(cudaStream_t s, std::uint64_t ns) {
  delay_kernel<><<<1, 1, 0, s>>>(ns);
  OOMB_CUDA_CHECK_LAUNCH("delay kernel");
}

/// A CUDA stream that stalls ~300 us before every copy or batch: the CUDA twin of the offload
/// tests' slow_host_stream.
struct slow_cuda_stream : oomb::cuda_stream {
  static constexpr std::uint64_t delay_ns = 300000;
  slow_cuda_stream() : oomb::cuda_stream() {}
  void enqueue_copy(void* dst, const void* src, std::size_t bytes) {
    enqueue_delay(get(), delay_ns);
    oomb::cuda_stream::enqueue_copy(dst, src, bytes);
  }
  void enqueue_copies(const oomb::copy_op* ops, std::size_t count) {
    enqueue_delay(get(), delay_ns);
    oomb::cuda_stream::enqueue_copies(ops, count);
  }
  void enqueue_memset(void* dst, int value, std::size_t bytes) {
    enqueue_delay(get(), delay_ns);
    oomb::cuda_stream::enqueue_memset(dst, value, bytes);
  }
};

/// A device buffer for test plumbing (not a library type).
template <class T>
struct device_buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::size_t count) : n(count) {
    OOMB_CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T) + 1), "test device buffer");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { (void)cudaFree(ptr); }
};

inline void sync_device() { OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "test: synchronising the device"); }

}  // namespace oomb_cuda_test
