// Sparse page selection over 8K past pages: scoring a query tile (Quest bound, mean key), top-k
// selection alone, and both together through tile_selector. Run:
//   topk_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/scoring.hpp"
#include "oomb/sparse/selection.hpp"
#include "oomb/sparse/tile_selector.hpp"

namespace {

constexpr std::int32_t kPages = 8192;     // 1M tokens of context at 128 tokens a page
constexpr std::int32_t kPageSize = 128;
constexpr std::int32_t kQHeads = 8;        // GQA 8:2 (one layer of a small model)
constexpr std::int32_t kKvHeads = 2;
constexpr std::int32_t kHeadDim = 64;
constexpr oomb::selection_config kPick{256, 4, 16};  // budget 256 pages + 4 sink + 16 local

std::vector<float> random_values(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Summaries of kPages full pages (built once) and a shuffled page-table row.
struct setup {
  oomb::page_summaries summaries{kKvHeads, kHeadDim, kPages};
  std::vector<std::int32_t> ids;
  setup() {
    std::mt19937_64 rng(1);
    ids.resize(kPages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (std::int32_t p = 0; p < kPages; ++p) {
      const auto keys = random_values(rng, std::size_t(kPageSize) * kKvHeads * kHeadDim);
      summaries.update(p, 0,
                       oomb::tensor_view<const float, 3>::contiguous(keys.data(), {kPageSize, kKvHeads, kHeadDim}));
    }
  }
};

const setup& shared() {
  static const setup s;
  return s;
}

void score_tile(benchmark::State& state, oomb::score_kind kind) {
  const auto& s = shared();
  const auto tile = static_cast<std::int32_t>(state.range(0));
  std::mt19937_64 rng(2);
  const auto q = random_values(rng, std::size_t(tile) * kQHeads * kHeadDim);
  oomb::tile_scorer scorer(kind, kQHeads, kKvHeads, kHeadDim);
  std::vector<float> scores(kPages);
  for (auto _ : state) {
    scorer.load(oomb::tensor_view<const float, 3>::contiguous(q.data(), {tile, kQHeads, kHeadDim}));
    scorer.score(s.summaries.view(), s.ids.data(), kPages, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  // Items: (page, query, query head) scores computed.
  state.SetItemsProcessed(state.iterations() * kPages * tile * kQHeads);
}

void BM_score_quest(benchmark::State& state) { score_tile(state, oomb::score_kind::quest); }
void BM_score_mean(benchmark::State& state) { score_tile(state, oomb::score_kind::mean); }

// Top-k alone: budget 256 of 8K pages plus sink and local.
void BM_select_topk(benchmark::State& state) {
  std::mt19937_64 rng(3);
  const auto scores = random_values(rng, kPages);
  oomb::page_selector sel(kPick);
  std::vector<std::int32_t> out;
  for (auto _ : state) {
    sel.select(scores.data(), kPages, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kPages);
}

// Scoring + selection + CSR export for one chunk of 512 queries (tiles of range(0) queries).
void BM_tile_selector_chunk(benchmark::State& state) {
  const auto& s = shared();
  const auto tile = static_cast<std::int32_t>(state.range(0));
  const std::int32_t chunk = 512;
  std::mt19937_64 rng(4);
  const auto q = random_values(rng, std::size_t(chunk) * kQHeads * kHeadDim);
  oomb::tile_selector sel({tile, oomb::score_kind::quest, kPick}, kQHeads, kKvHeads, kHeadDim);
  oomb::sparse_page_table table;
  for (auto _ : state) {
    table.clear();
    sel.select(s.summaries.view(), oomb::tensor_view<const float, 3>::contiguous(q.data(), {chunk, kQHeads, kHeadDim}),
               s.ids.data(), kPages, table);
    benchmark::DoNotOptimize(table.indices().data());
  }
  state.SetItemsProcessed(state.iterations() * sel.num_tiles(chunk));  // tiles selected
}

// Summarising one full page of 128 tokens (float keys).
void BM_summary_update_page(benchmark::State& state) {
  std::mt19937_64 rng(5);
  const auto keys = random_values(rng, std::size_t(kPageSize) * kKvHeads * kHeadDim);
  oomb::page_summaries s(kKvHeads, kHeadDim, 1);
  for (auto _ : state) {
    s.update(0, 0, oomb::tensor_view<const float, 3>::contiguous(keys.data(), {kPageSize, kKvHeads, kHeadDim}));
    benchmark::DoNotOptimize(s.view().max);
  }
  state.SetItemsProcessed(state.iterations() * kPageSize);
}

}  // namespace

BENCHMARK(BM_score_quest)->Arg(1)->Arg(16)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_score_mean)->Arg(1)->Arg(16)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_select_topk)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tile_selector_chunk)->Arg(16)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_summary_update_page)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
