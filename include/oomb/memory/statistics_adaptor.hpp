// oomb — counts what passes through a memory resource.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstddef>

#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Bytes and allocations currently held, their high water, and totals.
struct resource_statistics {
  std::size_t bytes_in_use = 0;
  std::size_t bytes_high_water = 0;
  std::size_t allocations_in_use = 0;
  std::size_t total_allocations = 0;
};

/// Wraps an upstream resource (held by reference; it must outlive the adaptor) and counts bytes.
/// Thread-safe when the upstream is: the counters are atomics.
template <class Upstream>
class statistics_adaptor {
  static_assert(is_memory_resource_v<Upstream>, "statistics_adaptor needs a memory resource");

 public:
  static constexpr memory_kind kind = Upstream::kind;

  explicit statistics_adaptor(Upstream& upstream) noexcept : upstream_(&upstream) {}
  statistics_adaptor(const statistics_adaptor&) = delete;
  statistics_adaptor& operator=(const statistics_adaptor&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment) {
    void* p = upstream_->allocate(bytes, alignment);
    const std::size_t now = in_use_.fetch_add(bytes) + bytes;
    std::size_t peak = high_water_.load();
    while (now > peak && !high_water_.compare_exchange_weak(peak, now)) {
    }
    ++count_;
    ++total_;
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    upstream_->deallocate(p, bytes, alignment);
    in_use_ -= bytes;
    --count_;
  }

  resource_statistics statistics() const noexcept {
    return {in_use_.load(), high_water_.load(), count_.load(), total_.load()};
  }

  Upstream& upstream() const noexcept { return *upstream_; }

 private:
  Upstream* upstream_;
  std::atomic<std::size_t> in_use_{0}, high_water_{0}, count_{0}, total_{0};
};


OOMB_NAMESPACE_END
