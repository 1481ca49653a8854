// oomb — where a piece of memory can be reached from.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// Where memory lives. `pinned` is page-locked host memory reachable from both the host and the
/// device (the far tier's home); `device` is reachable from kernels only.
enum class memory_kind { host, pinned, device };

/// True when host code may dereference memory of this kind.
constexpr bool host_accessible(memory_kind k) noexcept { return k != memory_kind::device; }
/// True when kernels may dereference memory of this kind.
constexpr bool device_accessible(memory_kind k) noexcept { return k != memory_kind::host; }

constexpr const char* to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::host: return "host";
    case memory_kind::pinned: return "pinned";
    case memory_kind::device: return "device";
  }
  return "unknown";
}

OOMB_NAMESPACE_END
