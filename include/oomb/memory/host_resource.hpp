// oomb — pageable host memory through aligned operator new.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <new>

#include "oomb/core/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Plain host memory. Stateless and thread-safe; both tiers of the CPU build are host pools.
class host_resource {
 public:
  static constexpr memory_kind kind = memory_kind::host;

  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "host_resource: alignment must be a power of two, got ", alignment);
    try {
      return ::operator new(bytes, std::align_val_t{alignment});
    } catch (const std::bad_alloc&) {
      OOMB_FAIL(out_of_memory, "host_resource: could not allocate ", bytes, " bytes (alignment ",
                alignment, ")");
    }
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) noexcept {
    ::operator delete(p, bytes, std::align_val_t{alignment});
  }
};

static_assert(is_memory_resource_v<host_resource>);

OOMB_NAMESPACE_END
