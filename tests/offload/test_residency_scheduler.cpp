// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/residency_scheduler.hpp"
#include "scheduler_fixture.hpp"
#include "scheduler_model.hpp"
#include "test_streams.hpp"

using oomb::access;
using oomb::page_state;
using oomb_test::fast_streams;
using oomb_test::slow_compute;
using oomb_test::slow_copies;

static_assert(oomb::is_residency_backend_v<oomb::host_backend>);
static_assert(!oomb::is_residency_backend_v<int>);

namespace {
void check_accounting(const oomb::host_residency_scheduler& s) {
  const auto st = s.stats();
  CHECK(st.capacity == s.capacity());
  CHECK(s.free_slots() + st.resident == s.capacity());  // free + used = capacity
}
}  // namespace

TEST_CASE_TEMPLATE("scheduler: prefetch, acquire, read: readers see a slot only after its copy", D,
                   fast_streams, slow_copies, slow_compute) {
  oomb_test::tiers<D> t(16, 6);
  for (std::int32_t p = 0; p < 16; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);

  t.sched.prefetch({3, 4, 5, 9});
  const auto slots = t.sched.acquire(t.compute, {3, 4, 5, 9}, access::read);
  REQUIRE(slots.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(t.sched.slot_of(std::vector<int>{3, 4, 5, 9}[i]) == slots[i]);
    CHECK(t.sched.page_in(slots[i]) == std::vector<int>{3, 4, 5, 9}[i]);
  }
  for (std::size_t i = 0; i < 4; ++i) t.check_on_compute(slots[i], std::vector<int>{3, 4, 5, 9}[i], 1);
  t.sched.release(t.compute, {3, 4, 5, 9});
  t.settle();
  CHECK(t.bad.load() == 0);
  for (int p : {3, 4, 5, 9}) CHECK(t.sched.state(p) == page_state::near);
  CHECK(t.sched.state(0) == page_state::far);

  const auto st = t.sched.stats();
  CHECK(st.misses == 4);
  CHECK(st.hits == 4);  // the acquire found all four prefetched
  CHECK(st.acquire_misses == 0);
  CHECK(st.bytes_to_near == 4 * t.bytes());
  CHECK(st.copies_to_near <= 2);  // pages 3,4,5 are one run when their slots are neighbours
  CHECK(st.bytes_to_far == 0);
  CHECK(st.resident == 4);
  CHECK(st.pinned == 0);
  check_accounting(t.sched);
}

TEST_CASE_TEMPLATE("scheduler: gradient pages are zero-filled at first touch, accumulate, and land home",
                   D, fast_streams, slow_copies, slow_compute) {
  oomb_test::tiers<D> t(8, 4);
  for (std::int32_t p = 0; p < 8; ++p) t.stamp_home(p, 7);  // garbage: never marked written
  const auto s = t.sched.acquire(t.compute, {2, 5}, access::write);
  t.update_on_compute(s[0], 2, 0);  // checks zeros, writes version 1
  t.update_on_compute(s[1], 5, 0);
  t.sched.release(t.compute, {2, 5});
  CHECK(t.sched.stats().dirty == 2);
  CHECK(t.sched.write_back({2, 5, 6}) == 2);  // 6 is far: skipped
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(oomb_test::has_content(t.home(2), t.bytes(), 2, 1));
  CHECK(oomb_test::has_content(t.home(5), t.bytes(), 5, 1));
  CHECK(t.sched.state(2) == page_state::near);
  CHECK(t.sched.home_written(2));
  CHECK(t.sched.write_back({2, 5}) == 0);  // clean now: nothing to copy

  // Second round: accumulate onto the slot again; then evict (written back first) and re-read.
  const auto s2 = t.sched.acquire(t.compute, {2}, access::write);
  t.update_on_compute(s2[0], 2, 1);
  t.sched.release(t.compute, {2});
  t.sched.evict({2});
  CHECK(t.sched.state(2) == page_state::far);
  const auto s3 = t.sched.acquire(t.compute, {2}, access::read);  // copy-in waits for the write-back
  t.check_on_compute(s3[0], 2, 2);
  t.sched.release(t.compute, {2});
  t.settle();
  CHECK(t.bad.load() == 0);
  const auto st = t.sched.stats();
  CHECK(st.zero_fills == 2);
  CHECK(st.write_backs == 3);
  CHECK(st.bytes_to_far == 3 * t.bytes());
  CHECK(st.evictions == 1);
  CHECK(st.acquire_misses == 3);
  check_accounting(t.sched);
}

TEST_CASE_TEMPLATE("scheduler: K/V produced near are copied home exactly once", D, fast_streams,
                   slow_copies, slow_compute) {
  oomb_test::tiers<D> t(8, 4);
  const auto s = t.sched.acquire(t.compute, {0, 1, 2}, access::overwrite);
  for (int i = 0; i < 3; ++i) t.update_on_compute(s[static_cast<std::size_t>(i)], i, 4, true);
  t.sched.release(t.compute, {0, 1, 2});
  CHECK(t.sched.stats().zero_fills == 0);  // overwrite: no fill, no copy
  CHECK(t.sched.stats().bytes_to_near == 0);
  CHECK(t.sched.write_back({0, 1, 2}) == 3);
  CHECK(t.sched.stats().copies_to_far <= 3);
  // Read them many times, evict them, fill the near tier with others: never written home again.
  for (int round = 0; round < 3; ++round) {
    const auto r = t.sched.acquire(t.compute, {0, 1, 2}, access::read);
    for (int i = 0; i < 3; ++i) t.check_on_compute(r[static_cast<std::size_t>(i)], i, 5);
    t.sched.release(t.compute, {0, 1, 2});
    t.sched.evict({0, 1, 2});
    t.sched.flush();
  }
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(t.sched.stats().write_backs == 3);
  CHECK(t.sched.stats().bytes_to_far == 3 * t.bytes());
  for (int i = 0; i < 3; ++i) CHECK(oomb_test::has_content(t.home(i), t.bytes(), i, 5));
}

TEST_CASE("scheduler: page states follow the events (streams held back by gates)") {
  oomb_test::tiers<> t(8, 4);
  for (std::int32_t p = 0; p < 8; ++p) t.stamp_home(p, 2);
  t.sched.mark_written({0, 1});
  oomb_test::gate in_gate, out_gate, compute_gate;
  t.copy_in.enqueue(in_gate.task());
  t.copy_out.enqueue(out_gate.task());
  t.sched.prefetch({0, 1, 5});  // 5: no home content, zero fill
  CHECK(t.sched.state(0) == page_state::to_near);
  CHECK(t.sched.state(5) == page_state::to_near);
  CHECK(t.sched.state(2) == page_state::far);
  // acquire returns at once: the compute stream waits, not the host.
  t.compute.enqueue(compute_gate.task());
  const auto s = t.sched.acquire(t.compute, {0, 5}, access::write);
  t.update_on_compute(s[0], 0, 2);
  t.update_on_compute(s[1], 5, 0);
  t.sched.release(t.compute, {0, 5});
  CHECK(t.sched.state(0) == page_state::to_near);
  in_gate.open();
  t.copy_in.synchronize();
  CHECK(t.sched.state(0) == page_state::near_dirty);  // marked at acquire: compute will write it
  CHECK(t.sched.state(1) == page_state::near);
  CHECK(t.sched.write_back({0, 5}) == 2);
  CHECK(t.sched.state(0) == page_state::to_far);  // copy-out is held back
  compute_gate.open();
  out_gate.open();
  t.settle();
  CHECK(t.sched.state(0) == page_state::near);
  CHECK(t.sched.state(5) == page_state::near);
  CHECK(t.bad.load() == 0);
  CHECK(oomb_test::has_content(t.home(0), t.bytes(), 0, 3));
  CHECK(oomb_test::has_content(t.home(5), t.bytes(), 5, 1));
  CHECK(std::string(oomb::to_string(page_state::near_dirty)) == "near_dirty");
}

TEST_CASE("scheduler: a copy from home waits for the write-back into that home") {
  oomb_test::tiers<> t(8, 2);
  const std::int32_t a = 3, y = 6;
  auto s = t.sched.acquire(t.compute, {a}, access::write);  // zero fill, then version 1
  t.update_on_compute(s[0], a, 0);
  t.sched.release(t.compute, {a});
  oomb_test::gate out_gate;
  t.copy_out.enqueue(out_gate.task());
  t.sched.evict({a});  // write-back held back by the gate: a's home is still stale
  // y takes a's old slot without a copy (overwrite: only the compute stream waits for the
  // write-back), so a comes back into the other slot: only the home's event orders its copy.
  auto sy = t.sched.acquire(t.compute, {y}, access::overwrite);
  CHECK(sy[0] == s[0]);
  t.sched.prefetch({a});
  CHECK(t.sched.slot_of(a) != s[0]);
  auto sa = t.sched.acquire(t.compute, {a}, access::read);
  t.check_on_compute(sa[0], a, 1);
  t.sched.release(t.compute, {a});
  t.update_on_compute(sy[0], y, 0, true);
  t.sched.release(t.compute, {y});
  out_gate.open();
  t.settle();
  CHECK(t.bad.load() == 0);
}

TEST_CASE("scheduler: LRU eviction of clean unpinned slots; dirty ones are written back first") {
  oomb_test::tiers<> t(16, 4);
  for (std::int32_t p = 0; p < 16; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  t.sched.prefetch({0, 1, 2, 3});
  t.sched.prefetch({0});  // touch 0: now 1 is least recently used
  t.sched.prefetch({4});
  CHECK(t.sched.slot_of(1) == -1);
  for (int p : {0, 2, 3, 4}) CHECK(t.sched.slot_of(p) >= 0);

  // Make 2 dirty: a clean page (3) is evicted before it even though 2 is older.
  auto s = t.sched.acquire(t.compute, {2}, access::write);
  t.update_on_compute(s[0], 2, 1);
  t.sched.release(t.compute, {2});
  t.sched.prefetch({5});
  CHECK(t.sched.slot_of(3) == -1);
  CHECK(t.sched.slot_of(2) >= 0);
  CHECK(t.sched.stats().write_backs == 0);

  // Pin 0 and 4; ask for two new pages: only 2 (dirty) and 5 can go, 2 is written back first.
  auto pinned = t.sched.acquire(t.compute, {0, 4}, access::read);
  t.sched.prefetch({6, 7});
  CHECK(t.sched.slot_of(2) == -1);
  CHECK(t.sched.slot_of(5) == -1);
  CHECK(t.sched.slot_of(0) == pinned[0]);
  CHECK(t.sched.slot_of(4) == pinned[1]);
  CHECK(t.sched.stats().write_backs == 1);
  CHECK(t.sched.stats().evictions == 4);
  t.sched.release(t.compute, {0, 4});
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(oomb_test::has_content(t.home(2), t.bytes(), 2, 2));
  check_accounting(t.sched);
}

TEST_CASE("scheduler: more pages at once than the near tier holds is out_of_memory, state unchanged") {
  oomb_test::tiers<slow_copies> t(16, 4);
  for (std::int32_t p = 0; p < 16; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  t.sched.prefetch({0, 1});
  const auto before = t.sched.stats();
  const auto pending_in = t.copy_in.pending();

  CHECK_THROWS_WITH_AS(t.sched.prefetch({5, 6, 7, 8, 9}),
                       doctest::Contains("asked for 5 pages at once, the near tier holds 4 slots"),
                       oomb::out_of_memory);
  CHECK_THROWS_WITH_AS(t.sched.acquire(t.compute, {5, 6, 7, 8, 9, 5}, access::read),
                       doctest::Contains("asked for 5 pages at once"), oomb::out_of_memory);
  auto pinned = t.sched.acquire(t.compute, {0, 1, 2}, access::read);
  CHECK_THROWS_WITH_AS(t.sched.prefetch({2, 10, 11}),
                       doctest::Contains("2 pages need a slot but only 1 of the 4 slots can be freed "
                                         "(3 pinned by compute, 1 held for this request)"),
                       oomb::out_of_memory);
  CHECK(t.sched.slot_of(10) == -1);
  CHECK(t.sched.stats().resident == 3);
  CHECK(t.sched.stats().pinned == 3);
  t.sched.prefetch({10});  // one fits
  CHECK(t.sched.slot_of(10) >= 0);
  t.sched.release(t.compute, {0, 1, 2});
  CHECK(pinned.size() == 3);
  t.settle();
  CHECK(before.misses == 2);
  CHECK(pending_in <= 2);
  check_accounting(t.sched);
  t.sched.prefetch({5, 6, 7, 8});  // now everything may be evicted
  t.settle();
  CHECK(t.sched.stats().resident == 4);
}

TEST_CASE("scheduler: bad input names the values and changes nothing") {
  oomb_test::tiers<> t(8, 3);
  auto other = oomb_test::far_pool::contiguous(t.mem, 256, 4);
  oomb::host_stream s1, s2;
  CHECK_THROWS_WITH_AS(oomb::host_residency_scheduler(t.far, t.mem, 0, s1, s2),
                       doctest::Contains("at least one slot, got 0"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::host_residency_scheduler(t.far, t.mem, 2, s1, s1),
                       doctest::Contains("two different streams"), oomb::invalid_argument);
  t.far.release(7);
  CHECK_THROWS_WITH_AS(t.sched.prefetch({1, 7}), doctest::Contains("page 7 (entry 1) is not in use in the far pool"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.sched.prefetch({-3}), doctest::Contains("page -3 (entry 0)"), oomb::invalid_argument);
  CHECK_THROWS_AS(t.sched.acquire(t.compute, {100}, access::read), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.sched.release(t.compute, {1}), doctest::Contains("page 1 (entry 0) is not near"),
                       oomb::invalid_argument);
  CHECK(t.sched.stats().misses == 0);
  CHECK(t.sched.slot_of(1) == -1);

  auto s = t.sched.acquire(t.compute, {1, 2}, access::write);
  CHECK_THROWS_WITH_AS(t.sched.release(t.compute, {1, 1}),
                       doctest::Contains("page 1 (entry 1) released more often than acquired (1 pins)"),
                       oomb::invalid_argument);
  CHECK(t.sched.stats().pinned == 2);  // the refused release unpinned nothing
  CHECK_THROWS_WITH_AS(t.sched.write_back({2}), doctest::Contains("still acquired by compute (1 pins)"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(t.sched.flush(), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.sched.evict({0, 1}), doctest::Contains("page 1 (entry 1) is acquired"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(t.sched.discard({2}), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(t.sched.mark_written({1}), doctest::Contains("has a slot"), oomb::invalid_argument);
  CHECK_THROWS_AS(t.sched.page_in(3), oomb::invalid_argument);
  CHECK(t.sched.stats().write_backs == 0);
  for (std::size_t i = 0; i < 2; ++i) t.update_on_compute(s[i], static_cast<std::int32_t>(i) + 1, 0);
  t.sched.release(t.compute, {1, 2});
  CHECK(t.sched.flush() == 2);

  // An id released from the far pool is not a page any more (its reuse: test_id_reuse.cpp).
  t.sched.prefetch({3});
  t.far.release(3);
  CHECK_THROWS_WITH_AS(t.sched.prefetch({3}), doctest::Contains("is not in use in the far pool"),
                       oomb::invalid_argument);
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(oomb_test::has_content(t.home(1), t.bytes(), 1, 1));
}

TEST_CASE("scheduler: discard drops dead pages; a recycled id starts empty (zero fill)") {
  oomb_test::tiers<slow_compute> t(6, 3);
  auto s = t.sched.acquire(t.compute, {4}, access::write);
  t.update_on_compute(s[0], 4, 0);
  t.sched.release(t.compute, {4});
  t.sched.write_back({4});
  t.sched.discard({4});
  CHECK(t.sched.slot_of(4) == -1);
  CHECK_FALSE(t.sched.home_written(4));
  CHECK(t.sched.free_slots() == 3);
  // The same id again (as if released and re-acquired from the far pool): zero-filled, even though
  // its home still holds the old content, and the slot's old reader/writer are waited for.
  auto s2 = t.sched.acquire(t.compute, {4}, access::write);
  t.update_on_compute(s2[0], 4, 0);
  t.sched.release(t.compute, {4});
  t.sched.flush();
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(t.sched.stats().zero_fills == 2);
}

TEST_CASE("scheduler: slot reuse waits for slow compute readers; write-backs wait for slow writers") {
  oomb_test::tiers<slow_compute> t(8, 1);  // one slot: every page evicts the previous one
  for (std::int32_t p = 0; p < 8; ++p) t.stamp_home(p, 3);
  t.sched.mark_written(t.ids);
  for (std::int32_t p = 0; p < 8; ++p) {
    auto s = t.sched.acquire(t.compute, {p}, p % 2 ? access::write : access::read);
    if (p % 2)
      t.update_on_compute(s[0], p, 3);
    else
      t.check_on_compute(s[0], p, 3);
    t.sched.release(t.compute, {p});  // the next acquire reuses the slot at once
  }
  t.sched.flush();
  t.settle();
  CHECK(t.bad.load() == 0);
  for (std::int32_t p = 1; p < 8; p += 2) CHECK(oomb_test::has_content(t.home(p), t.bytes(), p, 4));
  CHECK(t.sched.stats().evictions == 7);
  CHECK(t.sched.stats().write_backs == 4);
}

// The model the random sequences are checked against: scheduler_model.hpp.
TEST_CASE_TEMPLATE("scheduler property: random prefetch/compute/dirty/evict sequences against a model", D,
                   fast_streams, slow_copies, slow_compute) {
  constexpr std::int32_t pages = 40, slots = 10;
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    oomb_test::tiers<D> t(pages, slots, 256);
    const auto st = oomb_test::run_scheduler_model(t, pages, slots, seed).stats;
    CHECK(st.misses > 0);
    CHECK(st.hits > 0);
    CHECK(st.evictions > 0);
    CHECK(st.write_backs > 0);
    MESSAGE("seed " << seed << ": hits " << st.hits << " misses " << st.misses << " evictions "
                    << st.evictions << " write-backs " << st.write_backs << " zero fills "
                    << st.zero_fills);
  }
}

namespace {
// A backend that says how batches move (the CUDA backend's hook), counting its calls.
struct counting_backend : oomb::host_backend {
  int* batches;
  explicit counting_backend(int* b = nullptr) : batches(b) {}
  template <class D, class S>
  oomb::transfer_report transfer(oomb::host_stream& s, oomb::block_pool<D>& dst, oomb::id_span dst_ids,
                                 const oomb::block_pool<S>& src, oomb::id_span src_ids) {
    ++*batches;
    return oomb::transfer_pages(s, dst, dst_ids, src, src_ids);
  }
};
static_assert(oomb::is_residency_backend_v<counting_backend>);
}  // namespace

TEST_CASE("scheduler: a backend's transfer hook moves every batch, both ways") {
  oomb::host_resource mem;
  auto far = oomb_test::far_pool::contiguous(mem, 256, 8);
  std::vector<std::int32_t> ids(8);
  far.acquire(8, ids.data());
  for (std::int32_t p = 0; p < 8; ++p) oomb_test::write_content(far.address(p), 256, p, 1);
  oomb::host_stream in, out, compute;
  int batches = 0;
  oomb::residency_scheduler<counting_backend> s(far, mem, 4, in, out, counting_backend(&batches));
  s.mark_written({0, 1, 2, 3});
  s.prefetch({0, 1, 2});
  CHECK(batches == 1);
  auto slots = s.acquire(compute, {0}, access::write);
  compute.enqueue([p = s.near_pool().address(slots[0])] { oomb_test::write_content(p, 256, 0, 2); });
  s.release(compute, {0});
  s.write_back({0});
  CHECK(batches == 2);
  compute.synchronize();
  s.drain();
  CHECK(oomb_test::has_content(far.address(0), 256, 0, 2));
  CHECK(s.stats().bytes_to_near == 3 * 256);
  CHECK(s.stats().bytes_to_far == 256);
}

namespace {
// A backend whose write-backs read their slots before they write their homes, as a staged CUDA
// transfer does (DMA into staging, then the host's copy): slot -> staging, the sources_read hook,
// then a gate the test holds, then staging -> home, all on the copy-out stream.
struct staged_backend : oomb::host_backend {
  std::shared_ptr<oomb_test::gate> home_gate = std::make_shared<oomb_test::gate>();
  std::shared_ptr<std::vector<std::byte>> staging = std::make_shared<std::vector<std::byte>>();
  int hooks = 0;
  template <class D, class S>
  oomb::transfer_report transfer(oomb::host_stream& s, oomb::block_pool<D>& dst, oomb::id_span dst_ids,
                                 const oomb::block_pool<S>& src, oomb::id_span src_ids) {
    return oomb::transfer_pages(s, dst, dst_ids, src, src_ids);
  }
  template <class D, class S>
  oomb::transfer_report transfer(oomb::host_stream& s, oomb::block_pool<D>& dst, oomb::id_span dst_ids,
                                 const oomb::block_pool<S>& src, oomb::id_span src_ids, oomb::sources_read_hook read) {
    const std::size_t n = src.block_bytes();
    staging->resize(n * src_ids.size());
    std::vector<oomb::copy_op> in, out;
    for (std::size_t i = 0; i < src_ids.size(); ++i) {
      in.push_back({staging->data() + i * n, src.address(src_ids[i]), n});
      out.push_back({dst.address(dst_ids[i]), staging->data() + i * n, n});
    }
    s.enqueue_copies(in.data(), in.size());
    ++hooks;
    read();
    s.enqueue(home_gate->task());
    s.enqueue_copies(out.data(), out.size());
    oomb::transfer_report r;
    r.pages = r.copies = src_ids.size();
    r.bytes = n * src_ids.size();
    return r;
  }
};
static_assert(oomb::is_residency_backend_v<staged_backend>);

template <class E>
bool ready_within(const E& e, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!e.ready())
    if (std::chrono::steady_clock::now() > end) return false;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}
}  // namespace

TEST_CASE("scheduler: a write-back whose backend reports its slots read frees them before its homes are written") {
  // One slot: every acquire of another page reuses it. Page 0 is written back through the staged
  // backend while its home stage is held; page 1 then loads into the slot at once (it waits for the
  // slot's read, not the home), and page 0 comes back only after its home has been written.
  oomb_test::tiers<oomb_test::fast_streams, staged_backend> t(4, 1);
  for (std::int32_t p = 0; p < 4; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  auto s0 = t.sched.acquire(t.compute, {0}, access::write);
  t.update_on_compute(s0[0], 0, 1);  // version 2, near only
  t.sched.release(t.compute, {0});
  t.copy_in.synchronize();
  t.compute.synchronize();
  CHECK(t.sched.write_back({0}) == 1);
  CHECK(t.sched.state(0) == page_state::to_far);  // home write held by the gate
  auto s1 = t.sched.acquire(t.compute, {1}, access::read);
  t.check_on_compute(s1[0], 1, 1);
  t.sched.release(t.compute, {1});
  const auto loaded = t.compute.record();
  CHECK_MESSAGE(ready_within(loaded, std::chrono::seconds(5)), "the slot waited for the home write");
  CHECK(t.sched.state(0) == page_state::far);
  CHECK_FALSE(oomb_test::has_content(t.home(0), t.bytes(), 0, 2));  // still held
  auto s2 = t.sched.acquire(t.compute, {0}, access::read);
  t.check_on_compute(s2[0], 0, 2);
  t.sched.release(t.compute, {0});
  const auto reread = t.compute.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(reread.ready());  // a copy from page 0's home waits for its write
  t.sched.backend().home_gate->open();
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(oomb_test::has_content(t.home(0), t.bytes(), 0, 2));
  CHECK(t.sched.backend().hooks == 1);
}
