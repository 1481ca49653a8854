// oomb — the CPU residency backend: host streams, both tiers in host memory, memset fills.
// SPDX-License-Identifier: Apache-2.0
//
// The policy residency_scheduler is instantiated with in CPU builds and tests. The CUDA side
// provides its own (CUDA streams, device slots, pinned homes, cudaMemsetAsync), so code written
// against residency_scheduler<Backend> moves to the GPU by changing this one type.
#pragma once

#include <cstddef>
#include <cstring>

#include "oomb/memory/host_resource.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/host_stream_view.hpp"
#include "oomb/offload/residency_scheduler.hpp"

OOMB_NAMESPACE_BEGIN

/// Residency backend over host_stream and host_resource slots; the homes come from `FarResource`
/// (any host-reachable resource: host_resource, a limiting_adaptor or statistics_adaptor over it).
template <class FarResource = host_resource>
struct basic_host_backend {
  using stream_type = host_stream;
  using compute_stream_type = host_stream_view;
  using near_resource = host_resource;
  using far_resource = FarResource;

  /// Enqueues memset(dst, 0, bytes) on `stream`, in order with its copies.
  void zero_fill(host_stream& stream, void* dst, std::size_t bytes) const {
    stream.enqueue([dst, bytes] { std::memset(dst, 0, bytes); });
  }
};

/// The CPU backend with homes in host_resource.
using host_backend = basic_host_backend<>;

static_assert(is_residency_backend_v<host_backend>);

/// The residency scheduler of CPU builds.
using host_residency_scheduler = residency_scheduler<host_backend>;

OOMB_NAMESPACE_END
