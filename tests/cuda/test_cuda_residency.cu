// The residency scheduler on CUDA: event ordering with slow streams, K/V home exactly once, zero fill
// at first touch, bad input, the stress test (thousands of pages, random orders, every byte; the
// first three with pinned and with pageable homes), and
// the same under injected transfer and fill failures; destruction with copies in flight, a
// framework's raw stream through a temporary view, a limiting_adaptor as the far tier, far id
// reuse, pooled events.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/residency.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/cuda/vmm_resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "offload/fault_injection.hpp"

using namespace oomb_cuda_test;

static_assert(oomb::is_residency_backend_v<oomb::cuda_backend<>>);
static_assert(oomb::is_residency_backend_v<oomb::cuda_backend<oomb::vmm_device_resource>>);

namespace {

using far_pool = oomb::block_pool<oomb::pinned_resource>;
// Homes pinned (DMA and the copy kernel reach them) or pageable (staged through pinned memory).
using pinned_homes = oomb::pinned_resource;
using pageable_homes = oomb::host_resource;

// Word k (uint64) of page `page` before any bump: never zero.
std::uint64_t base_word(std::int32_t page, std::size_t k) {
  std::uint64_t x = (std::uint64_t(page) + 1) * 0x9e3779b97f4a7c15ull ^ (std::uint64_t(k) + 7) * 0xc2b2ae3d27d4eb4full;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return x | 1;
}

// The model of one far page: written from the host (base pattern) or not (a gradient page, zero at
// first touch), plus the sum of the bumps compute applied.
struct page_model {
  bool written = false;
  std::uint64_t bump = 0;
  std::uint64_t word(std::int32_t page, std::size_t k) const { return (written ? base_word(page, k) : 0) + bump; }
};

std::uint64_t model_checksum(const page_model& m, std::int32_t page, std::size_t bytes) {
  std::uint64_t h = 0x84222325cbf29ce4ull;
  for (std::size_t k = 0; k < bytes / 8; ++k) h = mix64(h, m.word(page, k) * (k + 1));
  return h;
}

template <class Far = pinned_homes>
struct gpu_tiers {
  using backend = oomb::cuda_backend<oomb::device_resource, oomb::cuda_stream, Far>;
  gpu_tiers(std::int32_t pages, std::int32_t slots, std::size_t page_bytes, oomb::cuda_transfer_options o)
      : far(oomb::block_pool<Far>::growing(home_memory, page_bytes, 256)),
        copy_in(oomb::cuda_stream::greatest_priority()),
        copy_out(oomb::cuda_stream::greatest_priority()),
        sched(far, device, slots, copy_in, copy_out, backend(o)),
        models(static_cast<std::size_t>(pages)) {
    ids.resize(static_cast<std::size_t>(pages));
    far.acquire(pages, ids.data());
  }
  std::size_t bytes() const { return far.block_bytes(); }
  // Writes the base pattern into the home of `page` (host; streams idle for it).
  void write_home(std::int32_t page) {
    auto* w = reinterpret_cast<std::uint64_t*>(far.address(page));
    for (std::size_t k = 0; k < bytes() / 8; ++k) w[k] = base_word(page, k);
    models[static_cast<std::size_t>(page)].written = true;
  }
  bool home_matches(std::int32_t page) const {
    const auto* w = reinterpret_cast<const std::uint64_t*>(far.address(page));
    const page_model& m = models[static_cast<std::size_t>(page)];
    for (std::size_t k = 0; k < bytes() / 8; ++k)
      if (w[k] != m.word(page, k)) return false;
    return true;
  }

  Far home_memory;
  oomb::device_resource device;
  oomb::block_pool<Far> far;
  oomb::cuda_stream copy_in, copy_out, compute;
  oomb::residency_scheduler<backend> sched;
  std::vector<std::int32_t> ids;
  std::vector<page_model> models;
};

// Per-step slot lists live in pinned memory that kernels read directly, kept until the end.
struct slot_lists {
  explicit slot_lists(std::size_t capacity) : cap(capacity) {
    p = static_cast<std::int32_t*>(pinned.allocate(capacity * 4, 256));
  }
  ~slot_lists() { pinned.deallocate(p, cap * 4, 256); }
  std::int32_t* put(const std::vector<std::int32_t>& v) {
    REQUIRE(used + v.size() <= cap);
    std::int32_t* at = p + used;
    std::copy(v.begin(), v.end(), at);
    used += v.size();
    return at;
  }
  oomb::pinned_resource pinned;
  std::int32_t* p = nullptr;
  std::size_t cap, used = 0;
};

}  // namespace

TEST_CASE_TEMPLATE("cuda residency: compute sees a slot only after its copy, even behind a slow copy stream", Far,
                   pinned_homes, pageable_homes) {
  gpu_tiers<Far> g(64, 16, 32 << 10, {});
  for (std::int32_t p : g.ids) g.write_home(p);
  g.sched.mark_written(g.ids);
  slot_lists lists(4096);
  device_buffer<std::uint64_t> sums(1024);
  std::vector<std::uint64_t> want;
  std::mt19937 rng(8);
  std::size_t at = 0;
  for (int round = 0; round < 8; ++round) {
    std::vector<std::int32_t> window(g.ids);
    std::shuffle(window.begin(), window.end(), rng);
    window.resize(16);
    enqueue_delay(g.copy_in.get(), 2'000'000);  // copies land 2 ms late
    g.sched.prefetch(window);
    const auto slots = g.sched.acquire(g.compute, window, oomb::access::read);
    checksum_pages_kernel<><<<16, 32, 0, g.compute.get()>>>(g.sched.near_pool().base(), g.bytes(), lists.put(slots),
                                                            16, sums.ptr + at);
    OOMB_CUDA_CHECK_LAUNCH("test");
    g.sched.release(g.compute, window);
    for (std::int32_t p : window) want.push_back(model_checksum(g.models[std::size_t(p)], p, g.bytes()));
    at += 16;
  }
  g.compute.synchronize();
  std::vector<std::uint64_t> got(at);
  OOMB_CUDA_CHECK(cudaMemcpy(got.data(), sums.ptr, at * 8, cudaMemcpyDeviceToHost), "test");
  CHECK(got == want);
  g.sched.drain();
}

TEST_CASE_TEMPLATE("cuda residency: K/V produced near reach home exactly once; gradients zero-filled at first touch", Far,
                   pinned_homes, pageable_homes) {
  gpu_tiers<Far> g(32, 32, 16 << 10, {});
  std::vector<std::int32_t> kv(g.ids.begin(), g.ids.begin() + 16), grad(g.ids.begin() + 16, g.ids.end());
  slot_lists lists(256);
  // K/V: overwrite access (no copy in), compute writes the base pattern + 5, written home once.
  const auto ks = g.sched.acquire(g.compute, kv, oomb::access::overwrite);
  for (std::size_t i = 0; i < kv.size(); ++i) {
    // fill the slot on the device with the page's base pattern (copied from a host image)
    std::vector<std::uint64_t> img(g.bytes() / 8);
    for (std::size_t k = 0; k < img.size(); ++k) img[k] = base_word(kv[i], k);
    OOMB_CUDA_CHECK(cudaMemcpyAsync(g.sched.near_pool().address(ks[i]), img.data(), g.bytes(), cudaMemcpyHostToDevice,
                                    g.compute.get()),
                    "test");
    g.compute.synchronize();
    g.models[std::size_t(kv[i])].written = true;
  }
  bump_pages_kernel<><<<16, 128, 0, g.compute.get()>>>(g.sched.near_pool().base(), g.bytes(), lists.put(ks), 16, 5);
  for (std::int32_t p : kv) g.models[std::size_t(p)].bump += 5;
  g.sched.release(g.compute, kv);
  CHECK(g.sched.write_back(kv) == 16);
  CHECK(g.sched.write_back(kv) == 0);  // clean now: never copied home again
  g.sched.evict(kv);                   // clean: costs nothing
  // Gradients: first touch zero-fills in the slot, compute adds, write-back lands home.
  for (int pass = 0; pass < 3; ++pass) {
    g.sched.prefetch(grad);
    const auto gs = g.sched.acquire(g.compute, grad, oomb::access::write);
    bump_pages_kernel<><<<16, 128, 0, g.compute.get()>>>(g.sched.near_pool().base(), g.bytes(), lists.put(gs), 16,
                                                         std::uint64_t(pass) + 1);
    for (std::int32_t p : grad) g.models[std::size_t(p)].bump += std::uint64_t(pass) + 1;
    g.sched.release(g.compute, grad);
    g.sched.evict(grad);  // dirty: written back first
  }
  g.sched.drain();
  const auto st = g.sched.stats();
  CHECK(st.zero_fills == 16);  // only the first pass
  CHECK(st.write_backs == 16 + 3 * 16);
  CHECK(st.bytes_to_far == (16 + 3 * 16) * g.bytes());
  int bad = 0;
  for (std::int32_t p : g.ids) bad += g.home_matches(p) ? 0 : 1;
  CHECK(bad == 0);
}

TEST_CASE("cuda residency: more pages than slots is out_of_memory before anything is enqueued") {
  gpu_tiers<> g(64, 8, 16 << 10, {});
  for (std::int32_t p : g.ids) g.write_home(p);
  g.sched.mark_written(g.ids);
  std::vector<std::int32_t> nine(g.ids.begin(), g.ids.begin() + 9);
  const auto before = g.sched.stats();
  try {
    g.sched.prefetch(nine);
    FAIL("9 pages fit 8 slots");
  } catch (const oomb::out_of_memory& e) {
    const std::string m = e.what();
    CHECK(m.find("9 pages") != std::string::npos);
    CHECK(m.find("8 slots") != std::string::npos);
  }
  const auto after = g.sched.stats();
  CHECK(after.misses == before.misses);
  CHECK(after.resident == 0);
  CHECK(after.bytes_to_near == 0);
  std::vector<std::int32_t> bad = {g.ids[0], 100000};
  CHECK_THROWS_AS(g.sched.prefetch(bad), oomb::invalid_argument);
  CHECK(g.sched.stats().resident == 0);
}

// The stress test: thousands of pages through a small near tier, random windows in random orders,
// reads and read-modify-writes (a checksum kernel per page, then a bump), random write-backs and
// evictions, slow copy and compute streams at random; every checksum and every byte checked.
TEST_CASE_TEMPLATE("cuda residency stress: prefetch, checksum, modify, write back thousands of pages", Far, pinned_homes,
                   pageable_homes) {
  constexpr bool pageable = std::is_same_v<Far, pageable_homes>;
  for (const bool kernel_path : {true, false}) {
    if (pageable && kernel_path) continue;  // pageable homes always cross by staging and copy engines
    oomb::cuda_transfer_options o;
    o.path = kernel_path ? oomb::transfer_path::automatic : oomb::transfer_path::memcpy_batch;
    o.kernel_min_pages = 4;
    o.kernel_blocks = 4;
    const std::int32_t pages = quick() ? 1200 : 3000, slots = 512;
    o.pageable.chunk_bytes = 256 << 10;  // 16 pages a chunk: most batches span several chunks
    o.pageable.chunks = 3;
    gpu_tiers<Far> g(pages, slots, 16 << 10, o);
    std::mt19937 rng(kernel_path ? 1234 : 4321);
    // Two thirds of the pages have home content (K/V), a third none yet (gradients: zero fill).
    std::vector<std::int32_t> written;
    for (std::int32_t p : g.ids)
      if (rng() % 3 != 0) {
        g.write_home(p);
        written.push_back(p);
      }
    g.sched.mark_written(written);
    const int steps = quick() ? 30 : 120;
    slot_lists lists(std::size_t(steps) * 400);
    device_buffer<std::uint64_t> sums(std::size_t(steps) * 400);
    std::vector<std::uint64_t> want;
    std::size_t at = 0;
    std::uint64_t touched = 0;
    for (int step = 0; step < steps; ++step) {
      const std::size_t w = 1 + rng() % 400;
      std::vector<std::int32_t> window(g.ids);
      std::shuffle(window.begin(), window.end(), rng);
      window.resize(w);
      if (rng() % 4 == 0) enqueue_delay(g.copy_in.get(), 300'000);
      if (rng() % 5 != 0) g.sched.prefetch(window);  // sometimes not: acquire brings them near
      const bool modify = rng() % 2 == 0;
      const auto sl = g.sched.acquire(g.compute, window, modify ? oomb::access::write : oomb::access::read);
      const auto n = static_cast<int>(w);
      std::int32_t* dev_slots = lists.put(sl);
      checksum_pages_kernel<><<<n, 32, 0, g.compute.get()>>>(g.sched.near_pool().base(), g.bytes(), dev_slots, n,
                                                             sums.ptr + at);
      OOMB_CUDA_CHECK_LAUNCH("stress checksum");
      for (std::int32_t p : window) want.push_back(model_checksum(g.models[std::size_t(p)], p, g.bytes()));
      at += w;
      if (modify) {
        const std::uint64_t delta = 1 + rng() % 1000;
        bump_pages_kernel<><<<n, 128, 0, g.compute.get()>>>(g.sched.near_pool().base(), g.bytes(), dev_slots, n, delta);
        OOMB_CUDA_CHECK_LAUNCH("stress bump");
        for (std::int32_t p : window) g.models[std::size_t(p)].bump += delta;
      }
      if (rng() % 4 == 0) enqueue_delay(g.compute.get(), 300'000);  // slow readers and writers
      g.sched.release(g.compute, window);
      touched += w;
      const int action = static_cast<int>(rng() % 6);
      if (action == 0) {
        std::vector<std::int32_t> some(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(w / 2));
        g.sched.write_back(some);
      } else if (action == 1) {
        std::vector<std::int32_t> some(window.begin(), window.begin() + static_cast<std::ptrdiff_t>((w + 2) / 3));
        g.sched.evict(some);
      }
    }
    g.sched.flush();
    g.sched.drain();
    g.compute.synchronize();
    std::vector<std::uint64_t> got(at);
    OOMB_CUDA_CHECK(cudaMemcpy(got.data(), sums.ptr, at * 8, cudaMemcpyDeviceToHost), "test");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < at; ++i) wrong += got[i] != want[i];
    CHECK_MESSAGE(wrong == 0, wrong, " of ", at, " checksums wrong (kernel path ", kernel_path, ")");
    int bad = 0;
    for (std::int32_t p : g.ids) bad += g.home_matches(p) ? 0 : 1;
    CHECK_MESSAGE(bad == 0, bad, " of ", pages, " homes wrong (kernel path ", kernel_path, ")");
    const auto st = g.sched.stats();
    CHECK(touched > (quick() ? 4000u : 20000u));
    CHECK(st.evictions > 0);
    CHECK(st.write_backs > 0);
    CHECK(st.zero_fills > 0);
    if (kernel_path) CHECK(g.sched.backend().kernel_batches() > 0);
    else CHECK(g.sched.backend().kernel_batches() == 0);
    CHECK(g.sched.backend().copy_engine_batches() > 0);
    MESSAGE("stress (", std::string(pageable ? "pageable homes" : kernel_path ? "automatic" : "memcpy_batch"), "): ", touched, " page touches, ", st.misses,
            " misses, ", st.evictions, " evictions, ", st.write_backs, " write-backs, ", st.zero_fills,
            " zero fills, kernel batches ", g.sched.backend().kernel_batches(), ", copy-engine batches ",
            g.sched.backend().copy_engine_batches());
  }
}

namespace {

// cuda_backend whose transfers and zero fills throw when the plan says; a failing transfer first
// enqueues half its batch (a reused slot partly overwritten: the worst case for the rollback).
struct failing_cuda_backend : oomb::cuda_backend<> {
  oomb_test::fault_plan* plan = nullptr;
  failing_cuda_backend(oomb_test::fault_plan& p, oomb::cuda_transfer_options o) : oomb::cuda_backend<>(o), plan(&p) {}

  void zero_fill(stream_type& s, void* dst, std::size_t bytes) const {
    if (plan->fails(plan->fills, plan->fail_fill)) throw oomb_test::injected_fault("injected: zero fill");
    oomb::cuda_backend<>::zero_fill(s, dst, bytes);
  }
  template <class D, class S>
  oomb::transfer_report transfer(stream_type& s, oomb::block_pool<D>& dst, oomb::id_span d, const oomb::block_pool<S>& src,
                                 oomb::id_span si) {
    if (plan->fails(plan->transfers, plan->fail_transfer)) {
      const std::size_t half = (d.size() + 1) / 2;
      oomb::cuda_backend<>::transfer(s, dst, oomb::id_span(d.data(), half), src, oomb::id_span(si.data(), half));
      throw oomb_test::injected_fault("injected: transfer");
    }
    return oomb::cuda_backend<>::transfer(s, dst, d, src, si);
  }
};
static_assert(oomb::is_residency_backend_v<failing_cuda_backend>);

}  // namespace

// The stress loop under faults: some steps arm a failure of the next transfer or zero fill; a step
// that throws must leave every page it named where it was (and nothing pinned), and every
// checksum and home byte at the end must still match the model.
TEST_CASE("cuda residency faults: injected transfer and fill failures never serve another page's bytes") {
  for (const bool kernel_path : {true, false}) {
    CAPTURE(kernel_path);
    oomb::cuda_transfer_options o;
    o.path = kernel_path ? oomb::transfer_path::automatic : oomb::transfer_path::memcpy_batch;
    o.kernel_min_pages = 4;
    o.kernel_blocks = 4;
    const std::int32_t pages = 600, slots = 128;
    const std::size_t page_bytes = 4096;
    oomb_test::fault_plan plan;
    oomb::pinned_resource pinned;
    oomb::device_resource device;
    far_pool far = far_pool::growing(pinned, page_bytes, 256);
    oomb::cuda_stream copy_in(oomb::cuda_stream::greatest_priority()), copy_out(oomb::cuda_stream::greatest_priority()),
        compute;
    oomb::residency_scheduler<failing_cuda_backend> sched(far, device, slots, copy_in, copy_out,
                                                          failing_cuda_backend(plan, o));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
    far.acquire(pages, ids.data());
    std::vector<page_model> models(static_cast<std::size_t>(pages));
    std::mt19937 rng(kernel_path ? 77 : 78);
    std::vector<std::int32_t> written;
    for (std::int32_t p : ids)
      if (rng() % 3 != 0) {
        auto* w = reinterpret_cast<std::uint64_t*>(far.address(p));
        for (std::size_t k = 0; k < page_bytes / 8; ++k) w[k] = base_word(p, k);
        models[std::size_t(p)].written = true;
        written.push_back(p);
      }
    sched.mark_written(written);
    const int steps = 80;
    slot_lists lists(std::size_t(steps) * 100);
    device_buffer<std::uint64_t> sums(std::size_t(steps) * 100);
    std::vector<std::uint64_t> want;
    std::size_t at = 0;
    int faults = 0;
    for (int step = 0; step < steps; ++step) {
      plan.disarm();
      if (rng() % 3 == 0) (rng() % 2 ? plan.next_transfer() : plan.next_fill());
      const std::size_t w = 1 + rng() % 100;
      std::vector<std::int32_t> window(ids);
      std::shuffle(window.begin(), window.end(), rng);
      window.resize(w);
      if (rng() % 4 == 0) enqueue_delay(copy_in.get(), 200'000);
      std::vector<std::int32_t> before;
      for (std::int32_t p : window) before.push_back(sched.slot_of(p));
      const bool modify = rng() % 2 == 0;
      std::vector<std::int32_t> sl;
      try {
        if (rng() % 2) sched.prefetch(window);
        sl = sched.acquire(compute, window, modify ? oomb::access::write : oomb::access::read);
      } catch (const oomb_test::injected_fault&) {
        ++faults;
        for (std::size_t i = 0; i < w; ++i) CHECK(sched.slot_of(window[i]) == before[i]);
        CHECK(sched.stats().pinned == 0);
        continue;
      }
      const auto n = static_cast<int>(w);
      std::int32_t* dev_slots = lists.put(sl);
      checksum_pages_kernel<><<<n, 32, 0, compute.get()>>>(sched.near_pool().base(), page_bytes, dev_slots, n, sums.ptr + at);
      OOMB_CUDA_CHECK_LAUNCH("faults checksum");
      for (std::int32_t p : window) want.push_back(model_checksum(models[std::size_t(p)], p, page_bytes));
      at += w;
      if (modify) {
        const std::uint64_t delta = 1 + rng() % 1000;
        bump_pages_kernel<><<<n, 128, 0, compute.get()>>>(sched.near_pool().base(), page_bytes, dev_slots, n, delta);
        OOMB_CUDA_CHECK_LAUNCH("faults bump");
        for (std::int32_t p : window) models[std::size_t(p)].bump += delta;
      }
      sched.release(compute, window);
      if (rng() % 3 == 0) {
        std::vector<std::int32_t> some(window.begin(), window.begin() + static_cast<std::ptrdiff_t>((w + 1) / 2));
        try {
          rng() % 2 ? (void)sched.write_back(some) : sched.evict(some);
        } catch (const oomb_test::injected_fault&) {
          ++faults;
        }
      }
    }
    plan.disarm();
    sched.flush();
    sched.drain();
    compute.synchronize();
    std::vector<std::uint64_t> got(at);
    OOMB_CUDA_CHECK(cudaMemcpy(got.data(), sums.ptr, at * 8, cudaMemcpyDeviceToHost), "test");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < at; ++i) wrong += got[i] != want[i];
    CHECK_MESSAGE(wrong == 0, wrong, " of ", at, " checksums wrong");
    int bad = 0;
    for (std::int32_t p : ids) {
      const auto* h = reinterpret_cast<const std::uint64_t*>(far.address(p));
      for (std::size_t k = 0; k < page_bytes / 8; ++k)
        if (h[k] != models[std::size_t(p)].word(p, k)) {
          ++bad;
          break;
        }
    }
    CHECK_MESSAGE(bad == 0, bad, " of ", pages, " homes wrong");
    CHECK(faults >= 5);
    MESSAGE("faults (kernel path ", kernel_path, "): ", faults, " injected failures met, ", at, " checksums");
  }
}

TEST_CASE_TEMPLATE("cuda residency lifetime: destroying a scheduler waits for copies still queued behind a slow stream", Far,
                   pinned_homes, pageable_homes) {
  Far home_memory;
  oomb::device_resource device;
  auto far = oomb::block_pool<Far>::contiguous(home_memory, 64 << 10, 64);
  std::vector<std::int32_t> ids(64);
  far.acquire(64, ids.data());
  oomb::cuda_stream copy_in, copy_out, compute;
  {
    oomb::residency_scheduler<oomb::cuda_backend<oomb::device_resource, oomb::cuda_stream, Far>> sched(far, device, 32,
                                                                                                       copy_in, copy_out);
    sched.mark_written(ids);
    enqueue_delay(copy_in.get(), 50'000'000);  // 50 ms: the copies below are still queued at the '}'
    sched.prefetch(std::vector<std::int32_t>(ids.begin(), ids.begin() + 32));
    CHECK_FALSE(copy_in.ready());
  }  // without the wait, cudaFree of the near pool (and the staging) races the queued copies
  CHECK(copy_in.ready());
}

TEST_CASE("cuda residency streams: a framework's raw cudaStream_t through a temporary view; pooled events") {
  oomb::pinned_resource pinned;
  oomb::device_resource device;
  far_pool far = far_pool::contiguous(pinned, 16 << 10, 64);
  std::vector<std::int32_t> ids(64);
  far.acquire(64, ids.data());
  oomb::cuda_stream copy_in, copy_out;
  cudaStream_t raw = nullptr;  // the framework's stream: oomb never owns it
  OOMB_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), "test");
  {
    oomb::cuda_residency_scheduler sched(far, device, 16, copy_in, copy_out);
    std::size_t created_after_warmup = 0;
    for (int round = 0; round < 40; ++round) {
      const std::int32_t first = (round * 8) % 64;
      std::vector<std::int32_t> w(ids.begin() + first, ids.begin() + first + 8);
      const auto s = sched.acquire(oomb::cuda_stream_view(raw), w, oomb::access::write);
      CHECK(s.size() == 8);
      sched.release(oomb::cuda_stream_view(raw), w);
      sched.write_back(w);
      if (round == 9) {
        sched.drain();
        OOMB_CUDA_CHECK(cudaStreamSynchronize(raw), "test");
        created_after_warmup = sched.events_created();
      }
      if (round % 10 == 9) sched.drain();
    }
    sched.drain();
    OOMB_CUDA_CHECK(cudaStreamSynchronize(raw), "test");
    // After the warm-up, events come back to the pool once pruned: far fewer than one per record.
    CHECK(sched.events_created() < created_after_warmup + 20);
    MESSAGE("events created: " << sched.events_created() << " (" << created_after_warmup << " after 10 rounds)");
  }
  OOMB_CUDA_CHECK(cudaStreamDestroy(raw), "test");
}

TEST_CASE("cuda residency far tier: a limiting_adaptor over pinned memory is the home; reused ids start empty") {
  oomb::pinned_resource pinned;
  using limited = oomb::limiting_adaptor<oomb::pinned_resource>;
  limited cap(pinned, 8 * 4096);
  oomb::device_resource device;
  auto far = oomb::block_pool<limited>::growing(cap, 4096, 4);
  oomb::cuda_stream copy_in, copy_out, compute;
  oomb::residency_scheduler<oomb::cuda_backend<oomb::device_resource, oomb::cuda_stream, limited>> sched(
      far, device, 4, copy_in, copy_out);
  std::vector<std::int32_t> ids(8);
  far.acquire(8, ids.data());
  CHECK_THROWS_AS(far.acquire(), oomb::out_of_memory);  // the limit holds the far tier
  for (std::int32_t p : ids) {
    auto* w = reinterpret_cast<std::uint64_t*>(far.address(p));
    for (std::size_t k = 0; k < 512; ++k) w[k] = base_word(p, k);
  }
  sched.mark_written(ids);
  sched.prefetch({ids[0], ids[1]});
  far.release(ids[1]);
  REQUIRE(far.acquire() == ids[1]);  // LIFO: the same id, a new (empty) page
  slot_lists lists(8);
  device_buffer<std::uint64_t> sums(2);
  const auto s = sched.acquire(compute, {ids[0], ids[1]}, oomb::access::read);
  checksum_pages_kernel<><<<2, 32, 0, compute.get()>>>(sched.near_pool().base(), 4096, lists.put(s), 2, sums.ptr);
  OOMB_CUDA_CHECK_LAUNCH("far tier checksum");
  sched.release(compute, {ids[0], ids[1]});
  sched.drain();
  compute.synchronize();
  std::uint64_t got[2];
  OOMB_CUDA_CHECK(cudaMemcpy(got, sums.ptr, 16, cudaMemcpyDeviceToHost), "test");
  page_model full, empty;
  full.written = true;
  CHECK(got[0] == model_checksum(full, ids[0], 4096));
  CHECK(got[1] == model_checksum(empty, ids[1], 4096));  // zero-filled, not the old page's bytes
}
