// oomb — a device copy of a page_table, kept current from its change log through pinned staging.
// SPDX-License-Identifier: Apache-2.0
//
// Layout in device memory (one allocation, fixed capacities chosen at construction):
//   indptr[max_seqs + 1] | last_page_len[max_seqs] | indices A[layers][max_pages] | indices B[...]
// Every layer has the same indptr (a sequence has one length in all layers, page_table's rule), so
// view(layer) = {indptr, indices(current) + layer * max_pages, last_page_len}: the CSR form
// kernels read (page_table_view).
//
// sync(table, stream) turns what changed since the last sync into a list of (position, value)
// int32 writes, written into a pinned staging slot that one scatter kernel reads directly (mapped
// memory: no extra copy); only the deltas cross PCIe, never the table. The values come from the
// table's current state and the positions from its change log, so applying a log twice is
// harmless (the caller clears the log when it likes: page_table::clear_changes). The first sync
// uploads the whole table, as the change-log contract says (export once, then deltas).
// When a sequence other than the last changes its page count (batch > 1), the pages of the later
// sequences move: a relayout kernel copies every layer into the other indices buffer at the new
// offsets, on the device, before the scatter. Batch 1 never relayouts.
//
// Ordering: sync enqueues on `stream`, after the previous sync whatever stream that one ran on
// (the stream waits for the previous sync's event: syncs on different streams never race on the
// index buffers). Kernels that read the table must run on that stream or be ordered after it by
// an event, and a sync must not overtake readers still running on another stream (make `stream`
// wait for them). Views stay valid across syncs except after a relayout (relayouts() counts
// them): take views after sync. The staging slots are a staging_ring (staging_ring.hpp): a slot is
// reused once the event of its kernel has completed (asked without blocking); with every slot in
// flight the ring grows instead, so sync never blocks the host. A slot's pinned buffer grows when
// a sync needs more than it holds (it is free then). Not internally synchronised.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/paging/page_table.hpp"
#include "oomb/paging/views.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

/// One write of a table update: device word `offset` (int32 words from the table's base) = value.
struct table_write {
  std::uint32_t offset;
  std::int32_t value;
};

OOMB_KERNEL_NAMESPACE_BEGIN

template <int = 0>
OOMB_KERNEL void table_scatter_kernel(std::int32_t* __restrict__ base, const table_write* __restrict__ writes,
                                     std::uint32_t count) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const table_write w = writes[i];  // mapped pinned memory, read once
    base[w.offset] = w.value;
  }
}

/// Block (s, l): copies the pages sequence s keeps (min of old and new count) of layer l from the
/// old indices buffer at the old offset to the new buffer at the new offset.
template <int = 0>
OOMB_KERNEL void table_relayout_kernel(const std::int32_t* __restrict__ from, std::int32_t* __restrict__ to,
                                      std::int64_t layer_stride, const std::int32_t* __restrict__ old_indptr,
                                      const std::int32_t* __restrict__ new_indptr, std::int32_t old_seqs) {
  const std::int32_t s = blockIdx.x;
  if (s >= old_seqs) return;
  const std::int64_t l = blockIdx.y;
  const std::int32_t o = old_indptr[s], n = new_indptr[s];
  const std::int32_t keep = min(old_indptr[s + 1] - o, new_indptr[s + 1] - n);
  for (std::int32_t i = threadIdx.x; i < keep; i += blockDim.x) to[l * layer_stride + n + i] = from[l * layer_stride + o + i];
}

OOMB_KERNEL_NAMESPACE_END

}  // namespace detail

/// A device copy of one page_table (see the file comment).
class device_page_table {
 public:
  /// Capacities: `max_seqs` sequences and `max_pages` pages per layer (all sequences together).
  device_page_table(std::int32_t layers, std::int32_t page_size, std::int32_t max_seqs, std::int32_t max_pages,
                    int staging_slots = 4)
      : layers_(layers), page_size_(page_size), max_seqs_(max_seqs), max_pages_(max_pages) {
    OOMB_EXPECTS(layers > 0, "device_page_table: layers must be positive, got ", layers);
    OOMB_EXPECTS(page_size >= 16 && (page_size & (page_size - 1)) == 0,
                 "device_page_table: page_size must be a power of two >= 16, got ", page_size);
    OOMB_EXPECTS(max_seqs > 0 && max_pages > 0, "device_page_table: capacities must be positive, got ", max_seqs,
                 " sequences and ", max_pages, " pages per layer");
    OOMB_EXPECTS(staging_slots > 0, "device_page_table: staging_slots must be positive, got ", staging_slots);
    const std::uint64_t words = header_words() + 2 * std::uint64_t(layers) * std::uint64_t(max_pages);
    OOMB_EXPECTS(words < (std::uint64_t(1) << 32), "device_page_table: ", layers, " layers of ", max_pages,
                 " pages are too many for 32-bit offsets");
    void* p = nullptr;
    OOMB_CUDA_CHECK_ALLOC(cudaMalloc(&p, words * sizeof(std::int32_t)), "device_page_table: allocating ",
                          words * sizeof(std::int32_t), " bytes");
    base_.reset(static_cast<std::int32_t*>(p));
    OOMB_CUDA_CHECK(cudaMemset(p, 0, header_words() * sizeof(std::int32_t)), "device_page_table: clearing");
    ring_.grow(static_cast<std::size_t>(staging_slots), empty_slot);  // pinned on first use
  }
  device_page_table(const device_page_table&) = delete;
  device_page_table& operator=(const device_page_table&) = delete;
  // Destruction waits for its own staging to be consumed (staging_ring's destructor, an edge).

  /// Brings the device copy up to `table` (see the file comment). Throws invalid_argument (nothing
  /// enqueued) for a table of other geometry, one that does not record changes, or one that
  /// outgrew the capacities (naming both numbers).
  void sync(const page_table& table, cuda_stream_view stream) {
    OOMB_EXPECTS(table.num_layers() == layers_ && table.page_size() == page_size_,
                 "device_page_table: table of ", table.num_layers(), " layers and page size ", table.page_size(),
                 ", device copy of ", layers_, " layers and page size ", page_size_);
    OOMB_EXPECTS(table.recording_changes() || !synced_,
                 "device_page_table: the page table does not record changes, so it cannot be synced by deltas");
    const std::int32_t seqs = table.num_seqs();
    OOMB_EXPECTS(seqs <= max_seqs_, "device_page_table: the table holds ", seqs, " sequences, the device copy ",
                 max_seqs_);
    OOMB_EXPECTS(table.pages_per_layer() <= max_pages_, "device_page_table: the table holds ",
                 table.pages_per_layer(), " pages per layer, the device copy ", max_pages_);

    // New layout (offsets are the same for every layer).
    new_indptr_.assign(static_cast<std::size_t>(seqs) + 1, 0);
    for (std::int32_t s = 0; s < seqs; ++s) new_indptr_[std::size_t(s) + 1] = new_indptr_[std::size_t(s)] + table.num_pages(s);
    bool relayout = false;
    const auto old_seqs = static_cast<std::int32_t>(indptr_.size()) - 1;
    for (std::int32_t s = 0; s < old_seqs && s < seqs && synced_; ++s) {
      const std::int32_t keep = std::min(indptr_[std::size_t(s) + 1] - indptr_[std::size_t(s)],
                                         new_indptr_[std::size_t(s) + 1] - new_indptr_[std::size_t(s)]);
      if (keep > 0 && indptr_[std::size_t(s)] != new_indptr_[std::size_t(s)]) relayout = true;
    }
    const int target = relayout ? 1 - current_ : current_;

    // The writes: header whenever lengths changed, then the indices named by the log (or all).
    writes_.clear();
    const page_table_changes& log = table.changes();
    if (!synced_ || !log.lengths.empty() || seqs != old_seqs) {
      for (std::int32_t s = 0; s <= seqs; ++s) writes_.push_back({std::uint32_t(s), new_indptr_[std::size_t(s)]});
      for (std::int32_t s = 0; s < seqs; ++s)
        writes_.push_back({std::uint32_t(max_seqs_ + 1 + s), table.last_page_len(s)});
    }
    const std::uint64_t buffer = indices_offset(target);
    if (!synced_) {
      for (std::int32_t s = 0; s < seqs; ++s)
        for (std::int32_t l = 0; l < layers_; ++l) {
          const id_span ids = table.pages(s, l);
          for (std::size_t i = 0; i < ids.size(); ++i)
            writes_.push_back({std::uint32_t(buffer + std::uint64_t(l) * std::uint64_t(max_pages_) +
                                             std::uint64_t(new_indptr_[std::size_t(s)]) + i),
                               ids[i]});
        }
    } else {
      for (const page_delta& d : log.pages) {
        if (d.seq >= seqs || d.layer < 0 || d.layer >= layers_) continue;
        if (d.page < 0 || d.page >= table.num_pages(d.seq)) continue;  // removed since
        writes_.push_back({std::uint32_t(buffer + std::uint64_t(d.layer) * std::uint64_t(max_pages_) +
                                         std::uint64_t(new_indptr_[std::size_t(d.seq)]) + std::uint64_t(d.page)),
                           table.page(d.seq, d.layer, d.page)});
      }
    }

    // --- enqueue: staging slot (writes, then old and new indptr for a relayout), kernels, event.
    const std::size_t extra = relayout ? indptr_.size() + new_indptr_.size() : 0;
    const std::size_t slot_index = take_slot(writes_.size() + (extra + 1) / 2 + 1);
    slot& st = ring_[slot_index];
    if (synced_)  // after the previous sync, on whichever stream it ran: never a host wait
      OOMB_CUDA_CHECK(cudaStreamWaitEvent(stream.get(), ring_.event(last_slot_).get(), 0),
                      "device_page_table: ordering a sync after the previous one");
    std::copy(writes_.begin(), writes_.end(), st.host.get());
    auto* tail = reinterpret_cast<std::int32_t*>(st.host.get() + writes_.size());
    if (relayout) {
      std::copy(indptr_.begin(), indptr_.end(), tail);
      std::copy(new_indptr_.begin(), new_indptr_.end(), tail + indptr_.size());
      const dim3 grid(static_cast<unsigned>(old_seqs), static_cast<unsigned>(layers_));
      detail::table_relayout_kernel<><<<grid, 256, 0, stream.get()>>>(
          base_.get() + indices_offset(current_), base_.get() + indices_offset(target), max_pages_, tail,
          tail + indptr_.size(), old_seqs);
      OOMB_CUDA_CHECK_LAUNCH("device_page_table: relayout of ", old_seqs, " sequences x ", layers_, " layers");
      ++relayouts_;
    }
    if (!writes_.empty()) {
      const auto n = static_cast<std::uint32_t>(writes_.size());
      const unsigned blocks = std::min<unsigned>((n + 255) / 256, 64);
      detail::table_scatter_kernel<><<<blocks, 256, 0, stream.get()>>>(base_.get(), st.host.get(), n);
      OOMB_CUDA_CHECK_LAUNCH("device_page_table: scatter of ", n, " writes");
    }
    ring_.record(slot_index, stream);

    // --- nothing below can fail
    current_ = target;
    last_slot_ = slot_index;
    indptr_ = new_indptr_;
    synced_ = true;
    last_writes_ = writes_.size();
    num_seqs_ = seqs;
  }

  /// The CSR view of `layer` over device memory (valid after the sync that produced it has run).
  page_table_view view(std::int32_t layer) const {
    OOMB_EXPECTS(layer >= 0 && layer < layers_, "device_page_table: layer ", layer, " out of range [0, ",
                 layers_, ")");
    page_table_view v;
    v.indptr = base_.get();
    v.last_page_len = base_.get() + max_seqs_ + 1;
    v.indices = base_.get() + indices_offset(current_) + std::int64_t(layer) * max_pages_;
    v.num_seqs = num_seqs_;
    v.page_size = page_size_;
    return v;
  }

  std::int32_t num_layers() const noexcept { return layers_; }
  std::int32_t num_seqs() const noexcept { return num_seqs_; }
  std::int32_t max_seqs() const noexcept { return max_seqs_; }
  std::int32_t max_pages() const noexcept { return max_pages_; }
  /// Writes staged by the last sync (header entries included): what crossed PCIe.
  std::size_t last_writes() const noexcept { return last_writes_; }
  /// Syncs that moved sequences to new offsets on the device.
  std::size_t relayouts() const noexcept { return relayouts_; }

 private:
  struct free_device {
    void operator()(std::int32_t* p) const noexcept { (void)cudaFree(p); }
  };
  // Mapped pinned writes, read directly by the scatter kernel; grown when a sync needs more.
  struct slot {
    pinned_staging<detail::table_write> host;
    std::size_t capacity = 0;
  };
  static slot empty_slot() { return slot{}; }

  std::uint64_t header_words() const noexcept { return 2 * std::uint64_t(max_seqs_) + 1; }
  std::uint64_t indices_offset(int buffer) const noexcept {
    return header_words() + std::uint64_t(buffer) * std::uint64_t(layers_) * std::uint64_t(max_pages_);
  }

  // A free ring slot (the ring grows by one when all are in flight; never the previous sync's slot
  // while that sync may still run) holding at least `entries` writes.
  std::size_t take_slot(std::size_t entries) {
    const std::size_t index = ring_.take(1, empty_slot).front();
    slot& s = ring_[index];
    if (s.capacity < entries) {  // the slot is free: its old buffer may go
      const std::size_t cap = std::max(entries, 2 * s.capacity + 1024);
      s.host = make_pinned_staging<detail::table_write>(cap, cudaHostAllocMapped | cudaHostAllocPortable,
                                                        "device_page_table");
      s.capacity = cap;
    }
    return index;
  }

  std::int32_t layers_, page_size_, max_seqs_, max_pages_;
  std::unique_ptr<std::int32_t, free_device> base_;
  staging_ring<slot> ring_;
  std::size_t last_slot_ = 0;  // the slot of the last sync, whose event orders the next one
  int current_ = 0;
  bool synced_ = false;
  std::int32_t num_seqs_ = 0;
  std::vector<std::int32_t> indptr_{0}, new_indptr_;
  std::vector<detail::table_write> writes_;
  std::size_t last_writes_ = 0, relayouts_ = 0;
};

OOMB_NAMESPACE_END
