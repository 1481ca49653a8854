// staging_ring alone: a busy slot is never handed out, the ring grows by the missing slots (all or
// nothing), readers see their own staging while later slots are filled, and destruction waits.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream.hpp"

using namespace oomb_cuda_test;

namespace {

// A slot that counts the live ones, so a failed growth that leaked or kept a slot shows.
struct counted_slot {
  int id = -1;
  int* live = nullptr;
  counted_slot(int i, int* l) : id(i), live(l) { ++*live; }
  counted_slot(counted_slot&& o) noexcept : id(o.id), live(std::exchange(o.live, nullptr)) {}
  counted_slot& operator=(counted_slot&&) = delete;
  ~counted_slot() {
    if (live != nullptr) --*live;
  }
};

// Makes slots numbered in order; throws instead of making slot `fail_at` (-1: never).
struct slot_maker {
  int* live;
  int made = 0, fail_at = -1;
  counted_slot operator()() {
    if (made == fail_at) throw std::runtime_error("slot_maker: refused");
    return counted_slot(made++, live);
  }
};

}  // namespace

TEST_CASE("staging_ring: a busy slot is not handed out; the ring grows by what is missing, then reuses") {
  oomb::cuda_stream stream;
  const oomb::cuda_stream_view s = stream.view();
  int live = 0;
  slot_maker make{&live};
  {
    oomb::staging_ring<counted_slot> ring;
    CHECK(ring.grow(2, make) == 0);
    CHECK(ring.size() == 2);
    CHECK(live == 2);

    // Under compute-sanitizer (quick) a launch returns only once it ran: nothing stays in flight.
    const bool in_flight = !quick();
    if (in_flight) enqueue_delay(s.get(), 2'000'000'000ull);  // far longer than the takes below
    const std::size_t a = ring.take(1, make).front();
    ring.record(a, s);
    const std::size_t b = ring.take(1, make).front();
    ring.record(b, s);
    const std::vector<std::size_t> grown = ring.take(2, make);
    for (std::size_t i : grown) ring.record(i, s);
    CHECK(a == 0);
    if (in_flight) {
      CHECK(cudaStreamQuery(s.get()) == cudaErrorNotReady);  // the checks below saw busy slots
      CHECK(b == 1);                                         // not the busy slot 0
      CHECK(grown == std::vector<std::size_t>{2, 3});        // both busy: two new slots
      CHECK(ring.size() == 4);
      CHECK(make.made == 4);
      CHECK_FALSE(ring.event(a).ready());
    }
    OOMB_CUDA_CHECK(cudaStreamSynchronize(s.get()), "test");

    // All done: every slot comes back, in ring order from where the last take ended, no growth.
    const std::size_t size = ring.size();
    const std::vector<std::size_t> all = ring.take(size, make);
    CHECK(all.size() == size);
    CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == size);
    CHECK(all.front() == (grown.back() + 1) % size);
    CHECK(ring.size() == size);
    CHECK(live == static_cast<int>(size));
    for (std::size_t i : all) CHECK(ring[i].id == static_cast<int>(i));  // slots stay where they were made
    CHECK_THROWS_AS(ring.record(size, s), oomb::invalid_argument);
  }
  CHECK(live == 0);
}

TEST_CASE("staging_ring: growth is all or nothing; a refused take leaves the ring as it was") {
  oomb::cuda_stream stream;
  const oomb::cuda_stream_view s = stream.view();
  int live = 0;
  slot_maker make{&live};
  oomb::staging_ring<counted_slot> ring;
  ring.grow(2, make);

  make.fail_at = 3;  // the second of two new slots
  CHECK_THROWS_AS(ring.grow(2, make), std::runtime_error);
  CHECK(ring.size() == 2);
  CHECK(live == 2);  // the slot made before the throw is gone too

  const bool in_flight = !quick();
  if (in_flight) enqueue_delay(s.get(), 2'000'000'000ull);
  ring.record(ring.take(1, make).front(), s);  // slot 0 busy, next take starts at 1
  make.fail_at = make.made;  // slot 1 free (0 too, if its delay ran): the ring must grow, and cannot
  CHECK_THROWS_AS(ring.take(3, make), std::runtime_error);
  CHECK(ring.size() == 2);
  CHECK(live == 2);

  make.fail_at = -1;
  const std::vector<std::size_t> again = ring.take(1, make);
  CHECK(again.front() == 1);  // the refused take moved nothing
  if (in_flight) CHECK(cudaStreamQuery(s.get()) == cudaErrorNotReady);
  OOMB_CUDA_CHECK(cudaStreamSynchronize(s.get()), "test");
}

TEST_CASE("staging_ring: each reader sees its own staging while later slots are filled; destruction waits") {
  // A pinned half copied to a device twin (the page-copy engine's shape), seeded random tables:
  // a slot refilled while its copy or reader was pending would give another sum.
  struct twin {
    oomb::pinned_staging<std::int32_t> host;
    oomb::device_staging<std::int32_t> device;
  };
  constexpr int n = 1000;
  const int rounds = quick() ? 16 : 200;
  auto make = [] {
    return twin{oomb::make_pinned_staging<std::int32_t>(n, cudaHostAllocPortable, "test"),
                oomb::make_device_staging<std::int32_t>(n, "test")};
  };
  oomb::cuda_stream stream;
  const oomb::cuda_stream_view s = stream.view();
  device_buffer<unsigned long long> sums(static_cast<std::size_t>(rounds));
  OOMB_CUDA_CHECK(cudaMemset(sums.ptr, 0, sums.n * sizeof(unsigned long long)), "test");
  std::vector<unsigned long long> expect(static_cast<std::size_t>(rounds), 0);
  std::mt19937 rng(4242);
  std::size_t slots = 0;
  {
    oomb::staging_ring<twin> ring;
    ring.grow(2, make);
    for (int k = 0; k < rounds; ++k) {
      if (k % 10 == 0) enqueue_delay(s.get(), 2'000'000);  // bursts in flight: the ring must grow
      const std::size_t i = ring.take(1, make).front();
      CHECK(ring.event(i).ready());
      for (int j = 0; j < n; ++j) {
        const auto v = static_cast<std::int32_t>(rng());
        ring[i].host[j] = v;
        expect[std::size_t(k)] += static_cast<unsigned long long>(std::uint32_t(v)) * (j + 1);
      }
      OOMB_CUDA_CHECK(cudaMemcpyAsync(ring[i].device.get(), ring[i].host.get(), n * sizeof(std::int32_t),
                                      cudaMemcpyHostToDevice, s.get()),
                      "test");
      weighted_sum_kernel<><<<1, 128, 0, s.get()>>>(ring[i].device.get(), n, sums.ptr + k);
      OOMB_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
      ring.record(i, s);
    }
    slots = ring.size();
    enqueue_delay(s.get(), 100'000'000);  // the last work on `s`, before the last slot's event
    ring.record(0, s);
  }  // the destructor waits for every slot's event, so `s` is idle by now
  CHECK(cudaStreamQuery(s.get()) == cudaSuccess);
  MESSAGE(rounds << " rounds through " << slots << " slots");
  if (!quick()) CHECK(slots > 2);
  std::vector<unsigned long long> got(sums.n);
  OOMB_CUDA_CHECK(cudaMemcpy(got.data(), sums.ptr, sums.n * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
                  "test");
  CHECK(got == expect);
}
