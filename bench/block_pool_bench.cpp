// block_pool acquire + release against malloc/free and new/delete of the same block size, side by
// side. Run: block_pool_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"

namespace {

constexpr std::int32_t kCapacity = 1024;  // blocks in the pool
constexpr std::int32_t kBatch = 64;       // blocks per batch in the *_batch benchmarks

// One block taken and given back per iteration, with a quarter of the pool already in use (a
// pool in service, not a pristine one).
void BM_block_pool_contiguous(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  oomb::host_resource host;
  auto pool = oomb::block_pool<oomb::host_resource>::contiguous(host, bytes, kCapacity);
  std::vector<std::int32_t> held(kCapacity / 4);
  pool.acquire(static_cast<std::int32_t>(held.size()), held.data());
  for (auto _ : state) {
    const std::int32_t id = pool.acquire();
    std::byte* p = pool.address(id);
    benchmark::DoNotOptimize(p);
    pool.release(id);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_block_pool_growing(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  oomb::host_resource host;
  auto pool = oomb::block_pool<oomb::host_resource>::growing(host, bytes, 64, kCapacity);
  std::vector<std::int32_t> held(kCapacity / 4);
  pool.acquire(static_cast<std::int32_t>(held.size()), held.data());
  for (auto _ : state) {
    const std::int32_t id = pool.acquire();
    std::byte* p = pool.address(id);
    benchmark::DoNotOptimize(p);
    pool.release(id);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_malloc_free(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_new_delete(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    auto* p = new std::byte[bytes];
    benchmark::DoNotOptimize(p);
    delete[] p;
  }
  state.SetItemsProcessed(state.iterations());
}

// kBatch blocks taken, then all given back (a chunk's pages): items are blocks.
void BM_block_pool_contiguous_batch(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  oomb::host_resource host;
  auto pool = oomb::block_pool<oomb::host_resource>::contiguous(host, bytes, kCapacity);
  std::int32_t ids[kBatch];
  for (auto _ : state) {
    pool.acquire(kBatch, ids);
    benchmark::DoNotOptimize(ids);
    for (std::int32_t id : ids) pool.release(id);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_malloc_free_batch(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  void* ptrs[kBatch];
  for (auto _ : state) {
    for (auto& p : ptrs) p = std::malloc(bytes);
    benchmark::DoNotOptimize(ptrs);
    for (void* p : ptrs) std::free(p);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_new_delete_batch(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::byte* ptrs[kBatch];
  for (auto _ : state) {
    for (auto& p : ptrs) p = new std::byte[bytes];
    benchmark::DoNotOptimize(ptrs);
    for (std::byte* p : ptrs) delete[] p;
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

}  // namespace

// 64 KiB: a bf16 K/V page pair of 128 tokens x 1 head x 128 dims; 256 B: a small block.
#define OOMB_BLOCK_SIZES Arg(64 << 10)->Arg(256)
BENCHMARK(BM_block_pool_contiguous)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_block_pool_growing)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_malloc_free)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_new_delete)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_block_pool_contiguous_batch)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_malloc_free_batch)->OOMB_BLOCK_SIZES;
BENCHMARK(BM_new_delete_batch)->OOMB_BLOCK_SIZES;

BENCHMARK_MAIN();
