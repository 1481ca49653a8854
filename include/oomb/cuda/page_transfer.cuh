// oomb — batched page transfers between device and pinned pools, choosing copy engines or a kernel.
// SPDX-License-Identifier: Apache-2.0
//
// Two ways to move a batch of scattered pages over PCIe, and why each wins where it does
// (H200, PCIe 5 x16, ~55 GB/s per direction for one large copy; see docs/benchmarks.md):
//  - copy engines, one cudaMemcpyBatchAsync per batch (runs of adjacent pages merged first): no
//    SM is used, so compute runs at full speed, and long runs reach the link's bandwidth; but each
//    copy carries a fixed DMA cost, so scattered 64 KiB pages stall near ~40 GB/s;
//  - the gather/scatter kernel (page_copy_kernel.cuh): a few blocks read or write mapped pinned
//    memory directly, 16 bytes per access, many loads in flight; per-page cost is nearly nothing,
//    so scattered small pages reach ~50 GB/s, but those blocks hold SMs compute cannot use.
// transfer_path::automatic takes the copy engines for long runs (mean merged copy >=
// copy_engine_run_bytes) and for tiny batches (fewer than kernel_min_pages pages, where the kernel's
// launch and descriptor upload dominate), and the kernel for many short runs. Device-to-device
// batches always take the copy engines. A caller protecting compute sets path = memcpy_batch.
//
// Validation (equal block sizes and page formats, ids in use, no destination twice) is
// page_transfer's, done in full before anything is enqueued; pageable host pools do not compile.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/page_copy_kernel.cuh"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/page_transfer.hpp"

OOMB_NAMESPACE_BEGIN

/// How a batch moves.
enum class transfer_path {
  automatic,     ///< chosen per batch (see the file comment)
  memcpy_batch,  ///< copy engines: one cudaMemcpyBatchAsync of the merged runs
  kernel,        ///< the gather/scatter kernel over mapped pinned memory
  per_page,      ///< one cudaMemcpyAsync per merged run (for comparison only)
};

inline constexpr const char* to_string(transfer_path p) noexcept {
  switch (p) {
    case transfer_path::automatic: return "automatic";
    case transfer_path::memcpy_batch: return "memcpy_batch";
    case transfer_path::kernel: return "kernel";
    case transfer_path::per_page: return "per_page";
  }
  return "unknown";
}

/// Knobs of a cuda_page_transfer; the defaults come from the benchmark on an H200 (see
/// choose() and docs/benchmarks.md).
struct cuda_transfer_options {
  transfer_path path = transfer_path::automatic;
  int kernel_blocks = 8;                                ///< blocks of a kernel batch (SMs taken from compute)
  std::size_t copy_engine_run_bytes = 256 * 1024;       ///< mean merged copy at least this: copy engines
  std::size_t kernel_run_bytes = 64 * 1024;             ///< mean merged copy below this: the kernel ...
  std::size_t kernel_min_pages = 16;                    ///< ... once the batch has this many pages
  std::size_t kernel_min_batch_bytes = 64u << 20;       ///< runs in between: the kernel from this many bytes
  std::size_t pages_per_launch = 8192;                  ///< kernel staging slot size (bigger batches: more launches)
  int staging_slots = 8;                                ///< kernel launches in flight before back-pressure
};

/// What a transfer moved, and how.
struct cuda_transfer_report : transfer_report {
  transfer_path path = transfer_path::memcpy_batch;
};

/// True when pages can move between pools over these resources: each side device or pinned
/// (pageable host memory is neither truly asynchronous nor readable by kernels).
template <class DstResource, class SrcResource>
inline constexpr bool cuda_transferable_v =
    DstResource::kind != memory_kind::host && SrcResource::kind != memory_kind::host;

/// Validates and enqueues batches of page copies from pool `src` to pool `dst` on CUDA streams.
/// Keeps its scratch and staging between calls (steady state allocates nothing). Not internally
/// synchronised: one per thread, or a lock.
template <class DstResource, class SrcResource>
class cuda_page_transfer {
  static_assert(cuda_transferable_v<DstResource, SrcResource>,
                "cuda_page_transfer: both pools must be device or pinned memory (pageable host "
                "memory cannot be transferred asynchronously); use pinned_resource for the far tier");

 public:
  using dst_pool_type = block_pool<DstResource>;
  using src_pool_type = block_pool<SrcResource>;
  static constexpr bool device_to_device =
      DstResource::kind == memory_kind::device && SrcResource::kind == memory_kind::device;

  /// Pages of both pools must have the same block size (throws invalid_argument naming both).
  cuda_page_transfer(dst_pool_type& dst, const src_pool_type& src, cuda_transfer_options options = {})
      : plan_(dst, src), options_(checked(options)) {}
  /// As above, and the page formats must be equal and fit the blocks.
  cuda_page_transfer(dst_pool_type& dst, const page_format& dst_format, const src_pool_type& src,
                     const page_format& src_format, cuda_transfer_options options = {})
      : plan_(dst, dst_format, src, src_format), options_(checked(options)) {}

  /// Copies page src_ids[i] of the source pool to page dst_ids[i] of the destination pool, as one
  /// batch on `stream`, by options().path. Everything is validated before anything is enqueued.
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids) {
    return enqueue(stream, dst_ids, src_ids, options_.path);
  }
  /// As above, by `path`.
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids, transfer_path path) {
    cuda_transfer_report r;
    static_cast<transfer_report&>(r) = plan_.plan(dst_ids, src_ids);
    r.path = choose(r, path);
    const std::vector<copy_op>& ops = plan_.ops();
    if (ops.empty()) return r;
    switch (r.path) {
      case transfer_path::kernel:
        engine().enqueue(ops.data(), ops.size(), plan_.dst().block_bytes(), options_.kernel_blocks, stream);
        break;
      case transfer_path::per_page:
        for (const copy_op& o : ops) stream.enqueue_copy(o.dst, o.src, o.bytes);
        break;
      default:
        memcpy_batch_async(ops.data(), ops.size(), stream);
        break;
    }
    return r;
  }

  /// The path a batch described by `r` takes when `requested` (automatic: see the file comment).
  transfer_path choose(const transfer_report& r, transfer_path requested) const noexcept {
    const bool kernel_ok = !device_to_device && plan_.dst().block_bytes() % 16 == 0;
    if (requested == transfer_path::kernel) return kernel_ok ? transfer_path::kernel : transfer_path::memcpy_batch;
    if (requested != transfer_path::automatic) return requested;
    if (!kernel_ok || r.copies == 0 || r.pages < options_.kernel_min_pages) return transfer_path::memcpy_batch;
    const std::size_t run = r.bytes / r.copies;
    if (run >= options_.copy_engine_run_bytes) return transfer_path::memcpy_batch;
    if (run < options_.kernel_run_bytes) return transfer_path::kernel;
    return r.bytes >= options_.kernel_min_batch_bytes ? transfer_path::kernel : transfer_path::memcpy_batch;
  }

  const cuda_transfer_options& options() const noexcept { return options_; }
  void set_options(const cuda_transfer_options& o) { options_ = checked(o); }
  /// The copies of the last batch, merged and sorted by destination address.
  const std::vector<copy_op>& ops() const noexcept { return plan_.ops(); }
  dst_pool_type& dst() const noexcept { return plan_.dst(); }
  const src_pool_type& src() const noexcept { return plan_.src(); }

 private:
  static cuda_transfer_options checked(const cuda_transfer_options& o) {
    OOMB_EXPECTS(o.kernel_blocks > 0, "cuda_page_transfer: kernel_blocks must be positive, got ", o.kernel_blocks);
    OOMB_EXPECTS(o.pages_per_launch > 0, "cuda_page_transfer: pages_per_launch must be positive");
    OOMB_EXPECTS(o.staging_slots > 0, "cuda_page_transfer: staging_slots must be positive, got ", o.staging_slots);
    return o;
  }
  // Staging is pinned memory: taken on the first kernel batch only.
  page_copy_engine& engine() {
    if (engine_.empty()) engine_.emplace_back(options_.pages_per_launch, options_.staging_slots);
    return engine_.front();
  }

  page_transfer<DstResource, SrcResource> plan_;
  cuda_transfer_options options_;
  std::vector<page_copy_engine> engine_;  // zero or one (an optional that needs no C++17 move-assign)
};

OOMB_NAMESPACE_END
