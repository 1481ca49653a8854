// The example of docs/offload.md: the region between the snippet markers is quoted verbatim there
// (checked by the ctest `readme.snippets`), so the docs show code that compiles and runs.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/offload/belady_eviction.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/residency_scheduler.hpp"

TEST_CASE("docs/offload.md example: a window of gradient pages accumulated near, written home") {
  // snippet-begin: scheduler
  oomb::host_resource host;
  auto homes = oomb::block_pool<oomb::host_resource>::contiguous(host, 4096, 64);  // far tier
  std::vector<std::int32_t> pages(8);
  homes.acquire(8, pages.data());  // new gradient pages: no content at home yet

  oomb::host_stream compute, copy_in, copy_out;
  oomb::host_residency_scheduler near(homes, host, /*slots=*/16, copy_in, copy_out);

  near.prefetch(pages);  // zero-fills 8 slots on copy_in (a copy for pages with home content)
  const std::vector<std::int32_t> slots = near.acquire(compute, pages, oomb::access::write);
  for (std::int32_t s : slots) {  // compute waits for the fills, then adds into each slot
    auto* g = reinterpret_cast<float*>(near.near_pool().address(s));
    compute.enqueue([g] { for (int i = 0; i < 1024; ++i) g[i] += 0.5f; });
  }
  near.release(compute, pages);  // slots may be reused once this compute work is done
  near.write_back(pages);        // copy_out waits for it, copies the 8 pages home (one batch)

  compute.synchronize();  // the edge of a step: the host waits
  near.drain();
  float first;
  std::memcpy(&first, homes.address(pages[3]), sizeof first);  // 0.5f, at home now
  // snippet-end: scheduler
  CHECK(first == 0.5f);
  CHECK(near.stats().write_backs == 8);
  CHECK(near.stats().zero_fills == 8);
  CHECK(near.stats().bytes_to_far == 8 * 4096);

  // snippet-begin: transfer
  oomb::host_stream stream;
  auto far = oomb::block_pool<oomb::host_resource>::contiguous(host, 4096, 64);
  auto slab = oomb::block_pool<oomb::host_resource>::contiguous(host, 4096, 16);
  std::int32_t f[4], n[4];
  far.acquire(4, f);   // ids 0..3
  slab.acquire(4, n);  // ids 0..3
  const oomb::transfer_report r = oomb::transfer_pages(stream, slab, {n[0], n[1], n[2], n[3]},
                                                       far, {f[0], f[1], f[2], f[3]});
  // r.pages == 4, r.copies == 1 (one run: adjacent on both sides), r.bytes == 4 * 4096
  stream.record().wait();
  // snippet-end: transfer
  CHECK(r.pages == 4);
  CHECK(r.copies == 1);
  CHECK(r.bytes == 4 * 4096);
}

TEST_CASE("docs/offload.md example: a declared window order evicts the page needed last") {
  oomb::host_resource host;
  auto homes = oomb::block_pool<oomb::host_resource>::contiguous(host, 4096, 64);
  std::vector<std::int32_t> pages(6);
  homes.acquire(6, pages.data());
  oomb::host_stream compute, copy_in, copy_out;
  // snippet-begin: belady
  oomb::residency_scheduler<oomb::host_backend, oomb::belady_eviction> near(homes, host, /*slots=*/4,
                                                                            copy_in, copy_out);
  const std::vector<std::vector<std::int32_t>> windows = {{0, 1}, {2, 3}, {4, 5}, {0, 1}, {2, 3}};
  std::vector<std::int32_t> order;  // the pages the loop below asks for, in order
  for (const auto& w : windows) order.insert(order.end(), w.begin(), w.end());
  near.eviction().expect(order);
  for (const auto& w : windows) {
    near.prefetch(w);  // {4, 5} evicts {2, 3} (needed last); LRU would evict {0, 1} (needed next)
    const std::vector<std::int32_t> slots = near.acquire(compute, w, oomb::access::read);
    // ... enqueue the window's work on compute, reading `slots` ...
    near.release(compute, w);
  }
  // snippet-end: belady
  compute.synchronize();
  near.drain();
  CHECK(near.stats().misses == 8);
  oomb::host_residency_scheduler lru(homes, host, 4, copy_in, copy_out);
  for (const auto& w : windows) {
    lru.prefetch(w);
    lru.acquire(compute, w, oomb::access::read);
    lru.release(compute, w);
  }
  compute.synchronize();
  lru.drain();
  CHECK(lru.stats().misses == 10);  // it evicts {0, 1} for {4, 5}, then {2, 3} for {0, 1}
}
