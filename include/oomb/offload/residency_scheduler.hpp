// oomb — the residency scheduler: pages live in the far tier and stream through near-tier slots.
// SPDX-License-Identifier: Apache-2.0
//
// The residency model (docs/offload.md, DESIGN "Residency model"): every page's home is a block of
// the far pool (pinned host memory on the GPU, a host pool in CPU builds). The near tier is a fixed
// set of slots, one contiguous block_pool owned by the scheduler (device memory on the GPU), so
// kernels address slot s as near_pool().base() + s * block_bytes. The near tier is a cache, never a
// second home. Pages are named by their far-pool ids; the scheduler tracks, per page,
//   far         no slot (its content, if any, is at home)
//   to_near     a slot whose copy from home (or zero fill) is in flight
//   near        a clean slot: same content as home
//   near_dirty  a slot the compute side wrote (gradient accumulated, K/V produced): home is stale
//   to_far      a clean slot whose write-back to home is in flight
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
// K/V produced in a slot (acquire(..., access::overwrite), then release) are dirty: write_back
// copies them home exactly once; a clean page is never copied home again (evicting a clean slot
// costs nothing). Gradient pages with no home content are zero-filled in the slot at first touch
// (Backend::zero_fill: a host memset here, cudaMemsetAsync on the GPU) and accumulate there.
//
// Errors: every call validates its whole input first (ids in use in the far pool, pins, capacity)
// and throws before enqueuing anything, leaving the scheduler unchanged: invalid_argument for bad
// ids or pin misuse, out_of_memory when more distinct pages are asked at once than the near tier
// holds, or than can be freed (pinned slots), naming both numbers. A stream call that throws after
// validation (allocation failure) leaves a consistent but possibly partly enqueued state.
//
// Thread safety: not internally synchronised; drive a scheduler from one host thread (the streams
// themselves run concurrently). The far pool may be used by other code between calls, but a
// page's far id must be discard()ed here before it is released from the far pool.
//
// Backend (a policy the CUDA side swaps, so the trainer changes types, not logic):
//   using stream_type   = ...;  // is_stream_v; events must be movable
//   using near_resource = ...;  // memory resource of the slots
//   using far_resource  = ...;  // memory resource of the homes
//   void zero_fill(stream_type&, void* dst, std::size_t bytes);  // enqueue a fill with zero bytes
// and optionally, how a batch of pages moves (the CUDA backend picks copy engines or its gather
// kernel per batch); without it a page_transfer enqueues one enqueue_copies batch:
//   transfer_report transfer(stream_type&, block_pool<D>& dst, id_span dst_ids,
//                            const block_pool<S>& src, id_span src_ids);  // D, S: near/far resources
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// Where a page is, as seen by the scheduler (see the file comment).
enum class page_state : std::uint8_t { far, to_near, near, near_dirty, to_far };

constexpr const char* to_string(page_state s) noexcept {
  switch (s) {
    case page_state::far: return "far";
    case page_state::to_near: return "to_near";
    case page_state::near: return "near";
    case page_state::near_dirty: return "near_dirty";
    case page_state::to_far: return "to_far";
  }
  return "unknown";
}

/// What the compute side does with the slots it acquires.
enum class access : std::uint8_t {
  read,       ///< reads only; the page stays clean
  write,      ///< reads and writes (gradient accumulation): content brought near, page dirty
  overwrite,  ///< writes every byte (K/V produced): no copy, no fill for a miss; page dirty
};

/// Counters of a residency_scheduler. Bytes and copies count what was enqueued.
struct residency_stats {
  std::uint64_t bytes_to_near = 0;   ///< home -> slot
  std::uint64_t bytes_to_far = 0;    ///< slot -> home
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
};

namespace detail {
template <class B, class = void>
struct is_residency_backend : std::false_type {};
template <class B>
struct is_residency_backend<
    B, std::void_t<typename B::stream_type, typename B::near_resource, typename B::far_resource,
                   decltype(std::declval<B&>().zero_fill(std::declval<typename B::stream_type&>(),
                                                         static_cast<void*>(nullptr), std::size_t{}))>>
    : std::bool_constant<is_stream_v<typename B::stream_type> &&
                         is_memory_resource_v<typename B::near_resource> &&
                         is_memory_resource_v<typename B::far_resource>> {};
}  // namespace detail

namespace detail {
template <class B, class D, class S, class = void>
struct has_backend_transfer : std::false_type {};
template <class B, class D, class S>
struct has_backend_transfer<
    B, D, S,
    std::enable_if_t<std::is_same_v<
        decltype(std::declval<B&>().transfer(std::declval<typename B::stream_type&>(), std::declval<block_pool<D>&>(),
                                             id_span{}, std::declval<const block_pool<S>&>(), id_span{})),
        transfer_report>>> : std::true_type {};
}  // namespace detail

/// True when B is a residency backend (see the file comment).
template <class B>
inline constexpr bool is_residency_backend_v = detail::is_residency_backend<B>::value;

/// Streams pages of a far pool through a fixed set of near slots (see the file comment).
template <class Backend>
class residency_scheduler {
  static_assert(is_residency_backend_v<Backend>, "residency_scheduler needs a residency backend");

 public:
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;
  using event_type = typename stream_type::event_type;
  using near_resource = typename Backend::near_resource;
  using far_resource = typename Backend::far_resource;
  using near_pool_type = block_pool<near_resource>;
  using far_pool_type = block_pool<far_resource>;

  /// `slots` near slots of far.block_bytes() each, one contiguous range from `near_memory`.
  /// Copies home -> slot run on `copy_in`, write-backs on `copy_out` (two streams, so the two
  /// directions overlap). The pools, resource and streams must outlive the scheduler.
  residency_scheduler(far_pool_type& far, near_resource& near_memory, std::int32_t slots,
                      stream_type& copy_in, stream_type& copy_out, Backend backend = Backend{},
                      std::size_t alignment = 256)
      : far_(&far),
        near_(near_pool_type::contiguous(near_memory, far.block_bytes(), checked_slots(slots), alignment)),
        copy_in_(&copy_in),
        copy_out_(&copy_out),
        backend_(std::move(backend)),
        slots_(static_cast<std::size_t>(slots)) {
    OOMB_EXPECTS(&copy_in != &copy_out,
                 "residency_scheduler: copy_in and copy_out must be two different streams");
  }

  residency_scheduler(const residency_scheduler&) = delete;
  residency_scheduler& operator=(const residency_scheduler&) = delete;
  residency_scheduler(residency_scheduler&&) noexcept = default;
  residency_scheduler& operator=(residency_scheduler&&) noexcept = default;

  /// Declares the pages needed next, in compute order: starts their copies (or zero fills) on the
  /// copy-in stream; pages already near are touched (most recently used). Evicts least recently
  /// used unpinned slots, clean ones first; a dirty victim is written back first. Throws
  /// out_of_memory (nothing enqueued) when the distinct pages exceed the near tier or what can be
  /// freed, invalid_argument for ids not in use in the far pool.
  void prefetch(id_span pages) { bring_near(pages, access::read, "prefetch", false); }

  /// Slots for `pages` (slots_out[i] for pages[i]), for work the caller enqueues next on
  /// `compute`: the compute stream is first made to wait for the pages' copies (never the host).
  /// Pages not prefetched are brought near now (counted in acquire_misses). The pages stay pinned
  /// until release(); with write or overwrite access they become near_dirty.
  void acquire(stream_type& compute, id_span pages, access mode, std::int32_t* slots_out) {
    OOMB_EXPECTS(slots_out != nullptr || pages.empty(), "residency_scheduler::acquire: null slots_out");
    bring_near(pages, mode, "acquire", true);
    // Everything below is stream waits and bookkeeping: no validation left to fail.
    waits_.clear();
    for (std::size_t i = 0; i < pages.size(); ++i) {
      slot_rec& s = slots_[static_cast<std::size_t>(page(pages[i]).slot)];
      add_wait(s.in_event);
      add_wait(s.last_write);  // a writer on another compute stream
      if (mode != access::read) {
        add_wait(s.wb_event);
        for (const event_ptr& u : s.uses) add_wait(u);
      }
    }
    for (const event_type* e : waits_) compute.wait(*e);
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t sid = page(pages[i]).slot;
      slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      ++s.pins;
      if (mode != access::read) s.dirty = true;
      slots_out[i] = sid;
    }
  }

  /// As above, returning the slots.
  std::vector<std::int32_t> acquire(stream_type& compute, id_span pages, access mode = access::read) {
    std::vector<std::int32_t> out(pages.size());
    acquire(compute, pages, mode, out.data());
    return out;
  }

  /// The work using `pages` (as acquired, one release per acquire entry) has been enqueued on
  /// `compute`: records the event after which their slots may be overwritten or written back, and
  /// unpins them. Throws invalid_argument (nothing changed) for a page that is not pinned.
  void release(stream_type& compute, id_span pages) {
    validate(pages, "release");
    ++epoch_;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      page_rec& p = page(pages[i]);
      OOMB_EXPECTS(p.slot >= 0, "residency_scheduler::release: page ", pages[i], " (entry ", i,
                   ") is not near, so it was never acquired");
      slot_rec& s = slots_[static_cast<std::size_t>(p.slot)];
      if (s.mark != epoch_) {
        s.mark = epoch_;
        s.count = 0;
      }
      ++s.count;
      OOMB_EXPECTS(s.count <= s.pins, "residency_scheduler::release: page ", pages[i], " (entry ", i,
                   ") released more often than acquired (", s.pins, " pins)");
    }
    if (pages.empty()) return;
    auto used = std::make_shared<const event_type>(compute.record());
    for (std::size_t i = 0; i < pages.size(); ++i) {
      slot_rec& s = slots_[static_cast<std::size_t>(page(pages[i]).slot)];
      --s.pins;
      if (s.uses.empty() || s.uses.back() != used) {
        prune(s.uses);
        s.uses.push_back(used);
      }
      if (s.dirty) s.last_write = used;  // conservative: readers elsewhere wait for it
    }
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
      const page_rec& p = page(pages[i]);
      if (p.slot < 0) continue;
      slot_rec& s = slots_[static_cast<std::size_t>(p.slot)];
      if (!s.dirty || s.mark == epoch_) continue;
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::write_back: page ", pages[i], " (entry ", i,
                   ") is dirty and still acquired by compute (", s.pins, " pins): release it first");
      s.mark = epoch_;
      victims_.push_back(p.slot);
    }
    write_back_slots(victims_);
    return victims_.size();
  }

  /// write_back() of every dirty page; throws (nothing enqueued) if one is still pinned.
  std::size_t flush() {
    victims_.clear();
    for (std::int32_t sid = lru_head_; sid >= 0; sid = slots_[static_cast<std::size_t>(sid)].next) {
      const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      if (!s.dirty) continue;
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::flush: page ", s.page,
                   " is dirty and still acquired by compute (", s.pins, " pins): release it first");
      victims_.push_back(sid);
    }
    write_back_slots(victims_);
    return victims_.size();
  }

  /// Makes `pages` far now: dirty ones are written back first (one batch), then their slots are
  /// freed (reused only after that write-back and after their readers). Far pages are skipped.
  /// Throws invalid_argument (nothing changed) for a pinned page.
  void evict(id_span pages) {
    validate(pages, "evict");
    ++epoch_;
    victims_.clear();
    std::vector<std::int32_t> freed;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const page_rec& p = page(pages[i]);
      if (p.slot < 0) continue;
      slot_rec& s = slots_[static_cast<std::size_t>(p.slot)];
      OOMB_EXPECTS(s.pins == 0, "residency_scheduler::evict: page ", pages[i], " (entry ", i,
                   ") is acquired by compute (", s.pins, " pins)");
      if (s.mark == epoch_) continue;
      s.mark = epoch_;
      freed.push_back(p.slot);
      if (s.dirty) victims_.push_back(p.slot);
    }
    write_back_slots(victims_);
    for (std::int32_t sid : freed) {
      detach(sid);
      near_.release(sid);
      ++stats_.evictions;
    }
  }

  /// Forgets `pages`: their content is dead (chunk finished), dirty or not; nothing is written
  /// back. Call it before releasing a far id from the far pool. Slots return to the free list
  /// (reused only after their pending events). Throws invalid_argument for a pinned page.
  void discard(id_span pages) {
    validate(pages, "discard");
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const page_rec& p = page(pages[i]);
      if (p.slot >= 0)
        OOMB_EXPECTS(slots_[static_cast<std::size_t>(p.slot)].pins == 0,
                     "residency_scheduler::discard: page ", pages[i], " (entry ", i,
                     ") is acquired by compute");
    }
    for (std::int32_t id : pages) {
      page_rec& p = page(id);
      if (p.slot >= 0) {
        const std::int32_t sid = p.slot;
        slots_[static_cast<std::size_t>(sid)].dirty = false;
        detach(sid);
        near_.release(sid);
      }
      p.home_valid = false;  // a later page with this id starts empty (home_event still orders it)
    }
  }

  /// Declares that the homes of `pages` were written outside the scheduler (e.g. by host code), so
  /// prefetch copies them instead of zero-filling. Throws invalid_argument for a page that has a
  /// slot (its slot would be stale: discard it first).
  void mark_written(id_span pages) {
    validate(pages, "mark_written");
    for (std::size_t i = 0; i < pages.size(); ++i)
      OOMB_EXPECTS(page(pages[i]).slot < 0, "residency_scheduler::mark_written: page ", pages[i],
                   " (entry ", i, ") has a slot; discard it before writing its home");
    for (std::int32_t id : pages) page(id).home_valid = true;
  }

  /// Blocks the host until every copy, fill and write-back enqueued so far has completed (the edge
  /// of a step: before the host reads or writes homes directly). Rethrows a stream's error.
  void drain() {
    event_type in = copy_in_->record();
    event_type out = copy_out_->record();
    in.wait();
    out.wait();
    for (slot_rec& s : slots_) {
      prune_one(s.in_event);
      prune_one(s.wb_event);
      prune_one(s.last_write);
      prune(s.uses);
    }
    for (page_rec& p : pages_) prune_one(p.home_event);
  }

  /// State of page `id` (events are polled, never waited for).
  page_state state(std::int32_t id) const {
    check_id(id, "state");
    const page_rec* p = find(id);
    if (!p || p->slot < 0) return page_state::far;
    const slot_rec& s = slots_[static_cast<std::size_t>(p->slot)];
    if (pending(s.in_event)) return page_state::to_near;
    if (s.dirty) return page_state::near_dirty;
    if (pending(s.wb_event)) return page_state::to_far;
    return page_state::near;
  }

  /// Slot of page `id`, or -1 when it is far.
  std::int32_t slot_of(std::int32_t id) const {
    check_id(id, "slot_of");
    const page_rec* p = find(id);
    return p ? p->slot : -1;
  }

  /// Page held by slot `slot`, or -1 when the slot is free.
  std::int32_t page_in(std::int32_t slot) const {
    OOMB_EXPECTS(slot >= 0 && slot < capacity(), "residency_scheduler::page_in: slot ", slot,
                 " out of range [0, ", capacity(), ")");
    return slots_[static_cast<std::size_t>(slot)].page;
  }

  /// True when the home of `id` holds (or will, once its write-back lands) the page's content.
  bool home_written(std::int32_t id) const {
    check_id(id, "home_written");
    const page_rec* p = find(id);
    return p && p->home_valid;
  }

  residency_stats stats() const {
    residency_stats r = stats_;
    r.capacity = capacity();
    r.resident = near_.in_use();
    for (const slot_rec& s : slots_) {
      if (s.page < 0) continue;
      r.dirty += s.dirty ? 1 : 0;
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

 private:
  using event_ptr = std::shared_ptr<const event_type>;

  struct page_rec {
    std::int32_t slot = -1;
    bool home_valid = false;   // the home holds the content (or will, after home_event)
    std::uint64_t mark = 0;    // epoch of the last request that listed it (dedup)
    event_ptr home_event;      // write-back into the home in flight
  };
  struct slot_rec {
    std::int32_t page = -1;
    std::int32_t pins = 0;
    bool dirty = false;
    std::uint64_t mark = 0;    // epoch of the last request that claimed it
    std::int32_t count = 0;    // scratch for release()
    std::int32_t prev = -1, next = -1;  // LRU list of resident slots
    event_ptr in_event;        // copy or fill into the slot (readers wait)
    event_ptr wb_event;        // write-back out of the slot (writers and reuse wait)
    std::vector<event_ptr> uses;  // compute work that used the slot (writers and reuse wait)
    event_ptr last_write;      // compute work that wrote it (readers on other streams wait)
  };

  static std::int32_t checked_slots(std::int32_t slots) {
    OOMB_EXPECTS(slots > 0, "residency_scheduler: the near tier needs at least one slot, got ", slots);
    return slots;
  }

  static bool pending(const event_ptr& e) { return e && !e->ready(); }
  static void prune_one(event_ptr& e) {
    if (e && e->ready()) e.reset();
  }
  static void prune(std::vector<event_ptr>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](const event_ptr& e) { return e->ready(); }), v.end());
  }

  void add_wait(const event_ptr& e) {
    if (!pending(e)) return;
    if (std::find(waits_.begin(), waits_.end(), e.get()) == waits_.end()) waits_.push_back(e.get());
  }

  void check_id(std::int32_t id, const char* who) const {
    OOMB_EXPECTS(far_->owns(id), "residency_scheduler::", who, ": page ", id,
                 " is not in use in the far pool (reserved ", far_->reserved(), ")");
  }

  const page_rec* find(std::int32_t id) const {
    return static_cast<std::size_t>(id) < pages_.size() ? &pages_[static_cast<std::size_t>(id)] : nullptr;
  }
  page_rec& page(std::int32_t id) { return pages_[static_cast<std::size_t>(id)]; }

  void validate(id_span pages, const char* who) {
    OOMB_EXPECTS(pages.data() != nullptr || pages.empty(), "residency_scheduler::", who,
                 ": null page list of ", pages.size(), " entries");
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const std::int32_t id = pages[i];
      if (!far_->owns(id)) {
        const page_rec* p = id >= 0 ? find(id) : nullptr;
        OOMB_FAIL(invalid_argument, "residency_scheduler::", who, ": page ", id, " (entry ", i,
                  ") is not in use in the far pool (reserved ", far_->reserved(), ")",
                  p && p->slot >= 0 ? "; it still holds a slot: discard() it before releasing it" : "");
      }
    }
    if (pages_.size() < static_cast<std::size_t>(far_->reserved()))
      pages_.resize(static_cast<std::size_t>(far_->reserved()));
  }

  // LRU list: head = least recently used.
  void lru_remove(std::int32_t sid) {
    slot_rec& s = slots_[static_cast<std::size_t>(sid)];
    (s.prev >= 0 ? slots_[static_cast<std::size_t>(s.prev)].next : lru_head_) = s.next;
    (s.next >= 0 ? slots_[static_cast<std::size_t>(s.next)].prev : lru_tail_) = s.prev;
    s.prev = s.next = -1;
  }
  void lru_push_back(std::int32_t sid) {
    slot_rec& s = slots_[static_cast<std::size_t>(sid)];
    s.prev = lru_tail_;
    s.next = -1;
    (lru_tail_ >= 0 ? slots_[static_cast<std::size_t>(lru_tail_)].next : lru_head_) = sid;
    lru_tail_ = sid;
  }
  void touch(std::int32_t sid) {
    if (lru_tail_ == sid) return;
    lru_remove(sid);
    lru_push_back(sid);
  }

  // Unlinks a slot from its page (the slot keeps its events: hazards for its next user).
  void detach(std::int32_t sid) {
    slot_rec& s = slots_[static_cast<std::size_t>(sid)];
    page(s.page).slot = -1;
    s.page = -1;
    s.dirty = false;
    lru_remove(sid);
  }

  // Gives every distinct page of `pages` a slot, enqueuing copies/fills for misses (read, write)
  // or nothing (overwrite). All checks happen before the first change.
  void bring_near(id_span pages, access mode, const char* who, bool at_acquire) {
    validate(pages, who);
    ++epoch_;
    distinct_.clear();
    for (std::int32_t id : pages) {
      page_rec& p = page(id);
      if (p.mark == epoch_) continue;
      p.mark = epoch_;
      distinct_.push_back(id);
    }
    OOMB_CHECK(static_cast<std::int64_t>(distinct_.size()) <= capacity(), out_of_memory,
               "residency_scheduler::", who, ": asked for ", distinct_.size(),
               " pages at once, the near tier holds ", capacity(), " slots");
    std::int32_t missing = 0;
    for (std::int32_t id : distinct_) {
      const page_rec& p = page(id);
      if (p.slot >= 0)
        slots_[static_cast<std::size_t>(p.slot)].mark = epoch_;  // claimed: not a victim
      else
        ++missing;
    }
    const std::int32_t free_now = near_.available();
    std::int32_t evictable = 0, pinned = 0;
    for (std::int32_t sid = lru_head_; sid >= 0; sid = slots_[static_cast<std::size_t>(sid)].next) {
      const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      if (s.pins > 0)
        ++pinned;
      else if (s.mark != epoch_)
        ++evictable;
    }
    OOMB_CHECK(missing <= free_now + evictable, out_of_memory, "residency_scheduler::", who, ": ",
               missing, " pages need a slot but only ", free_now + evictable, " of the ", capacity(),
               " slots can be freed (", pinned, " pinned by compute, ",
               static_cast<std::int64_t>(distinct_.size()) - missing, " held for this request)");

    // Victims: least recently used first, clean before dirty.
    victims_.clear();
    dirty_victims_.clear();
    const std::int32_t need = std::max(0, missing - free_now);
    for (std::int32_t sid = lru_head_; sid >= 0 && static_cast<std::int32_t>(victims_.size()) < need;
         sid = slots_[static_cast<std::size_t>(sid)].next) {
      const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      if (s.pins == 0 && s.mark != epoch_ && !s.dirty) victims_.push_back(sid);
    }
    for (std::int32_t sid = lru_head_; sid >= 0 && static_cast<std::int32_t>(victims_.size()) < need;
         sid = slots_[static_cast<std::size_t>(sid)].next) {
      const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      if (s.pins == 0 && s.mark != epoch_ && s.dirty) {
        victims_.push_back(sid);
        dirty_victims_.push_back(sid);
      }
    }

    // --- changes start here ---
    stats_.hits += distinct_.size() - static_cast<std::size_t>(missing);
    stats_.misses += static_cast<std::size_t>(missing);
    if (at_acquire && mode != access::overwrite) stats_.acquire_misses += static_cast<std::size_t>(missing);
    write_back_slots(dirty_victims_);
    for (std::int32_t sid : victims_) {
      detach(sid);
      ++stats_.evictions;
    }

    load_slots_.clear();
    load_homes_.clear();
    zero_slots_.clear();
    std::size_t next_victim = 0;
    for (std::int32_t id : distinct_) {
      page_rec& p = page(id);
      if (p.slot >= 0) {
        touch(p.slot);
        continue;
      }
      const std::int32_t sid = next_victim < victims_.size() ? victims_[next_victim++] : near_.acquire();
      slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      s.page = id;
      s.dirty = false;
      s.mark = epoch_;
      p.slot = sid;
      lru_push_back(sid);
      if (mode == access::overwrite) continue;  // compute writes it; acquire waits for the hazards
      if (p.home_valid) {
        load_slots_.push_back(sid);
        load_homes_.push_back(id);
      } else {
        zero_slots_.push_back(sid);
      }
    }
    if (load_slots_.empty() && zero_slots_.empty()) return;

    // The copy-in stream waits for the reused slots' readers and write-backs, and for write-backs
    // into the homes it reads; then one batch of copies, the fills, and one event.
    waits_.clear();
    for (std::int32_t sid : load_slots_) add_slot_hazards(sid);
    for (std::int32_t sid : zero_slots_) add_slot_hazards(sid);
    for (std::int32_t id : load_homes_) add_wait(page(id).home_event);
    for (const event_type* e : waits_) copy_in_->wait(*e);
    if (!load_slots_.empty()) {
      const transfer_report r = move_pages(*copy_in_, near_, load_slots_, *far_, load_homes_);
      stats_.bytes_to_near += r.bytes;
      stats_.copies_to_near += r.copies;
    }
    if (!zero_slots_.empty()) {
      std::sort(zero_slots_.begin(), zero_slots_.end());
      const std::size_t bb = near_.block_bytes();
      for (std::size_t i = 0; i < zero_slots_.size();) {
        std::size_t j = i + 1;
        while (j < zero_slots_.size() && zero_slots_[j] == zero_slots_[j - 1] + 1) ++j;
        backend_.zero_fill(*copy_in_, near_.address(zero_slots_[i]), (j - i) * bb);
        i = j;
      }
      stats_.zero_fills += zero_slots_.size();
    }
    auto loaded = std::make_shared<const event_type>(copy_in_->record());
    for (auto* list : {&load_slots_, &zero_slots_})
      for (std::int32_t sid : *list) {
        slot_rec& s = slots_[static_cast<std::size_t>(sid)];
        s.in_event = loaded;
        s.wb_event.reset();  // the new content lands after these: later waits on in_event cover them
        s.uses.clear();
        s.last_write.reset();
      }
  }

  void add_slot_hazards(std::int32_t sid) {
    const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
    add_wait(s.in_event);
    add_wait(s.wb_event);
    for (const event_ptr& u : s.uses) add_wait(u);
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

  // One batch slot -> home on the copy-out stream, after the slots' compute uses.
  void write_back_slots(const std::vector<std::int32_t>& sids) {
    if (sids.empty()) return;
    waits_.clear();
    wb_slots_.clear();
    wb_homes_.clear();
    for (std::int32_t sid : sids) {
      const slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      add_wait(s.in_event);
      for (const event_ptr& u : s.uses) add_wait(u);
      wb_slots_.push_back(sid);
      wb_homes_.push_back(s.page);
    }
    for (const event_type* e : waits_) copy_out_->wait(*e);
    const transfer_report r = move_pages(*copy_out_, *far_, wb_homes_, near_, wb_slots_);
    auto written = std::make_shared<const event_type>(copy_out_->record());
    for (std::int32_t sid : sids) {
      slot_rec& s = slots_[static_cast<std::size_t>(sid)];
      page_rec& p = page(s.page);
      s.dirty = false;
      s.wb_event = written;
      s.uses.clear();  // the write-back ran after them: waiting for it covers them
      p.home_valid = true;
      p.home_event = written;
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
  std::vector<slot_rec> slots_;
  std::vector<page_rec> pages_;
  std::int32_t lru_head_ = -1, lru_tail_ = -1;
  std::uint64_t epoch_ = 0;
  residency_stats stats_;
  // Scratch reused between calls (no allocation in a steady state).
  std::vector<std::int32_t> distinct_, victims_, dirty_victims_, load_slots_, load_homes_, zero_slots_,
      wb_slots_, wb_homes_;
  std::vector<const event_type*> waits_;
};

OOMB_NAMESPACE_END
