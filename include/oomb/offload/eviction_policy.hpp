// oomb — eviction policies of the residency scheduler: the concept and least-recently-used.
// SPDX-License-Identifier: Apache-2.0
//
// An eviction policy P ranks the near tier's slots; residency_scheduler<Backend, P> tells it what
// happens and asks it for victims. It sees slots and pages only (no events, no memory), so it is
// tested alone. P has
//   explicit P(std::int32_t slots);                              // the near tier's size
//   void on_request(id_span pages) noexcept;   // a prefetch/acquire names these distinct pages
//   void on_insert(std::int32_t slot, std::int32_t page) noexcept;  // slot now holds page
//   void on_hit(std::int32_t slot, std::int32_t page) noexcept;     // a request found page near
//   void on_remove(std::int32_t slot) noexcept;                     // slot holds no page now
//   void choose(std::int32_t need, const C& kind, std::vector<std::int32_t>& out);
//       // appends `need` victims, each a slot s with kind(s) != victim_kind::no; the scheduler
//       // checked that enough exist. `out` has room for every slot (no reallocation).
// Every notification is noexcept, so the scheduler can commit its bookkeeping without a throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"

OOMB_NAMESPACE_BEGIN

/// Whether a slot may be evicted, and what it costs.
enum class victim_kind : std::uint8_t {
  no,     ///< pinned by compute, or held by the request itself
  clean,  ///< free to reuse (its content is at home, or dead)
  dirty,  ///< must be written back first
};

namespace detail {
// What a policy's choose() is called with (any callable slot -> victim_kind).
struct victim_probe {
  victim_kind operator()(std::int32_t) const noexcept { return victim_kind::clean; }
};

template <class P, class = void>
struct is_eviction_policy : std::false_type {};
template <class P>
struct is_eviction_policy<
    P, std::void_t<decltype(std::declval<P&>().choose(std::int32_t{}, std::declval<const victim_probe&>(),
                                                      std::declval<std::vector<std::int32_t>&>()))>>
    : std::bool_constant<std::is_constructible_v<P, std::int32_t> &&
                         noexcept(std::declval<P&>().on_request(id_span{})) &&
                         noexcept(std::declval<P&>().on_insert(std::int32_t{}, std::int32_t{})) &&
                         noexcept(std::declval<P&>().on_hit(std::int32_t{}, std::int32_t{})) &&
                         noexcept(std::declval<P&>().on_remove(std::int32_t{}))> {};
}  // namespace detail

/// True when P satisfies the eviction-policy concept (see the file comment).
template <class P>
inline constexpr bool is_eviction_policy_v = detail::is_eviction_policy<P>::value;

/// Least recently used first, clean slots before dirty ones (a clean victim costs no write-back).
/// O(1) notifications (an intrusive list over the slots), choose() walks from the oldest slot.
class lru_eviction {
 public:
  explicit lru_eviction(std::int32_t slots) : links_(static_cast<std::size_t>(slots)) {
    OOMB_EXPECTS(slots > 0, "lru_eviction: the near tier needs at least one slot, got ", slots);
  }

  void on_request(id_span) noexcept {}
  void on_insert(std::int32_t slot, std::int32_t) noexcept { push_back(slot); }
  void on_hit(std::int32_t slot, std::int32_t) noexcept {
    if (tail_ == slot) return;
    unlink(slot);
    push_back(slot);
  }
  void on_remove(std::int32_t slot) noexcept { unlink(slot); }

  template <class Kind>
  void choose(std::int32_t need, const Kind& kind, std::vector<std::int32_t>& out) const {
    const std::size_t target = out.size() + static_cast<std::size_t>(need);
    for (victim_kind pass : {victim_kind::clean, victim_kind::dirty})
      for (std::int32_t s = head_; s >= 0 && out.size() < target; s = at(s).next)
        if (kind(s) == pass) out.push_back(s);
  }

  /// Resident slots from least to most recently used (for tests and debugging).
  std::vector<std::int32_t> order() const {
    std::vector<std::int32_t> v;
    for (std::int32_t s = head_; s >= 0; s = at(s).next) v.push_back(s);
    return v;
  }

 private:
  struct link {
    std::int32_t prev = -1, next = -1;
  };
  link& at(std::int32_t s) noexcept { return links_[static_cast<std::size_t>(s)]; }
  const link& at(std::int32_t s) const noexcept { return links_[static_cast<std::size_t>(s)]; }
  void unlink(std::int32_t s) noexcept {
    link& l = at(s);
    (l.prev >= 0 ? at(l.prev).next : head_) = l.next;
    (l.next >= 0 ? at(l.next).prev : tail_) = l.prev;
    l.prev = l.next = -1;
  }
  void push_back(std::int32_t s) noexcept {
    link& l = at(s);
    l.prev = tail_;
    l.next = -1;
    (tail_ >= 0 ? at(tail_).next : head_) = s;
    tail_ = s;
  }

  std::vector<link> links_;
  std::int32_t head_ = -1, tail_ = -1;  // head: least recently used
};

static_assert(is_eviction_policy_v<lru_eviction>);

OOMB_NAMESPACE_END
