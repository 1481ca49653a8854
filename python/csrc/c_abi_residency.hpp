// A near tier's counters as both C-ABI libraries of the Python package report them
// (oomb_residency_stats of oomb_c.h: a store's near tiers, and oomb_cuda.h's paged session).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "oomb/offload/residency_scheduler.hpp"
#include "oomb_c.h"

namespace oomb_c_abi {

/// The scheduler's counters `s` of a tier of `slots` slots of `slot_bytes` each, in the C struct.
inline oomb_residency_stats residency_stats_of(const oomb::residency_stats& s, std::int32_t slots,
                                               std::int64_t slot_bytes) {
  oomb_residency_stats r{};
  r.bytes_to_near = static_cast<std::int64_t>(s.bytes_to_near);
  r.bytes_to_far = static_cast<std::int64_t>(s.bytes_to_far);
  r.hits = static_cast<std::int64_t>(s.hits);
  r.misses = static_cast<std::int64_t>(s.misses);
  r.evictions = static_cast<std::int64_t>(s.evictions);
  r.write_backs = static_cast<std::int64_t>(s.write_backs);
  r.zero_fills = static_cast<std::int64_t>(s.zero_fills);
  r.slots = slots;
  r.slot_bytes = slots > 0 ? slot_bytes : 0;
  return r;
}

}  // namespace oomb_c_abi
