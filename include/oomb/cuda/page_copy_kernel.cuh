// oomb — the gather/scatter kernel: a few blocks copy many equal pages through the SMs.
// SPDX-License-Identifier: Apache-2.0
//
// The device reads (gather, host -> device) or writes (scatter, device -> host) mapped pinned
// memory directly, so a batch of scattered pages costs one launch instead of one DMA descriptor
// per page. Each thread moves 16-byte vectors, several loads in flight before the first store:
// PCIe reads of host memory take ~1-2 us, so ~100-200 KiB must be in flight to fill the link, and
// kThreads * kUnroll * 16 B = 64 KiB per block gives that with a handful of blocks. Few blocks on
// purpose: each one holds an SM that compute (a GEMM) then cannot use.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/cuda/nvtx.hpp"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// One page of a kernel batch: where it comes from and goes to (device or mapped pinned memory,
/// 16-byte aligned). Kernel batches read these from device memory.
struct page_copy_desc {
  const void* src;
  void* dst;
};

namespace detail {

inline constexpr int page_copy_threads = 512;
inline constexpr int page_copy_unroll = 8;

/// Checks that one launch of `count` pages of `page_bytes` with `blocks` blocks fits the kernel's
/// 32-bit vector indices (at most 64 GiB per launch); names the numbers when it does not.
inline void check_page_copy_launch(std::size_t count, std::size_t page_bytes, int blocks) {
  OOMB_EXPECTS(page_bytes > 0 && page_bytes % 16 == 0,
               "page copy kernel: page bytes must be a positive multiple of 16, got ", page_bytes);
  OOMB_EXPECTS(blocks > 0, "page copy kernel: blocks must be positive, got ", blocks);
  constexpr std::uint64_t chunk = std::uint64_t(page_copy_threads) * page_copy_unroll;
  const std::uint64_t total = std::uint64_t(page_bytes / 16) * std::uint64_t(count);
  OOMB_EXPECTS(total / (page_bytes / 16) == count && total + chunk * std::uint64_t(blocks) < (std::uint64_t(1) << 32),
               "page copy kernel: a launch of ", count, " pages of ", page_bytes,
               " bytes is too large (at most 64 GiB per launch)");
}

OOMB_KERNEL_NAMESPACE_BEGIN

/// Block b handles chunks b, b + gridDim.x, ... of kThreads * kUnroll vectors of the batch seen as
/// one sequence of `count * vecs_per_page` vectors; a chunk may span pages (small pages keep every
/// thread busy). Vector v of the batch is vector v % vecs_per_page of page v / vecs_per_page.
/// 32-bit indices (the launcher checks the batch fits): a 64-bit division per vector would cost
/// about as long as the PCIe round trip it is meant to hide.
template <int kThreads, int kUnroll>
OOMB_KERNEL void __launch_bounds__(kThreads) page_copy_kernel(const page_copy_desc* __restrict__ desc,
                                                             std::uint32_t vecs_per_page,
                                                             std::uint32_t total_vecs) {
  constexpr std::uint32_t chunk = std::uint32_t(kThreads) * kUnroll;
  const std::uint32_t stride = gridDim.x * chunk;
  for (std::uint32_t base = blockIdx.x * chunk + threadIdx.x; base < total_vecs; base += stride) {
    uint4 r[kUnroll];
    uint4* dst[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint32_t v = base + std::uint32_t(u) * kThreads;
      dst[u] = nullptr;
      if (v < total_vecs) {
        const std::uint32_t page = v / vecs_per_page;
        const std::uint32_t within = v - page * vecs_per_page;
        const page_copy_desc d = desc[page];
        r[u] = __ldcs(static_cast<const uint4*>(d.src) + within);  // streaming: read once
        dst[u] = static_cast<uint4*>(d.dst) + within;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (dst[u] != nullptr) __stcs(dst[u], r[u]);
  }
}

OOMB_KERNEL_NAMESPACE_END

}  // namespace detail

/// Enqueues one kernel copying `count` pages of `page_bytes` each, as listed by `desc` (device
/// memory, `count` entries, valid until the kernel ran), on `stream` with `blocks` blocks.
/// page_bytes must be a positive multiple of 16 and every address 16-byte aligned (checked by the
/// caller that builds the list; see page_mover). Throws cuda_error if the launch fails.
inline void launch_page_copy_kernel(const page_copy_desc* desc, std::size_t count, std::size_t page_bytes,
                                    int blocks, cudaStream_t stream) {
  detail::check_page_copy_launch(count, page_bytes, blocks);
  if (count == 0) return;
  constexpr std::uint64_t chunk = std::uint64_t(detail::page_copy_threads) * detail::page_copy_unroll;
  const std::uint64_t vecs = page_bytes / 16;
  const std::uint64_t total = vecs * count;
  const std::uint64_t useful = (total + chunk - 1) / chunk;  // no block without work
  const unsigned grid = static_cast<unsigned>(useful < std::uint64_t(blocks) ? useful : std::uint64_t(blocks));
  detail::page_copy_kernel<detail::page_copy_threads, detail::page_copy_unroll>
      <<<grid, detail::page_copy_threads, 0, stream>>>(desc, static_cast<std::uint32_t>(vecs),
                                                        static_cast<std::uint32_t>(total));
  OOMB_CUDA_CHECK_LAUNCH("page copy kernel: launching ", grid, " blocks for ", count, " pages of ",
                         page_bytes, " bytes");
}

/// Runs kernel batches from lists of copies: expands each copy (a multiple of the page size, e.g.
/// a merged run) into per-page descriptors, writes them to a pinned staging slot, uploads them to
/// the slot's device twin on the same stream (one small copy) and launches the kernel. The slots
/// are a staging_ring (staging_ring.hpp): a slot is written again only once the event recorded
/// behind its last kernel has completed (asked without blocking); when every slot is still in
/// flight the ring grows instead of waiting, so enqueue never blocks the host and ordering stays
/// with streams and events. `slots` are taken up front (pages_per_launch * 16 bytes of pinned and
/// of device memory each); slots() says how many there are now. Batches above
/// `pages_per_launch` pages take several launches.
/// Not internally synchronised: one per thread, or a lock.
class page_copy_engine {
 public:
  explicit page_copy_engine(std::size_t pages_per_launch = 8192, int slots = 8) : per_launch_(pages_per_launch) {
    OOMB_EXPECTS(pages_per_launch > 0, "page_copy_engine: pages_per_launch must be positive");
    OOMB_EXPECTS(slots > 0, "page_copy_engine: slots must be positive, got ", slots);
    ring_.grow(static_cast<std::size_t>(slots), [this] { return make_slot(); });
  }

  /// Enqueues the copies of `ops` (each a positive multiple of `page_bytes`, 16-byte aligned on both
  /// sides, device or mapped pinned memory) on `stream`, `blocks` blocks per launch. Validates the
  /// whole batch, every launch's size included, and takes every staging slot it needs before it
  /// enqueues anything: invalid_argument or out_of_memory leave nothing enqueued (a cuda_error
  /// from the runtime itself may leave earlier launches of the batch enqueued).
  void enqueue(const copy_op* ops, std::size_t count, std::size_t page_bytes, int blocks, cudaStream_t stream) {
    const detail::nvtx_range range("oomb: page copy kernel batch");
    OOMB_EXPECTS(ops != nullptr || count == 0, "page_copy_engine: null batch of ", count, " copies");
    OOMB_EXPECTS(page_bytes > 0 && page_bytes % 16 == 0,
                 "page_copy_engine: page bytes must be a positive multiple of 16, got ", page_bytes);
    OOMB_EXPECTS(blocks > 0, "page_copy_engine: blocks must be positive, got ", blocks);
    std::size_t pages = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const copy_op& o = ops[i];
      OOMB_EXPECTS(o.bytes % page_bytes == 0, "page_copy_engine: copy ", i, " of ", o.bytes,
                   " bytes is not a whole number of ", page_bytes, "-byte pages");
      OOMB_EXPECTS(((reinterpret_cast<std::uintptr_t>(o.src) | reinterpret_cast<std::uintptr_t>(o.dst)) & 15) == 0,
                   "page_copy_engine: copy ", i, " is not 16-byte aligned (", o.src, " -> ", o.dst, ")");
      pages += o.bytes / page_bytes;
    }
    if (pages == 0) return;
    detail::check_page_copy_launch(std::min(pages, per_launch_), page_bytes, blocks);  // the largest launch
    const std::size_t launches = (pages + per_launch_ - 1) / per_launch_;
    const std::vector<std::size_t>& taken = ring_.take(launches, [this] { return make_slot(); });

    std::size_t op = 0, page_in_op = 0;
    for (const std::size_t index : taken) {
      slot& s = ring_[index];
      const std::size_t n = std::min(pages, per_launch_);
      for (std::size_t k = 0; k < n; ++k) {
        while (page_in_op * page_bytes == ops[op].bytes) ++op, page_in_op = 0;
        const std::size_t off = page_in_op * page_bytes;
        s.host.get()[k] = {static_cast<const std::byte*>(ops[op].src) + off, static_cast<std::byte*>(ops[op].dst) + off};
        ++page_in_op;
      }
      OOMB_CUDA_CHECK(cudaMemcpyAsync(s.device.get(), s.host.get(), n * sizeof(page_copy_desc),
                                      cudaMemcpyHostToDevice, stream),
                      "page_copy_engine: uploading ", n, " descriptors");
      launch_page_copy_kernel(s.device.get(), n, page_bytes, blocks, stream);
      ring_.record(index, cuda_stream_view(stream));
      pages -= n;
    }
  }

  page_copy_engine(page_copy_engine&&) noexcept = default;
  page_copy_engine& operator=(page_copy_engine&&) = delete;  // would free staging in flight
  // Destruction waits for its own launches (staging_ring's destructor): their staging is freed.

  std::size_t pages_per_launch() const noexcept { return per_launch_; }
  /// Staging slots now: those asked at construction, plus any the ring grew by.
  std::size_t slots() const noexcept { return ring_.size(); }

 private:
  struct slot {
    pinned_staging<page_copy_desc> host;
    device_staging<page_copy_desc> device;
  };

  // A slot of pages_per_launch descriptors, pinned (copied, not mapped) and on the device.
  slot make_slot() const {
    return slot{make_pinned_staging<page_copy_desc>(per_launch_, cudaHostAllocPortable, "page_copy_engine"),
                make_device_staging<page_copy_desc>(per_launch_, "page_copy_engine")};
  }

  std::size_t per_launch_;
  staging_ring<slot> ring_;
};

OOMB_NAMESPACE_END
