// The residency scheduler's pieces alone: bookkeeping (residency_table), slot hazards and wait
// lists, the event pool, the backend concept's optional hooks.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "oomb/offload/event_pool.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/residency_backend.hpp"
#include "oomb/offload/residency_table.hpp"
#include "oomb/offload/slot_hazards.hpp"
#include "test_streams.hpp"

TEST_CASE("residency_table: attach and detach keep page and slot consistent") {
  oomb::residency_table t(3);
  t.reserve_pages(10);
  CHECK(t.knows(9));
  CHECK_FALSE(t.knows(10));
  t.attach(1, 7);
  t.slot(1).dirty = true;
  CHECK(t.page(7).slot == 1);
  CHECK(t.slot(1).page == 7);
  t.detach(1);
  CHECK(t.page(7).slot == -1);
  CHECK(t.slot(1).page == -1);
  CHECK_FALSE(t.slot(1).dirty);
  t.detach(1);  // a free slot: nothing to unlink
  CHECK(t.slot(1).page == -1);
}

TEST_CASE("slot_hazards: what each access waits for; loads and write-backs replace what they cover") {
  using ptr = std::shared_ptr<const oomb::host_event>;
  oomb::host_stream s;
  oomb_test::gate g;
  s.enqueue(g.task());  // everything recorded below stays pending until the gate opens
  oomb::slot_hazards<oomb::host_event> h(2);
  h.reserve_pages(4);
  const ptr in = std::make_shared<const oomb::host_event>(s.record());
  const ptr use = std::make_shared<const oomb::host_event>(s.record());
  const ptr wb = std::make_shared<const oomb::host_event>(s.record());
  h.loaded(0, in);
  std::vector<std::int32_t> slot0{0};
  h.reserve_use(slot0);
  h.used(0, use, false);
  h.used(0, use, false);  // the same release twice: kept once
  oomb::wait_list<oomb::host_event> w;
  h.before_read(0, w);
  CHECK(w.size() == 1);  // the copy-in only (a clean use: no last write)
  w.clear();
  h.before_write(0, w);
  CHECK(w.size() == 2);  // copy-in and the reader
  h.written_back(0, 3, wb, wb);
  w.clear();
  h.before_write(0, w);
  CHECK(w.size() == 2);  // copy-in and the write-back, which covers the reader
  w.clear();
  h.before_home_read(3, w);
  CHECK(w.size() == 1);
  CHECK(h.copy_in_pending(0));
  CHECK(h.write_back_pending(0));
  g.open();
  s.synchronize();
  w.clear();
  h.before_write(0, w);
  CHECK(w.size() == 0);  // completed events are never waited for
  h.prune_all();
  CHECK_FALSE(h.copy_in_pending(0));
}

namespace {
// An event that counts its queries (on the GPU each is a cudaEventQuery, a driver call).
struct counted_event {
  int* queries;
  bool done;
  bool ready() const {
    ++*queries;
    return done;
  }
  void wait() const {}
};
}  // namespace

TEST_CASE("wait_list and slot_hazards: an event is queried once per request, not once per page naming it") {
  using ptr = std::shared_ptr<const counted_event>;
  int queries = 0;
  const ptr loaded = std::make_shared<const counted_event>(counted_event{&queries, false});
  const ptr done = std::make_shared<const counted_event>(counted_event{&queries, true});
  const std::int32_t slots = 300;  // a window of pages loaded by one batch
  oomb::slot_hazards<counted_event> h(slots);
  for (std::int32_t s = 0; s < slots; ++s) h.loaded(s, s % 2 ? loaded : done);
  oomb::wait_list<counted_event> w;
  for (std::int32_t s = 0; s < slots; ++s) h.before_write(s, w);
  CHECK(w.size() == 1);   // the pending batch, once
  CHECK(queries == 2);    // each distinct event queried once, though 300 slots name them
  w.clear();
  h.before_read(0, w);
  CHECK(queries == 3);    // a new request queries again: an event completes between requests

  // Released uses are pruned once a few have gathered, not at every release.
  queries = 0;
  const std::vector<std::int32_t> slot0{0};
  for (std::size_t i = 0; i + 1 < oomb::slot_hazards<counted_event>::prune_uses_at; ++i) {
    h.reserve_use(slot0);
    h.used(0, std::make_shared<const counted_event>(counted_event{&queries, true}), false);
  }
  CHECK(queries == 0);
  h.reserve_use(slot0);
  h.used(0, std::make_shared<const counted_event>(counted_event{&queries, false}), false);
  CHECK(queries == 0);  // prune_uses_at uses now: the next reserve prunes
  h.reserve_use(slot0);
  CHECK(queries == int(oomb::slot_hazards<counted_event>::prune_uses_at));
  w.clear();
  queries = 0;
  h.before_write(0, w);
  CHECK(w.size() == 1);  // the completed uses were dropped; the pending one stays
  CHECK(queries == 2);   // the copy-in and the one use left
}

namespace {
// A host stream that re-records an existing event (the CUDA streams' record(event&)), so the pool's
// reuse path runs on the CPU.
struct rerecording_stream {
  oomb::host_stream s;
  int records = 0;
  void record(oomb::host_event& e) {
    ++records;
    e = s.record();
  }
};
}  // namespace

TEST_CASE("event_pool: dropped events are reused by the next record; streams without record(event&) create") {
  oomb::event_pool<oomb::host_event> pool(2);
  rerecording_stream rs;
  {
    auto a = pool.record(rs);
    auto b = pool.record(rs);
    auto c = pool.record(rs);
    CHECK(pool.created() == 3);
    a->wait();
  }  // three dropped; two kept
  CHECK(pool.spare() == 2);
  for (int i = 0; i < 10; ++i) pool.record(rs)->wait();
  CHECK(pool.created() == 3);  // every later record reused a kept event
  CHECK(rs.records == 13);
  oomb::host_stream plain;
  auto e = pool.record(plain);  // no record(event&): a new event, nothing kept
  e->wait();
  CHECK(pool.spare() == 2);
}

namespace {
struct ranged_backend : oomb::host_backend {
  std::vector<const char*>* log;
  void range_begin(const char* name) noexcept { log->push_back(name); }
  void range_end() noexcept { log->push_back("end"); }
};
}  // namespace

TEST_CASE("residency backend hooks: profiler ranges wrap each scheduler batch") {
  static_assert(oomb::detail::has_backend_ranges<ranged_backend>::value);
  static_assert(!oomb::detail::has_backend_ranges<oomb::host_backend>::value);
  static_assert(!oomb::detail::has_backend_prepare<oomb::host_backend>::value);
  oomb::host_resource mem;
  auto far = oomb::block_pool<oomb::host_resource>::contiguous(mem, 256, 4);
  std::vector<std::int32_t> ids(4);
  far.acquire(4, ids.data());
  oomb::host_stream in, out, compute;
  std::vector<const char*> log;
  ranged_backend b;
  b.log = &log;
  oomb::residency_scheduler<ranged_backend> sched(far, mem, 2, in, out, b);
  sched.prefetch({0});
  sched.drain();
  REQUIRE(log.size() == 4);
  CHECK(std::string(log[0]) == "oomb::residency::prefetch");
  CHECK(std::string(log[1]) == "end");
  CHECK(std::string(log[2]) == "oomb::residency::drain");
}
