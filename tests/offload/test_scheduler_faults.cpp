// The residency scheduler under faults and at the end of its life: a backend whose transfers and
// zero fills throw on command, a resource whose allocations fail, destruction with work queued,
// and the compute-stream contract.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fault_injection.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/host_stream_view.hpp"
#include "oomb/offload/residency_scheduler.hpp"
#include "scheduler_fixture.hpp"
#include "scheduler_model.hpp"
#include "test_streams.hpp"

using oomb::access;
using oomb::page_state;
using oomb_test::fast_streams;
using oomb_test::slow_compute;
using oomb_test::slow_copies;
using faulty = oomb_test::failing_backend<>;

static_assert(oomb::is_residency_backend_v<faulty>);

TEST_CASE_TEMPLATE("scheduler faults: the model holds after every injected transfer and fill failure", D,
                   fast_streams, slow_copies, slow_compute) {
  constexpr std::int32_t pages = 40, slots = 10;
  int faults = 0;
  for (std::uint32_t seed : {11u, 12u, 13u, 14u}) {
    CAPTURE(seed);
    oomb_test::fault_plan plan;
    oomb_test::tiers<D, faulty> t(pages, slots, 256, faulty(plan));
    const auto r = oomb_test::run_scheduler_model(t, pages, slots, seed, &plan);
    faults += r.faults;
    CHECK(r.faults <= plan.injected);
    CHECK(r.stats.misses > 0);
  }
  CHECK(faults >= 8);  // the faults were met (each seed arms ~1 step in 4)
  MESSAGE("injected faults met by a scheduler call: " << faults);
}

TEST_CASE_TEMPLATE("scheduler faults: a failed copy into a reused slot never serves the victim's old bytes", D,
                   fast_streams, slow_copies) {
  oomb_test::fault_plan plan;
  oomb_test::tiers<D, faulty> t(8, 2, 256, faulty(plan));
  for (std::int32_t p = 0; p < 8; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  t.sched.prefetch({0, 1});  // both slots taken
  plan.next_transfer();      // page 2's copy fails after half its batch: into page 0's slot
  CHECK_THROWS_AS(t.sched.prefetch({2, 3}), oomb_test::injected_fault);
  CHECK(t.sched.state(2) == page_state::far);  // was: near, with page 0's (or half-copied) bytes
  CHECK(t.sched.state(3) == page_state::far);
  CHECK(t.sched.stats().misses == 2);
  // Every page now reads its own bytes, whichever slot it lands in.
  for (std::int32_t p : {0, 1, 2, 3}) {
    const auto s = t.sched.acquire(t.compute, {p}, access::read);
    t.check_on_compute(s[0], p, 1);
    t.sched.release(t.compute, {p});
  }
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(plan.injected == 1);
}

TEST_CASE("scheduler faults: a failed zero fill or write-back leaves the pages as they were") {
  oomb_test::fault_plan plan;
  oomb_test::tiers<slow_copies, faulty> t(6, 2, 256, faulty(plan));
  auto s = t.sched.acquire(t.compute, {0}, access::write);  // zero-filled, then +1
  t.update_on_compute(s[0], 0, 0);
  t.sched.release(t.compute, {0});
  plan.next_fill();
  CHECK_THROWS_AS(t.sched.acquire(t.compute, {1}, access::write), oomb_test::injected_fault);
  CHECK(t.sched.state(1) == page_state::far);
  CHECK(t.sched.stats().pinned == 0);
  CHECK(t.sched.acquire(t.compute, {1}, access::write).size() == 1);  // works again
  t.sched.release(t.compute, {1});
  t.settle();            // states below read "near_dirty", not "to_near"
  plan.next_transfer();  // the write-back of page 0
  CHECK_THROWS_AS(t.sched.write_back({0}), oomb_test::injected_fault);
  CHECK(t.sched.state(0) == page_state::near_dirty);  // still the only copy: not lost
  CHECK_FALSE(t.sched.home_written(0));
  plan.next_transfer();  // evict: its write-back fails, the page keeps its slot
  const std::int32_t slot0 = t.sched.slot_of(0);
  CHECK_THROWS_AS(t.sched.evict({0}), oomb_test::injected_fault);
  CHECK(t.sched.slot_of(0) == slot0);
  CHECK(t.sched.write_back({0}) == 1);
  t.settle();
  CHECK(oomb_test::has_content(t.home(0), t.bytes(), 0, 1));
  CHECK(t.bad.load() == 0);
}

TEST_CASE("scheduler faults: a far pool whose resource fails to grow, and a near tier that cannot be had") {
  oomb_test::fault_plan plan;
  oomb::host_resource host;
  oomb_test::failing_resource<oomb::host_resource> failing(host, plan);
  using pool = oomb::block_pool<oomb_test::failing_resource<oomb::host_resource>>;
  using backend = oomb::basic_host_backend<oomb_test::failing_resource<oomb::host_resource>>;
  auto far = pool::growing(failing, 256, 2);
  oomb::host_stream in, out, compute;
  oomb::residency_scheduler<backend> sched(far, host, 2, in, out);
  const std::int32_t a = far.acquire(), b = far.acquire();
  sched.prefetch({a, b});
  plan.next_allocation();
  CHECK_THROWS_AS(far.acquire(), oomb::out_of_memory);  // the third id needs a slab: refused
  CHECK(far.in_use() == 2);
  const std::int32_t c = far.acquire();  // the pool is unchanged and grows now
  auto s = sched.acquire(compute, {c}, access::write);
  CHECK(s.size() == 1);
  sched.release(compute, {c});
  compute.synchronize();
  sched.drain();

  struct near_fails : backend {
    using near_resource = oomb_test::failing_resource<oomb::host_resource>;
  };
  plan.next_allocation();  // the near tier's one allocation: the constructor throws, nothing leaks
  CHECK_THROWS_AS(oomb::residency_scheduler<near_fails>(far, failing, 4, in, out), oomb::out_of_memory);
}

TEST_CASE("scheduler lifetime: destruction waits for its copies, fills and write-backs on slow streams") {
  oomb::host_resource mem;
  auto far = oomb_test::far_pool::contiguous(mem, 4096, 64);
  std::vector<std::int32_t> ids(64);
  far.acquire(64, ids.data());
  oomb_test::slow_host_stream in, out;
  oomb::host_stream compute;
  {
    oomb::host_residency_scheduler sched(far, mem, 16, in, out);
    sched.mark_written({0, 2, 4, 6, 8, 10, 12, 14});
    for (std::int32_t p = 0; p < 16; ++p) sched.prefetch({p});  // 16 batches, 300 us each
    auto s = sched.acquire(compute, {1, 3}, access::write);
    sched.release(compute, {1, 3});
    sched.write_back({1, 3});
    CHECK(in.pending() > 0);  // still queued when the scheduler goes
  }  // without the wait, the slow stream copies into the freed near pool (ASan: use after free)
  CHECK(in.pending() == 0);
  CHECK(out.pending() == 0);
}

TEST_CASE("scheduler streams: a temporary view of a compute stream; one compute stream at a time") {
  oomb_test::tiers<slow_compute> t(8, 4, 256);
  for (std::int32_t p = 0; p < 8; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  oomb::host_stream other;
  // A view built in the call (as a framework passes its current stream).
  auto s = t.sched.acquire(oomb::host_stream_view(t.compute), {0, 1}, access::read);
  t.check_on_compute(s[0], 0, 1);  // slow: still running when `other` asks for page 0
  CHECK_THROWS_WITH_AS(t.sched.acquire(oomb::host_stream_view(other), {0}, access::write),
                       doctest::Contains("one compute stream at a time"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.sched.acquire(other, {5}, access::read), doctest::Contains("one compute stream at a time"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(t.sched.release(other, {0, 1}), oomb::invalid_argument);
  CHECK(t.sched.stats().pinned == 2);
  t.sched.release(t.compute, {0, 1});
  // Nothing pinned: `other` may take over; its write waits for the slow read on `compute`.
  auto w = t.sched.acquire(other, {0}, access::write);
  std::byte* slot = t.slot(w[0]);
  other.enqueue([slot, n = t.bytes()] { oomb_test::write_content(slot, n, 0, 2); });
  t.sched.release(other, {0});
  other.synchronize();
  t.settle();
  CHECK(t.bad.load() == 0);  // the read on `compute` saw version 1, not the write from `other`
}

TEST_CASE("scheduler far tier: any resource is the home (statistics_adaptor, limiting_adaptor)") {
  oomb::host_resource host;
  using counted = oomb::statistics_adaptor<oomb::host_resource>;
  counted stats(host);
  auto far = oomb::block_pool<counted>::growing(stats, 512, 4);
  oomb::host_stream in, out, compute;
  oomb::residency_scheduler<oomb::basic_host_backend<counted>> sched(far, host, 4, in, out);
  std::vector<std::int32_t> ids(6);
  far.acquire(6, ids.data());
  CHECK(stats.statistics().bytes_in_use == 8 * 512);  // two slabs of four
  auto s = sched.acquire(compute, {ids[0], ids[5]}, access::write);
  for (std::int32_t k = 0; k < 2; ++k) {
    std::byte* p = sched.near_pool().address(s[static_cast<std::size_t>(k)]);
    const std::int32_t id = ids[k == 0 ? 0 : 5];
    compute.enqueue([p, id] { oomb_test::write_content(p, 512, id, 3); });
  }
  sched.release(compute, {ids[0], ids[5]});
  CHECK(sched.flush() == 2);
  compute.synchronize();
  sched.drain();
  CHECK(oomb_test::has_content(far.address(ids[5]), 512, ids[5], 3));

  using limited = oomb::limiting_adaptor<oomb::host_resource>;
  limited cap(host, 4 * 512);
  auto small = oomb::block_pool<limited>::growing(cap, 512, 4);
  oomb::residency_scheduler<oomb::basic_host_backend<limited>> capped(small, host, 2, in, out);
  std::vector<std::int32_t> four(4);
  small.acquire(4, four.data());
  capped.prefetch({four[0], four[3]});
  CHECK_THROWS_WITH_AS(small.acquire(), doctest::Contains("limit"), oomb::out_of_memory);
  CHECK(capped.slot_of(four[3]) >= 0);
  capped.drain();
}
