// Page-table append and export, side by side.
// SPDX-License-Identifier: Apache-2.0
//
// Shapes follow Qwen2.5-7B (28 layers) with 128-token pages and 4096-token chunks: one chunk
// append adds 32 pages to each of 28 layers.
//  - page_table_append_chunk: append one chunk's ids to a sequence (change log on / off), popped
//    again every `chunks` appends so the table stays at a realistic size.
//  - paged_kv_cache_append_chunk: the same through the cache, pool acquire/release included.
//  - sync_*: keep a copy of all 28 layers' tables current after every chunk append + pop at a given
//    context length, by re-exporting CSR (full_export) or by applying the change log to a dense
//    replica (change_log): the "updated, not rebuilt" claim of the page model.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "oomb/paging/page_table.hpp"

namespace {

constexpr std::int32_t kLayers = 28;
constexpr std::int32_t kPage = 128;
constexpr std::int32_t kChunk = 4096;

std::vector<std::int32_t> chunk_ids(std::int32_t first, std::int32_t n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = first + i;
  return ids;
}

void page_table_append_chunk(benchmark::State& state) {
  const bool log = state.range(0) != 0;
  const auto chunks = static_cast<std::int32_t>(state.range(1));
  oomb::page_table t(kLayers, kPage, log);
  const auto s = t.add_sequence();
  const std::int32_t per_chunk = kChunk / kPage * kLayers;
  const auto ids = chunk_ids(0, per_chunk);  // reused every chunk: the table does not check ids
  std::int32_t held = 0;
  for (auto _ : state) {
    t.append(s, kChunk, ids.data(), ids.size());
    if (++held == chunks) {
      state.PauseTiming();
      t.pop(s, t.seq_len(s), [](std::int32_t, std::int32_t, std::int32_t) {});
      t.clear_changes();
      held = 0;
      state.ResumeTiming();
    }
  }
  state.counters["pages/s"] = benchmark::Counter(double(per_chunk) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(page_table_append_chunk)->ArgNames({"log", "chunks"})->Args({1, 64})->Args({0, 64});

void paged_kv_cache_append_chunk(benchmark::State& state) {
  oomb::host_resource r;
  oomb::paged_kv_config c;
  c.layers = kLayers;
  c.shape = {kPage, 1, 8, oomb::kv_layout::head_major};  // tiny pages: the bench measures bookkeeping
  c.chunk_size = kChunk;
  const auto chunks = static_cast<std::int32_t>(state.range(0));
  c.pool.max_pages = kChunk / kPage * kLayers * chunks;
  c.record_changes = false;
  oomb::paged_kv_cache<oomb::bf16, oomb::host_resource> kv(r, c);
  const auto s = kv.add_sequence();
  std::int32_t held = 0;
  for (auto _ : state) {
    kv.append(s, kChunk);
    if (++held == chunks) {
      state.PauseTiming();
      while (kv.pop_chunk(s) > 0) {
      }
      held = 0;
      state.ResumeTiming();
    }
  }
  state.counters["pages/s"] = benchmark::Counter(double(kChunk / kPage * kLayers) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(paged_kv_cache_append_chunk)->ArgNames({"chunks"})->Arg(64);

/// A table holding `context` tokens less one chunk, and the ids of that chunk.
struct sync_fixture {
  oomb::page_table table{kLayers, kPage};
  std::int32_t seq = table.add_sequence();
  std::vector<std::int32_t> ids;
  explicit sync_fixture(std::int64_t context) {
    std::int32_t next = 0;
    for (std::int64_t done = 0; done + kChunk < context; done += kChunk) {
      const auto chunk = chunk_ids(next, table.pages_needed(seq, kChunk) * kLayers);
      next += static_cast<std::int32_t>(chunk.size());
      table.append(seq, kChunk, chunk);
    }
    ids = chunk_ids(next, table.pages_needed(seq, kChunk) * kLayers);
    table.clear_changes();
  }
};

void sync_full_export(benchmark::State& state) {
  sync_fixture f(state.range(0));
  std::vector<oomb::page_table_csr> copy(kLayers);
  for (auto _ : state) {
    f.table.append(f.seq, kChunk, f.ids);
    for (std::int32_t l = 0; l < kLayers; ++l) f.table.export_csr(l, copy[static_cast<std::size_t>(l)]);
    f.table.pop(f.seq, kChunk, [](std::int32_t, std::int32_t, std::int32_t) {});
    for (std::int32_t l = 0; l < kLayers; ++l) f.table.export_csr(l, copy[static_cast<std::size_t>(l)]);
    f.table.clear_changes();
    benchmark::DoNotOptimize(copy.back().indices.data());
  }
}
BENCHMARK(sync_full_export)->ArgNames({"context"})->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20);

void sync_change_log(benchmark::State& state) {
  sync_fixture f(state.range(0));
  // A device-style replica: [layer][max pages] ids plus the length, written only by deltas.
  const auto max_pages = static_cast<std::size_t>(state.range(0) / kPage + 1);
  std::vector<std::int32_t> replica(static_cast<std::size_t>(kLayers) * max_pages, -1);
  std::int64_t len = 0;
  auto apply = [&](const oomb::page_table_changes& c) {
    for (const auto& d : c.pages)
      replica[static_cast<std::size_t>(d.layer) * max_pages + static_cast<std::size_t>(d.page)] = d.id;
    for (const auto& d : c.lengths) len = d.tokens;
  };
  for (auto _ : state) {
    f.table.append(f.seq, kChunk, f.ids);
    apply(f.table.changes());
    f.table.clear_changes();
    f.table.pop(f.seq, kChunk, [](std::int32_t, std::int32_t, std::int32_t) {});
    apply(f.table.changes());
    f.table.clear_changes();
    benchmark::DoNotOptimize(replica.data());
    benchmark::DoNotOptimize(len);
  }
}
BENCHMARK(sync_change_log)->ArgNames({"context"})->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
