// Device, pinned and VMM resources; block_pool on each; the growable layout; exhaustion errors.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/cuda/vmm_resource.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"

using namespace oomb_cuda_test;

static_assert(oomb::is_memory_resource_v<oomb::device_resource>);
static_assert(oomb::is_memory_resource_v<oomb::pinned_resource>);
static_assert(oomb::is_memory_resource_v<oomb::vmm_device_resource>);
static_assert(oomb::is_growable_resource_v<oomb::vmm_device_resource>);
static_assert(!oomb::is_growable_resource_v<oomb::device_resource>);
static_assert(oomb::device_resource::kind == oomb::memory_kind::device);
static_assert(oomb::pinned_resource::kind == oomb::memory_kind::pinned);
static_assert(oomb::vmm_device_resource::kind == oomb::memory_kind::device);
static_assert(oomb::is_memory_resource_v<oomb::limiting_adaptor<oomb::device_resource>>);

namespace {

// Writes word i of a range as f(seed, i) / checks it, on the device.
template <int = 0>
__global__ void pattern_kernel(std::uint64_t* p, std::size_t words, std::uint64_t seed, int* bad, bool check) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::uint64_t v = (seed ^ (i * 0x9e3779b97f4a7c15ull)) | 1;
    if (check) {
      if (p[i] != v) atomicAdd(bad, 1);
    } else {
      p[i] = v;
    }
  }
}

int device_pattern(void* p, std::size_t bytes, std::uint64_t seed, bool check) {
  device_buffer<int> bad(1);
  OOMB_CUDA_CHECK(cudaMemset(bad.ptr, 0, sizeof(int)), "test");
  pattern_kernel<><<<64, 256>>>(static_cast<std::uint64_t*>(p), bytes / 8, seed, bad.ptr, check);
  OOMB_CUDA_CHECK_LAUNCH("pattern kernel");
  int h = -1;
  OOMB_CUDA_CHECK(cudaMemcpy(&h, bad.ptr, sizeof(int), cudaMemcpyDeviceToHost), "test");
  return h;
}

// A resource that never gives memory: a block_pool must report exhaustion as out_of_memory.
template <class R>
void check_pool_on(R& resource, std::size_t block_bytes, std::int32_t capacity) {
  auto pool = oomb::block_pool<R>::contiguous(resource, block_bytes, capacity);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(capacity));
  pool.acquire(capacity, ids.data());
  CHECK(pool.in_use() == capacity);
  for (std::int32_t id : ids) CHECK(pool.address(id) == pool.base() + std::int64_t(id) * std::int64_t(block_bytes));
  CHECK_THROWS_AS(pool.acquire(), oomb::out_of_memory);
  CHECK(device_pattern(pool.base(), block_bytes * std::size_t(capacity), 77, false) == 0);
  CHECK(device_pattern(pool.base(), block_bytes * std::size_t(capacity), 77, true) == 0);
  for (std::int32_t id : ids) pool.release(id);
  CHECK(pool.in_use() == 0);
}

}  // namespace

TEST_CASE("cuda error check: throws cuda_error with CUDA's text and what was asked") {
  try {
    OOMB_CUDA_CHECK(cudaSetDevice(9999), "selecting device ", 9999);
    FAIL("no throw");
  } catch (const oomb::cuda_error& e) {
    const std::string m = e.what();
    CHECK(m.find("selecting device 9999") != std::string::npos);
    CHECK(m.find("cudaSetDevice") != std::string::npos);
    CHECK(m.find(cudaGetErrorString(cudaErrorInvalidDevice)) != std::string::npos);
  }
  CHECK(cudaGetLastError() == cudaSuccess);  // the failed call left no error behind
}

TEST_CASE("device_resource: slabs a kernel can fill; exhaustion is out_of_memory and recoverable") {
  oomb::device_resource r;
  void* p = r.allocate(3 << 20, 256);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  CHECK(device_pattern(p, 3 << 20, 5, false) == 0);
  CHECK(device_pattern(p, 3 << 20, 5, true) == 0);
  CHECK(device_pattern(p, 3 << 20, 6, true) > 0);  // the check can fail
  r.deallocate(p, 3 << 20, 256);
  try {
    (void)r.allocate(std::size_t(1) << 50, 256);
    FAIL("1 PiB of device memory was granted");
  } catch (const oomb::out_of_memory& e) {
    CHECK(std::string(e.what()).find("1125899906842624 bytes") != std::string::npos);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  void* q = r.allocate(1 << 20, 256);  // still usable
  CHECK(q != nullptr);
  r.deallocate(q, 1 << 20, 256);
  CHECK_THROWS_AS(r.allocate(64, 512), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb::device_resource(4096), oomb::invalid_argument);
}

TEST_CASE("pinned_resource: host writes, device reads the same pointer (mapped), and back") {
  oomb::pinned_resource r;
  const std::size_t n = 1 << 20;
  auto* p = static_cast<std::uint64_t*>(r.allocate(n, 256));
  REQUIRE(p != nullptr);
  cudaPointerAttributes attr{};
  OOMB_CUDA_CHECK(cudaPointerGetAttributes(&attr, p), "test");
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(attr.devicePointer == p);
  CHECK(device_pattern(p, n, 9, false) == 0);  // the kernel writes host memory
  bool host_sees = true;
  for (std::size_t i = 0; i < n / 8; ++i) host_sees &= p[i] == ((9 ^ (i * 0x9e3779b97f4a7c15ull)) | 1);
  CHECK(host_sees);
  p[12345] ^= 2;  // the host changes a word: the kernel sees it
  CHECK(device_pattern(p, n, 9, true) == 1);
  r.deallocate(p, n, 256);
  CHECK_THROWS_AS((void)r.allocate(std::size_t(1) << 50, 256), oomb::out_of_memory);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("block_pool over device, pinned and VMM resources: contiguous ranges kernels index") {
  oomb::device_resource d;
  oomb::pinned_resource h;
  oomb::vmm_device_resource v;
  check_pool_on(d, 64 << 10, 37);
  check_pool_on(h, 32 << 10, 21);
  check_pool_on(v, 96 << 10, 29);  // 2.7 MiB: not a multiple of the granularity
  oomb::limiting_adaptor<oomb::device_resource> limited(d, 1 << 20);
  CHECK_THROWS_AS(oomb::block_pool<oomb::limiting_adaptor<oomb::device_resource>>::contiguous(limited, 64 << 10, 17),
                  oomb::out_of_memory);
  auto grows = oomb::block_pool<oomb::limiting_adaptor<oomb::device_resource>>::growing(limited, 64 << 10, 8);
  std::vector<std::int32_t> ids(16);
  grows.acquire(16, ids.data());
  CHECK_THROWS_AS(grows.acquire(), oomb::out_of_memory);  // a third slab would pass the limit
  CHECK(grows.in_use() == 16);
}

TEST_CASE("vmm_device_resource: reserve, commit in steps, the base never moves, failures change nothing") {
  oomb::vmm_device_resource v;
  const std::size_t g = v.granularity();
  REQUIRE(g >= 4096);
  CHECK((g & (g - 1)) == 0);
  const std::size_t max = 64 * g;
  void* base = v.reserve(max, 256);
  REQUIRE(base != nullptr);
  CHECK(v.committed(base) == 0);
  v.commit(base, g / 2);
  CHECK(v.committed(base) == g);  // rounded up to the granularity
  CHECK(device_pattern(base, g, 1, false) == 0);
  v.commit(base, 5 * g + 1);
  CHECK(v.committed(base) == 6 * g);
  CHECK(device_pattern(base, g, 1, true) == 0);  // the first chunk kept its content
  CHECK(device_pattern(static_cast<std::byte*>(base) + g, 5 * g, 2, false) == 0);
  v.commit(base, 2 * g);  // smaller: no-op
  CHECK(v.committed(base) == 6 * g);
  CHECK_THROWS_AS(v.commit(base, max + 1), oomb::invalid_argument);
  CHECK_THROWS_AS(v.commit(reinterpret_cast<void*>(0x1000), g), oomb::invalid_argument);
  v.unreserve(base, max);
  CHECK(v.committed(base) == 0);

  // Exhaustion: reserve half again as much as the device has, then commit it all.
  std::size_t free_bytes = 0, total_bytes = 0;
  OOMB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "test");
  const std::size_t huge = (total_bytes + total_bytes / 2 + g - 1) / g * g;
  void* big = v.reserve(huge, 256);
  CHECK_THROWS_AS(v.commit(big, huge), oomb::out_of_memory);
  CHECK(v.committed(big) == 0);
  v.commit(big, g);  // still usable
  CHECK(v.committed(big) == g);
  CHECK(device_pattern(big, g, 3, false) == 0);
  v.unreserve(big, huge);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("block_pool::growable over VMM: grows in steps without moving, kernels index base + id * bytes") {
  oomb::vmm_device_resource v;
  const std::size_t block = 80 << 10;  // 80 KiB: steps do not end on granularity boundaries
  auto pool = oomb::block_pool<oomb::vmm_device_resource>::growable(v, block, 50, 2000);
  CHECK(pool.is_contiguous());
  CHECK(pool.is_growable());
  std::byte* const base = pool.base();
  CHECK(pool.reserved() == 0);
  CHECK(v.committed(base) == 0);
  std::mt19937 rng(31);
  std::vector<std::int32_t> held;
  for (int round = 0; round < 12; ++round) {
    const auto n = static_cast<std::int32_t>(1 + rng() % 90);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    pool.acquire(n, ids.data());
    held.insert(held.end(), ids.begin(), ids.end());
    CHECK(pool.base() == base);
    CHECK(v.committed(base) >= std::size_t(pool.reserved()) * block);
    for (std::int32_t id : ids) CHECK(pool.address(id) == base + std::int64_t(id) * std::int64_t(block));
    // The kernel writes every block held so far at base + id * bytes; earlier writes survive growth.
    for (std::int32_t id : ids) CHECK(device_pattern(pool.address(id), block, std::uint64_t(id) * 7 + 1, false) == 0);
    int bad = 0;
    for (std::int32_t id : held) bad += device_pattern(pool.address(id), block, std::uint64_t(id) * 7 + 1, true);
    CHECK(bad == 0);
    if (round % 3 == 2)  // give some back: ids are reused, no growth needed
      for (int k = 0; k < 10 && !held.empty(); ++k) {
        pool.release(held.back());
        held.pop_back();
      }
  }
  CHECK(pool.stats().reserved_bytes == std::size_t(pool.reserved()) * block);
  CHECK(pool.reserved() % 50 == 0);
  CHECK_THROWS_AS(oomb::block_pool<oomb::vmm_device_resource>::growable(v, block, 0, 10), oomb::invalid_argument);
}

TEST_CASE("block_pool::growable: exhaustion mid-growth throws out_of_memory and leaves the pool usable") {
  // Host model of the growable concept with a commit limit of 5 steps, then the same on the device
  // through a limit the VMM resource cannot meet (a capacity larger than the device).
  oomb::host_growable_resource host(5 * 16 * 4096);
  auto hp = oomb::block_pool<oomb::host_growable_resource>::growable(host, 4096, 16, 1000);
  std::vector<std::int32_t> ids(80);
  hp.acquire(80, ids.data());
  CHECK(hp.reserved() == 80);
  CHECK_THROWS_AS(hp.acquire(), oomb::out_of_memory);
  CHECK(hp.in_use() == 80);
  CHECK(hp.reserved() == 80);
  hp.release(ids[7]);
  CHECK(hp.acquire() == ids[7]);

  oomb::vmm_device_resource v;
  const std::size_t block = std::size_t(1) << 30;  // 1 GiB blocks, capacity 4096: 4 TiB of address space
  auto dp = oomb::block_pool<oomb::vmm_device_resource>::growable(v, block, 256, 4096);
  CHECK_THROWS_AS(dp.acquire(), oomb::out_of_memory);  // the first step (256 GiB) does not fit
  CHECK(dp.reserved() == 0);
  CHECK(dp.in_use() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
}

namespace {
// Reads a strided view element by element through its accessors, in device code.
template <int = 0>
__global__ void gather_view_kernel(oomb::tensor_view<const float, 3> in, float* out) {
  const std::int64_t n = in.size();
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t a = i / (in.extent(1) * in.extent(2)), b = (i / in.extent(2)) % in.extent(1), c = i % in.extent(2);
    const float* by_strides = in.data() + a * in.stride(0) + b * in.stride(1) + c * in.stride(2);
    out[i] = in(a, b, c) == *by_strides ? in(a, b, c) : -1.0f;  // -1: operator() and stride() disagree
  }
}
}  // namespace

TEST_CASE("tensor_view: its accessors work in kernels on a strided view (CPU reference, exact)") {
  // A [5][7][9] view over [9][5][7] storage (a permutation of the axes), seeded random values.
  const std::int64_t A = 5, B = 7, C = 9;
  std::vector<float> storage(std::size_t(A * B * C));
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (auto& x : storage) x = u(rng);
  device_buffer<float> d_in(storage.size()), d_out(storage.size());
  OOMB_CUDA_CHECK(cudaMemcpy(d_in.ptr, storage.data(), storage.size() * 4, cudaMemcpyHostToDevice), "test");
  const std::array<std::int64_t, 3> shape{A, B, C}, strides{B, 1, A * B};
  const oomb::tensor_view<const float, 3> host_view(storage.data(), shape, strides);
  const oomb::tensor_view<const float, 3> device_view(d_in.ptr, shape, strides, oomb::memory_kind::device);
  gather_view_kernel<><<<8, 128>>>(device_view, d_out.ptr);
  OOMB_CUDA_CHECK_LAUNCH("gather_view_kernel");
  std::vector<float> got(storage.size());
  OOMB_CUDA_CHECK(cudaMemcpy(got.data(), d_out.ptr, got.size() * 4, cudaMemcpyDeviceToHost), "test");
  std::size_t bad = 0, i = 0;
  for (std::int64_t a = 0; a < A; ++a)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < C; ++c) bad += got[i++] != host_view(a, b, c);
  CHECK(bad == 0);
}
