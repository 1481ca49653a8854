// oomb — the residency scheduler: pages live in the far tier and stream through near-tier slots.
// SPDX-License-Identifier: Apache-2.0
//
// The residency model (docs/offload.md, "The residency scheduler"): every page's home is a block of
// the far pool (pinned host memory on the GPU, a host pool in CPU builds). The near tier is a fixed
// set of slots, one contiguous block_pool owned by the scheduler (device memory on the GPU), so
// kernels address slot s as near_pool().base() + s * page_bytes(). The near tier is a cache, never a
// second home. A slot is as large as a home, unless the backend converts (residency_backend.hpp:
// near_block_bytes, decode_pages, encode_pages): then homes hold a narrower encoding of the slots'
// pages (bf16 homes of fp32 slots), decoded on the way near and encoded on the way home. Pages are named by their far-pool ids. The scheduler composes four pieces, each in
// its own header and tested alone:
//   residency_backend.hpp  what a platform provides (streams, resources, fills, transfers)
//   residency_table.hpp    which slot holds which page; pins, dirtiness, id generations
//   slot_hazards.hpp       the events each slot and home must be ordered after
//   eviction_policy.hpp    which slot to reuse (lru_eviction; belady_eviction.hpp: known order)
//
// Event-ordering contract (never a host-blocking wait on the hot path; only stream waits):
//  1. prefetch(pages) enqueues, on the copy-in stream, one batch of copies home -> slot (adjacent
//     pages merged) and one zero fill per run of slots for pages with no home content yet, then
//     records one event E_in. Before that batch the copy-in stream waits for every hazard of the
//     reused slots (2, 3 below) and for in-flight write-backs into the homes it reads.
//  2. acquire(compute, pages, mode) makes the compute stream wait for E_in of every page before it
//     returns slot ids, so no work enqueued afterwards on `compute` can see a slot before its copy
//     landed. For write/overwrite access it also waits for the slot's write-back (WAR) and for the
//     earlier readers of a reused slot. The pages are pinned: not evictable.
//  3. release(compute, pages) records E_use on the compute stream after the work that used the
//     slots and unpins them. A slot is overwritten (reused for another page) only after its E_use
//     events, and read by a write-back only after them.
//  4. write_back(pages) / eviction of a dirty slot enqueue, on the copy-out stream (after the
//     slots' E_use), one batch slot -> home and record E_out. The slot may be reused only after
//     E_out; a later copy of that page from its home also waits for E_out.
//
// Compute streams: taken by value as views (Backend::compute_stream_type: host_stream_view,
// cuda_stream_view), so a temporary view of a framework's stream works. One compute stream at a
// time: while any page is pinned, acquire and release must name the stream the pins were taken on
// (another one is invalid_argument: its work could not be ordered against work still unreleased);
// once nothing is pinned, the next acquire may name any stream (its waits on the release events
// order it after the earlier stream's work).
//
// Exception safety (docs/offload.md, "Errors"): every call validates its whole input first and
// throws before enqueuing anything, leaving the scheduler unchanged. A throw from the backend or a
// stream after that (a failed transfer, fill, event) leaves: for prefetch/acquire, every page asked
// for in the state it had (nothing pinned, no slot given); dirty victims may have been written back
// (clean now) and the victims chosen for the batch may be far now, their slots fenced behind the
// failed work (or, if not even a fence could be recorded, out of service until drain()); for
// release, write_back, flush and evict, nothing changed (a failed write-back may have written part
// of a dirty page's stale home, which nothing reads). No page is ever served another page's bytes.
//
// Far ids are checked against the far pool's generation (block_pool::generation): a page whose id
// was released from the far pool (and perhaps handed out again) is dead, its slot is dropped
// without a write-back at the next call that meets it. discard() stays for pages whose content dies
// while their id lives on.
//
// Lifetime: the destructor blocks until every event it holds has completed (copies, fills and
// write-backs into and out of its near pool, released compute work), then frees the near pool.
// Work of pages acquired and never released is the caller's to finish first.
//
// Thread safety: not internally synchronised; drive a scheduler from one host thread (the streams
// themselves run concurrently). The far pool may be used by other code between calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/offload/eviction_policy.hpp"
#include "oomb/offload/event_pool.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/residency_backend.hpp"
#include "oomb/offload/residency_table.hpp"
#include "oomb/offload/slot_hazards.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// Counters of a residency_scheduler. Bytes and copies count what was enqueued.
struct residency_stats {
  std::uint64_t bytes_to_near = 0;   ///< home -> slot (bytes of the homes' encoding)
  std::uint64_t bytes_to_far = 0;    ///< slot -> home (bytes of the homes' encoding)
  std::uint64_t copies_to_near = 0;  ///< copies after merging adjacent pages
  std::uint64_t copies_to_far = 0;
  std::uint64_t zero_fills = 0;      ///< pages zero-filled at first touch
  std::uint64_t hits = 0;            ///< pages asked (prefetch or acquire) that already had a slot
  std::uint64_t misses = 0;          ///< pages asked that needed a slot
  std::uint64_t acquire_misses = 0;  ///< of which at a read/write acquire: a copy not prefetched
  std::uint64_t evictions = 0;       ///< slots taken from one page for another, or by evict()
  std::uint64_t write_backs = 0;     ///< pages copied home (dirty pages only)
  std::int32_t capacity = 0;         ///< slots of the near tier
  std::int32_t resident = 0;         ///< slots holding a page (any state but far)
  std::int32_t dirty = 0;            ///< of which near_dirty
  std::int32_t pinned = 0;           ///< of which acquired by compute and not yet released
  std::int32_t out_of_service = 0;   ///< slots held back after a failed batch, until drain()
};

/// Streams pages of a far pool through a fixed set of near slots (see the file comment). Eviction
/// is a policy: lru_eviction (the default) or belady_eviction (a declared future order).
template <class Backend, class Eviction = lru_eviction>
class residency_scheduler {
  static_assert(is_residency_backend_v<Backend>, "residency_scheduler needs a residency backend");
  static_assert(is_eviction_policy_v<Eviction>, "residency_scheduler needs an eviction policy");
  static_assert(!detail::has_backend_near_block_bytes<Backend>::value || detail::has_backend_codec<Backend>::value,
                "a backend whose slots differ from its homes (near_block_bytes) must convert both ways: "
                "decode_pages (home -> slot) and encode_pages (slot -> home)");

 public:
  using backend_type = Backend;
  using eviction_type = Eviction;
  using stream_type = typename Backend::stream_type;
  using compute_stream_type = typename Backend::compute_stream_type;
  using event_type = typename stream_type::event_type;
  using near_resource = typename Backend::near_resource;
  using far_resource = typename Backend::far_resource;
  using near_pool_type = block_pool<near_resource>;
  using far_pool_type = block_pool<far_resource>;

  /// `slots` near slots of far.block_bytes() each (a converting backend's near_block_bytes of
  /// it), one contiguous range from `near_memory`.
  /// Copies home -> slot run on `copy_in`, write-backs on `copy_out` (two streams, so the two
  /// directions overlap). The pools, resource and streams must outlive the scheduler. The
  /// backend's prepare() (if any) allocates its transfer staging now, not on the first batch.
  residency_scheduler(far_pool_type& far, near_resource& near_memory, std::int32_t slots,
                      stream_type& copy_in, stream_type& copy_out, Backend backend = Backend{},
                      std::size_t alignment = 256)
      : far_(&far),
        near_(near_pool_type::contiguous(near_memory, slot_bytes(backend, far.block_bytes()), checked_slots(slots),
                                         alignment)),
        copy_in_(&copy_in),
        copy_out_(&copy_out),
        backend_(std::move(backend)),
        table_(slots),
        eviction_(slots),
        hazards_(slots) {
    OOMB_EXPECTS(&copy_in != &copy_out,
                 "residency_scheduler: copy_in and copy_out must be two different streams");
    for (auto* v : {&distinct_, &victims_, &dirty_victims_, &targets_, &fresh_, &load_slots_, &load_homes_,
                    &zero_slots_, &wb_slots_, &wb_homes_, &quarantine_})
      v->reserve(static_cast<std::size_t>(slots));
    if constexpr (detail::has_backend_prepare<Backend>::value) backend_.prepare(near_, far);
  }

  residency_scheduler(const residency_scheduler&) = delete;
  residency_scheduler& operator=(const residency_scheduler&) = delete;
  residency_scheduler(residency_scheduler&&) noexcept = default;
  residency_scheduler& operator=(residency_scheduler&&) = delete;  // would free a near pool in use
  /// Blocks until the copies, fills, write-backs and released compute work it knows of are done,
  /// then frees the near pool (see the file comment, "Lifetime").
  ~residency_scheduler() {
    hazards_.wait_all();
    if (!quarantine_.empty()) {  // failed work without a fence: wait for the copy-in stream itself
      try {
        copy_in_->record().wait();
      } catch (...) {
      }
    }
  }

  /// Declares the pages needed next, in compute order: starts their copies (or zero fills) on the
  /// copy-in stream; pages already near are touched. Victims come from the eviction policy among
  /// unpinned slots; a dirty victim is written back first. Throws out_of_memory (nothing
  /// enqueued) when the distinct pages exceed the near tier or what can be freed,
  /// invalid_argument for ids not in use in the far pool.
  void prefetch(id_span pages) {
    residency_range<Backend> range(backend_, "oomb::residency::prefetch");
    bring_near(pages, access::read, "prefetch", nullptr, nullptr);
  }

  /// Slots for `pages` (slots_out[i] for pages[i]), for work the caller enqueues next on
  /// `compute`: the compute stream is first made to wait for the pages' copies (never the host).
  /// Pages not prefetched are brought near now (counted in acquire_misses). The pages stay pinned
  /// until release(); with write or overwrite access they become near_dirty. While pages are
  /// pinned, `compute` must be the stream they were pinned on (invalid_argument otherwise).
  void acquire(compute_stream_type compute, id_span pages, access mode, std::int32_t* slots_out) {
    OOMB_EXPECTS(slots_out != nullptr || pages.empty(), "residency_scheduler::acquire: null slots_out");
    check_compute(compute, "acquire");
    residency_range<Backend> range(backend_, "oomb::residency::acquire");
    bring_near(pages, mode, "acquire", &compute, slots_out);
  }

  /// As above, returning the slots.
  std::vector<std::int32_t> acquire(compute_stream_type compute, id_span pages, access mode = access::read) {
    std::vector<std::int32_t> out(pages.size());
    acquire(compute, pages, mode, out.data());
    return out;
  }

  /// The work using `pages` (as acquired, one release per acquire entry) has been enqueued on
  /// `compute` (the stream they were acquired on): records the event after which their slots may
  /// be overwritten or written back, and unpins them. Throws invalid_argument (nothing changed)
  /// for a page that is not pinned or another stream; a failed record changes nothing either.
  void release(compute_stream_type compute, id_span pages) {
    validate(pages, "release");
    check_compute(compute, "release");
    ++epoch_;
    wb_slots_.clear();
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const auto& p = table_.page(pages[i]);
      OOMB_EXPECTS(p.slot >= 0, "residency_scheduler::release: page ", pages[i], " (entry ", i,
                   ") is not near, so it was never acquired");
      auto& s = table_.slot(p.slot);
      if (s.mark != epoch_) {
        s.mark = epoch_;
        s.count = 0;
        wb_slots_.push_back(p.slot);
      }
      ++s.count;
      OOMB_EXPECTS(s.count <= s.pins, "residency_scheduler::release: page ", pages[i], " (entry ", i,
                   ") released more often than acquired (", s.pins, " pins)");
    }
    if (pages.empty()) return;
    residency_range<Backend> range(backend_, "oomb::residency::release");
    hazards_.reserve_use(wb_slots_);
    const event_ptr used = events_.record(compute);
    // --- no throw from here on ---
    for (std::int32_t id : pages) {
      auto& s = table_.slot(table_.page(id).slot);
      --s.pins;
      hazards_.used(table_.page(id).slot, used, s.dirty);  // dirty: readers elsewhere wait for it
    }
    pinned_entries_ -= static_cast<std::int64_t>(pages.size());
    if (pinned_entries_ == 0) pinned_on_.reset();
  }

  /// Copies the dirty ones of `pages` home, as one batch on the copy-out stream; clean or far
  /// pages are skipped (so K/V produced near reach home exactly once). Throws invalid_argument
  /// (nothing enqueued) for a dirty page still pinned by compute: release it first.
  /// Returns the number of pages written back.
  std::size_t write_back(id_span pages) {
    validate(pages, "write_back");
    ++epoch_;
    victims_.clear();
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t sid = table_.page(pages[i]).slot;
      if (sid < 0) continue;
      auto& s = table_.slot(sid);
      if (!s.dirty || s.mark == epoch_) continue;
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::write_back: page ", pages[i], " (entry ", i,
                   ") is dirty and still acquired by compute (", s.pins, " pins): release it first");
      s.mark = epoch_;
      victims_.push_back(sid);
    }
    residency_range<Backend> range(backend_, "oomb::residency::write_back");
    write_back_slots(victims_);
    return victims_.size();
  }

  /// write_back() of every dirty page (pages of released far ids are dead: skipped); throws
  /// (nothing enqueued) if one is still pinned.
  std::size_t flush() {
    victims_.clear();
    for (std::int32_t sid = 0; sid < capacity(); ++sid) {
      const auto& s = table_.slot(sid);
      if (s.page < 0 || !s.dirty || !live(s.page)) continue;
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::flush: page ", s.page,
                   " is dirty and still acquired by compute (", s.pins, " pins): release it first");
      victims_.push_back(sid);
    }
    residency_range<Backend> range(backend_, "oomb::residency::flush");
    write_back_slots(victims_);
    return victims_.size();
  }

  /// Makes `pages` far now: dirty ones are written back first (one batch), then their slots are
  /// freed (reused only after that write-back and after their readers). Far pages are skipped.
  /// Throws invalid_argument (nothing changed) for a pinned page; a failed write-back changes
  /// nothing.
  void evict(id_span pages) {
    validate(pages, "evict");
    ++epoch_;
    victims_.clear();
    dirty_victims_.clear();
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t sid = table_.page(pages[i]).slot;
      if (sid < 0) continue;
      auto& s = table_.slot(sid);
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::evict: page ", pages[i], " (entry ", i,
                   ") is acquired by compute (", s.pins, " pins)");
      if (s.mark == epoch_) continue;
      s.mark = epoch_;
      victims_.push_back(sid);
      if (s.dirty) dirty_victims_.push_back(sid);
    }
    residency_range<Backend> range(backend_, "oomb::residency::evict");
    write_back_slots(dirty_victims_);
    for (std::int32_t sid : victims_) {
      free_slot(sid);
      ++stats_.evictions;
    }
  }

  /// Forgets `pages`: their content is dead (chunk finished), dirty or not; nothing is written
  /// back. Releasing a far id from the far pool does this by itself (generations); discard() is
  /// for ids that live on with new content. Slots return to the free list (reused only after their
  /// pending events). Throws invalid_argument (nothing changed) for a pinned page.
  void discard(id_span pages) {
    validate(pages, "discard");
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t sid = table_.page(pages[i]).slot;
      if (sid >= 0)
        OOMB_EXPECTS(table_.slot(sid).pins == 0, "residency_scheduler::discard: page ", pages[i], " (entry ", i,
                     ") is acquired by compute");
    }
    for (std::int32_t id : pages) {
      auto& p = table_.page(id);
      if (p.slot >= 0) free_slot(p.slot);
      p.home_valid = false;  // a later page with this id starts empty (the home's event still orders it)
    }
  }

  /// Declares that the homes of `pages` were written outside the scheduler (e.g. by host code), so
  /// prefetch copies them instead of zero-filling. Throws invalid_argument for a page that has a
  /// slot (its slot would be stale: discard it first).
  void mark_written(id_span pages) {
    validate(pages, "mark_written");
    for (std::size_t i = 0; i < pages.size(); ++i)
      OOMB_EXPECTS(table_.page(pages[i]).slot < 0, "residency_scheduler::mark_written: page ", pages[i],
                   " (entry ", i, ") has a slot; discard it before writing its home");
    for (std::int32_t id : pages) table_.page(id).home_valid = true;
  }

  /// Blocks the host until every copy, fill and write-back enqueued so far has completed (the edge
  /// of a step: before the host reads or writes homes directly). Rethrows a stream's error. Slots
  /// taken out of service by a failed batch return to the free list.
  void drain() {
    residency_range<Backend> range(backend_, "oomb::residency::drain");
    const event_ptr in = events_.record(*copy_in_);
    const event_ptr out = events_.record(*copy_out_);
    in->wait();
    out->wait();
    hazards_.prune_all();
    for (std::int32_t sid : quarantine_) near_.release(sid);
    quarantine_.clear();
  }

  /// State of page `id` (events are polled, never waited for).
  page_state state(std::int32_t id) const {
    check_id(id, "state");
    const std::int32_t sid = slot_of(id);
    if (sid < 0) return page_state::far;
    if (hazards_.copy_in_pending(sid)) return page_state::to_near;
    if (table_.slot(sid).dirty) return page_state::near_dirty;
    if (hazards_.write_back_pending(sid) || hazards_.home_write_pending(id)) return page_state::to_far;
    return page_state::near;
  }

  /// Slot of page `id`, or -1 when it is far.
  std::int32_t slot_of(std::int32_t id) const {
    check_id(id, "slot_of");
    return table_.knows(id) && live(id) ? table_.page(id).slot : -1;
  }

  /// Page held by slot `slot`, or -1 when the slot holds none (or a dead page).
  std::int32_t page_in(std::int32_t slot) const {
    OOMB_EXPECTS(slot >= 0 && slot < capacity(), "residency_scheduler::page_in: slot ", slot,
                 " out of range [0, ", capacity(), ")");
    const std::int32_t id = table_.slot(slot).page;
    return id >= 0 && live(id) ? id : -1;
  }

  /// True when the home of `id` holds (or will, once its write-back lands) the page's content.
  bool home_written(std::int32_t id) const {
    check_id(id, "home_written");
    return table_.knows(id) && live(id) && table_.page(id).home_valid;
  }

  residency_stats stats() const {
    residency_stats r = stats_;
    r.capacity = capacity();
    r.out_of_service = static_cast<std::int32_t>(quarantine_.size());
    r.resident = near_.in_use() - r.out_of_service;
    for (std::int32_t sid = 0; sid < capacity(); ++sid) {
      const auto& s = table_.slot(sid);
      if (s.page < 0) continue;
      r.dirty += s.dirty && live(s.page) ? 1 : 0;
      r.pinned += s.pins > 0 ? 1 : 0;
    }
    return r;
  }

  std::int32_t capacity() const noexcept { return near_.capacity(); }
  /// Slots holding no page.
  std::int32_t free_slots() const noexcept { return near_.available(); }
  std::size_t page_bytes() const noexcept { return near_.block_bytes(); }
  /// The near tier: slot s is at near_pool().base() + s * page_bytes().
  const near_pool_type& near_pool() const noexcept { return near_; }
  const far_pool_type& far_pool() const noexcept { return *far_; }
  stream_type& copy_in_stream() const noexcept { return *copy_in_; }
  stream_type& copy_out_stream() const noexcept { return *copy_out_; }
  Backend& backend() noexcept { return backend_; }
  /// The eviction policy (belady_eviction: declare the order with eviction().expect(pages)).
  Eviction& eviction() noexcept { return eviction_; }
  /// Events the scheduler created so far (the rest were reused; host streams always create).
  std::size_t events_created() const { return events_.created(); }

 private:
  using event_ptr = std::shared_ptr<const event_type>;

  static std::size_t slot_bytes(const Backend& backend, std::size_t far_block_bytes) {
    if constexpr (detail::has_backend_near_block_bytes<Backend>::value)
      return backend.near_block_bytes(far_block_bytes);
    else
      return far_block_bytes;
  }

  static std::int32_t checked_slots(std::int32_t slots) {
    OOMB_EXPECTS(slots > 0, "residency_scheduler: the near tier needs at least one slot, got ", slots);
    return slots;
  }

  void check_id(std::int32_t id, const char* who) const {
    OOMB_EXPECTS(far_->owns(id), "residency_scheduler::", who, ": page ", id,
                 " is not in use in the far pool (reserved ", far_->reserved(), ")");
  }

  void check_compute(compute_stream_type compute, const char* who) const {
    OOMB_EXPECTS(!pinned_on_ || *pinned_on_ == compute, "residency_scheduler::", who,
                 ": another compute stream than the one ", pinned_entries_,
                 " page entries are pinned on; one compute stream at a time: release them first");
  }

  // The record of `id` describes the page the far pool now hands out under that id.
  bool live(std::int32_t id) const noexcept {
    return far_->owns(id) && table_.page(id).generation == far_->generation(id);
  }

  // Checks every id and forgets the records of ids released from the far pool since (dead pages:
  // dropped without a write-back). Forgetting is invisible: nothing observable changes.
  void validate(id_span pages, const char* who) {
    OOMB_EXPECTS(pages.data() != nullptr || pages.empty(), "residency_scheduler::", who,
                 ": null page list of ", pages.size(), " entries");
    for (std::size_t i = 0; i < pages.size(); ++i)
      OOMB_EXPECTS(far_->owns(pages[i]), "residency_scheduler::", who, ": page ", pages[i], " (entry ", i,
                   ") is not in use in the far pool (reserved ", far_->reserved(), ")");
    table_.reserve_pages(static_cast<std::size_t>(far_->reserved()));
    hazards_.reserve_pages(static_cast<std::size_t>(far_->reserved()));
    for (std::size_t i = 0; i < pages.size(); ++i) {
      auto& p = table_.page(pages[i]);
      const std::uint32_t g = far_->generation(pages[i]);
      if (p.generation == g) continue;
      OOMB_EXPECTS(p.slot < 0 || table_.slot(p.slot).pins == 0, "residency_scheduler::", who, ": page ",
                   pages[i], " (entry ", i, ") was released from the far pool while acquired by compute");
      if (p.slot >= 0) free_slot(p.slot);
      p.home_valid = false;
      p.generation = g;
    }
  }

  // Unlinks a slot from its page and returns it to the free list (it keeps its events: hazards for
  // its next user).
  void free_slot(std::int32_t sid) noexcept {
    eviction_.on_remove(sid);
    table_.detach(sid);
    near_.release(sid);
  }

  victim_kind kind_of(std::int32_t sid) const noexcept {
    const auto& s = table_.slot(sid);
    if (s.page < 0 || s.pins > 0 || s.mark == epoch_) return victim_kind::no;
    return s.dirty && live(s.page) ? victim_kind::dirty : victim_kind::clean;
  }

  // Gives every distinct page of `pages` a slot: plan (validate, victims, target slots), enqueue
  // (write-backs of dirty victims, copies and fills, compute waits), then commit the bookkeeping,
  // which cannot throw. A throw while enqueuing undoes the plan (see the file comment).
  void bring_near(id_span pages, access mode, const char* who, const compute_stream_type* compute,
                  std::int32_t* slots_out) {
    validate(pages, who);
    ++epoch_;
    distinct_.clear();
    for (std::int32_t id : pages) {
      auto& p = table_.page(id);
      if (p.mark == epoch_) continue;
      p.mark = epoch_;
      distinct_.push_back(id);
    }
    OOMB_CHECK(static_cast<std::int64_t>(distinct_.size()) <= capacity(), out_of_memory,
               "residency_scheduler::", who, ": asked for ", distinct_.size(),
               " pages at once, the near tier holds ", capacity(), " slots");
    std::int32_t missing = 0;
    for (std::int32_t id : distinct_) {
      const std::int32_t sid = table_.page(id).slot;
      if (sid >= 0)
        table_.slot(sid).mark = epoch_;  // claimed: not a victim
      else
        ++missing;
    }
    const std::int32_t free_now = near_.available();
    std::int32_t evictable = 0, pinned = 0;
    for (std::int32_t sid = 0; sid < capacity(); ++sid) {
      const auto& s = table_.slot(sid);
      if (s.page < 0) continue;
      if (s.pins > 0)
        ++pinned;
      else if (s.mark != epoch_)
        ++evictable;
    }
    OOMB_CHECK(missing <= free_now + evictable, out_of_memory, "residency_scheduler::", who, ": ",
               missing, " pages need a slot but only ", free_now + evictable, " of the ", capacity(),
               " slots can be freed (", pinned, " pinned by compute, ",
               static_cast<std::int64_t>(distinct_.size()) - missing, " held for this request",
               quarantine_.empty() ? "" : ", some out of service after a failed batch", ")");

    victims_.clear();
    dirty_victims_.clear();
    const std::int32_t need = std::max(0, missing - free_now);
    if (need > 0) eviction_.choose(need, [this](std::int32_t sid) { return kind_of(sid); }, victims_);
    OOMB_CHECK(static_cast<std::int32_t>(victims_.size()) == need, invalid_argument,
               "residency_scheduler::", who, ": the eviction policy chose ", victims_.size(),
               " victims, ", need, " were needed");
    for (std::int32_t sid : victims_)
      if (kind_of(sid) == victim_kind::dirty) dirty_victims_.push_back(sid);

    // Target slots of the misses: the victims, then free slots (taken now, given back on a throw).
    targets_.assign(distinct_.size(), -1);
    fresh_.clear();
    {
      std::size_t v = 0;
      for (std::size_t i = 0; i < distinct_.size(); ++i) {
        if (table_.page(distinct_[i]).slot >= 0) continue;
        if (v < victims_.size()) {
          targets_[i] = victims_[v++];
        } else {
          targets_[i] = near_.acquire();  // checked above: never throws
          fresh_.push_back(targets_[i]);
        }
      }
    }

    // --- enqueue ---
    try {
      write_back_slots(dirty_victims_);  // commits itself: the victims are clean from here on
    } catch (...) {
      for (std::int32_t sid : fresh_) near_.release(sid);
      throw;
    }
    event_ptr loaded;
    bool touched = false;  // work was enqueued that may write the target slots
    try {
      load_slots_.clear();
      load_homes_.clear();
      zero_slots_.clear();
      if (mode != access::overwrite)
        for (std::size_t i = 0; i < distinct_.size(); ++i) {
          if (targets_[i] < 0) continue;
          if (table_.page(distinct_[i]).home_valid) {
            load_slots_.push_back(targets_[i]);
            load_homes_.push_back(distinct_[i]);
          } else {
            zero_slots_.push_back(targets_[i]);
          }
        }
      if (!load_slots_.empty() || !zero_slots_.empty()) loaded = enqueue_loads(touched);
      if (compute) {
        waits_.clear();
        for (std::size_t i = 0; i < distinct_.size(); ++i) {
          const std::int32_t sid = targets_[i] >= 0 ? targets_[i] : table_.page(distinct_[i]).slot;
          if (targets_[i] >= 0 && mode != access::overwrite)
            waits_.add(loaded);  // the copy-in waited for the slot's earlier hazards
          else if (mode == access::read)
            hazards_.before_read(sid, waits_);
          else
            hazards_.before_write(sid, waits_);
        }
        waits_.apply(*compute);
      }
    } catch (...) {
      abandon_targets(loaded, touched);
      throw;
    }

    // --- commit: no throw from here on ---
    stats_.hits += distinct_.size() - static_cast<std::size_t>(missing);
    stats_.misses += static_cast<std::size_t>(missing);
    if (compute && mode != access::overwrite) stats_.acquire_misses += static_cast<std::size_t>(missing);
    stats_.zero_fills += zero_slots_.size();
    eviction_.on_request(distinct_);
    for (std::int32_t sid : victims_) {
      eviction_.on_remove(sid);
      table_.detach(sid);
      ++stats_.evictions;
    }
    for (std::size_t i = 0; i < distinct_.size(); ++i) {
      const std::int32_t id = distinct_[i], sid = targets_[i];
      if (sid < 0) {
        eviction_.on_hit(table_.page(id).slot, id);
        continue;
      }
      table_.attach(sid, id);
      eviction_.on_insert(sid, id);
      if (loaded) hazards_.loaded(sid, loaded);
    }
    if (!compute) return;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t sid = table_.page(pages[i]).slot;
      auto& s = table_.slot(sid);
      ++s.pins;
      if (mode != access::read) s.dirty = true;
      slots_out[i] = sid;
    }
    pinned_entries_ += static_cast<std::int64_t>(pages.size());
    if (!pages.empty()) pinned_on_ = *compute;
  }

  // The copy-in stream waits for the target slots' hazards and for write-backs into the homes it
  // reads; then one batch of copies, the zero fills (one per run of slots), and one event.
  event_ptr enqueue_loads(bool& touched) {
    waits_.clear();
    for (std::int32_t sid : load_slots_) hazards_.before_write(sid, waits_);
    for (std::int32_t sid : zero_slots_) hazards_.before_write(sid, waits_);
    for (std::int32_t id : load_homes_) hazards_.before_home_read(id, waits_);
    waits_.apply(*copy_in_);
    touched = true;
    transfer_report moved{};
    if (!load_slots_.empty()) moved = to_near(load_slots_, load_homes_);
    if (!zero_slots_.empty()) {
      std::sort(zero_slots_.begin(), zero_slots_.end());
      const std::size_t bb = near_.block_bytes();
      for (std::size_t i = 0; i < zero_slots_.size();) {
        std::size_t j = i + 1;
        while (j < zero_slots_.size() && zero_slots_[j] == zero_slots_[j - 1] + 1) ++j;
        backend_.zero_fill(*copy_in_, near_.address(zero_slots_[i]), (j - i) * bb);
        i = j;
      }
    }
    event_ptr e = events_.record(*copy_in_);
    stats_.bytes_to_near += moved.bytes;
    stats_.copies_to_near += moved.copies;
    return e;
  }

  // A batch failed after work that may write its target slots was enqueued: the victims lose their
  // pages (clean: written back first, or content at home / dead), and every target slot is reused
  // only after a fence behind that work, or kept out of service until drain() when even the fence
  // cannot be recorded. The pages asked for stay as they were.
  void abandon_targets(event_ptr fence, bool touched) noexcept {
    if (!touched) {
      for (std::int32_t sid : fresh_) near_.release(sid);
      return;
    }
    if (!fence) {
      try {
        fence = events_.record(*copy_in_);
      } catch (...) {
      }
    }
    for (std::int32_t sid : targets_) {
      if (sid < 0) continue;
      if (table_.slot(sid).page >= 0) {  // a victim
        eviction_.on_remove(sid);
        table_.detach(sid);
        ++stats_.evictions;
      }
      if (fence) {
        hazards_.fenced(sid, fence);
        near_.release(sid);
      } else {
        quarantine_.push_back(sid);  // reserved for every slot: no throw
      }
    }
  }

  // One batch home -> slot on the copy-in stream, and slot -> home on the copy-out stream: decoded
  // and encoded by a converting backend, else copied.
  transfer_report to_near(id_span slots, id_span homes) {
    if constexpr (detail::has_backend_codec<Backend>::value)
      return backend_.decode_pages(*copy_in_, near_, slots, *far_, homes);
    else
      return move_pages(*copy_in_, near_, slots, *far_, homes);
  }
  // `slots_read`: an event on the copy-out stream after which the slots may be reused, when the
  // backend reports that point before the homes are written (else it stays empty).
  transfer_report to_far(id_span homes, id_span slots, event_ptr& slots_read) {
    if constexpr (detail::has_backend_codec<Backend>::value) {
      return backend_.encode_pages(*copy_out_, *far_, homes, near_, slots);
    } else if constexpr (detail::has_backend_sources_read<Backend, far_resource, near_resource>::value) {
      struct recorder {
        event_pool<event_type>* events;
        stream_type* stream;
        event_ptr* out;
      } rec{&events_, copy_out_, &slots_read};
      const sources_read_hook read{[](void* p) {
                                     auto* r = static_cast<recorder*>(p);
                                     *r->out = r->events->record(*r->stream);
                                   },
                                   &rec};
      return backend_.transfer(*copy_out_, *far_, homes, near_, slots, read);
    } else {
      return move_pages(*copy_out_, *far_, homes, near_, slots);
    }
  }

  // One batch of page copies: through the backend when it says how, else one enqueue_copies.
  template <class D, class S>
  transfer_report move_pages(stream_type& stream, block_pool<D>& dst, id_span dst_ids, const block_pool<S>& src,
                             id_span src_ids) {
    if constexpr (detail::has_backend_transfer<Backend, D, S>::value) {
      return backend_.transfer(stream, dst, dst_ids, src, src_ids);
    } else {
      page_transfer<D, S> t(dst, src);
      return t.enqueue(stream, dst_ids, src_ids);
    }
  }

  // One batch slot -> home on the copy-out stream, after the slots' compute uses. On a throw
  // nothing is committed (the pages stay dirty; a partial copy only touched their stale homes).
  void write_back_slots(const std::vector<std::int32_t>& sids) {
    if (sids.empty()) return;
    waits_.clear();
    wb_slots_.clear();
    wb_homes_.clear();
    for (std::int32_t sid : sids) {
      hazards_.before_write_back(sid, waits_);
      wb_slots_.push_back(sid);
      wb_homes_.push_back(table_.slot(sid).page);
    }
    waits_.apply(*copy_out_);
    event_ptr slots_read;  // set where the backend says the slots have been read (else: `written`)
    const transfer_report r = to_far(wb_homes_, wb_slots_, slots_read);
    const event_ptr written = events_.record(*copy_out_);
    for (std::int32_t sid : sids) {
      auto& s = table_.slot(sid);
      s.dirty = false;
      hazards_.written_back(sid, s.page, slots_read ? slots_read : written, written);
      table_.page(s.page).home_valid = true;
    }
    stats_.write_backs += sids.size();
    stats_.bytes_to_far += r.bytes;
    stats_.copies_to_far += r.copies;
  }

  far_pool_type* far_;
  near_pool_type near_;
  stream_type* copy_in_;
  stream_type* copy_out_;
  Backend backend_;
  residency_table table_;
  Eviction eviction_;
  slot_hazards<event_type> hazards_;  // after near_: waited for (and destroyed) before it is freed
  event_pool<event_type> events_;
  std::optional<compute_stream_type> pinned_on_;  // the stream of the pins, while any exist
  std::int64_t pinned_entries_ = 0;
  std::uint64_t epoch_ = 0;
  residency_stats stats_;
  // Scratch reused between calls (no allocation in a steady state).
  std::vector<std::int32_t> distinct_, victims_, dirty_victims_, targets_, fresh_, load_slots_, load_homes_,
      zero_slots_, wb_slots_, wb_homes_, quarantine_;
  wait_list<event_type> waits_;
};

OOMB_NAMESPACE_END
