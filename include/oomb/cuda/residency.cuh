// oomb — the residency scheduler on CUDA: device slots near, pinned homes far, CUDA streams.
// SPDX-License-Identifier: Apache-2.0
//
// cuda_backend is the policy residency_scheduler (oomb/offload/residency_scheduler.hpp) is
// instantiated with on the GPU, so code written against residency_scheduler<Backend> moves from
// the CPU (host_backend) to the GPU by changing this one type:
//  - prefetch copies run on the scheduler's copy-in stream, write-backs on its copy-out stream
//    (two streams: the two PCIe directions overlap); compute streams wait on their events
//    (cudaStreamWaitEvent), the host never waits on the hot path;
//  - batches move by cuda_page_transfer (see page_transfer.cuh for the measured trade-off): copy
//    engines (cudaMemcpyBatchAsync) for pages of 64 KiB and more, which also reach ~100 GB/s with
//    prefetch and write-back running at once; the gather/scatter kernel for many small pages.
//    Options may differ per direction (cuda_backend(to_near, to_far)); path = memcpy_batch
//    leaves every SM to compute;
//  - gradient pages are zeroed in their slot at first touch with cudaMemsetAsync, in order with
//    the copy-in stream's copies;
//  - compute streams are cuda_stream_view, taken by value: a temporary view of a framework's
//    cudaStream_t works; the far tier is any pinned (or device) resource: pinned_resource, a
//    framework's pinned allocator, a limiting_adaptor or statistics_adaptor over either; or
//    pageable host memory (host_resource), whose pages move through a pinned staging ring with
//    their host copies in stream order (cuda_staged_page_transfer): no pinned homes, so no device
//    memory for their pinning (the driver's 8 bytes per 4 KiB), at the host copies' rate;
//  - prepare() builds both transfer objects, kernel staging included, when the scheduler is built
//    (nothing is allocated lazily on the first batch), and each scheduler batch is an NVTX range
//    ("oomb::residency::prefetch", ...) that a framework's profiler shows (NVTX3, header-only).
// Streams: use high-priority streams for copy_in / copy_out (cuda_stream::greatest_priority()) so
// kernel-path copies are scheduled ahead of compute blocks waiting for an SM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/nvtx.hpp"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/staged_page_transfer.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/residency_scheduler.hpp"

OOMB_NAMESPACE_BEGIN

/// Residency backend over CUDA streams: slots in `NearResource` (device memory), homes in
/// `FarResource` (pinned memory by default; pageable host or device memory too). `Stream` is the
/// copy streams' type: cuda_stream (owners) or cuda_stream_view (streams owned elsewhere; the
/// scheduler keeps pointers to the caller's view objects). Compute streams are always
/// cuda_stream_view, by value.
template <class NearResource = device_resource, class Stream = cuda_stream, class FarResource = pinned_resource>
class cuda_backend {
  static_assert(NearResource::kind == memory_kind::device, "cuda_backend: the near tier is device memory");

 public:
  using stream_type = Stream;
  using compute_stream_type = cuda_stream_view;
  using near_resource = NearResource;
  using far_resource = FarResource;

  /// The same options for both directions.
  explicit cuda_backend(cuda_transfer_options options = {}) : cuda_backend(options, options) {}
  /// Options for prefetches (home -> slot) and for write-backs (slot -> home).
  cuda_backend(cuda_transfer_options to_near, cuda_transfer_options to_far) : in_options_(to_near), out_options_(to_far) {}

  /// cudaMemsetAsync of `bytes` zero bytes at `dst` on `stream`.
  void zero_fill(stream_type& stream, void* dst, std::size_t bytes) const {
    cuda_stream_view(stream).enqueue_memset(dst, 0, bytes);
  }

  /// Builds both transfer objects for the scheduler's pools (called by its constructor), so the
  /// first batch allocates none of the backend's own objects.
  void prepare(block_pool<near_resource>& near, block_pool<far_resource>& far) {
    (void)slot_for(near, static_cast<const block_pool<far_resource>&>(far));
    (void)slot_for(far, static_cast<const block_pool<near_resource>&>(near));
  }

  /// NVTX ranges (in the "oomb" domain, as the transfers' own) around the scheduler's batches.
  void range_begin(const char* name) noexcept { detail::nvtx_push(name); }
  void range_end() noexcept { detail::nvtx_pop(); }

  /// One batch of page copies between the tiers, by the path options() choose. The transfer
  /// objects (validation scratch, kernel staging) are kept per direction and rebuilt only when the
  /// scheduler's pools move (the scheduler itself was moved).
  template <class D, class S>
  transfer_report transfer(stream_type& stream, block_pool<D>& dst, id_span dst_ids, const block_pool<S>& src,
                           id_span src_ids) {
    return counted(slot_for(dst, src).enqueue(cuda_stream_view(stream), dst_ids, src_ids));
  }
  /// Pageable homes only (staged transfers): the same, calling `read` where the batch has read its
  /// sources. Written back, that is after the DMA out of the slots and before the host's copies
  /// into the homes, so the scheduler reuses the slots without waiting for those copies.
  template <class D, class S,
            std::enable_if_t<D::kind == memory_kind::host || S::kind == memory_kind::host, int> = 0>
  transfer_report transfer(stream_type& stream, block_pool<D>& dst, id_span dst_ids, const block_pool<S>& src,
                           id_span src_ids, sources_read_hook read) {
    return counted(slot_for(dst, src).enqueue(cuda_stream_view(stream), dst_ids, src_ids, read));
  }

  const cuda_transfer_options& to_near_options() const noexcept { return in_options_; }
  const cuda_transfer_options& to_far_options() const noexcept { return out_options_; }
  /// Take effect from the next batch.
  void set_options(const cuda_transfer_options& to_near, const cuda_transfer_options& to_far) {
    if (in_) in_->set_options(to_near);
    if (out_) out_->set_options(to_far);
    in_options_ = to_near;
    out_options_ = to_far;
  }
  /// Batches moved by the gather/scatter kernel, and by the copy engines (memcpy batch / per page).
  std::uint64_t kernel_batches() const noexcept { return kernel_batches_; }
  std::uint64_t copy_engine_batches() const noexcept { return copy_engine_batches_; }

 private:
  // Counts the batch by its path.
  cuda_transfer_report counted(const cuda_transfer_report& r) noexcept {
    if (r.copies > 0) ++(r.path == transfer_path::kernel ? kernel_batches_ : copy_engine_batches_);
    return r;
  }

  using in_transfer = cuda_tier_transfer<near_resource, far_resource>;
  using out_transfer = cuda_tier_transfer<far_resource, near_resource>;

  template <class D, class S>
  auto& slot_for(block_pool<D>& dst, const block_pool<S>& src) {
    if constexpr (std::is_same_v<D, near_resource> && std::is_same_v<S, far_resource>) {
      if (!in_ || in_pools_[0] != &dst || in_pools_[1] != &src) {
        in_ = std::make_unique<in_transfer>(dst, src, in_options_);
        in_pools_[0] = &dst;
        in_pools_[1] = &src;
      }
      return *in_;
    } else {
      static_assert(std::is_same_v<D, far_resource> && std::is_same_v<S, near_resource>,
                    "cuda_backend moves pages between its near and far tiers only");
      if (!out_ || out_pools_[0] != &dst || out_pools_[1] != &src) {
        out_ = std::make_unique<out_transfer>(dst, src, out_options_);
        out_pools_[0] = &dst;
        out_pools_[1] = &src;
      }
      return *out_;
    }
  }

  cuda_transfer_options in_options_, out_options_;
  std::unique_ptr<in_transfer> in_;
  std::unique_ptr<out_transfer> out_;
  const void* in_pools_[2] = {nullptr, nullptr};  // the pools in_ was built for (compared, never used)
  const void* out_pools_[2] = {nullptr, nullptr};
  std::uint64_t kernel_batches_ = 0, copy_engine_batches_ = 0;
};

static_assert(is_residency_backend_v<cuda_backend<>>);
static_assert(is_residency_backend_v<cuda_backend<device_resource, cuda_stream_view>>);
static_assert(is_residency_backend_v<cuda_backend<device_resource, cuda_stream, host_resource>>);
static_assert(detail::has_backend_prepare<cuda_backend<>>::value && detail::has_backend_ranges<cuda_backend<>>::value);
// Write-backs to pageable homes report when their slots are read; to pinned ones the batch is one point.
static_assert(detail::has_backend_sources_read<cuda_backend<device_resource, cuda_stream, host_resource>, host_resource,
                                               device_resource>::value);
static_assert(!detail::has_backend_sources_read<cuda_backend<>, pinned_resource, device_resource>::value);

/// The residency scheduler of CUDA builds: device slots (cudaMalloc), pinned homes, cuda_streams.
using cuda_residency_scheduler = residency_scheduler<cuda_backend<>>;

OOMB_NAMESPACE_END
