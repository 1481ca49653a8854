// The API example of docs/sparse.md, compiled and run here; readme.snippets checks that the doc
// quotes the region between the snippet markers verbatim.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/paging/views.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/tile_selector.hpp"

TEST_CASE("docs/sparse.md example") {
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  const oomb::page_shape shape{16, 2, 64, oomb::kv_layout::head_major};
  const int past = 40, chunk = 300;
  std::vector<oomb::bf16> pool_memory(std::size_t(past) * shape.pair_elements());
  for (auto& x : pool_memory) x = oomb::bf16(u(rng));
  const auto pool_view = oomb::page_pool_view<oomb::bf16>::over(pool_memory.data(), shape);
  std::vector<std::int32_t> page_ids(past);
  for (int i = 0; i < past; ++i) page_ids[std::size_t(i)] = past - 1 - i;  // a page-table row
  std::vector<float> q(std::size_t(chunk) * 8 * 64);
  for (auto& x : q) x = u(rng) - 0.55f;
  const auto queries = oomb::tensor_view<const float, 3>::contiguous(q.data(), {chunk, 8, 64});

  // snippet-begin: example
  // One store per layer, indexed by the pool's page ids: 2 KV heads, head_dim 64.
  oomb::page_summaries summaries(/*kv_heads=*/2, /*head_dim=*/64);
  // As pages fill (after K is written to the pool): tokens [first, first + count) of page id.
  for (int i = 0; i < past; ++i) {
    summaries.update_from_pool(pool_view, page_ids[std::size_t(i)], /*first_token=*/0, /*count=*/10);
    summaries.update_from_pool(pool_view, page_ids[std::size_t(i)], /*first_token=*/10, /*count=*/6);
  }

  // Stage 1, one chunk of queries [n][q_heads][head_dim] whose past is logical pages [0, past):
  oomb::tile_selector selector({/*tile_queries=*/128, oomb::score_kind::quest,
                                {/*budget=*/8, /*sink=*/1, /*local=*/2}},
                               /*q_heads=*/8, /*kv_heads=*/2, /*head_dim=*/64);
  oomb::sparse_page_table table;  // one CSR row per tile, kept for stage 2 and prefetch
  selector.select(summaries.view(), queries, page_ids.data(), past, table);

  const oomb::sparse_page_table_view v = table.view();  // by value to kernels
  for (std::int32_t t = 0; t < v.num_tiles; ++t)
    for (std::int32_t i = 0; i < v.num_pages(t); ++i) {
      const std::int32_t logical = v.page(t, i);            // ascending, sink and local included
      const std::int32_t id = page_ids[std::size_t(logical)];  // the page table gives the pool id
      (void)id;
    }
  // snippet-end: example

  CHECK(v.num_tiles == 3);  // 300 queries in tiles of 128
  for (std::int32_t t = 0; t < v.num_tiles; ++t) {
    REQUIRE(v.num_pages(t) == 11);
    CHECK(v.page(t, 0) == 0);
    CHECK(v.page(t, 9) == past - 2);
    CHECK(v.page(t, 10) == past - 1);
  }
  CHECK(summaries.tokens(page_ids[0]) == 16);
}
