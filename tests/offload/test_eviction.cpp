// Eviction policies alone (slots and pages, no events), and inside the scheduler: a declared
// future order (belady_eviction) against LRU on a cyclic pattern larger than the near tier.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "oomb/offload/belady_eviction.hpp"
#include "oomb/offload/eviction_policy.hpp"
#include "oomb/offload/host_backend.hpp"
#include "scheduler_fixture.hpp"

using oomb::victim_kind;

static_assert(oomb::is_eviction_policy_v<oomb::lru_eviction>);
static_assert(oomb::is_eviction_policy_v<oomb::belady_eviction>);
static_assert(!oomb::is_eviction_policy_v<int>);

namespace {
struct kinds {
  std::vector<victim_kind> k;
  victim_kind operator()(std::int32_t s) const { return k[static_cast<std::size_t>(s)]; }
};
}  // namespace

TEST_CASE("lru_eviction: oldest first, clean before dirty, hits move to the back") {
  oomb::lru_eviction lru(4);
  for (std::int32_t s = 0; s < 4; ++s) lru.on_insert(s, 10 + s);
  lru.on_hit(0, 10);
  CHECK(lru.order() == std::vector<std::int32_t>{1, 2, 3, 0});
  std::vector<std::int32_t> out;
  lru.choose(2, kinds{{victim_kind::clean, victim_kind::dirty, victim_kind::clean, victim_kind::no}}, out);
  CHECK(out == std::vector<std::int32_t>{2, 0});  // 1 is older but dirty; 3 is held
  out.clear();
  lru.choose(3, kinds{{victim_kind::clean, victim_kind::dirty, victim_kind::clean, victim_kind::no}}, out);
  CHECK(out == std::vector<std::int32_t>{2, 0, 1});
  lru.on_remove(2);
  CHECK(lru.order() == std::vector<std::int32_t>{1, 3, 0});
}

TEST_CASE("belady_eviction: the page needed furthest ahead goes first; the order is consumed by requests") {
  oomb::belady_eviction b(3);
  b.expect({1, 2, 3, 1, 2, 4, 1});
  for (std::int32_t s = 0; s < 3; ++s) b.on_insert(s, s + 1);  // slots hold pages 1, 2, 3
  b.on_request({1});
  b.on_request({2});
  b.on_request({3});
  CHECK(b.consumed() == 3);
  CHECK(b.next_use(1) == 3);
  CHECK(b.next_use(3) == oomb::belady_eviction::never);
  const kinds all{{victim_kind::clean, victim_kind::clean, victim_kind::clean}};
  std::vector<std::int32_t> out;
  b.choose(1, all, out);
  CHECK(out == std::vector<std::int32_t>{2});  // page 3: never needed again
  b.on_request({1});
  b.on_request({2});  // next: 4, then 1; page 2 is never needed again, page 3 neither
  out.clear();
  b.choose(2, kinds{{victim_kind::clean, victim_kind::dirty, victim_kind::clean}}, out);
  CHECK(out == std::vector<std::int32_t>{2, 1});  // both never: clean (page 3) before dirty (page 2)
  CHECK_THROWS_AS(b.expect({0, -1}), oomb::invalid_argument);
  CHECK(b.next_use(1) == 6);  // a refused expect() changed nothing
}

namespace {
// Walks `rounds` cycles over `pages` pages, one page per request (prefetch, acquire, release), on
// a scheduler with `slots` < pages slots; returns its misses.
template <class Eviction>
std::uint64_t cyclic_misses(std::int32_t pages, std::int32_t slots, int rounds, bool declare) {
  oomb_test::tiers<oomb_test::fast_streams, oomb::host_backend, Eviction> t(pages, slots, 256);
  for (std::int32_t p = 0; p < pages; ++p) t.stamp_home(p, 1);
  t.sched.mark_written(t.ids);
  std::vector<std::int32_t> order;
  for (int r = 0; r < rounds; ++r)
    for (std::int32_t p = 0; p < pages; ++p) order.push_back(p);
  if constexpr (std::is_same_v<Eviction, oomb::belady_eviction>)
    if (declare) t.sched.eviction().expect(order);
  for (std::int32_t p : order) {
    t.sched.prefetch({p});
    const auto s = t.sched.acquire(t.compute, {p}, oomb::access::read);
    t.check_on_compute(s[0], p, 1);
    t.sched.release(t.compute, {p});
  }
  t.settle();
  CHECK(t.bad.load() == 0);
  return t.sched.stats().misses;
}
}  // namespace

TEST_CASE("scheduler eviction: a declared order beats LRU on a cyclic window larger than the near tier") {
  constexpr std::int32_t pages = 10, slots = 8;
  constexpr int rounds = 6;
  const std::uint64_t lru = cyclic_misses<oomb::lru_eviction>(pages, slots, rounds, false);
  const std::uint64_t belady = cyclic_misses<oomb::belady_eviction>(pages, slots, rounds, true);
  const std::uint64_t undeclared = cyclic_misses<oomb::belady_eviction>(pages, slots, rounds, false);
  CHECK(lru == pages * rounds);  // LRU evicts exactly the page needed next: every access misses
  CHECK(belady < lru / 2);
  CHECK(belady >= pages);        // the first round misses every page
  CHECK(undeclared <= lru);      // nothing declared: every page "never" needed, oldest first
  MESSAGE("misses over " << rounds << " cycles of " << pages << " pages through " << slots
                         << " slots: LRU " << lru << ", declared order " << belady);
}
