// oomb — eviction by a declared future access order (Belady's rule: evict the page needed last).
// SPDX-License-Identifier: Apache-2.0
//
// A trainer knows what it asks for next (the next windows of a chunk, the next layer). It declares
// that order with expect(pages); each request the scheduler reports (prefetch or acquire) consumes
// the front of the order while the front page is among the request's pages. A victim is the
// evictable slot whose page is next needed furthest ahead (never needed: furthest of all); ties
// prefer clean slots, then the least recently inserted. On a cyclic pattern larger than the near
// tier LRU misses every page, this keeps near as many as fit (tests/offload/test_eviction.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/eviction_policy.hpp"

OOMB_NAMESPACE_BEGIN

/// Evicts the page whose next use in the declared order is furthest (see the file comment).
class belady_eviction {
 public:
  explicit belady_eviction(std::int32_t slots)
      : page_of_(static_cast<std::size_t>(slots), -1), inserted_(static_cast<std::size_t>(slots), 0) {
    OOMB_EXPECTS(slots > 0, "belady_eviction: the near tier needs at least one slot, got ", slots);
    ranked_.reserve(static_cast<std::size_t>(slots));
  }

  /// Declares the pages the scheduler will be asked for next, in order (repeats allowed),
  /// replacing what was declared before. Throws invalid_argument for a negative id.
  void expect(id_span pages) {
    std::int32_t top = -1;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      OOMB_EXPECTS(pages[i] >= 0, "belady_eviction::expect: page ", pages[i], " (entry ", i, ") is negative");
      top = std::max(top, pages[i]);
    }
    std::vector<std::int32_t> order(pages.begin(), pages.end());
    std::vector<std::size_t> next(order.size(), never);
    std::vector<std::size_t> next_use(static_cast<std::size_t>(top + 1), never);
    for (std::size_t i = order.size(); i-- > 0;) {
      std::size_t& first = next_use[static_cast<std::size_t>(order[i])];
      next[i] = first;
      first = i;
    }
    std::vector<std::uint64_t> mark(next_use.size(), 0);
    order_.swap(order);  // no throw from here on
    next_.swap(next);
    next_use_.swap(next_use);
    mark_.swap(mark);
    cursor_ = 0;
  }

  void on_request(id_span pages) noexcept {
    ++epoch_;
    for (std::int32_t p : pages)
      if (p >= 0 && static_cast<std::size_t>(p) < mark_.size()) mark_[static_cast<std::size_t>(p)] = epoch_;
    while (cursor_ < order_.size() && mark_[static_cast<std::size_t>(order_[cursor_])] == epoch_) {
      next_use_[static_cast<std::size_t>(order_[cursor_])] = next_[cursor_];
      ++cursor_;
    }
  }
  void on_insert(std::int32_t slot, std::int32_t page) noexcept {
    page_of_[static_cast<std::size_t>(slot)] = page;
    inserted_[static_cast<std::size_t>(slot)] = ++clock_;
  }
  void on_hit(std::int32_t, std::int32_t) noexcept {}
  void on_remove(std::int32_t slot) noexcept { page_of_[static_cast<std::size_t>(slot)] = -1; }

  template <class Kind>
  void choose(std::int32_t need, const Kind& kind, std::vector<std::int32_t>& out) {
    ranked_.clear();
    for (std::size_t s = 0; s < page_of_.size(); ++s) {
      if (page_of_[s] < 0) continue;
      const victim_kind k = kind(static_cast<std::int32_t>(s));
      if (k != victim_kind::no) ranked_.push_back({next_use(page_of_[s]), k, inserted_[s], static_cast<std::int32_t>(s)});
    }
    const std::size_t n = std::min(ranked_.size(), static_cast<std::size_t>(need));
    std::partial_sort(ranked_.begin(), ranked_.begin() + static_cast<std::ptrdiff_t>(n), ranked_.end(),
                      [](const candidate& a, const candidate& b) {
                        if (a.next != b.next) return a.next > b.next;   // needed last first
                        if (a.kind != b.kind) return a.kind < b.kind;   // clean before dirty
                        return a.inserted < b.inserted;                 // then the oldest
                      });
    for (std::size_t i = 0; i < n; ++i) out.push_back(ranked_[i].slot);
  }

  /// Position in the declared order of the next use of `page` (counted from the start of the
  /// last expect()), or never.
  std::size_t next_use(std::int32_t page) const noexcept {
    return page >= 0 && static_cast<std::size_t>(page) < next_use_.size() ? next_use_[static_cast<std::size_t>(page)]
                                                                          : never;
  }
  /// Entries of the declared order consumed so far.
  std::size_t consumed() const noexcept { return cursor_; }

  static constexpr std::size_t never = std::numeric_limits<std::size_t>::max();

 private:
  struct candidate {
    std::size_t next;
    victim_kind kind;
    std::uint64_t inserted;
    std::int32_t slot;
  };

  std::vector<std::int32_t> order_;      // the declared order
  std::vector<std::size_t> next_;        // next_[i]: next position of order_[i]'s page after i
  std::vector<std::size_t> next_use_;    // per page: its next position at or after the cursor
  std::vector<std::uint64_t> mark_;      // per page: epoch of the last request naming it
  std::size_t cursor_ = 0;
  std::uint64_t epoch_ = 0, clock_ = 0;
  std::vector<std::int32_t> page_of_;    // per slot: the page it holds, or -1
  std::vector<std::uint64_t> inserted_;  // per slot: when it got its page
  std::vector<candidate> ranked_;        // scratch of choose()
};

static_assert(is_eviction_policy_v<belady_eviction>);

OOMB_NAMESPACE_END
