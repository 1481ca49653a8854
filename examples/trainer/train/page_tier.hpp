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
#include <oomb/offload/residency_scheduler.hpp>
#include <oomb/paging/views.hpp>

#include "trainer/backend/trainer_backend.hpp"

namespace oomb_trainer {

/// The pages of one far pool of element X, as backend B's kernels reach them.
template <class B, class X, class Eviction = oomb::lru_eviction>
class page_tier {
  static_assert(is_trainer_backend_v<B>, "page_tier needs a trainer backend");
  using residency = typename B::residency_backend;
  using scheduler = oomb::residency_scheduler<residency, Eviction>;

 public:
  using far_pool_type = oomb::block_pool<typename residency::far_resource>;

  /// `near_slots` == 0: in place (the far pool must be contiguous); else streamed through that
  /// many near slots from the backend's near memory, on its copy streams.
  page_tier(B& backend, far_pool_type& far, const oomb::page_shape& shape, std::int32_t near_slots)
      : backend_(&backend), far_(&far), shape_(shape) {
    // In place the kernels address the far pool: it must be the memory they compute in (pinned
    // homes read in place by a GPU would cross PCIe on every access).
    OOMB_EXPECTS(near_slots > 0 || residency::far_resource::kind == residency::near_resource::kind,
                 "page_tier: this backend keeps the pages' homes in ", oomb::to_string(residency::far_resource::kind),
                 " memory, which its kernels do not read in place: it needs offload (near slots)");
    if (near_slots > 0)
      scheduler_ = std::make_unique<scheduler>(far, backend.near_memory(), near_slots, backend.copy_in(), backend.copy_out());
  }

  bool streamed() const noexcept { return scheduler_ != nullptr; }

  /// True when expect() is heard: streamed, with belady_eviction.
  bool wants_order() const noexcept { return scheduler_ && std::is_same_v<Eviction, oomb::belady_eviction>; }
  /// The order in which pages will be asked for from now on (belady_eviction only).
  void expect(oomb::id_span order) {
    if constexpr (std::is_same_v<Eviction, oomb::belady_eviction>)
      if (scheduler_) scheduler_->eviction().expect(order);
  }
  /// The pages asked for next, in compute order (their copies start now when streamed).
  void prefetch(oomb::id_span ids) {
    if (scheduler_) scheduler_->prefetch(ids);
  }
  /// Where to address `ids` in view() (where[i] for ids[i]) for work enqueued next on the
  /// backend's compute stream; pinned until release(ids).
  void acquire(oomb::id_span ids, oomb::access mode, std::vector<std::int32_t>& where) {
    where.assign(ids.begin(), ids.end());
    if (!scheduler_) return;
    if constexpr (has_transfer_wait_probe_v<B>) backend_->transfer_wait_begin();
    scheduler_->acquire(backend_->compute(), ids, mode, where.data());
    if constexpr (has_transfer_wait_probe_v<B>) backend_->transfer_wait_end();
  }
  /// The work on `ids` is enqueued on the compute stream.
  void release(oomb::id_span ids) {
    if (scheduler_) scheduler_->release(backend_->compute(), ids);
  }
  /// The content of `ids` was produced near: copy it home (once).
  void write_back(oomb::id_span ids) {
    if (scheduler_) scheduler_->write_back(ids);
  }
  /// The content of `ids` is dead (call before the ids go back to the far pool).
  void discard(oomb::id_span ids) {
    if (scheduler_) scheduler_->discard(ids);
  }
  /// Far page `id` was just acquired and must read as zeros: in place the backend zeroes it;
  /// streamed the scheduler zero-fills a page without home content at its first copy.
  void zero_fresh(std::int32_t id) {
    if (!scheduler_) backend_->zero_page(view(), id);
  }
  /// Waits until every copy has landed (the edge of a step).
  void drain() {
    if (scheduler_) scheduler_->drain();
  }

  /// The pool acquire's ids address: the far pool in place, the near slots streamed.
  oomb::page_pool_view<X> view() const {
    return oomb::page_pool_view<X>::over(reinterpret_cast<X*>(scheduler_ ? scheduler_->near_pool().base() : far_->base()),
                                         shape_);
  }
  /// Every id acquire returns is below this.
  std::int32_t id_space() const noexcept { return scheduler_ ? scheduler_->capacity() : far_->capacity(); }

  /// Counters (zeros in place).
  oomb::residency_stats stats() const { return scheduler_ ? scheduler_->stats() : oomb::residency_stats{}; }
  std::int32_t near_slots() const noexcept { return scheduler_ ? scheduler_->capacity() : 0; }
  std::size_t near_bytes() const noexcept { return scheduler_ ? scheduler_->near_pool().stats().reserved_bytes : 0; }

 private:
  B* backend_;
  far_pool_type* far_;
  oomb::page_shape shape_;
  std::unique_ptr<scheduler> scheduler_;
};

}  // namespace oomb_trainer
