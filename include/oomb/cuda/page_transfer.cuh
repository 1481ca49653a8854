// oomb — batched page transfers between device and pinned pools, choosing copy engines or a kernel.
// SPDX-License-Identifier: Apache-2.0
//
// Two ways to move a batch of scattered pages over PCIe, measured on the H200 of the GPU machine
// (one large cudaMemcpyAsync moves 55 GB/s per direction over PCIe, 101 GB/s both at once;
// bench/cuda/page_transfer_bench.cu, docs/benchmarks.md "CUDA page transfers"):
//  - copy engines, one cudaMemcpyBatchAsync per batch (runs of adjacent pages merged first): no
//    SM is used, so compute keeps every SM (a concurrent bf16 GEMM lost nothing measurable). In
//    steady state pages of >= 64 KiB move at 95-100% of the large copy per direction and 93-101
//    GB/s both ways at once, from batches of 64 pages; 32 KiB pages host to device only 38-47
//    GB/s (the DMA cost per copy shows). The host pays ~0.6-0.8 us per copy inside the call.
//  - the gather/scatter kernel (page_copy_kernel.cuh): 8 blocks read or write mapped pinned
//    memory directly; 48-52 GB/s per direction for any page size from batches of 256, so it
//    beats the copy engines for small pages host to device, at ~0.08 us of host time per page;
//    but SM-issued PCIe traffic tops out near 63-72 GB/s both ways at once, and its blocks hold
//    SMs (a GEMM beside it: no measurable loss up to 16 blocks, 24% at 32).
// transfer_path::automatic therefore takes the kernel only for short runs (mean merged copy
// below kernel_run_bytes, 64 KiB) in batches of at least kernel_min_pages (64), and the copy
// engines for everything else. Device-to-device batches always take the copy engines. A caller
// protecting compute sets path = memcpy_batch; one moving many small pages sets kernel.
//
// Validation (equal block sizes and page formats, ids in use, no destination twice) is
// page_transfer's, done in full before anything is enqueued. Pageable host pools do not compile
// here: cuda_staged_page_transfer (staged_page_transfer.cuh) moves them through pinned staging, and
// cuda_tier_transfer picks whichever of the two a pair of pools needs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/nvtx.hpp"
#include "oomb/cuda/page_copy_kernel.cuh"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/parallel_copier.hpp"

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
  int kernel_blocks = 8;                     ///< blocks of a kernel batch (SMs taken from compute)
  std::size_t kernel_run_bytes = 64 * 1024;  ///< automatic: mean merged copy below this takes the kernel ...
  std::size_t kernel_min_pages = 64;         ///< ... when the batch has at least this many pages
  std::size_t pages_per_launch = 8192;       ///< kernel staging slot size (bigger batches: more launches)
  int staging_slots = 8;                     ///< kernel launches in flight before back-pressure
  /// Pageable homes only (cuda_staged_page_transfer, staged_page_transfer.cuh): the pinned staging
  /// ring each transfer object owns, and the threads copying between the homes and it.
  struct pageable_staging {
    std::size_t chunk_bytes = std::size_t(8) << 20;  ///< bytes per chunk: one host copy, one DMA batch
    int chunks = 4;   ///< chunks per transfer object (pinned: chunks x chunk_bytes); host copies overlap DMA
    /// The threads that copy between the homes and the staging: null for parallel_copier::shared(),
    /// one thread per hardware thread for all of the process's transfers; else a copier that outlives
    /// every transfer built with it. On the H200's host one thread moves ~6 GB/s; 8 moved 31-39 GB/s
    /// one way and 40-45 both ways at once (bench/cuda/staged_transfer_bench.cu).
    parallel_copier* copier = nullptr;
  } pageable;
};

/// What a transfer moved, and how.
struct cuda_transfer_report : transfer_report {
  transfer_path path = transfer_path::memcpy_batch;
};

/// True when pages can move between pools over these resources by DMA or the copy kernel alone: each
/// side device or pinned (pageable host memory is neither truly asynchronous nor readable by
/// kernels; cuda_staged_page_transfer stages it).
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
                "memory cannot be transferred asynchronously); use cuda_staged_page_transfer or cuda_tier_transfer "
                "(staged_page_transfer.cuh) for pageable homes");

 public:
  using dst_pool_type = block_pool<DstResource>;
  using src_pool_type = block_pool<SrcResource>;
  static constexpr bool device_to_device =
      DstResource::kind == memory_kind::device && SrcResource::kind == memory_kind::device;

  /// Pages of both pools must have the same block size (throws invalid_argument naming both).
  cuda_page_transfer(dst_pool_type& dst, const src_pool_type& src, cuda_transfer_options options = {})
      : plan_(dst, src), options_(checked(options)) {
    take_staging();
  }
  /// As above, and the page formats must be equal and fit the blocks.
  cuda_page_transfer(dst_pool_type& dst, const page_format& dst_format, const src_pool_type& src,
                     const page_format& src_format, cuda_transfer_options options = {})
      : plan_(dst, dst_format, src, src_format), options_(checked(options)) {
    take_staging();
  }

  /// Copies page src_ids[i] of the source pool to page dst_ids[i] of the destination pool, as one
  /// batch on `stream`, by options().path. Everything is validated before anything is enqueued.
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids) {
    return enqueue(stream, dst_ids, src_ids, options_.path);
  }
  /// As above, by `path`.
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids, transfer_path path) {
    const detail::nvtx_range range("oomb: page transfer batch");
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
    return r.bytes / r.copies < options_.kernel_run_bytes ? transfer_path::kernel : transfer_path::memcpy_batch;
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
  // The kernel path's staging (pinned and device memory) is taken here, at construction, when the
  // options may choose the kernel, so a batch does not fail for want of it; an explicit kernel
  // batch under other options takes it on first use.
  void take_staging() {
    const bool may_use_kernel = options_.path == transfer_path::automatic || options_.path == transfer_path::kernel;
    if (may_use_kernel && !device_to_device && plan_.dst().block_bytes() % 16 == 0) (void)engine();
  }
  page_copy_engine& engine() {
    if (engine_.empty()) engine_.emplace_back(options_.pages_per_launch, options_.staging_slots);
    return engine_.front();
  }

  page_transfer<DstResource, SrcResource> plan_;
  cuda_transfer_options options_;
  std::vector<page_copy_engine> engine_;  // zero or one (an optional that needs no C++17 move-assign)
};

OOMB_NAMESPACE_END
