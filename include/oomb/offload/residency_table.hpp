// oomb — the residency scheduler's bookkeeping: which slot holds which page, and in what state.
// SPDX-License-Identifier: Apache-2.0
//
// No events and no memory here (those are slot_hazards and the pools): per page, its slot, whether
// its home holds its content, and the far pool's generation of its id when the record was made (a
// record whose generation differs belongs to a page that was released: it is dead); per slot, its
// page, compute pins and dirtiness. attach/detach keep both sides consistent and never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// Where a page is, as seen by the scheduler (docs/offload.md, "The residency scheduler").
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

/// Per-page and per-slot records of a near tier over a far pool (see the file comment).
class residency_table {
 public:
  struct page_entry {
    std::int32_t slot = -1;
    bool home_valid = false;       // the home holds the content (or will, once its write-back lands)
    std::uint32_t generation = 0;  // the far pool's generation of the id this record describes
    std::uint64_t mark = 0;        // epoch of the last request that listed it (dedup)
  };
  struct slot_entry {
    std::int32_t page = -1;
    std::int32_t pins = 0;
    bool dirty = false;
    std::uint64_t mark = 0;   // epoch of the last request that claimed it
    std::int32_t count = 0;   // scratch of release()
  };

  explicit residency_table(std::int32_t slots) : slots_(static_cast<std::size_t>(slots)) {}

  /// Room for page ids [0, n) (the far pool's reserved ids). Throws only bad_alloc.
  void reserve_pages(std::size_t n) {
    if (pages_.size() < n) pages_.resize(n);
  }
  bool knows(std::int32_t id) const noexcept { return id >= 0 && static_cast<std::size_t>(id) < pages_.size(); }

  page_entry& page(std::int32_t id) noexcept { return pages_[static_cast<std::size_t>(id)]; }
  const page_entry& page(std::int32_t id) const noexcept { return pages_[static_cast<std::size_t>(id)]; }
  slot_entry& slot(std::int32_t s) noexcept { return slots_[static_cast<std::size_t>(s)]; }
  const slot_entry& slot(std::int32_t s) const noexcept { return slots_[static_cast<std::size_t>(s)]; }
  std::int32_t slots() const noexcept { return static_cast<std::int32_t>(slots_.size()); }

  /// Slot `s` now holds page `id` (clean, unpinned).
  void attach(std::int32_t s, std::int32_t id) noexcept {
    slot_entry& e = slot(s);
    e.page = id;
    e.dirty = false;
    e.pins = 0;
    page(id).slot = s;
  }
  /// Slot `s` holds no page now.
  void detach(std::int32_t s) noexcept {
    slot_entry& e = slot(s);
    if (e.page >= 0) page(e.page).slot = -1;
    e.page = -1;
    e.dirty = false;
    e.pins = 0;
  }

 private:
  std::vector<page_entry> pages_;
  std::vector<slot_entry> slots_;
};

OOMB_NAMESPACE_END
