// Batched page transfers between pinned and device pools: every path, every byte, bad input.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/cuda/page_copy_kernel.cuh"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/vmm_resource.hpp"
#include "oomb/memory/host_resource.hpp"

using namespace oomb_cuda_test;
using pinned_pool = oomb::block_pool<oomb::pinned_resource>;
using device_pool = oomb::block_pool<oomb::device_resource>;
using vmm_pool = oomb::block_pool<oomb::vmm_device_resource>;

static_assert(oomb::cuda_transferable_v<oomb::device_resource, oomb::pinned_resource>);
static_assert(oomb::cuda_transferable_v<oomb::pinned_resource, oomb::vmm_device_resource>);
static_assert(oomb::cuda_transferable_v<oomb::device_resource, oomb::device_resource>);
static_assert(!oomb::cuda_transferable_v<oomb::device_resource, oomb::host_resource>);
static_assert(!oomb::cuda_transferable_v<oomb::host_resource, oomb::device_resource>);

namespace {

std::vector<std::int32_t> take(pinned_pool& p, std::int32_t n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  p.acquire(n, ids.data());
  return ids;
}

// Fills the listed host pages with seeded random bytes.
void fill_pages(pinned_pool& p, const std::vector<std::int32_t>& ids, std::uint64_t seed) {
  for (std::int32_t id : ids) fill_random(p.address(id), p.block_bytes(), seed * 1000003u + std::uint64_t(id));
}

bool same_page(const pinned_pool& a, std::int32_t ia, const pinned_pool& b, std::int32_t ib) {
  return std::memcmp(a.address(ia), b.address(ib), a.block_bytes()) == 0;
}

// Host -> device (random slots, random order) -> host (other pages), by `path`, checked byte by byte.
template <class DevicePool>
void round_trip(DevicePool& dev, std::size_t page_bytes, oomb::transfer_path path, std::uint32_t seed,
                std::int32_t pages, oomb::cuda_transfer_options opts = {}) {
  oomb::pinned_resource pr;
  auto home = pinned_pool::growing(pr, page_bytes, 64);
  auto back = pinned_pool::growing(pr, page_bytes, 32);
  std::mt19937 rng(seed);
  // Scatter the homes: take extra pages and keep a random subset.
  auto all = take(home, pages * 2);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int32_t> src(all.begin(), all.begin() + pages);
  fill_pages(home, src, seed);
  std::vector<std::int32_t> slots(static_cast<std::size_t>(pages));
  dev.acquire(pages, slots.data());
  std::shuffle(slots.begin(), slots.end(), rng);
  auto dst = take(back, pages);
  std::shuffle(dst.begin(), dst.end(), rng);
  for (std::int32_t id : dst) std::memset(back.address(id), 0, page_bytes);

  oomb::cuda_stream in, out;
  using D = typename DevicePool::resource_type;
  oomb::cuda_page_transfer<D, oomb::pinned_resource> up(dev, home, opts);
  oomb::cuda_page_transfer<oomb::pinned_resource, D> down(back, dev, opts);
  const auto r1 = up.enqueue(in, slots, src, path);
  CHECK(r1.pages == std::size_t(pages));
  CHECK(r1.bytes == std::size_t(pages) * page_bytes);
  if (path != oomb::transfer_path::automatic)
    CHECK(r1.path == (path == oomb::transfer_path::kernel && page_bytes % 16 != 0 ? oomb::transfer_path::memcpy_batch : path));
  out.wait(in.record());
  const auto r2 = down.enqueue(out, dst, slots, path);
  CHECK(r2.pages == std::size_t(pages));
  out.synchronize();
  int bad = 0;
  for (std::int32_t i = 0; i < pages; ++i) bad += same_page(home, src[std::size_t(i)], back, dst[std::size_t(i)]) ? 0 : 1;
  CHECK_MESSAGE(bad == 0, "path ", oomb::to_string(path), ", ", page_bytes, "-byte pages, ", pages, " pages");
  for (std::int32_t s : slots) dev.release(s);
}

}  // namespace

TEST_CASE("page transfers: every path moves every byte, scattered pages, random orders") {
  oomb::device_resource dr;
  oomb::vmm_device_resource vr;
  const oomb::transfer_path paths[] = {oomb::transfer_path::memcpy_batch, oomb::transfer_path::kernel,
                                       oomb::transfer_path::per_page, oomb::transfer_path::automatic};
  std::uint32_t seed = 1;
  for (std::size_t page_bytes : {std::size_t(32) << 10, std::size_t(64) << 10, std::size_t(48 << 10) + 16, std::size_t(4004)}) {
    auto dev = device_pool::contiguous(dr, page_bytes, 700);
    auto vmm = vmm_pool::growable(vr, page_bytes, 100, 4096);
    for (oomb::transfer_path p : paths) {
      round_trip(dev, page_bytes, p, seed++, quick() ? 97 : 611);
      round_trip(vmm, page_bytes, p, seed++, quick() ? 61 : 333);
    }
  }
}

TEST_CASE("page transfers: kernel batches larger than a staging slot, more launches than slots") {
  oomb::device_resource dr;
  auto dev = device_pool::contiguous(dr, 16 << 10, 2000);
  oomb::cuda_transfer_options o;
  o.pages_per_launch = 37;  // 1500 pages: 41 launches through 2 slots (back-pressure path)
  o.staging_slots = 2;
  o.kernel_blocks = 3;
  round_trip(dev, 16 << 10, oomb::transfer_path::kernel, 99, quick() ? 300 : 1500, o);
  o.kernel_blocks = 132;
  o.pages_per_launch = 8192;
  round_trip(dev, 16 << 10, oomb::transfer_path::kernel, 98, quick() ? 400 : 1999, o);
}

TEST_CASE("page transfers: automatic picks copy engines for long runs and small batches, the kernel otherwise") {
  oomb::device_resource dr;
  oomb::pinned_resource pr;
  auto dev = device_pool::contiguous(dr, 64 << 10, 256);
  auto home = pinned_pool::contiguous(pr, 64 << 10, 512);
  oomb::cuda_stream s;
  oomb::cuda_transfer_options o;  // explicit thresholds: the test does not follow the tuned defaults
  o.kernel_run_bytes = 64 << 10;
  o.kernel_min_pages = 16;
  oomb::cuda_page_transfer<oomb::device_resource, oomb::pinned_resource> t(dev, home, o);
  std::vector<std::int32_t> slots(256), far(512);
  dev.acquire(256, slots.data());
  home.acquire(512, far.data());
  fill_pages(home, far, 5);
  std::vector<std::int32_t> run(far.begin(), far.begin() + 256);  // 256 adjacent pages: one copy
  auto r = t.enqueue(s, slots, run);
  CHECK(r.copies == 1);
  CHECK(r.path == oomb::transfer_path::memcpy_batch);
  std::vector<std::int32_t> scattered;
  for (std::size_t i = 0; i < 256; ++i) scattered.push_back(far[2 * i]);  // every other page
  r = t.enqueue(s, slots, scattered);  // 64 KiB runs: not below kernel_run_bytes
  CHECK(r.copies == 256);
  CHECK(r.path == oomb::transfer_path::memcpy_batch);
  o.kernel_run_bytes = 128 << 10;  // now they are short runs: the kernel from 16 pages
  t.set_options(o);
  r = t.enqueue(s, slots, scattered);
  CHECK(r.path == oomb::transfer_path::kernel);
  r = t.enqueue(s, oomb::id_span(slots.data(), 16), oomb::id_span(scattered.data(), 16));
  CHECK(r.path == oomb::transfer_path::kernel);
  r = t.enqueue(s, oomb::id_span(slots.data(), 15), oomb::id_span(scattered.data(), 15));
  CHECK(r.path == oomb::transfer_path::memcpy_batch);
  r = t.enqueue(s, oomb::id_span(slots.data(), 16), oomb::id_span(run.data(), 16));  // one 1 MiB run
  CHECK(r.path == oomb::transfer_path::memcpy_batch);
  s.synchronize();
  // Device to device never takes the kernel.
  auto dev2 = device_pool::contiguous(dr, 64 << 10, 256);
  std::vector<std::int32_t> slots2(256);
  dev2.acquire(256, slots2.data());
  oomb::cuda_page_transfer<oomb::device_resource, oomb::device_resource> d2d(dev2, dev);
  std::vector<std::int32_t> rev(slots.rbegin(), slots.rend());
  r = d2d.enqueue(s, slots2, rev, oomb::transfer_path::kernel);
  CHECK(r.path == oomb::transfer_path::memcpy_batch);
  s.synchronize();
}

TEST_CASE("page transfers: bad input throws before anything is enqueued") {
  oomb::device_resource dr;
  oomb::pinned_resource pr;
  auto dev = device_pool::contiguous(dr, 32 << 10, 64);
  auto home = pinned_pool::growing(pr, 32 << 10, 16);
  auto other = pinned_pool::growing(pr, 16 << 10, 16);
  using T = oomb::cuda_page_transfer<oomb::device_resource, oomb::pinned_resource>;
  CHECK_THROWS_AS(T(dev, other), oomb::invalid_argument);  // block sizes differ
  oomb::page_format f{oomb::page_shape{16, 2, 64, oomb::kv_layout::head_major}, 2};
  oomb::page_format g = f;
  g.shape.head_dim = 128;
  CHECK_THROWS_AS(T(dev, f, home, g), oomb::invalid_argument);  // page formats differ
  oomb::cuda_transfer_options bad;
  bad.kernel_blocks = 0;
  CHECK_THROWS_AS(T(dev, home, bad), oomb::invalid_argument);

  T t(dev, f, home, f);
  std::vector<std::int32_t> slots(8), far(8);
  dev.acquire(8, slots.data());
  home.acquire(8, far.data());
  fill_pages(home, far, 11);
  oomb::cuda_stream s;
  // Poison the slots, then try bad batches; the slots must stay poisoned.
  OOMB_CUDA_CHECK(cudaMemset(dev.base(), 0x5a, 64 * (32 << 10)), "test");
  const auto expect_untouched = [&] {
    s.synchronize();
    std::vector<unsigned char> h(32 << 10);
    bool ok = true;
    for (std::int32_t id : slots) {
      OOMB_CUDA_CHECK(cudaMemcpy(h.data(), dev.address(id), h.size(), cudaMemcpyDeviceToHost), "test");
      ok &= std::all_of(h.begin(), h.end(), [](unsigned char c) { return c == 0x5a; });
    }
    return ok;
  };
  for (oomb::transfer_path p : {oomb::transfer_path::memcpy_batch, oomb::transfer_path::kernel}) {
    std::vector<std::int32_t> seven(far.begin(), far.begin() + 7);
    CHECK_THROWS_AS(t.enqueue(s, slots, seven, p), oomb::invalid_argument);  // counts differ
    auto unowned = far;
    unowned[5] = 12;  // reserved by the pool's slab but never acquired
    CHECK_THROWS_AS(t.enqueue(s, slots, unowned, p), oomb::invalid_argument);
    auto twice = slots;
    twice[6] = twice[2];
    try {
      t.enqueue(s, twice, far, p);
      FAIL("a destination written twice was accepted");
    } catch (const oomb::invalid_argument& e) {
      CHECK(std::string(e.what()).find("appears twice") != std::string::npos);
    }
    auto negative = slots;
    negative[0] = -1;
    CHECK_THROWS_AS(t.enqueue(s, negative, far, p), oomb::invalid_argument);
    CHECK(expect_untouched());
  }
  const auto r = t.enqueue(s, slots, far, oomb::transfer_path::kernel);  // the transfer still works
  CHECK(r.pages == 8);
  CHECK_FALSE(expect_untouched());
}

TEST_CASE("page_copy_engine: bad lists throw before anything is enqueued") {
  oomb::page_copy_engine e(16, 2);
  oomb::cuda_stream s;
  device_buffer<unsigned char> a(1 << 16), b(1 << 16);
  oomb::copy_op ok{a.ptr, b.ptr, 4096};
  oomb::copy_op ragged{a.ptr + 4096, b.ptr + 4096, 1000};
  oomb::copy_op misaligned{a.ptr + 8, b.ptr, 4096};
  oomb::copy_op two[] = {ok, ragged};
  CHECK_THROWS_AS(e.enqueue(two, 2, 4096, 4, s.get()), oomb::invalid_argument);
  CHECK_THROWS_AS(e.enqueue(&misaligned, 1, 4096, 4, s.get()), oomb::invalid_argument);
  CHECK_THROWS_AS(e.enqueue(&ok, 1, 4095, 4, s.get()), oomb::invalid_argument);
  CHECK_THROWS_AS(e.enqueue(&ok, 1, 4096, 0, s.get()), oomb::invalid_argument);
  e.enqueue(&ok, 1, 1024, 2, s.get());  // one 4 KiB copy as four 1 KiB pages
  s.synchronize();
}

TEST_CASE("page_copy_engine: a launch over 64 GiB is refused before anything is enqueued") {
  // 65536 pages of 1 MiB in one launch: past the kernel's 32-bit indices. The addresses are never
  // touched; stream capture records what the call enqueued (the old check ran after the upload).
  oomb::page_copy_engine e(65536, 1);
  oomb::cuda_stream s;
  const std::size_t page = std::size_t(1) << 20;
  oomb::copy_op huge{reinterpret_cast<void*>(std::uintptr_t(1) << 40), reinterpret_cast<const void*>(std::uintptr_t(1) << 41),
                     page * 65536};
  OOMB_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeRelaxed), "test: capture");
  CHECK_THROWS_WITH_AS(e.enqueue(&huge, 1, page, 8, s.get()), doctest::Contains("at most 64 GiB per launch"),
                       oomb::invalid_argument);
  cudaGraph_t graph = nullptr;
  OOMB_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph), "test: end capture");
  std::size_t nodes = 1;
  OOMB_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes), "test: graph nodes");
  CHECK(nodes == 0);
  OOMB_CUDA_CHECK(cudaGraphDestroy(graph), "test: graph");
}

TEST_CASE("page_copy_engine: more launches in flight than slots never block the host; every byte lands") {
  // The stream is held behind a delay; a batch of 7 launches through 2 slots must return at once
  // (the old ring waited on the host for slot 0's kernel, i.e. for the delay) and copy correctly.
  const std::size_t page = 4096, pages = 100;
  oomb::page_copy_engine e(16, 2);
  oomb::cuda_stream s;
  device_buffer<unsigned char> src(page * pages), dst(page * pages);
  std::vector<unsigned char> host(page * pages), back(page * pages);
  fill_random(host.data(), host.size(), 2024);
  OOMB_CUDA_CHECK(cudaMemcpy(src.ptr, host.data(), host.size(), cudaMemcpyHostToDevice), "test");
  OOMB_CUDA_CHECK(cudaMemset(dst.ptr, 0, page * pages), "test");
  std::vector<oomb::copy_op> ops;  // page i of dst <- page pages-1-i of src
  for (std::size_t i = 0; i < pages; ++i) ops.push_back({dst.ptr + i * page, src.ptr + (pages - 1 - i) * page, page});
  enqueue_delay(s.get(), 200'000'000);  // 200 ms
  const oomb::cuda_event delayed = s.record();
  e.enqueue(ops.data(), ops.size(), page, 4, s.get());
  CHECK_FALSE(delayed.ready());
  CHECK(e.slots() >= 7);
  e.enqueue(ops.data(), 3, page, 4, s.get());  // and again, still in flight: more slots
  CHECK_FALSE(delayed.ready());
  s.synchronize();
  OOMB_CUDA_CHECK(cudaMemcpy(back.data(), dst.ptr, back.size(), cudaMemcpyDeviceToHost), "test");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < pages; ++i)
    bad += std::memcmp(back.data() + i * page, host.data() + (pages - 1 - i) * page, page) != 0;
  CHECK(bad == 0);
  // Slots whose kernels completed are reused: the ring does not grow once the stream is idle.
  const std::size_t slots = e.slots();
  for (int k = 0; k < 3; ++k) {
    e.enqueue(ops.data(), ops.size(), page, 4, s.get());
    s.synchronize();
  }
  CHECK(e.slots() == slots);
}

TEST_CASE("kernels in oomb's headers live in a namespace keyed by the target architectures") {
#define OOMB_TEST_STR2(x) #x
#define OOMB_TEST_STR(x) OOMB_TEST_STR2(x)
  const std::string name = OOMB_TEST_STR(OOMB_KERNEL_ARCH_NAMESPACE);
  CHECK(name.rfind("sm_", 0) == 0);
  CHECK(name != "sm_host");  // nvcc says which architectures it compiles for (sm_900 for 90a)
}
