// Far ids reused by the far pool (block_pool hands released ids out again, last-in-first-out):
// the scheduler tells the new page from the old one by the id's generation, without a discard().
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>

#include "oomb/offload/host_backend.hpp"
#include "scheduler_fixture.hpp"

using oomb::access;
using oomb::page_state;

TEST_CASE("scheduler id reuse: a released and re-acquired far id never hits the old page's slot") {
  oomb_test::tiers<oomb_test::slow_copies> t(6, 4, 256);
  for (std::int32_t p = 0; p < 6; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  t.sched.prefetch({2, 3});
  CHECK(t.sched.slot_of(2) >= 0);
  t.far.release(2);  // no discard(): nothing to forget by construction
  REQUIRE(t.far.acquire() == 2);  // LIFO: the same id, a new page with no content yet
  CHECK(t.sched.slot_of(2) == -1);
  CHECK(t.sched.state(2) == page_state::far);
  CHECK_FALSE(t.sched.home_written(2));
  auto s = t.sched.acquire(t.compute, {2}, access::read);
  t.check_on_compute(s[0], 2, 0);  // zero-filled, not the old page's bytes (version 1)
  t.sched.release(t.compute, {2});
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(t.sched.stats().zero_fills == 1);
  CHECK(t.sched.stats().hits == 0);
}

TEST_CASE("scheduler id reuse: a dead dirty slot is never written into the home's new owner") {
  oomb_test::tiers<oomb_test::slow_compute> t(6, 2, 256);
  auto s = t.sched.acquire(t.compute, {0}, access::write);
  t.update_on_compute(s[0], 0, 0);  // page 0 version 1, only near (dirty)
  t.sched.release(t.compute, {0});
  t.far.release(0);
  REQUIRE(t.far.acquire() == 0);
  t.settle();
  t.stamp_home(0, 7);  // the new owner of id 0 writes its home on the host
  t.sched.mark_written({0});
  CHECK(t.sched.stats().dirty == 0);  // the old page is dead: not dirty, not counted
  CHECK(t.sched.flush() == 0);
  t.sched.prefetch({1, 2});  // takes both slots: the dead one is reused without a write-back
  t.settle();
  CHECK(oomb_test::has_content(t.home(0), t.bytes(), 0, 7));
  auto r = t.sched.acquire(t.compute, {0}, access::read);
  t.check_on_compute(r[0], 0, 7);
  t.sched.release(t.compute, {0});
  t.settle();
  CHECK(t.bad.load() == 0);
  CHECK(t.sched.stats().write_backs == 0);
}

TEST_CASE("scheduler id reuse: an id released while acquired is refused when met again") {
  oomb_test::tiers<> t(4, 2, 256);
  auto s = t.sched.acquire(t.compute, {1}, access::read);
  t.far.release(1);
  REQUIRE(t.far.acquire() == 1);
  CHECK_THROWS_WITH_AS(t.sched.prefetch({1}), doctest::Contains("released from the far pool while acquired"),
                       oomb::invalid_argument);
  CHECK(s.size() == 1);
}
