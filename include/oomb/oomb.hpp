// oomb — the umbrella header: every public header that needs no CUDA, listed by hand.
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA side (oomb/cuda/, the kernels in oomb/attention/*.cuh) is not included: it needs nvcc
// or the CUDA runtime's headers; include its headers where you use them. A test (tests/headers/check_umbrella.py) fails when a public
// header outside cuda/ and detail/ is missing here, or when a line here names no header.
#pragma once

// core: version, compiler glue, errors, scalar and tensor types, fixed-order reductions
#include "oomb/core/version.hpp"
#include "oomb/core/config.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/memory_kind.hpp"
#include "oomb/core/bf16.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/core/dtype.hpp"
#include "oomb/core/any_tensor_view.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/core/fixed_order.hpp"

// memory: the resource concept, host memory, adaptors, growable ranges, the block pool
#include "oomb/memory/resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/callback_resource.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/block_pool.hpp"

// paging: page geometry, pools of page pairs, page tables, the KV cache, the gradient mirror and
// the POD views kernels read
#include "oomb/paging/page_shape.hpp"
#include "oomb/paging/page_pool_config.hpp"
#include "oomb/paging/views.hpp"
#include "oomb/paging/page_table.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "oomb/paging/grad_mirror.hpp"

// offload: the stream concept, the host stream and its view, batched page transfers, host copies
// split over threads, the residency scheduler (its backend concept, bookkeeping, slot hazards,
// event pool, eviction policies) and its CPU backend
#include "oomb/offload/stream.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/host_stream_view.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/parallel_copier.hpp"
#include "oomb/offload/residency_backend.hpp"
#include "oomb/offload/residency_table.hpp"
#include "oomb/offload/slot_hazards.hpp"
#include "oomb/offload/event_pool.hpp"
#include "oomb/offload/eviction_policy.hpp"
#include "oomb/offload/belady_eviction.hpp"
#include "oomb/offload/residency_scheduler.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/bf16_codec.hpp"
#include "oomb/offload/converting_host_backend.hpp"

// sparse: per-page key summaries, Quest / mean-key scoring of query tiles, top-k page selection
// with sink and local pages, the per-tile sparse page table (CSR) and its POD view
#include "oomb/sparse/page_summary_view.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/scoring.hpp"
#include "oomb/sparse/selection.hpp"
#include "oomb/sparse/sparse_page_table.hpp"
#include "oomb/sparse/tile_selector.hpp"

// attention: what one paged attention call works on, its plan, the Hopper backward's walk over query
// rows (host logic the kernels share), the CPU reference every kernel is checked against, and the RoPE
// table the K/V page writes read (the kernels are under oomb/attention/*.cuh)
#include "oomb/attention/args.hpp"
#include "oomb/attention/fast_divmod.hpp"
#include "oomb/attention/plan.hpp"
#include "oomb/attention/query_walk.hpp"
#include "oomb/attention/reference.hpp"
#include "oomb/attention/rope_table.hpp"
