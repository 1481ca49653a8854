// oomb — the events each near slot and each home must be ordered after.
// SPDX-License-Identifier: Apache-2.0
//
// The residency scheduler's ordering lives here, apart from its bookkeeping (which page holds
// which slot) and its eviction policy. Per slot:
//   in          the copy or zero fill into the slot (readers and a write-back wait for it)
//   out         the write-back out of the slot (writers and a reuse wait for it): the point where
//               the batch has read the slot, which a staged write-back reaches before its home
//               is written (cuda_staged_page_transfer: the DMA, then the host's copy)
//   uses        compute work released on the slot (writers, a write-back and a reuse wait for it)
//   last_write  compute work that wrote it (readers on another compute stream wait for it)
// and per page, `home`: the write-back into its home (a copy from that home waits for it).
// A wait_list gathers the pending ones of a request, each once, and makes one stream wait on them.
// Ready events are dropped as they are met; wait_all() blocks until every one has completed (the
// scheduler's destructor: nothing may still write its near pool once it is freed).
// Queries cost: a CUDA event's ready() is a driver call (cudaEventQuery), and a request of a few
// hundred pages names the same few batch events hundreds of times. So a wait_list queries each
// distinct event once (it compares pointers first), and a slot's released uses are pruned only
// once a few have gathered. Querying on every mention cost the GPU trainer ~8 queries per page
// per call: 55 s of host time in a 126-second step at 2M tokens (docs/offload.md, "Host cost").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// Distinct pending events one stream is about to wait on.
template <class Event>
class wait_list {
 public:
  using event_ptr = std::shared_ptr<const Event>;

  void clear() noexcept {
    events_.clear();
    ready_.clear();
  }
  /// Lists `e` if it is pending; an event already met (pending or not) is not queried again.
  void add(const event_ptr& e) {
    if (!e) return;
    const Event* p = e.get();
    if (std::find(events_.begin(), events_.end(), p) != events_.end() ||
        std::find(ready_.begin(), ready_.end(), p) != ready_.end())
      return;
    (p->ready() ? ready_ : events_).push_back(p);
  }
  /// `stream` waits for every listed event (no host wait).
  template <class Stream>
  void apply(Stream& stream) const {
    for (const Event* e : events_) stream.wait(*e);
  }
  std::size_t size() const noexcept { return events_.size(); }

 private:
  std::vector<const Event*> events_;  // pending: waited for
  std::vector<const Event*> ready_;   // met complete: skipped without another query
};

/// The events of every slot of a near tier and of every home (see the file comment).
template <class Event>
class slot_hazards {
 public:
  using event_ptr = std::shared_ptr<const Event>;

  explicit slot_hazards(std::int32_t slots) : slots_(static_cast<std::size_t>(slots)) {}
  slot_hazards(slot_hazards&&) noexcept = default;
  slot_hazards& operator=(slot_hazards&&) noexcept = default;
  ~slot_hazards() { wait_all(); }

  /// Room for homes [0, pages).
  void reserve_pages(std::size_t pages) {
    if (homes_.size() < pages) homes_.resize(pages);
  }
  /// Room for one more use on each slot of `slots`, so used() cannot throw. A slot's completed
  /// uses are dropped once `prune_uses_at` have gathered (not at every release: see the file
  /// comment), so a slot holds fewer than that many completed uses.
  template <class Slots>
  void reserve_use(const Slots& slots) {
    for (std::int32_t s : slots) {
      std::vector<event_ptr>& u = at(s).uses;
      if (u.size() >= prune_uses_at) prune(u);
      u.reserve(u.size() + 1);
    }
  }
  static constexpr std::size_t prune_uses_at = 8;

  // What a stream must wait for before it ...
  /// ... reads the slot (compute read, or a write-back).
  void before_read(std::int32_t s, wait_list<Event>& w) const {
    w.add(at(s).in);
    w.add(at(s).last_write);
  }
  /// ... writes the slot in place (compute write or overwrite): also its write-back and readers.
  void before_write(std::int32_t s, wait_list<Event>& w) const {
    before_read(s, w);
    w.add(at(s).out);
    for (const event_ptr& u : at(s).uses) w.add(u);
  }
  /// ... copies the slot home: the content landed and compute is done with it.
  void before_write_back(std::int32_t s, wait_list<Event>& w) const {
    w.add(at(s).in);
    for (const event_ptr& u : at(s).uses) w.add(u);
  }
  /// ... copies from the home of `page`.
  void before_home_read(std::int32_t page, wait_list<Event>& w) const {
    if (static_cast<std::size_t>(page) < homes_.size()) w.add(homes_[static_cast<std::size_t>(page)]);
  }

  // What happened (noexcept: the scheduler commits with these).
  /// New content is (being) copied or filled into the slot after its earlier hazards.
  void loaded(std::int32_t s, const event_ptr& e) noexcept {
    rec& r = at(s);
    r.in = e;
    r.out.reset();  // the copy-in waited for these: waiting for `in` covers them
    r.uses.clear();
    r.last_write.reset();
  }
  /// Work of unknown extent may still write the slot (a failed batch): the slot is reused only
  /// after `e`.
  void fenced(std::int32_t s, const event_ptr& e) noexcept { at(s).in = e; }
  /// The slot was (is being) copied home into `page`'s home.
  /// `slot_read`: the batch has read the slot; `home_written`: its home holds the content (the
  /// same event unless the backend reports the first earlier).
  void written_back(std::int32_t s, std::int32_t page, const event_ptr& slot_read, const event_ptr& home_written) noexcept {
    rec& r = at(s);
    r.out = slot_read;
    r.uses.clear();  // the write-back waited for them
    homes_[static_cast<std::size_t>(page)] = home_written;
  }
  /// Compute work that used the slot was released (after reserve_use for this slot).
  void used(std::int32_t s, const event_ptr& e, bool wrote) noexcept {
    rec& r = at(s);
    if (r.uses.empty() || r.uses.back() != e) r.uses.push_back(e);
    if (wrote) r.last_write = e;
  }

  bool copy_in_pending(std::int32_t s) const { return pending(at(s).in); }
  bool write_back_pending(std::int32_t s) const { return pending(at(s).out); }
  bool home_write_pending(std::int32_t page) const {
    return static_cast<std::size_t>(page) < homes_.size() && pending(homes_[static_cast<std::size_t>(page)]);
  }

  /// Drops the events that completed.
  void prune_all() {
    for (rec& r : slots_) {
      prune_one(r.in);
      prune_one(r.out);
      prune_one(r.last_write);
      prune(r.uses);
    }
    for (event_ptr& h : homes_) prune_one(h);
  }

  /// Blocks until every event held has completed, dropping them; errors are swallowed (the
  /// streams report them). For destruction: nothing the streams do may outlive the near pool.
  void wait_all() noexcept {
    auto settle = [](event_ptr& e) noexcept {
      if (!e) return;
      try {
        e->wait();
      } catch (...) {
      }
      e.reset();
    };
    for (rec& r : slots_) {
      settle(r.in);
      settle(r.out);
      settle(r.last_write);
      for (event_ptr& u : r.uses) settle(u);
      r.uses.clear();
    }
    for (event_ptr& h : homes_) settle(h);
  }

 private:
  struct rec {
    event_ptr in, out, last_write;
    std::vector<event_ptr> uses;
  };
  static bool pending(const event_ptr& e) { return e && !e->ready(); }
  static void prune_one(event_ptr& e) {
    if (e && e->ready()) e.reset();
  }
  static void prune(std::vector<event_ptr>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const event_ptr& e) { return e->ready(); }), v.end());
  }
  rec& at(std::int32_t s) noexcept { return slots_[static_cast<std::size_t>(s)]; }
  const rec& at(std::int32_t s) const noexcept { return slots_[static_cast<std::size_t>(s)]; }

  std::vector<rec> slots_;
  std::vector<event_ptr> homes_;
};

OOMB_NAMESPACE_END
