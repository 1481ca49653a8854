// oomb trainer — page-sparse selection on the GPU: the CUDA backend's selector_type.
// SPDX-License-Identifier: Apache-2.0
//
// Page summaries live in the far tier: one store in pinned host memory mapped into the device, an
// entry per far page id (oomb::device_page_summaries, only the statistics the scoring kind reads),
// written by a kernel from the chunk's K rows right where paged_attention writes its pages, so the
// pages need not be near (offload) for it; they grow with the context and the device must not.
// Selection runs per query tile with oomb::select_tiles over the home itself (tile-level query
// summaries; the layer's past in slices, each gathered into the workspace, read once over the bus,
// scored and merged into a running CUB top-k; sink and local pages always; with packed documents
// each tile's candidates start at its document's first page, tile_first);
// the table is copied back to the host sparse_page_table the seam wants, with one
// event wait per call: in stage 1 a layer's selection depends on its own queries, and the trainer
// stores the host table for stage 2. No other call waits for the device. Its device work is the
// backend's op of kind selection (NVTX ranges selection/summarize, selection/forget,
// selection/select; with time_ops, op_time[selection]): the summaries' kernel, the scoring and
// top-k and the gather, not the read-back of the table nor the wait for it.
//
// Scoring differs from cpu_page_selector's (per query, then the tile's maximum): the GPU scores a
// page against the box (Quest) or mean (mean-key) of the tile's queries over its GQA group — an
// upper bound of the CPU's Quest score, the CPU's mean-key score of the tile's mean query — so
// both select the same pages for one-query tiles without GQA, and may differ otherwise
// (include/oomb/cuda/tile_selection.cuh says exactly how).
//
// Bytes: the home holds num_ids x bytes_per_id of pinned host memory (Qwen2.5-7B's 4 KV heads x
// 128, 28 layers, 128-token pages: 8.97 MB per 10K tokens for Quest, 4.49 MB for mean-key); the
// device holds the selection's workspace, fixed by its slice once the past is longer than one
// (oomb::default_selection_slice_pages: the 7B's Quest slice is 8.4 MB; docs/sparse.md).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/core/id_span.hpp>
#include <oomb/core/tensor.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/event.hpp>
#include <oomb/cuda/page_summary_kernels.cuh>
#include <oomb/cuda/pinned_resource.hpp>
#include <oomb/cuda/staging_ring.hpp>
#include <oomb/cuda/stream_view.hpp>
#include <oomb/cuda/tile_selection.cuh>
#include <oomb/cuda/upload_ring.hpp>
#include <oomb/sparse/sparse_page_table.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/cuda/device_buffer.cuh"
#include "trainer/ops/op_kind.hpp"

namespace oomb_trainer {

/// Rows of one query block of the GPU attention kernels: a sparse tile of `tile` queries times the
/// GQA group must fill whole blocks.
inline constexpr std::int32_t gpu_attention_block_rows = 128;

/// Throws invalid_argument unless a selection tile of `tile` queries with GQA group hq / hkv fills
/// whole query blocks of the GPU attention kernels.
inline void check_gpu_sparse_tile(std::int32_t tile, std::int32_t hq, std::int32_t hkv) {
  OOMB_EXPECTS(hkv > 0 && hq % hkv == 0, "cuda sparse attention: hq (", hq, ") must be a multiple of hkv (", hkv, ")");
  const std::int32_t group = hq / hkv;
  const std::int64_t rows = std::int64_t(tile) * group;
  OOMB_EXPECTS(tile > 0 && rows % gpu_attention_block_rows == 0, "cuda sparse attention: a selection tile of ", tile,
               " queries times the GQA group ", group, " (hq ", hq, " / hkv ", hkv, ") is ", rows,
               " query rows, not a multiple of ", gpu_attention_block_rows,
               " (the GPU kernels' query block); use --tile ", gpu_attention_block_rows / std::gcd(gpu_attention_block_rows, group),
               " or a multiple of it");
}

/// Bytes of pinned host memory that kernels address at the host pointer (oomb::pinned_resource).
class pinned_bytes {
 public:
  explicit pinned_bytes(std::size_t n) : p_(static_cast<unsigned char*>(oomb::pinned_resource{}.allocate(n))), n_(n) {}
  pinned_bytes(const pinned_bytes&) = delete;
  pinned_bytes& operator=(const pinned_bytes&) = delete;
  ~pinned_bytes() { oomb::pinned_resource{}.deallocate(p_, n_); }
  unsigned char* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  unsigned char* p_;
  std::size_t n_;
};

/// The GPU selector (see the file comment) of a CUDA backend: its activations' element (bf16), its
/// compute stream and its op clock.
template <class Backend>
class cuda_page_selector {
  using T = typename Backend::value_type;
  using op_scope = typename Backend::op_scope;

 public:
  /// Summaries of `capacity` page ids of `page` tokens, `hkv` heads of dim `d`; queries have `hq`
  /// heads; everything enqueued on the backend's compute stream.
  cuda_page_selector(Backend& backend, std::int32_t page, std::int32_t hq, std::int32_t hkv, std::int32_t d,
                     std::int32_t capacity, const oomb::tile_selection_config& config)
      : backend_(backend), stream_(backend.compute()), page_(page), hq_(hq), hkv_(hkv), d_(d),
        config_((config.validate(), check_gpu_sparse_tile(config.tile_queries, hq, hkv), config)),
        stats_(oomb::summary_stats_for(config.kind)),
        home_(oomb::device_page_summaries::bytes(capacity, hkv, d, stats_)),
        summaries_(oomb::device_page_summaries::over(home_.data(), capacity, hkv, d, stats_)),
        ring_(std::size_t(64) << 10), done_(oomb::cuda_event::create()) {
    oomb::clear_page_summaries(summaries_, stream_);
  }
  cuda_page_selector(const cuda_page_selector&) = delete;
  cuda_page_selector& operator=(const cuda_page_selector&) = delete;

  /// Pinned host bytes of the summaries' home (fixed at construction: every id the trainer may hold).
  std::size_t summary_bytes() const noexcept { return home_.size(); }

  /// Page ids[i] holds keys rows [i * page, min(n, (i + 1) * page)) of k [n][hkv * d] (device).
  void summarize(oomb::id_span ids, std::int64_t n, const T* k) {
    const std::int64_t count = (n + page_ - 1) / page_;
    OOMB_EXPECTS(n > 0 && count <= static_cast<std::int64_t>(ids.size()), "cuda_page_selector::summarize: ", n,
                 " rows need ", count, " pages, given ", ids.size());
    forget_pending();
    const op_scope timed(backend_, op_kind::selection, "selection/summarize");
    const auto t = ring_.upload(ids.data(), static_cast<std::size_t>(count), stream_);
    oomb::summarize_key_rows(k, n, page_, t.data, static_cast<std::int32_t>(count), summaries_, stream_);
    ring_.release(t, stream_);
  }

  /// The past pages (the first `past` of the layer's `ids`, from tile_first[t] on for tile t, or
  /// from 0 when null: a host array, one entry per tile) each query tile of q [n][hq * d] (device)
  /// attends, into the host table `out`. Waits for the device once, unless the budget covers the
  /// whole past (then every tile takes every candidate, as the CPU does, without the GPU).
  void select(const T* q, std::int64_t n, oomb::id_span ids, std::int32_t past, const std::int32_t* tile_first,
              oomb::sparse_page_table& out) {
    OOMB_EXPECTS(n > 0 && past >= 0 && past <= static_cast<std::int64_t>(ids.size()), "cuda_page_selector::select: ",
                 n, " queries, past ", past, " of ", ids.size(), " pages");
    const auto tiles = static_cast<std::int32_t>((n + config_.tile_queries - 1) / config_.tile_queries);
    if (tile_first != nullptr)
      for (std::int32_t t = 0; t < tiles; ++t)
        OOMB_EXPECTS(tile_first[t] >= 0, "cuda_page_selector::select: tile ", t, " has a negative first page ",
                     tile_first[t]);
    out.clear();
    if (past <= config_.pages.max_pages()) {
      for (std::int32_t t = 0; t < tiles; ++t) {
        const std::int32_t first = tile_first == nullptr ? 0 : std::min(tile_first[t], past);
        chosen_.resize(static_cast<std::size_t>(past - first));
        std::iota(chosen_.begin(), chosen_.end(), first);
        out.add_tile(chosen_);
      }
      return;
    }
    forget_pending();
    plan_for(tiles, past);
    // Rows are at most per_tile long (shorter from a late first page): read back their capacity,
    // so that one wait brings indptr and pages together.
    const std::int32_t per_tile = plan_.pages_per_tile(past);
    const auto entries = static_cast<std::size_t>(tiles) * static_cast<std::size_t>(per_tile);
    {
      const op_scope timed(backend_, op_kind::selection, "selection/select");
      const auto far_ids = ring_.upload(ids.data(), static_cast<std::size_t>(past), stream_);
      oomb::upload_ring::uploaded<std::int32_t> firsts{};
      if (tile_first != nullptr) firsts = ring_.upload(tile_first, static_cast<std::size_t>(tiles), stream_);
      const oomb::tensor_view<const T, 3> queries(q, {n, hq_, d_}, {std::int64_t(hq_) * d_, d_, 1},
                                                  oomb::memory_kind::device);
      oomb::select_tiles(plan_, summaries_.view(), queries, far_ids.data, past, firsts.data, indptr_.data(),
                         pages_.data(), workspace_.data(), workspace_.size(), stream_);
      if (tile_first != nullptr) ring_.release(firsts, stream_);
      ring_.release(far_ids, stream_);
    }
    OOMB_CUDA_CHECK(cudaMemcpyAsync(host_indptr_.get(), indptr_.data(), (std::size_t(tiles) + 1) * sizeof(std::int32_t),
                                    cudaMemcpyDeviceToHost, stream_.get()),
                    "cuda_page_selector: reading the selection's row offsets back");
    OOMB_CUDA_CHECK(cudaMemcpyAsync(host_pages_.get(), pages_.data(), entries * sizeof(std::int32_t),
                                    cudaMemcpyDeviceToHost, stream_.get()),
                    "cuda_page_selector: reading the selection back");
    stream_.record(done_);
    const auto waited = std::chrono::steady_clock::now();
    done_.wait();  // the one wait: stage 1 stores the selection on the host for stage 2
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - waited).count();
    const std::int32_t* indptr = host_indptr_.get();
    for (std::int32_t i = 0; i < tiles; ++i) out.add_tile(host_pages_.get() + indptr[i], indptr[i + 1] - indptr[i]);
  }

  /// Seconds the host has been blocked in select()'s waits since construction.
  double wait_seconds() const noexcept { return wait_seconds_; }

  /// Page `id` holds no keys any more (emptied on the device before the next summarize or select).
  void forget(std::int32_t id) { forgotten_.push_back(id); }

 private:
  /// Empties the forgotten ids' summaries (rows 0: every listed page gets no tokens), in one launch.
  void forget_pending() {
    if (forgotten_.empty()) return;
    const op_scope timed(backend_, op_kind::selection, "selection/forget");
    const auto t = ring_.upload(forgotten_.data(), forgotten_.size(), stream_);
    oomb::summarize_key_rows<T>(nullptr, 0, page_, t.data, static_cast<std::int32_t>(forgotten_.size()), summaries_,
                                stream_);
    ring_.release(t, stream_);
    forgotten_.clear();
  }

  /// A plan, workspace and output tables for `tiles` tiles over `past` pages; grown geometrically
  /// (past doubles) so a step re-plans a handful of times, each right after a wait. The workspace
  /// stops growing once the past is longer than one slice.
  void plan_for(std::int32_t tiles, std::int32_t past) {
    if (tiles <= plan_.max_tiles && past <= plan_.max_past_pages) return;
    plan_ = oomb::plan_tile_selection(config_, hq_, hkv_, d_, std::max(tiles, plan_.max_tiles),
                                      std::max(past, 2 * plan_.max_past_pages));
    workspace_.resize(plan_.workspace_bytes);
    indptr_.resize(static_cast<std::size_t>(plan_.max_tiles) + 1);
    const auto entries = static_cast<std::size_t>(std::max<std::int64_t>(plan_.max_entries(), 1));
    pages_.resize(entries);
    host_indptr_ = oomb::make_pinned_staging<std::int32_t>(indptr_.size(), cudaHostAllocDefault, "cuda_page_selector");
    host_pages_ = oomb::make_pinned_staging<std::int32_t>(entries, cudaHostAllocDefault, "cuda_page_selector");
  }

  Backend& backend_;
  oomb::cuda_stream_view stream_;
  std::int32_t page_, hq_, hkv_, d_;
  oomb::tile_selection_config config_;
  oomb::summary_stats stats_;
  pinned_bytes home_;                      // the far tier: every id's summary
  oomb::device_page_summaries summaries_;  // over home_
  oomb::upload_ring ring_;  // page ids to the device (the selector's own: the backend's is private)
  oomb::cuda_event done_;
  oomb::tile_selection_plan plan_{};
  gpu::device_buffer<unsigned char> workspace_;
  gpu::device_buffer<std::int32_t> indptr_, pages_;
  oomb::pinned_staging<std::int32_t> host_indptr_, host_pages_;
  std::vector<std::int32_t> chosen_, forgotten_;
  double wait_seconds_ = 0;
};

}  // namespace oomb_trainer
