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
// chunk j mod options.pageable.chunks. Each transfer object owns a second stream, the *lane*, and a
// worker thread that copies with a parallel_copier (options.pageable.copier; by default the process's
// shared one, so the transfers of all tiers and both directions split one set of threads, one per
// hardware thread, instead of each bringing its own). The lane decides *when* a chunk's host copy may start: a
// host function (cudaLaunchHostFunc) on it hands the chunk to the worker, which copies between the
// homes and staging and then publishes the chunk's sequence number in a pinned counter; the
// caller's stream waits for that number (cuStreamWaitValue32) before its DMA. Events order the
// lane behind the caller's stream, so nothing waits on the host:
//   to the device:  the lane first waits for the caller's stream as it was at the call (the homes
//                   it reads may be written by copies the caller's stream waited for); per chunk:
//                   lane: wait until the DMA that last read this staging chunk landed (`drained`),
//                   hand the chunk to the worker; caller's stream: wait for the chunk's number,
//                   DMA to the device, record `drained`.
//   to the homes:   per chunk: caller's stream: wait for the number of the worker's last copy out
//                   of this staging chunk, DMA from the device, record `drained`; lane: wait
//                   `drained`, hand the chunk to the worker. At the end the caller's stream waits
//                   for the batch's last number (the worker copies in order).
// So work the caller enqueues after the call (and the events it records) runs after every byte of
// the batch has landed, exactly as after a cuda_page_transfer, so the residency scheduler orders it
// as any batch; to the homes it may also pass a sources_read_hook, called after the last DMA and
// before the wait for the host's copies, to reuse the slots from that point. Host copies of chunk j+1 overlap the DMA of chunk j, and the copies of different transfer
// objects (the K/V and gradient tiers, both directions) run at once: each worker hands its chunk's
// shares to the shared copier and copies one share itself.
// Why a worker and not the copy inside the host function: CUDA runs every host function of a
// process on one driver thread, so host copies made there serialise across all transfers (measured
// on the H200: two directions at once moved no more than one; bench/cuda/staged_transfer_bench.cu).
// The host functions now only hand over a chunk (no allocation, no blocking). Sustained rate: the
// copiers' (~6 GB/s per thread of host memcpy on the H200's host) and the link's; pinned homes
// (cuda_page_transfer) stay the faster choice where their device cost is affordable. Host memory:
// chunks x chunk_bytes pinned per object, fixed, and one pinned counter.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
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
#include "oomb/offload/residency_backend.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// cuStreamWaitValue32 from the driver (no link to libcuda: the runtime hands out its entry point).
inline void stream_wait_value32(cudaStream_t stream, const std::uint32_t* device_address, std::uint32_t value) {
  using fn_type = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  static const fn_type fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    OOMB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &f, 12000, cudaEnableDefault, &found),
                    "cuda_staged_page_transfer: looking up cuStreamWaitValue32");
    OOMB_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr, cuda_error,
               "cuda_staged_page_transfer: the driver has no cuStreamWaitValue32 (CUDA 12 or newer is needed)");
    return reinterpret_cast<fn_type>(f);
  }();
  const CUresult r = fn(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(device_address), value,
                        CU_STREAM_WAIT_VALUE_GEQ);
  OOMB_CHECK(r == CUDA_SUCCESS, cuda_error, "cuda_staged_page_transfer: cuStreamWaitValue32 failed (CUresult ", int(r), ")");
}

/// The worker of one staged transfer: copies the chunks handed to it, in order, with its copier,
/// then publishes each chunk's number in a pinned counter that streams wait on.
class staged_copy_worker {
 public:
  /// One chunk's host copies and its number. Allocated by the enqueuing thread, handed over by a
  /// host function (no allocation there), freed by the worker.
  struct job {
    std::vector<copy_op> ops;
    std::uint32_t number = 0;
    staged_copy_worker* owner = nullptr;
    job* next = nullptr;
  };

  explicit staged_copy_worker(parallel_copier& copier)
      : copier_(&copier), done_(make_pinned_staging<std::uint32_t>(1, cudaHostAllocMapped, "cuda_staged_page_transfer")) {
    *done_.get() = 0;
    void* device = nullptr;
    OOMB_CUDA_CHECK(cudaHostGetDevicePointer(&device, done_.get(), 0), "cuda_staged_page_transfer: mapping the counter");
    done_device_ = static_cast<const std::uint32_t*>(device);
    thread_ = std::thread([this] { run(); });
  }
  staged_copy_worker(const staged_copy_worker&) = delete;
  staged_copy_worker& operator=(const staged_copy_worker&) = delete;
  /// Finishes the jobs handed over (call after the lane has run its host functions), then joins.
  ~staged_copy_worker() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  /// The counter as streams read it.
  const std::uint32_t* done_device() const noexcept { return done_device_; }

  /// Host function: hands `job` (a job*) to the worker. Allocates nothing, never blocks for long.
  static void CUDART_CB hand_over(void* p) {
    job* j = static_cast<job*>(p);
    staged_copy_worker& w = *j->owner;
    {
      const std::lock_guard<std::mutex> lock(w.mutex_);
      (w.tail_ ? w.tail_->next : w.head_) = j;
      w.tail_ = j;
    }
    w.wake_.notify_one();
  }

  /// A job for this worker, to launch with hand_over.
  std::unique_ptr<job> make_job(std::vector<copy_op> ops, std::uint32_t number) {
    auto j = std::make_unique<job>();
    j->ops = std::move(ops);
    j->number = number;
    j->owner = this;
    return j;
  }

 private:
  void run() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || head_ != nullptr; });
      if (head_ == nullptr) return;  // stopping, nothing left
      job* j = head_;
      head_ = j->next;
      if (head_ == nullptr) tail_ = nullptr;
      lock.unlock();
      copier_->copy(j->ops.data(), j->ops.size());
      // The copies (other threads' too: copy() returned after them) before the number: the DMA
      // that waits for it reads what they wrote.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      reinterpret_cast<volatile std::uint32_t*>(done_.get())[0] = j->number;
      delete j;
      lock.lock();
    }
  }

  parallel_copier* copier_;  // shared with other transfers (copy() is thread-safe)
  pinned_staging<std::uint32_t> done_;  // the number of the last job copied (mapped: streams poll it)
  const std::uint32_t* done_device_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  job* head_ = nullptr;  // handed over, not yet copied (a list: the host function allocates nothing)
  job* tail_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail

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
  /// worker now, and starts the shared copier if no copier is given (throws out_of_memory naming the
  /// bytes, or invalid_argument for bad options), so no batch allocates them.
  cuda_staged_page_transfer(dst_pool_type& dst, const src_pool_type& src, cuda_transfer_options options = {})
      : plan_(dst, src),
        options_(checked(options)),
        staging_(make_pinned_staging<std::byte>(staging_bytes(), cudaHostAllocDefault, "cuda_staged_page_transfer")),
        worker_(std::make_unique<detail::staged_copy_worker>(*options_.pageable.copier)),
        emptied_(chunks(), 0) {
    drained_.reserve(chunks());
    for (std::size_t k = 0; k < chunks(); ++k) drained_.push_back(cuda_event::create());
    start_ = cuda_event::create();
  }
  cuda_staged_page_transfer(const cuda_staged_page_transfer&) = delete;
  cuda_staged_page_transfer& operator=(const cuda_staged_page_transfer&) = delete;
  /// Waits for the lane's hand-overs, the worker's copies and every DMA that touches the staging:
  /// an edge, not the hot path (the residency scheduler drains first anyway).
  ~cuda_staged_page_transfer() {
    (void)cudaStreamSynchronize(lane_.get());
    worker_.reset();  // copies every job handed over, publishing its number: the DMAs may proceed
    for (const cuda_event& e : drained_) (void)cudaEventSynchronize(e.get());
  }

  /// Copies page src_ids[i] of the source pool to page dst_ids[i] of the destination pool, as one
  /// batch on `stream`. Everything is validated before anything is enqueued. On a CUDA failure
  /// part of the batch may have been enqueued (as with any transfer): its destinations are stale.
  /// `sources_read` is called once where what is enqueued on `stream` covers every read of the
  /// sources: to the homes, after the last DMA out of the device and before the wait for the
  /// host's copies into the homes; to the device, at the end. If it throws, the batch's homes are
  /// not waited for on `stream` (they stay stale to it, as after a CUDA failure).
  cuda_transfer_report enqueue(cuda_stream_view stream, id_span dst_ids, id_span src_ids,
                               sources_read_hook sources_read = {}) {
    const detail::nvtx_range range("oomb: staged page transfer batch");
    cuda_transfer_report r;
    static_cast<transfer_report&>(r) = plan_.plan(dst_ids, src_ids);
    r.path = transfer_path::memcpy_batch;  // the DMA half: copy engines
    const std::vector<copy_op>& ops = plan_.ops();
    if (ops.empty()) {
      sources_read();
      return r;
    }
    const cuda_stream_view lane = lane_.view();
    if (to_device) {
      stream.record(start_);
      lane.wait(start_);
    }
    r.copies = 0;
    std::size_t op = 0, done = 0;  // the next byte to stage: `done` bytes into ops[op]
    while (op < ops.size()) {
      const std::size_t k = next_ % chunks();
      std::byte* chunk = staging_.get() + k * options_.pageable.chunk_bytes;
      // Cut the next chunk_bytes of the batch into pieces, each within one op.
      std::vector<copy_op> host_ops;
      device_ops_.clear();
      std::size_t used = 0;
      while (op < ops.size() && used < options_.pageable.chunk_bytes) {
        const copy_op& o = ops[op];
        const std::size_t n = std::min(o.bytes - done, options_.pageable.chunk_bytes - used);
        std::byte* staged = chunk + used;
        if (to_device) {
          host_ops.push_back({staged, static_cast<const std::byte*>(o.src) + done, n});
          device_ops_.push_back({static_cast<std::byte*>(o.dst) + done, staged, n});
        } else {
          device_ops_.push_back({staged, static_cast<const std::byte*>(o.src) + done, n});
          host_ops.push_back({static_cast<std::byte*>(o.dst) + done, staged, n});
        }
        used += n;
        done += n;
        if (done == o.bytes) {
          ++op;
          done = 0;
        }
      }
      const std::uint32_t number = handed_ + 1;
      auto job = worker_->make_job(std::move(host_ops), number);
      if (to_device) {
        lane.wait(drained_[k]);
        hand_over(lane, std::move(job));
        detail::stream_wait_value32(stream.get(), worker_->done_device(), number);
        memcpy_batch_async(device_ops_.data(), device_ops_.size(), stream.get());
        stream.record(drained_[k]);
      } else {
        if (emptied_[k] != 0) detail::stream_wait_value32(stream.get(), worker_->done_device(), emptied_[k]);
        memcpy_batch_async(device_ops_.data(), device_ops_.size(), stream.get());
        stream.record(drained_[k]);
        lane.wait(drained_[k]);
        hand_over(lane, std::move(job));
        emptied_[k] = number;
      }
      ++next_;
      r.copies += device_ops_.size();
    }
    sources_read();
    // The worker copies in order: its last number covers the batch.
    if (!to_device) detail::stream_wait_value32(stream.get(), worker_->done_device(), handed_);
    return r;
  }

  const cuda_transfer_options& options() const noexcept { return options_; }
  /// Takes effect from the next batch; the staging's geometry and the copier stay as built (a null
  /// copier in `o` keeps the one in use).
  void set_options(const cuda_transfer_options& o) {
    OOMB_EXPECTS(o.pageable.chunk_bytes == options_.pageable.chunk_bytes && o.pageable.chunks == options_.pageable.chunks &&
                     (!o.pageable.copier || o.pageable.copier == options_.pageable.copier),
                 "cuda_staged_page_transfer: the staging (chunk bytes, chunks, copier) is fixed when the transfer is built");
    parallel_copier* const copier = options_.pageable.copier;
    options_ = o;
    options_.pageable.copier = copier;
  }
  /// The copies of the last batch (before cutting into chunks), merged and sorted by destination.
  const std::vector<copy_op>& ops() const noexcept { return plan_.ops(); }
  dst_pool_type& dst() const noexcept { return plan_.dst(); }
  const src_pool_type& src() const noexcept { return plan_.src(); }
  /// Pinned bytes of the staging ring.
  std::size_t staging_bytes() const noexcept { return options_.pageable.chunk_bytes * chunks(); }

 private:
  // Launches the host function that hands `job` to the worker; its number is taken only once the
  // launch succeeded, so a failed one leaves no number that nothing will publish.
  void hand_over(cuda_stream_view lane, std::unique_ptr<detail::staged_copy_worker::job> job) {
    OOMB_CUDA_CHECK(cudaLaunchHostFunc(lane.get(), &detail::staged_copy_worker::hand_over, job.get()),
                    "cuda_staged_page_transfer: enqueuing a host copy of ", job->ops.size(), " pieces");
    job.release();  // the worker owns it now
    ++handed_;
  }

  // The options as used: checked, and the shared copier where none is given.
  static cuda_transfer_options checked(cuda_transfer_options o) {
    OOMB_EXPECTS(o.pageable.chunk_bytes >= 4096 && o.pageable.chunk_bytes % 4096 == 0,
                 "cuda_staged_page_transfer: pageable.chunk_bytes must be a positive multiple of 4096, got ",
                 o.pageable.chunk_bytes);
    OOMB_EXPECTS(o.pageable.chunks >= 2 && o.pageable.chunks <= 1024,
                 "cuda_staged_page_transfer: pageable.chunks must be in [2, 1024] (host copies overlap DMA only with two), got ",
                 o.pageable.chunks);
    if (!o.pageable.copier) o.pageable.copier = &parallel_copier::shared();
    return o;
  }
  std::size_t chunks() const noexcept { return static_cast<std::size_t>(options_.pageable.chunks); }

  page_transfer<DstResource, SrcResource> plan_;
  cuda_transfer_options options_;
  pinned_staging<std::byte> staging_;
  std::unique_ptr<detail::staged_copy_worker> worker_;
  cuda_stream lane_;
  std::vector<cuda_event> drained_;   // per staging chunk: the last DMA that used it
  std::vector<std::uint32_t> emptied_;  // to the homes, per staging chunk: the worker's last copy out of it
  cuda_event start_;                  // the caller's stream at the call (to the device)
  std::size_t next_ = 0;              // chunks cut so far: the next one is next_ % chunks()
  std::uint32_t handed_ = 0;          // the number of the last chunk handed to the worker
  std::vector<copy_op> device_ops_;
};

/// The transfer between two tiers on CUDA: staged through pinned memory when one side is pageable
/// host memory, cuda_page_transfer otherwise.
template <class DstResource, class SrcResource>
using cuda_tier_transfer =
    std::conditional_t<DstResource::kind == memory_kind::host || SrcResource::kind == memory_kind::host,
                       cuda_staged_page_transfer<DstResource, SrcResource>, cuda_page_transfer<DstResource, SrcResource>>;

OOMB_NAMESPACE_END
