// A residency backend and a memory resource that fail on command, for the fault tests.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/page_transfer.hpp"

namespace oomb_test {

/// What a fault test throws (never thrown by oomb itself, so a test tells injected from real).
struct injected_fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Calls seen so far and which one fails (1-based; 0: none). Shared by a backend and a resource.
struct fault_plan {
  std::int64_t transfers = 0, fills = 0, allocations = 0;
  std::int64_t fail_transfer = 0, fail_fill = 0, fail_allocation = 0;
  int injected = 0;

  /// The next transfer (zero fill, allocation) throws.
  void next_transfer() { fail_transfer = transfers + 1; }
  void next_fill() { fail_fill = fills + 1; }
  void next_allocation() { fail_allocation = allocations + 1; }
  void disarm() { fail_transfer = fail_fill = fail_allocation = 0; }

  bool fails(std::int64_t& count, std::int64_t at) {
    if (++count != at) return false;
    ++injected;
    return true;
  }
};

/// `Base` (a host backend) whose transfers and zero fills throw when the plan says. A failing
/// transfer first enqueues half its batch: the worst case for a scheduler's rollback (a reused
/// slot partly overwritten).
template <class Base = oomb::host_backend>
struct failing_backend : Base {
  fault_plan* plan = nullptr;
  failing_backend() = default;
  explicit failing_backend(fault_plan& p) : plan(&p) {}

  void zero_fill(oomb::host_stream& s, void* dst, std::size_t bytes) const {
    if (plan && plan->fails(plan->fills, plan->fail_fill)) throw injected_fault("injected: zero fill");
    Base::zero_fill(s, dst, bytes);
  }

  template <class D, class S>
  oomb::transfer_report transfer(oomb::host_stream& s, oomb::block_pool<D>& dst, oomb::id_span dst_ids,
                                 const oomb::block_pool<S>& src, oomb::id_span src_ids) {
    if (plan && plan->fails(plan->transfers, plan->fail_transfer)) {
      const std::size_t half = (dst_ids.size() + 1) / 2;
      oomb::transfer_pages(s, dst, oomb::id_span(dst_ids.data(), half), src, oomb::id_span(src_ids.data(), half));
      throw injected_fault("injected: transfer");
    }
    return oomb::transfer_pages(s, dst, dst_ids, src, src_ids);
  }
};

/// A resource over `Upstream` whose allocations fail (out_of_memory) when the plan says.
template <class Upstream>
class failing_resource {
 public:
  static constexpr oomb::memory_kind kind = Upstream::kind;
  failing_resource(Upstream& up, fault_plan& plan) : up_(&up), plan_(&plan) {}
  void* allocate(std::size_t bytes, std::size_t alignment) {
    if (plan_->fails(plan_->allocations, plan_->fail_allocation))
      OOMB_FAIL(oomb::out_of_memory, "failing_resource: injected failure of an allocation of ", bytes, " bytes");
    return up_->allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept { up_->deallocate(p, bytes, alignment); }

 private:
  Upstream* up_;
  fault_plan* plan_;
};

}  // namespace oomb_test
