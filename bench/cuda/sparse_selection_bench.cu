// GPU page summaries and tile selection at long context: Qwen2.5-7B heads (28 query heads, 4 KV
// heads, head_dim 128), 128-token pages, one layer. For each context length and budget: the
// median time of select_tiles (query-tile summaries, per slice of the past: gather, scoring, CUB
// top-k with the best so far; then the picks by index and the CSR) for one chunk of 4096 queries
// (32 tiles of 128) whose past is the whole context, with summaries in device memory and the
// default slice; at budget 64 (Quest) also other slices (8,192 pages, the whole past in one pass)
// and summaries in mapped pinned memory, as the trainer keeps them. And summarize_pages for the
// chunk's 32 new pages and for every page of the context. One JSON line per measurement.
//   sparse_selection_bench [--out FILE.jsonl] [--reps N]
// SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/page_summary_kernels.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/tile_selection.cuh"
#include "oomb/paging/page_shape.hpp"

namespace {

template <int = 0>
__global__ void fill_kernel(oomb::bf16* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    p[i] = oomb::bf16(float(std::int64_t(x % 20001) - 10000) * 1e-4f);  // uniform in [-1, 1], never all zero
  }
}

template <class T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  OOMB_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), "bench: cudaMalloc of ", n * sizeof(T), " bytes");
  return static_cast<T*>(p);
}

template <class F>
double median_ms(cudaStream_t s, int reps, F&& f) {
  cudaEvent_t a, b;
  OOMB_CUDA_CHECK(cudaEventCreate(&a), "bench");
  OOMB_CUDA_CHECK(cudaEventCreate(&b), "bench");
  f();  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    OOMB_CUDA_CHECK(cudaEventRecord(a, s), "bench");
    f();
    OOMB_CUDA_CHECK(cudaEventRecord(b, s), "bench");
    OOMB_CUDA_CHECK(cudaEventSynchronize(b), "bench");
    float t = 0;
    OOMB_CUDA_CHECK(cudaEventElapsedTime(&t, a, b), "bench");
    ms.push_back(t);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  std::FILE* out = out_path.empty() ? nullptr : std::fopen(out_path.c_str(), "w");
  cudaDeviceProp prop{};
  OOMB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0), "bench");

  const std::int32_t q_heads = 28, kv_heads = 4, d = 128, page = 128, chunk = 4096, tile = 128;
  const oomb::page_shape shape{page, kv_heads, d, oomb::kv_layout::head_major};
  const std::int32_t max_pages = (std::int32_t(1) << 22) / page;  // 4M tokens
  oomb::cuda_stream stream;
  const cudaStream_t s = stream.get();

  // One layer's K/V pool for 4M tokens (8 GiB), queries of one chunk, summaries of every page.
  auto* pool = device_alloc<oomb::bf16>(std::size_t(max_pages) * shape.pair_elements());
  auto* q = device_alloc<oomb::bf16>(std::size_t(chunk) * q_heads * d);
  fill_kernel<<<1024, 256, 0, s>>>(pool, std::size_t(max_pages) * shape.pair_elements(), 1);
  fill_kernel<<<1024, 256, 0, s>>>(q, std::size_t(chunk) * q_heads * d, 2);
  const std::size_t sum_bytes = oomb::device_page_summaries::bytes(max_pages, kv_heads, d);
  void* sum_storage = device_alloc<unsigned char>(sum_bytes);
  const auto sums = oomb::device_page_summaries::over(sum_storage, max_pages, kv_heads, d);
  oomb::clear_page_summaries(sums, stream.view());
  std::vector<std::int32_t> ids(static_cast<std::size_t>(max_pages));
  for (std::int32_t i = 0; i < max_pages; ++i) ids[std::size_t(i)] = (i * 7919) % max_pages;  // scattered ids
  auto* dids = device_alloc<std::int32_t>(ids.size());
  OOMB_CUDA_CHECK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "bench");
  const auto pool_view = oomb::page_pool_view<const oomb::bf16>::over(pool, shape);
  const oomb::tensor_view<const oomb::bf16, 3> qv(q, {chunk, q_heads, d}, {q_heads * d, d, 1}, oomb::memory_kind::device);

  const auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (out) std::fprintf(out, "%s\n", line.c_str());
  };
  char buf[1024];
  // Summaries: a chunk's 32 new pages, and every page of 4M tokens.
  for (const std::int32_t n : {chunk / page, max_pages}) {
    const double ms = median_ms(s, reps, [&] { oomb::summarize_pages(pool_view, dids, nullptr, n, sums, stream.view()); });
    std::snprintf(buf, sizeof buf,
                  "{\"bench\":\"summarize_pages\",\"gpu\":\"%s\",\"pages\":%d,\"page_size\":%d,\"kv_heads\":%d,"
                  "\"head_dim\":%d,\"dtype\":\"bf16\",\"median_ms\":%.4f,\"reps\":%d,\"summary_bytes_per_page\":%zu}",
                  prop.name, n, page, kv_heads, d, ms, reps, oomb::device_page_summaries::bytes_per_id(kv_heads, d));
    emit(buf);
  }
  // The same summaries in mapped pinned memory: the trainer's far-tier home, read over the bus.
  void* pinned_storage = oomb::pinned_resource{}.allocate(sum_bytes);
  OOMB_CUDA_CHECK(cudaMemcpyAsync(pinned_storage, sum_storage, sum_bytes, cudaMemcpyDeviceToHost, s), "bench");
  const auto pinned_sums = oomb::device_page_summaries::over(pinned_storage, max_pages, kv_heads, d);
  // Selection for one chunk whose past is the whole context.
  struct variant {
    std::int32_t slice;  // 0: the whole past in one pass
    bool pinned;
  };
  for (const std::int64_t tokens : {std::int64_t(1) << 20, std::int64_t(1) << 21, std::int64_t(1) << 22}) {
    const std::int32_t past = std::int32_t(tokens / page) - chunk / page;
    for (const oomb::score_kind kind : {oomb::score_kind::quest, oomb::score_kind::mean})
      for (const std::int32_t budget : {0, 16, 64, 256}) {
        std::vector<variant> variants{{oomb::default_selection_slice_pages, false}};
        if (kind == oomb::score_kind::quest && budget == 64)
          variants.insert(variants.end(), {{8192, false}, {0, false}, {oomb::default_selection_slice_pages, true}});
        for (const variant v : variants) {
          const oomb::tile_selection_config config{tile, kind, {budget, 1, 2}};
          const auto plan = oomb::plan_tile_selection(config, q_heads, kv_heads, d, chunk / tile, past,
                                                      v.slice > 0 ? v.slice : past);
          auto* ws = device_alloc<unsigned char>(plan.workspace_bytes);
          auto* indptr = device_alloc<std::int32_t>(chunk / tile + 1);
          auto* pages = device_alloc<std::int32_t>(std::size_t(plan.max_entries()));
          const oomb::page_summary_view view = v.pinned ? pinned_sums.view() : sums.view();
          const double ms = median_ms(s, reps, [&] {
            oomb::select_tiles(plan, view, qv, dids, past, indptr, pages, ws, plan.workspace_bytes, stream.view());
          });
          std::snprintf(buf, sizeof buf,
                        "{\"bench\":\"select_tiles\",\"gpu\":\"%s\",\"context_tokens\":%lld,\"past_pages\":%d,"
                        "\"page_size\":%d,\"queries\":%d,\"tile\":%d,\"tiles\":%d,\"q_heads\":%d,\"kv_heads\":%d,"
                        "\"head_dim\":%d,\"scoring\":\"%s\",\"budget\":%d,\"sink\":1,\"local\":2,"
                        "\"slice_pages\":%d,\"summaries\":\"%s\",\"median_ms\":%.4f,\"reps\":%d,\"workspace_bytes\":%zu}",
                        prop.name, static_cast<long long>(tokens), past, page, chunk, tile, chunk / tile, q_heads,
                        kv_heads, d, oomb::to_string(kind), budget, plan.slice_pages, v.pinned ? "pinned" : "device", ms,
                        reps, plan.workspace_bytes);
          emit(buf);
          stream.synchronize();
          (void)cudaFree(ws);
          (void)cudaFree(indptr);
          (void)cudaFree(pages);
        }
      }
  }
  oomb::pinned_resource{}.deallocate(pinned_storage, sum_bytes);
  if (out) std::fclose(out);
  return 0;
}
