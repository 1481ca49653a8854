// The host side of a pageable-home transfer (cuda_staged_page_transfer: the worker copies pages
// between the homes and pinned staging; docs/cuda.md "Pageable homes"): memcpy of one KV page per
// call, in a shuffled page order, between a home of 1 GiB and a 64 MiB staging buffer, with the home
// in 4 KiB pages (madvise MADV_NOHUGEPAGE) and in transparent huge pages (MADV_HUGEPAGE: what a
// `madvise`-mode host such as the H200's gives only when asked), both directions. Issue 33's lead:
// would huge pages make the homes' copies faster? Linux only (madvise). Run:
//   home_copy_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Args: page bytes (256 KiB: Qwen2.5-7B's 128-token page of one layer; 64 KiB: the 0.5B's), huge (0/1).
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr std::size_t kHome = std::size_t(1) << 30, kStage = std::size_t(64) << 20, kHuge = std::size_t(2) << 20;

struct home {
  std::byte* p;
  explicit home(bool huge) : p(static_cast<std::byte*>(std::aligned_alloc(kHuge, kHome))) {
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, kHome, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(p, 1, kHome);  // first touch before timing, as homes are written before they are read
  }
  ~home() { std::free(p); }
  home(const home&) = delete;
  home& operator=(const home&) = delete;
};

void BM_home_copy(benchmark::State& state, bool to_stage) {
  const auto page = static_cast<std::size_t>(state.range(0));
  const home h(state.range(1) != 0);
  std::vector<std::byte> stage(kStage, std::byte{2});
  std::vector<std::size_t> order(kHome / page);
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  std::size_t i = 0;
  for (auto _ : state) {
    std::byte* home_page = h.p + order[i % order.size()] * page;
    std::byte* stage_page = stage.data() + (i * page) % kStage;
    if (to_stage)
      std::memcpy(stage_page, home_page, page);
    else
      std::memcpy(home_page, stage_page, page);
    benchmark::ClobberMemory();
    ++i;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * page));
}

void BM_home_to_staging(benchmark::State& state) { BM_home_copy(state, true); }
void BM_staging_to_home(benchmark::State& state) { BM_home_copy(state, false); }

}  // namespace

BENCHMARK(BM_home_to_staging)->ArgsProduct({{64 << 10, 256 << 10}, {0, 1}})->ArgNames({"page", "huge"});
BENCHMARK(BM_staging_to_home)->ArgsProduct({{64 << 10, 256 << 10}, {0, 1}})->ArgNames({"page", "huge"});
BENCHMARK_MAIN();
