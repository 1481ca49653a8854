// oomb — NVTX ranges in the "oomb" domain, so a framework's profiler (Nsight Systems, the PyTorch
// profiler) shows oomb's transfers and batches by name.
// SPDX-License-Identifier: Apache-2.0
//
// NVTX3 is header-only and ships with the CUDA toolkit; with no profiler attached a range costs a
// branch. Define NVTX_DISABLE to compile every range out.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include "oomb/core/config.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// The "oomb" NVTX domain, created on first use.
inline nvtxDomainHandle_t nvtx_domain() noexcept {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("oomb");
  return domain;
}

/// Opens a range named `name` (which must outlive it: string literals) in the "oomb" domain.
inline void nvtx_push(const char* name) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(nvtx_domain(), &a);
}
/// Closes the innermost range nvtx_push() opened.
inline void nvtx_pop() noexcept { nvtxDomainRangePop(nvtx_domain()); }

/// An NVTX range open for this object's lifetime (host time, as NVTX ranges are).
class nvtx_range {
 public:
  explicit nvtx_range(const char* name) noexcept { nvtx_push(name); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
  ~nvtx_range() { nvtx_pop(); }
};

}  // namespace detail

OOMB_NAMESPACE_END
