// oomb trainer — where the pages of one pool are read and written: in place, or streamed.
// SPDX-License-Identifier: Apache-2.0
//
// A page_tier is the one place that knows whether offload is on. In place, the kernels address the
// far pool itself (one contiguous range) by far id; streamed, a residency scheduler copies pages
// through a fixed set of near slots and the kernels address the slots. Either way the caller
// speaks one protocol: prefetch what comes next, acquire (ids -> where to address them), run the
// work on the backend's compute stream, release; write_back what was produced, discard what died.
// In place every call but acquire is free, and acquire returns the ids unchanged. Eviction is the
// scheduler's policy: with oomb::belady_eviction, expect() declares the order pages will be asked
// for (the trainer knows its next windows); with LRU it does nothing.
//
// Streamed, the homes may hold bf16 while the slots hold X (page_home_format::bf16 or
// bf16_stochastic): the scheduler then runs over the backend's bf16_home_residency<X>, a converting
// residency backend made from an oomb::bf16_codec<X> (the CPU's converts on its copy streams; the
// CUDA offload backend's moves bf16 over PCIe and converts on the device, the same bits), and every
// write-back rounds the page once: to nearest even, or stochastically (seed 0, the backend's write
// counter as the key: a run is reproducible, each write draws fresh bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include <oomb/core/error.hpp>
#include <oomb/core/id_span.hpp>
#include <oomb/core/memory_kind.hpp>
#include <oomb/memory/block_pool.hpp>
#include <oomb/offload/belady_eviction.hpp>
#include <oomb/offload/bf16_codec.hpp>
#include <oomb/offload/residency_scheduler.hpp>
#include <oomb/paging/views.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

namespace detail {
// B::bf16_home_residency<X> for float or double pages, when B has it; else B's own residency
// backend (never constructed: page_tier refuses bf16 homes first). Detected through overloads
// rather than a partially specialised void_t, which nvcc's front end does not treat as SFINAE.
template <class B, class X>
auto bf16_home_probe(int) -> std::enable_if_t<std::is_floating_point_v<X>, typename B::template bf16_home_residency<X>*>;
template <class B, class X>
void bf16_home_probe(...);

template <class B, class X>
struct bf16_home_residency {
  using probe = decltype(bf16_home_probe<B, X>(0));
  static constexpr bool available = !std::is_void_v<probe>;
  using type = std::conditional_t<available, std::remove_pointer_t<probe>, typename B::residency_backend>;
};
}  // namespace detail

/// The pages of one far pool of element X, as backend B's kernels reach them.
template <class B, class X, class Eviction = oomb::lru_eviction>
class page_tier {
  static_assert(is_attention_backend_v<B>, "page_tier needs an attention backend");
  using residency = typename B::residency_backend;
  using scheduler = oomb::residency_scheduler<residency, Eviction>;
  using bf16_home = detail::bf16_home_residency<B, X>;
  using bf16_scheduler = oomb::residency_scheduler<typename bf16_home::type, Eviction>;
  static_assert(std::is_same_v<typename bf16_home::type::far_resource, typename residency::far_resource> &&
                    std::is_same_v<typename bf16_home::type::near_resource, typename residency::near_resource>,
                "bf16 homes live where the backend's other homes do");

 public:
  using far_pool_type = oomb::block_pool<typename residency::far_resource>;

  /// `near_slots` == 0: in place (the far pool must be contiguous); else streamed through that
  /// many near slots from the backend's near memory, on its copy streams. `homes`: what the far
  /// pool's blocks hold (bf16: streamed only, on a backend with bf16_home_residency<X>).
  page_tier(B& backend, far_pool_type& far, const oomb::page_shape& shape, std::int32_t near_slots,
            page_home_format homes = page_home_format::same)
      : backend_(&backend), far_(&far), shape_(shape) {
    // In place the kernels address the far pool: it must be the memory they compute in (pinned
    // homes read in place by a GPU would cross PCIe on every access).
    OOMB_EXPECTS(near_slots > 0 || residency::far_resource::kind == residency::near_resource::kind,
                 "page_tier: this backend keeps the pages' homes in ", oomb::to_string(residency::far_resource::kind),
                 " memory, which its kernels do not read in place: it needs offload (near slots)");
    if (bf16_homes(homes)) {
      OOMB_EXPECTS(near_slots > 0, "page_tier: bf16 homes are converted on their way to near slots: they need offload");
      OOMB_EXPECTS(bf16_home::available, "page_tier: this backend has no converting residency backend for bf16 homes");
      if constexpr (bf16_home::available) {
        oomb::bf16_codec<X> codec;
        codec.rounding = homes == page_home_format::bf16_stochastic ? oomb::bf16_rounding::stochastic
                                                                     : oomb::bf16_rounding::nearest_even;
        bf16_ = std::make_unique<bf16_scheduler>(far, backend.near_memory(), near_slots, backend.copy_in(), backend.copy_out(),
                                                 typename bf16_home::type(codec));
      }
    } else if (near_slots > 0) {
      plain_ = std::make_unique<scheduler>(far, backend.near_memory(), near_slots, backend.copy_in(), backend.copy_out());
    }
  }

  bool streamed() const noexcept { return plain_ || bf16_; }

  /// True when expect() is heard: streamed, with belady_eviction.
  bool wants_order() const noexcept { return streamed() && std::is_same_v<Eviction, oomb::belady_eviction>; }
  /// The order in which pages will be asked for from now on (belady_eviction only).
  void expect(oomb::id_span order) {
    if constexpr (std::is_same_v<Eviction, oomb::belady_eviction>) each([&](auto& s) { s.eviction().expect(order); });
  }
  /// The pages asked for next, in compute order (their copies start now when streamed).
  void prefetch(oomb::id_span ids) {
    each([&](auto& s) { s.prefetch(ids); });
  }
  /// Where to address `ids` in view() (where[i] for ids[i]) for work enqueued next on the
  /// backend's compute stream; pinned until release(ids).
  void acquire(oomb::id_span ids, oomb::access mode, std::vector<std::int32_t>& where) {
    where.assign(ids.begin(), ids.end());
    each([&](auto& s) {
      if constexpr (has_transfer_wait_probe_v<B>) backend_->transfer_wait_begin();
      s.acquire(backend_->compute(), ids, mode, where.data());
      if constexpr (has_transfer_wait_probe_v<B>) backend_->transfer_wait_end();
    });
  }
  /// The work on `ids` is enqueued on the compute stream.
  void release(oomb::id_span ids) {
    each([&](auto& s) { s.release(backend_->compute(), ids); });
  }
  /// The content of `ids` was produced near: copy it home (once).
  void write_back(oomb::id_span ids) {
    each([&](auto& s) { s.write_back(ids); });
  }
  /// The content of `ids` is dead (call before the ids go back to the far pool).
  void discard(oomb::id_span ids) {
    each([&](auto& s) { s.discard(ids); });
  }
  /// Far page `id` was just acquired and must read as zeros: in place the backend zeroes it;
  /// streamed the scheduler zero-fills a page without home content at its first copy.
  void zero_fresh(std::int32_t id) {
    if (!streamed()) backend_->zero_page(view(), id);
  }
  /// Waits until every copy has landed (the edge of a step).
  void drain() {
    each([](auto& s) { s.drain(); });
  }

  /// The pool acquire's ids address: the far pool in place, the near slots streamed.
  oomb::page_pool_view<X> view() const {
    std::byte* base = nullptr;
    each([&](const auto& s) { base = s.near_pool().base(); });
    if (!streamed()) base = far_->base();
    return oomb::page_pool_view<X>::over(reinterpret_cast<X*>(base), shape_);
  }

  /// Counters (zeros in place).
  oomb::residency_stats stats() const {
    oomb::residency_stats r{};
    each([&](const auto& s) { r = s.stats(); });
    return r;
  }
  std::int32_t near_slots() const noexcept {
    std::int32_t n = 0;
    each([&](const auto& s) { n = s.capacity(); });
    return n;
  }
  std::size_t near_bytes() const noexcept {
    std::size_t n = 0;
    each([&](const auto& s) { n = s.near_pool().stats().reserved_bytes; });
    return n;
  }

 private:
  // f(scheduler) when streamed, over whichever scheduler the homes' format chose.
  template <class F>
  void each(F&& f) {
    if (plain_) f(*plain_);
    if constexpr (bf16_home::available)
      if (bf16_) f(*bf16_);
  }
  template <class F>
  void each(F&& f) const {
    if (plain_) f(static_cast<const scheduler&>(*plain_));
    if constexpr (bf16_home::available)
      if (bf16_) f(static_cast<const bf16_scheduler&>(*bf16_));
  }

  B* backend_;
  far_pool_type* far_;
  oomb::page_shape shape_;
  std::unique_ptr<scheduler> plain_;
  std::unique_ptr<bf16_scheduler> bf16_;  // bf16 homes
};

}  // namespace oomb_trainer
