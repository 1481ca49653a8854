// The model-based property test of the residency scheduler: random prefetch / compute (read,
// write, overwrite) / release / write-back / evict / discard sequences checked against a model
// after every step. Shared by the plain runs (test_residency_scheduler.cpp) and the runs with
// injected faults (test_scheduler_faults.cpp): with a fault_plan, some steps arm a failure of the
// next transfer or zero fill, and a step that throws it must have left every page it named as it
// was (slot, pins, content), so that every later check still holds.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "fault_injection.hpp"
#include "oomb/offload/residency_scheduler.hpp"

namespace oomb_test {

struct model_result {
  oomb::residency_stats stats;
  int faults = 0;  // steps that threw an injected fault
};

/// Runs 150 random steps on `t` (pages ids 0..pages-1, `slots` slots); `plan` may be null.
template <class Tiers>
model_result run_scheduler_model(Tiers& t, std::int32_t pages, std::int32_t slots, std::uint32_t seed,
                                 fault_plan* plan = nullptr) {
  using oomb::access;
  using oomb::page_state;
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> version(static_cast<std::size_t>(pages), 0);
  std::vector<int> pins(static_cast<std::size_t>(pages), 0);
  for (std::int32_t p = 0; p < pages; p += 2) {  // half the homes hold content, half are new
    version[static_cast<std::size_t>(p)] = 1;
    t.stamp_home(p, 1);
  }
  for (std::int32_t p = 0; p < pages; p += 2) t.sched.mark_written({p});
  std::vector<std::vector<std::int32_t>> windows;  // acquired, not yet released
  model_result result;

  auto random_pages = [&](std::size_t n) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(pages));
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(n);
    return v;
  };
  // Predicts out_of_memory from the observable state (slots held, our pins).
  auto must_fail = [&](const std::vector<std::int32_t>& req) {
    std::set<std::int32_t> distinct(req.begin(), req.end());
    if (static_cast<std::int32_t>(distinct.size()) > slots) return true;
    std::int32_t missing = 0, held = 0, pinned_else = 0;
    for (std::int32_t p : distinct) (t.sched.slot_of(p) >= 0 ? held : missing) += 1;
    for (std::int32_t p = 0; p < pages; ++p)
      if (pins[static_cast<std::size_t>(p)] > 0 && !distinct.count(p)) ++pinned_else;
    return missing > slots - pinned_else - held;
  };
  // After an injected fault: the pages named kept their slots (or stayed far), nothing pinned.
  auto slots_of = [&](const std::vector<std::int32_t>& req) {
    std::vector<std::int32_t> v;
    for (std::int32_t p : req) v.push_back(t.sched.slot_of(p));
    return v;
  };
  auto check_unchanged = [&](const std::vector<std::int32_t>& req, const std::vector<std::int32_t>& before,
                             const oomb::residency_stats& st) {
    ++result.faults;
    for (std::size_t i = 0; i < req.size(); ++i) CHECK(t.sched.slot_of(req[i]) == before[i]);
    CHECK(t.sched.stats().pinned == st.pinned);
    CHECK(t.sched.stats().misses == st.misses);
  };

  for (int step = 0; step < 150; ++step) {
    CAPTURE(step);
    if (plan) {
      plan->disarm();
      const unsigned r = rng() % 8;
      if (r == 0) plan->next_transfer();
      if (r == 1) plan->next_fill();
    }
    const int op = static_cast<int>(rng() % 10);
    if (op <= 2) {  // prefetch the next window
      auto req = random_pages(1 + rng() % 12);
      const auto before = t.sched.stats();
      const auto had = slots_of(req);
      if (must_fail(req)) {
        CHECK_THROWS_AS(t.sched.prefetch(req), oomb::out_of_memory);
        CHECK(t.sched.stats().misses == before.misses);
        CHECK(t.sched.stats().resident == before.resident);
      } else {
        try {
          t.sched.prefetch(req);
          for (std::int32_t p : req) CHECK(t.sched.slot_of(p) >= 0);
        } catch (const injected_fault&) {
          check_unchanged(req, had, before);
        }
      }
    } else if (op <= 5 && windows.size() < 2) {  // a window of compute
      auto req = random_pages(1 + rng() % 6);
      const auto mode = static_cast<access>(rng() % 3);
      if (must_fail(req)) {
        CHECK_THROWS_AS(t.sched.acquire(t.compute, req, mode), oomb::out_of_memory);
        continue;
      }
      const auto before = t.sched.stats();
      const auto had = slots_of(req);
      std::vector<std::int32_t> s;
      try {
        s = t.sched.acquire(t.compute, req, mode);
      } catch (const injected_fault&) {
        check_unchanged(req, had, before);
        continue;
      }
      for (std::size_t i = 0; i < req.size(); ++i) {
        const std::int32_t p = req[i];
        auto& v = version[static_cast<std::size_t>(p)];
        ++pins[static_cast<std::size_t>(p)];
        if (mode == access::read) {
          t.check_on_compute(s[i], p, v);
        } else {
          t.update_on_compute(s[i], p, v, mode == access::overwrite);
          ++v;
        }
      }
      windows.push_back(req);
    } else if (op <= 7 && !windows.empty()) {  // the window's work is enqueued: release it
      const std::size_t w = rng() % windows.size();
      t.sched.release(t.compute, windows[w]);
      for (std::int32_t p : windows[w]) --pins[static_cast<std::size_t>(p)];
      windows.erase(windows.begin() + static_cast<std::ptrdiff_t>(w));
    } else if (op == 8) {  // write back or evict some unpinned pages
      auto req = random_pages(1 + rng() % 8);
      req.erase(std::remove_if(req.begin(), req.end(),
                               [&](std::int32_t p) { return pins[static_cast<std::size_t>(p)] > 0; }),
                req.end());
      const auto before = t.sched.stats();
      const auto had = slots_of(req);
      std::vector<page_state> states;
      for (std::int32_t p : req) states.push_back(t.sched.state(p) == page_state::near_dirty ? page_state::near_dirty : page_state::near);
      try {
        if (rng() % 2)
          t.sched.write_back(req);
        else
          t.sched.evict(req);
        for (std::int32_t p : req) CHECK(t.sched.state(p) != page_state::near_dirty);
      } catch (const injected_fault&) {
        check_unchanged(req, had, before);
        for (std::size_t i = 0; i < req.size(); ++i)  // still dirty: nothing reached home
          if (states[i] == page_state::near_dirty) CHECK(t.sched.state(req[i]) == page_state::near_dirty);
      }
    } else if (op == 9 && windows.empty()) {  // a chunk ends: its pages die and are reused
      auto req = random_pages(1 + rng() % 3);
      t.sched.discard(req);
      t.compute.synchronize();
      t.sched.drain();  // homes are written by the host below: every stream idle first
      for (std::int32_t p : req) {
        if (rng() % 2) {  // reused with fresh content written by the host
          version[static_cast<std::size_t>(p)] = 100 + static_cast<std::uint32_t>(step);
          t.stamp_home(p, version[static_cast<std::size_t>(p)]);
          t.sched.mark_written({p});
        } else {  // reused as a new page: zero-filled at first touch
          version[static_cast<std::size_t>(p)] = 0;
        }
      }
    }
    // Invariants after every operation.
    const auto st = t.sched.stats();
    CHECK(t.sched.free_slots() + st.resident + st.out_of_service == slots);
    std::set<std::int32_t> used;
    std::int32_t pinned_pages = 0;
    for (std::int32_t p = 0; p < pages; ++p) {
      const std::int32_t sl = t.sched.slot_of(p);
      if (pins[static_cast<std::size_t>(p)] > 0) {
        ++pinned_pages;
        CHECK(sl >= 0);  // pinned pages are never evicted
      }
      if (sl >= 0) {
        CHECK(used.insert(sl).second);  // one page per slot
        CHECK(t.sched.page_in(sl) == p);
      }
    }
    CHECK(static_cast<std::int32_t>(used.size()) == st.resident);
    CHECK(st.pinned == pinned_pages);
  }
  if (plan) plan->disarm();
  for (const auto& w : windows) t.sched.release(t.compute, w);
  t.sched.flush();
  t.settle();
  CHECK(t.bad.load() == 0);  // no reader ever saw a slot before its copy, fill or write landed
  // Nothing lost: every page with content has it at home.
  for (std::int32_t p = 0; p < pages; ++p) {
    const auto v = version[static_cast<std::size_t>(p)];
    if (v == 0 && !t.sched.home_written(p)) continue;  // never written: no content anywhere
    CHECK(t.sched.home_written(p));
    CHECK(has_content(t.home(p), t.bytes(), p, v));
    CHECK(t.sched.state(p) != page_state::near_dirty);
  }
  result.stats = t.sched.stats();
  return result;
}

}  // namespace oomb_test
