// Page transfers between device memory and pageable host homes through pinned staging
// (cuda_staged_page_transfer): every byte over many staging geometries, the host copies' order
// against the streams (a home written by a slow write-back is read only after it), bad input and
// options, a destructor with batches still queued, and the process's shared copier under the
// transfers of three tiers moving both ways at once.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/staged_page_transfer.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/memory/host_resource.hpp"

using namespace oomb_cuda_test;
using host_pool = oomb::block_pool<oomb::host_resource>;
using device_pool = oomb::block_pool<oomb::device_resource>;
using up_transfer = oomb::cuda_staged_page_transfer<oomb::device_resource, oomb::host_resource>;
using down_transfer = oomb::cuda_staged_page_transfer<oomb::host_resource, oomb::device_resource>;

static_assert(std::is_same_v<oomb::cuda_tier_transfer<oomb::device_resource, oomb::host_resource>, up_transfer>);
static_assert(std::is_same_v<oomb::cuda_tier_transfer<oomb::device_resource, oomb::pinned_resource>,
                             oomb::cuda_page_transfer<oomb::device_resource, oomb::pinned_resource>>);

namespace {

// A copier of `threads` threads that lives until the tests end (options only point at it).
oomb::parallel_copier& copier_of(int threads) {
  static std::map<int, std::unique_ptr<oomb::parallel_copier>> copiers;
  auto& c = copiers[threads];
  if (!c) c = std::make_unique<oomb::parallel_copier>(threads);
  return *c;
}

oomb::cuda_transfer_options staging(std::size_t chunk_bytes, int chunks, int threads) {
  oomb::cuda_transfer_options o;
  o.pageable.chunk_bytes = chunk_bytes;
  o.pageable.chunks = chunks;
  o.pageable.copier = &copier_of(threads);
  return o;
}

std::vector<std::int32_t> take(host_pool& p, std::int32_t n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  p.acquire(n, ids.data());
  return ids;
}

// Pageable homes -> device (random slots, random order) -> other pageable pages, checked byte by
// byte; the streams start behind a delay half the time, so the lane waits for them.
void round_trip(std::size_t page_bytes, std::int32_t pages, const oomb::cuda_transfer_options& o, std::uint32_t seed) {
  CAPTURE(page_bytes);
  CAPTURE(pages);
  CAPTURE(o.pageable.chunk_bytes);
  CAPTURE(o.pageable.chunks);
  CAPTURE(o.pageable.copier ? o.pageable.copier->threads() : 0);
  oomb::host_resource hr;
  oomb::device_resource dr;
  auto home = host_pool::growing(hr, page_bytes, 37);  // slabs of 37: runs break at slab edges
  auto back = host_pool::growing(hr, page_bytes, 64);
  auto dev = device_pool::contiguous(dr, page_bytes, pages + 8);
  std::mt19937 rng(seed);
  auto all = take(home, pages * 2);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int32_t> src(all.begin(), all.begin() + pages);
  std::sort(src.begin(), src.begin() + pages / 2);  // half in order: long merged runs, cut into chunks
  for (std::int32_t id : src) fill_random(home.address(id), page_bytes, seed * 1000003u + std::uint64_t(id));
  std::vector<std::int32_t> slots(static_cast<std::size_t>(pages));
  dev.acquire(pages, slots.data());
  std::shuffle(slots.begin() + pages / 2, slots.end(), rng);
  auto dst = take(back, pages);
  std::shuffle(dst.begin(), dst.end(), rng);
  for (std::int32_t id : dst) std::memset(back.address(id), 0, page_bytes);

  oomb::cuda_stream in, out;
  up_transfer up(dev, home, o);
  down_transfer down(back, dev, o);
  if (seed % 2) enqueue_delay(in.get(), 2'000'000);
  const auto r1 = up.enqueue(in, slots, src);
  CHECK(r1.pages == std::size_t(pages));
  CHECK(r1.bytes == std::size_t(pages) * page_bytes);
  CHECK(r1.copies >= (r1.bytes + o.pageable.chunk_bytes - 1) / o.pageable.chunk_bytes);
  out.wait(in.record());
  if (seed % 3 == 0) enqueue_delay(out.get(), 2'000'000);
  const auto r2 = down.enqueue(out, dst, slots);
  CHECK(r2.bytes == r1.bytes);
  out.synchronize();  // the write-back's stream covers the lane's copies into the homes
  int bad = 0;
  for (std::int32_t i = 0; i < pages; ++i)
    bad += std::memcmp(home.address(src[std::size_t(i)]), back.address(dst[std::size_t(i)]), page_bytes) == 0 ? 0 : 1;
  CHECK_MESSAGE(bad == 0, bad, " of ", pages, " pages wrong");
}

}  // namespace

TEST_CASE("staged transfers: every byte between pageable homes and the device, over many staging geometries") {
  std::uint32_t seed = 1;
  // Chunks smaller than a page, a page and a bit, many pages; 2 to 8 chunks; 1 to 6 threads.
  for (std::size_t page_bytes : {std::size_t(64) << 10, std::size_t(48 << 10) + 16, std::size_t(4004)}) {
    for (const auto& o : {staging(4096, 2, 1), staging(68 << 10, 3, 2), staging(1 << 20, 2, 4), staging(8 << 20, 4, 4),
                          staging(256 << 10, 8, 6)}) {
      round_trip(page_bytes, quick() ? 97 : 411, o, seed++);
    }
  }
  // Batches far larger than the ring (the lane and the DMA take turns around it many times).
  round_trip(std::size_t(256) << 10, quick() ? 200 : 1200, staging(2 << 20, 2, 4), seed++);
}

TEST_CASE("staged transfers: a home written by a slow write-back is read only after it landed") {
  const std::size_t page_bytes = 256 << 10;
  const std::int32_t pages = 64;
  oomb::host_resource hr;
  oomb::device_resource dr;
  auto home = host_pool::contiguous(hr, page_bytes, pages);
  auto dev = device_pool::contiguous(dr, page_bytes, 2 * pages);
  auto ids = take(home, pages);
  std::vector<std::int32_t> a(static_cast<std::size_t>(pages)), b(static_cast<std::size_t>(pages));
  dev.acquire(pages, a.data());
  dev.acquire(pages, b.data());
  for (std::int32_t i = 0; i < pages; ++i) {  // the image below is laid out by these ids
    REQUIRE(ids[std::size_t(i)] == i);
    REQUIRE(a[std::size_t(i)] == i);
    REQUIRE(b[std::size_t(i)] == pages + i);
  }
  std::vector<unsigned char> image(std::size_t(pages) * page_bytes);
  fill_random(image.data(), image.size(), 99);
  OOMB_CUDA_CHECK(cudaMemcpy(dev.address(a[0]), image.data(), image.size(), cudaMemcpyHostToDevice), "test");

  oomb::cuda_stream in, out;
  const auto o = staging(1 << 20, 2, 3);
  up_transfer up(dev, home, o);
  down_transfer down(home, dev, o);
  for (int round = 0; round < 3; ++round) {
    for (std::int32_t id : ids) std::memset(home.address(id), 0x11, page_bytes);  // stale: must never arrive
    enqueue_delay(out.get(), 20'000'000);  // the write-back's DMA starts 20 ms from now
    down.enqueue(out, ids, round % 2 ? b : a);
    in.wait(out.record());  // what the residency scheduler does before reading a home written back
    up.enqueue(in, round % 2 ? a : b, ids);
    in.synchronize();
    std::vector<unsigned char> got(image.size());
    OOMB_CUDA_CHECK(cudaMemcpy(got.data(), dev.address(round % 2 ? a[0] : b[0]), got.size(), cudaMemcpyDeviceToHost),
                    "test");
    CHECK_MESSAGE(got == image, "round ", round);
    for (std::int32_t id : ids) CHECK(std::memcmp(home.address(id), image.data() + std::size_t(id) * page_bytes, page_bytes) == 0);
  }
}

TEST_CASE("staged transfers: bad input throws before anything is enqueued; bad options are refused") {
  const std::size_t page_bytes = 16 << 10;
  oomb::host_resource hr;
  oomb::device_resource dr;
  auto home = host_pool::contiguous(hr, page_bytes, 16);
  auto dev = device_pool::contiguous(dr, page_bytes, 16);
  auto other = device_pool::contiguous(dr, 2 * page_bytes, 4);
  auto ids = take(home, 4);
  std::vector<std::int32_t> slots(4);
  dev.acquire(4, slots.data());
  for (std::int32_t s : slots) OOMB_CUDA_CHECK(cudaMemset(dev.address(s), 0x5a, page_bytes), "test");
  for (std::int32_t id : ids) std::memset(home.address(id), 0x22, page_bytes);
  oomb::cuda_stream in;
  up_transfer up(dev, home, staging(4096, 2, 2));
  CHECK_THROWS_AS(up.enqueue(in, slots, std::vector<std::int32_t>{ids[0], ids[1], ids[2], 15}), oomb::invalid_argument);
  CHECK_THROWS_AS(up.enqueue(in, std::vector<std::int32_t>{slots[0], slots[0]}, std::vector<std::int32_t>{ids[0], ids[1]}),
                  oomb::invalid_argument);
  CHECK_THROWS_AS(up.enqueue(in, slots, std::vector<std::int32_t>{ids[0]}), oomb::invalid_argument);
  in.synchronize();
  std::vector<unsigned char> got(page_bytes);
  for (std::int32_t s : slots) {
    OOMB_CUDA_CHECK(cudaMemcpy(got.data(), dev.address(s), page_bytes, cudaMemcpyDeviceToHost), "test");
    CHECK(std::all_of(got.begin(), got.end(), [](unsigned char c) { return c == 0x5a; }));
  }
  CHECK_THROWS_AS(up_transfer(other, home), oomb::invalid_argument);  // block sizes differ
  CHECK_THROWS_AS(up_transfer(dev, home, staging(4000, 2, 2)), oomb::invalid_argument);
  CHECK_THROWS_AS(up_transfer(dev, home, staging(4096, 1, 2)), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(up.set_options(staging(8192, 2, 2)), doctest::Contains("fixed"), oomb::invalid_argument);
  // Another copier is refused; none (the options' default) keeps the one in use.
  const oomb::parallel_copier* copier = up.options().pageable.copier;
  CHECK_THROWS_WITH_AS(up.set_options(staging(4096, 2, 3)), doctest::Contains("fixed"), oomb::invalid_argument);
  oomb::cuda_transfer_options same;
  same.pageable.chunk_bytes = 4096;
  same.pageable.chunks = 2;
  up.set_options(same);
  CHECK(up.options().pageable.copier == copier);
  CHECK(up.staging_bytes() == 2 * 4096);
}

TEST_CASE("staged transfers: destroying a transfer waits for its batches queued behind a slow stream") {
  const std::size_t page_bytes = 64 << 10;
  const std::int32_t pages = 48;
  oomb::host_resource hr;
  oomb::device_resource dr;
  auto home = host_pool::contiguous(hr, page_bytes, pages);
  auto back = host_pool::contiguous(hr, page_bytes, pages);
  auto dev = device_pool::contiguous(dr, page_bytes, pages);
  auto ids = take(home, pages), out_ids = take(back, pages);
  std::vector<std::int32_t> slots(static_cast<std::size_t>(pages));
  dev.acquire(pages, slots.data());
  for (std::int32_t id : ids) fill_random(home.address(id), page_bytes, 500 + std::uint64_t(id));
  for (std::int32_t id : out_ids) std::memset(back.address(id), 0, page_bytes);
  oomb::cuda_stream s;
  {
    up_transfer up(dev, home, staging(64 << 10, 2, 2));
    down_transfer down(back, dev, staging(64 << 10, 2, 2));
    enqueue_delay(s.get(), 50'000'000);  // 50 ms: every chunk below is still queued at the '}'
    up.enqueue(s, slots, ids);
    down.enqueue(s, out_ids, slots);
    CHECK_FALSE(s.ready());
  }  // without the waits, the staging is freed under the queued DMA and host copies
  s.synchronize();
  for (std::int32_t i = 0; i < pages; ++i)
    CHECK(std::memcmp(home.address(ids[std::size_t(i)]), back.address(out_ids[std::size_t(i)]), page_bytes) == 0);
}

TEST_CASE("staged transfers: without a copier of their own, transfers share the process's, and six at once move every byte") {
  // The trainer's case: K/V, gradient and kept-output tiers, each with a transfer per direction, all
  // on the default options, enqueued from their own threads at once.
  oomb::cuda_transfer_options o;
  o.pageable.chunk_bytes = 256 << 10;  // several chunks per batch
  o.pageable.chunks = 2;
  const std::size_t pages[3] = {64 << 10, 256 << 10, std::size_t(48 << 10) + 16};
  std::vector<std::thread> tiers;
  std::vector<int> bad(3, -1);
  for (int t = 0; t < 3; ++t)
    tiers.emplace_back([&, t]() noexcept {
      try {
        oomb::host_resource hr;
        oomb::device_resource dr;
        const std::size_t page_bytes = pages[t];
        const std::int32_t n = quick() ? 40 : 160;
        auto home = host_pool::contiguous(hr, page_bytes, n);
        auto back = host_pool::contiguous(hr, page_bytes, n);
        auto dev = device_pool::contiguous(dr, page_bytes, n);
        auto ids = take(home, n), out_ids = take(back, n);
        std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
        dev.acquire(n, slots.data());
        std::shuffle(slots.begin(), slots.end(), std::mt19937(11u + unsigned(t)));
        for (std::int32_t id : ids) fill_random(home.address(id), page_bytes, 900 + 1000u * unsigned(t) + std::uint64_t(id));
        for (std::int32_t id : out_ids) std::memset(back.address(id), 0, page_bytes);
        oomb::cuda_stream in, out;
        up_transfer up(dev, home, o);
        down_transfer down(back, dev, o);
        for (int round = 0; round < 3; ++round) {  // the other tiers' batches overlap these
          in.wait(out.record());  // the slots are read by the last write-back
          up.enqueue(in, slots, ids);
          out.wait(in.record());
          down.enqueue(out, out_ids, slots);
        }
        out.synchronize();
        in.synchronize();
        int wrong = 0;
        for (std::int32_t i = 0; i < n; ++i)
          wrong += std::memcmp(home.address(ids[std::size_t(i)]), back.address(out_ids[std::size_t(i)]), page_bytes) != 0;
        bad[std::size_t(t)] = up.options().pageable.copier == &oomb::parallel_copier::shared() &&
                                      down.options().pageable.copier == &oomb::parallel_copier::shared()
                                  ? wrong
                                  : -2;
      } catch (...) {
        bad[std::size_t(t)] = -3;
      }
    });
  for (std::thread& t : tiers) t.join();
  for (int t = 0; t < 3; ++t)
    CHECK_MESSAGE(bad[std::size_t(t)] == 0, "tier ", t, ": ", bad[std::size_t(t)], " (-2: not the shared copier, -3: threw)");
  CHECK(oomb::parallel_copier::shared().threads() == oomb::parallel_copier::default_threads());
}
