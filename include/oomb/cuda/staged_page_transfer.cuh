// oomb — batched page transfers between device memory and *pageable* host memory, through a ring of
// pinned staging chunks, with the host's copies in stream order.
// SPDX-License-Identifier: Apache-2.0
//
// Why: pinning host memory costs device memory. The driver keeps 8 bytes per pinned 4 KiB page
// however it is pinned (bench/cuda/pinned_mapping_bench.cu: cudaHostAlloc, cudaHostRegister with or
// without huge pages, cuMemCreate on the host), so pinned homes make the GPU's memory grow with the
// context: 1.6 MB per 10K tokens at Qwen2.5-0.5B, 7.2 MB at 7B. Homes in ordinary pageable memory
// cost the device nothing; this moves their pages through a fixed pinned staging ring instead.
//
// How a batch moves (the batch is validated and merged by page_transfer first, as every transfer):
// its copies are cut into chunks of at most options.pageable.chunk_bytes, and chunk j uses staging
// chunk j mod options.pageable.chunks. Each transfer object owns a second stream, the *lane*, on
// which host functions (cudaLaunchHostFunc) copy between the homes and staging with a
// parallel_copier; the DMA between staging and the device runs on the caller's stream. Events
// order the two, so nothing waits on the host:
//   to the device:  the lane first waits for the caller's stream as it was at the call (the homes
//                   it reads may be written by copies the caller's stream waited for); per chunk:
//                   lane: wait until the DMA that last read this staging chunk landed, copy the
//                   homes into it, record `filled`; caller's stream: wait `filled`, DMA to the
//                   device, record `drained`.
//   to the homes:   per chunk: caller's stream: wait until the lane emptied this staging chunk last
//                   time (`filled` of its last use), DMA from the device, record `drained`; lane:
//                   wait `drained`, copy staging into the homes, record `filled`. At the end the
//                   caller's stream waits for the lane's last copy.
// So work the caller enqueues after the call (and the events it records) runs after every byte of
// the batch has landed, exactly as after a cuda_page_transfer: the residency scheduler needs no
// change. Host copies of chunk j+1 overlap the DMA of chunk j. The host functions run on the
// driver's thread and block it while the copier's threads work; they make no CUDA call.
// Sustained rate: the lower of the copier's (threads x ~6-12 GB/s of host memcpy, measured in
// bench/cuda) and the link's; pinned homes (cuda_page_transfer) stay the faster choice where their
// device cost is affordable. Host memory: chunks x chunk_bytes pinned per object, fixed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/memcpy_batch.hpp"
#include "oomb/cuda/nvtx.hpp"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/parallel_copier.hpp"

OOMB_NAMESPACE_BEGIN

/// Moves batches of pages between a device pool and a pageable host pool (either direction) on CUDA
/// streams, staged through pinned memory (see the file comment). The interface of
/// cuda_page_transfer. Not internally synchronised: one per thread, or a lock. The destructor waits
/// for the batches that use its staging.
template <class DstResource, class SrcResource>
class cuda_staged_page_transfer {
  static constexpr bool to_device = SrcResource::kind == memory_kind::host;
  static_assert((DstResource::kind == memory_kind::host) != (SrcResource::kind == memory_kind::host) &&
                    (to_device ? DstResource::kind : SrcResource::kind) == memory_kind::device,
                "cuda_staged_page_transfer: one pool is pageable host memory, the other device memory");

 public:
  using dst_pool_type = block_pool<DstResource>;
  using src_pool_type = block_pool<SrcResource>;

  /// Pages of both pools must have the same block size. Allocates the staging, the lane and the
  /// copier's threads now (throws out_of_memory naming the bytes, or invalid_argument for bad
  /// options), so no batch allocates them.
  cuda_staged_page_transfer(dst_pool_type& dst, const src_pool_type& src, cuda_transfer_options options = {})
      : plan_(dst, src),
        options_(checked(options)),
        staging_(make_pinned_staging<std::byte>(staging_bytes(), cudaHostAllocDefault, "cuda_staged_page_transfer")),
        copier_(std::make_unique<parallel_copier>(options_.pageable.threads)) {
    filled_.reserve(chunks());
    drained_.reserve(chunks());
    for (std::size_t k = 0; k < chunks(); ++k) {
      filled_.push_back(cuda_event::create());
      drained_.push_back(cuda_event::create());
    }
    start_ = cuda_event::create();
  }
  cuda_staged_page_transfer(const cuda_staged_page_transfer&) = delete;
  cuda_staged_page_transfer& operator=(const cuda_staged_page_transfer&) = delete;
  /// Waits for the lane's host copies and for every DMA that touches the staging: an edge, not the
  /// hot path (the residency scheduler drains first anyway).
  ~cuda_staged_page_transfer() {
    (void)cudaStreamSynchronize(lane_.get());
    for (const cuda_event& e : drained_) (void)cudaEventSynchronize(e.get());
  }

  /// Copies page src_ids[i] of the source pool to page dst_ids[i] of the destination pool, as one
  /// batch on `stream`. Everything is validated before anything is enqueued. On a CUDA failure
  /// part of the batch may have been enqueued (as with any transfer): its destinations are stale.
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids) {
    const detail::nvtx_range range("oomb: staged page transfer batch");
    cuda_transfer_report r;
    static_cast<transfer_report&>(r) = plan_.plan(dst_ids, src_ids);
    r.path = transfer_path::memcpy_batch;  // the DMA half: copy engines
    const std::vector<copy_op>& ops = plan_.ops();
    if (ops.empty()) return r;
    const cuda_stream_view lane = lane_.view();
    if (to_device) {
      stream.record(start_);
      lane.wait(start_);
    }
    r.copies = 0;
    std::size_t op = 0, done = 0;  // the next byte to stage: `done` bytes into ops[op]
    while (op < ops.size()) {
      const std::size_t k = next_++ % chunks();
      std::byte* chunk = staging_.get() + k * options_.pageable.chunk_bytes;
      // Cut the next chunk_bytes of the batch into pieces, each within one op.
      host_ops_.clear();
      device_ops_.clear();
      std::size_t used = 0;
      while (op < ops.size() && used < options_.pageable.chunk_bytes) {
        const copy_op& o = ops[op];
        const std::size_t n = std::min(o.bytes - done, options_.pageable.chunk_bytes - used);
        std::byte* staged = chunk + used;
        if (to_device) {
          host_ops_.push_back({staged, static_cast<const std::byte*>(o.src) + done, n});
          device_ops_.push_back({static_cast<std::byte*>(o.dst) + done, staged, n});
        } else {
          device_ops_.push_back({staged, static_cast<const std::byte*>(o.src) + done, n});
          host_ops_.push_back({static_cast<std::byte*>(o.dst) + done, staged, n});
        }
        used += n;
        done += n;
        if (done == o.bytes) {
          ++op;
          done = 0;
        }
      }
      if (to_device) {
        lane.wait(drained_[k]);
        launch_host_copy(lane);
        lane.record(filled_[k]);
        stream.wait(filled_[k]);
        memcpy_batch_async(device_ops_.data(), device_ops_.size(), stream.get());
        stream.record(drained_[k]);
      } else {
        stream.wait(filled_[k]);
        memcpy_batch_async(device_ops_.data(), device_ops_.size(), stream.get());
        stream.record(drained_[k]);
        lane.wait(drained_[k]);
        launch_host_copy(lane);
        lane.record(filled_[k]);
        last_ = k;
      }
      r.copies += device_ops_.size();
    }
    if (!to_device) stream.wait(filled_[last_]);  // the lane's copies are in order: the last covers all
    return r;
  }

  const cuda_transfer_options& options() const noexcept { return options_; }
  /// Takes effect from the next batch; the staging's geometry and the threads stay as built.
  void set_options(const cuda_transfer_options& o) {
    OOMB_EXPECTS(o.pageable.chunk_bytes == options_.pageable.chunk_bytes && o.pageable.chunks == options_.pageable.chunks &&
                     o.pageable.threads == options_.pageable.threads,
                 "cuda_staged_page_transfer: the staging (chunk bytes, chunks, threads) is fixed when the transfer is built");
    options_ = o;
  }
  /// The copies of the last batch (before cutting into chunks), merged and sorted by destination.
  const std::vector<copy_op>& ops() const noexcept { return plan_.ops(); }
  dst_pool_type& dst() const noexcept { return plan_.dst(); }
  const src_pool_type& src() const noexcept { return plan_.src(); }
  /// Pinned bytes of the staging ring.
  std::size_t staging_bytes() const noexcept { return options_.pageable.chunk_bytes * chunks(); }

 private:
  // One host function's copies: owned by the host function, which frees them when it has run (the
  // host enqueues far ahead of the lane, so these cannot live in a reused buffer).
  struct host_copy {
    parallel_copier* copier;
    std::vector<copy_op> ops;
  };
  static void CUDART_CB run_host_copy(void* p) {
    const std::unique_ptr<host_copy> job(static_cast<host_copy*>(p));
    job->copier->copy(job->ops.data(), job->ops.size());
  }

  void launch_host_copy(cuda_stream_view lane) {
    auto job = std::make_unique<host_copy>(host_copy{copier_.get(), host_ops_});
    OOMB_CUDA_CHECK(cudaLaunchHostFunc(lane.get(), &run_host_copy, job.get()),
                    "cuda_staged_page_transfer: enqueuing a host copy of ", job->ops.size(), " pieces");
    job.release();  // run_host_copy owns it now
  }

  static cuda_transfer_options checked(const cuda_transfer_options& o) {
    OOMB_EXPECTS(o.pageable.chunk_bytes >= 4096 && o.pageable.chunk_bytes % 4096 == 0,
                 "cuda_staged_page_transfer: pageable.chunk_bytes must be a positive multiple of 4096, got ",
                 o.pageable.chunk_bytes);
    OOMB_EXPECTS(o.pageable.chunks >= 2 && o.pageable.chunks <= 1024,
                 "cuda_staged_page_transfer: pageable.chunks must be in [2, 1024] (host copies overlap DMA only with two), got ",
                 o.pageable.chunks);
    return o;
  }
  std::size_t chunks() const noexcept { return static_cast<std::size_t>(options_.pageable.chunks); }

  page_transfer<DstResource, SrcResource> plan_;
  cuda_transfer_options options_;
  pinned_staging<std::byte> staging_;
  std::unique_ptr<parallel_copier> copier_;  // behind a pointer: host functions in flight keep its address
  cuda_stream lane_;
  std::vector<cuda_event> filled_, drained_;  // per staging chunk: the lane's last copy, the last DMA
  cuda_event start_;                          // the caller's stream at the call (to the device)
  std::size_t next_ = 0;                      // chunks used so far: the next one is next_ % chunks()
  std::size_t last_ = 0;                      // to the homes: the staging chunk of the batch's last copy
  std::vector<copy_op> host_ops_, device_ops_;
};

/// The transfer between two tiers on CUDA: staged through pinned memory when one side is pageable
/// host memory, cuda_page_transfer otherwise.
template <class DstResource, class SrcResource>
using cuda_tier_transfer =
    std::conditional_t<DstResource::kind == memory_kind::host || SrcResource::kind == memory_kind::host,
                       cuda_staged_page_transfer<DstResource, SrcResource>, cuda_page_transfer<DstResource, SrcResource>>;

OOMB_NAMESPACE_END
