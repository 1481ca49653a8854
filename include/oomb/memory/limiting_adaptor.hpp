// oomb — caps the bytes a memory resource may hand out.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstddef>

#include "oomb/core/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Wraps an upstream resource (held by reference; it must outlive the adaptor) and refuses any
/// allocation that would take the bytes in use past `limit`, raising out_of_memory with both
/// numbers before touching the upstream. Thread-safe when the upstream is.
template <class Upstream>
class limiting_adaptor {
  static_assert(is_memory_resource_v<Upstream>, "limiting_adaptor needs a memory resource");

 public:
  static constexpr memory_kind kind = Upstream::kind;

  limiting_adaptor(Upstream& upstream, std::size_t limit_bytes) noexcept
      : upstream_(&upstream), limit_(limit_bytes) {}
  limiting_adaptor(const limiting_adaptor&) = delete;
  limiting_adaptor& operator=(const limiting_adaptor&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment) {
    std::size_t used = used_.load();
    do {
      OOMB_CHECK(bytes <= limit_ - used, out_of_memory, "limiting_adaptor: asked for ", bytes,
                 " bytes, ", limit_ - used, " of the ", limit_, "-byte ", to_string(kind),
                 " limit left");
    } while (!used_.compare_exchange_weak(used, used + bytes));
    try {
      return upstream_->allocate(bytes, alignment);
    } catch (...) {
      used_ -= bytes;
      throw;
    }
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    upstream_->deallocate(p, bytes, alignment);
    used_ -= bytes;
  }

  std::size_t limit() const noexcept { return limit_; }
  std::size_t bytes_in_use() const noexcept { return used_.load(); }
  Upstream& upstream() const noexcept { return *upstream_; }

 private:
  Upstream* upstream_;
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

OOMB_NAMESPACE_END
