// The README's API tour. The regions between the snippet markers are quoted verbatim in README.md
// (checked by the ctest `readme.snippets`), so the README shows code that compiles and runs.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

// snippet-begin: include
#include <oomb/oomb.hpp>
// snippet-end: include

TEST_CASE("readme tour: a page pool on a capped host resource") {
  // snippet-begin: pool
  // The far tier of a CPU build: host memory, capped at 64 MiB and counted.
  oomb::host_resource host;
  oomb::limiting_adaptor<oomb::host_resource> capped(host, std::size_t{64} << 20);
  oomb::statistics_adaptor<oomb::limiting_adaptor<oomb::host_resource>> far(capped);

  // A page holds 128 tokens x 8 KV heads x 128 dims; a pool block is a K/V page *pair*.
  oomb::page_shape shape{128, 8, 128, oomb::kv_layout::head_major};
  shape.validate();  // throws oomb::invalid_argument for a bad shape
  const std::size_t pair_bytes = std::size_t(shape.pair_elements()) * sizeof(oomb::bf16);

  // 64 pairs in one range, so address(id) == base() + id * pair_bytes: what kernels index.
  auto pool = oomb::block_pool<decltype(far)>::contiguous(far, pair_bytes, 64);
  std::int32_t ids[16];
  pool.acquire(16, ids);  // all or nothing: int32 ids, O(1) each

  // Kernels and the CPU reference read pages through POD views.
  auto pages = oomb::page_pool_view<oomb::bf16>::over(
      reinterpret_cast<oomb::bf16*>(pool.base()), shape);
  *pages.k(ids[3], /*token=*/5, /*head=*/2) = oomb::bf16(1.5f);
  *pages.v(ids[3], /*token=*/5, /*head=*/2) = oomb::bf16(-2.0f);
  // snippet-end: pool

  CHECK(pool.in_use() == 16);
  CHECK(pool.stats().high_water == 16);
  CHECK(far.statistics().bytes_in_use == 64 * pair_bytes);
  CHECK(capped.bytes_in_use() == 64 * pair_bytes);
  for (int i = 0; i < 16; ++i) {
    CHECK(pool.owns(ids[i]));
    CHECK(pool.address(ids[i]) == pool.base() + std::int64_t(ids[i]) * pair_bytes);
  }
  // The K element lies where the page model says: pair base + head * page_size * head_dim + token
  // * head_dim (head-major); V is one page later.
  auto* k = reinterpret_cast<oomb::bf16*>(pool.address(ids[3])) + 2 * 128 * 128 + 5 * 128;
  CHECK(static_cast<float>(*k) == 1.5f);
  CHECK(static_cast<float>(*(k + shape.page_elements())) == -2.0f);

  // snippet-begin: errors
  // Bad input raises an oomb::error subclass that names the numbers; the pool stays usable.
  std::int32_t more[64];
  std::string message;
  try {
    pool.acquire(64, more);  // 48 are left
  } catch (const oomb::out_of_memory& e) {
    message = e.what();  // "oomb: block_pool: asked for 64 blocks of 524288 bytes, 48 left of
                         //  capacity 64 (16 in use) [.../block_pool.hpp:97]"
  }
  for (std::int32_t id : ids) pool.release(id);
  // snippet-end: errors

  CHECK(message.find("asked for 64 blocks of 524288 bytes, 48 left of capacity 64 (16 in use)") !=
        std::string::npos);
  CHECK(pool.in_use() == 0);
  CHECK_THROWS_AS(pool.acquire(65, more), oomb::out_of_memory);
  try {
    pool.acquire(65, more);
  } catch (const oomb::out_of_memory& e) {
    CHECK(std::string(e.what()).find("asked for 65 blocks of 524288 bytes, 64 left") !=
          std::string::npos);
  }
  CHECK_THROWS_AS(pool.release(ids[0]), oomb::invalid_argument);  // released twice
  CHECK(pool.in_use() == 0);
  pool.acquire(64, more);  // everything is still there
  CHECK(pool.in_use() == 64);
  CHECK_THROWS_AS(oomb::limiting_adaptor<oomb::host_resource>(host, 100).allocate(101, 64),
                  oomb::out_of_memory);
  CHECK_THROWS_AS((oomb::page_shape{100, 8, 128, oomb::kv_layout::head_major}.validate()),
                  oomb::invalid_argument);
}

TEST_CASE("readme tour: a paged KV cache") {
  oomb::host_resource host;
  // snippet-begin: cache
  // K/V of 4 layers in one pool of 256 page pairs (fp32 here; bf16 on the GPU), chunks of 512.
  oomb::paged_kv_config config;
  config.layers = 4;
  config.shape = {128, 2, 64, oomb::kv_layout::token_major};
  config.chunk_size = 512;  // a multiple of the page size, or invalid_argument
  config.pool.max_pages = 256;
  oomb::paged_kv_cache<float, oomb::host_resource> cache(host, config);

  const std::int32_t seq = cache.add_sequence();
  cache.append(seq, 512);  // chunk 0: 4 pages in each layer, all taken at once or none
  cache.append(seq, 300);  // chunk 1, the last, may be partial: 3 more pages per layer
  cache.k(seq, /*layer=*/1, /*pos=*/700, /*head=*/0)[5] = 0.25f;

  // What a kernel or the CPU reference reads: the pool and one layer's CSR page table.
  oomb::paged_kv_view<float> layer1 = cache.view(1);
  float k = layer1.k_at(seq, 700, 0)[5];  // 0.25f
  // A device copy of the tables is updated from the change log, not rebuilt.
  oomb::page_table_changes deltas = cache.take_changes();

  cache.pop_chunk(seq);  // stage 2 walks back: chunk 1's pages return to the pool
  // snippet-end: cache

  CHECK(k == 0.25f);
  CHECK(deltas.pages.size() == 4 * 7);  // 7 pages appended in each of 4 layers
  CHECK(layer1.table.num_pages(seq) == 7);
  CHECK(layer1.table.seq_len(seq) == 812);
  CHECK(cache.seq_len(seq) == 512);
  CHECK(cache.num_pages(seq) == 4);
  CHECK(cache.k(seq, 1, 300, 0)[0] == cache.view(1).k_at(seq, 300, 0)[0]);
  CHECK_THROWS_AS(cache.append(seq, 513), oomb::invalid_argument);    // more than a chunk
  CHECK_THROWS_AS(cache.k(seq, 1, 512, 0), oomb::invalid_argument);   // popped position
  config.chunk_size = 500;
  CHECK_THROWS_AS((oomb::paged_kv_cache<float, oomb::host_resource>(host, config)),
                  oomb::invalid_argument);
}

TEST_CASE("readme tour: pages stream through a near tier") {
  oomb::host_resource host;
  oomb::paged_kv_config config;
  config.layers = 2;
  config.shape = {16, 2, 8, oomb::kv_layout::head_major};
  config.chunk_size = 64;
  config.pool.max_pages = 32;
  oomb::paged_kv_cache<float, oomb::host_resource> cache(host, config);
  const std::int32_t seq = cache.add_sequence();
  cache.append(seq, 64);
  for (std::int64_t pos = 0; pos < 64; ++pos) cache.k(seq, 0, pos, 1)[7] = float(pos) + 0.5f;

  // snippet-begin: stream
  // The near tier (device slots on the GPU; host memory here): 8 slots the size of a K/V pair,
  // filled on a copy-in stream and written back on a copy-out stream.
  oomb::host_stream compute, copy_in, copy_out;
  oomb::host_residency_scheduler near(cache.pool(), host, /*slots=*/8, copy_in, copy_out);

  // Declare the pages needed next, then use them: compute waits for their copies, not the host.
  oomb::id_span window = cache.page_ids(seq, /*layer=*/0);  // 4 pages of layer 0
  near.mark_written(window);  // their homes hold K/V written by the host (else: zero-filled)
  near.prefetch(window);      // one batch of copies on copy_in
  std::vector<std::int32_t> slots = near.acquire(compute, window, oomb::access::read);
  float seen = 0;
  compute.enqueue([&] {  // stands for a kernel reading the slots
    auto* k = reinterpret_cast<float*>(near.near_pool().address(slots[2]));
    seen = k[1 * 16 * 8 + 3 * 8 + 7];  // head 1, token 3, dim 7 of logical page 2
  });
  near.release(compute, window);  // the slots may be reused once that work has run
  compute.synchronize();          // the edge of a step: the host waits
  // seen == K at position 2 * 16 + 3 == 35.5f; near.stats().bytes_to_near == 4 * pair bytes
  // snippet-end: stream

  CHECK(seen == 35.5f);
  CHECK(slots.size() == 4);
  CHECK(near.stats().bytes_to_near == 4 * cache.pair_bytes());
  CHECK(near.stats().copies_to_near >= 1);
  near.prefetch(window);  // already near: no new copy
  CHECK(near.stats().bytes_to_near == 4 * cache.pair_bytes());
  near.drain();
  cache.append(seq, 64);  // 8 pages per layer now: 16 distinct pages do not fit 8 slots
  std::vector<std::int32_t> all;
  for (std::int32_t layer = 0; layer < 2; ++layer)
    for (std::int32_t id : cache.page_ids(seq, layer)) all.push_back(id);
  CHECK(all.size() == 16);
  CHECK_THROWS_AS(near.prefetch(all), oomb::out_of_memory);
  near.prefetch(cache.page_ids(seq, 1));  // still usable: 8 pages fit; never written: zero-filled
  CHECK(near.stats().bytes_to_near == 4 * cache.pair_bytes());
  CHECK(near.stats().zero_fills == 8);
  near.drain();
  near.drain();
}
