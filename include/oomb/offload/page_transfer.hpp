// oomb — batched page transfers between two block pools, on any stream.
// SPDX-License-Identifier: Apache-2.0
//
// Moving page src_ids[i] of one pool to page dst_ids[i] of another is one batch: everything is
// validated first (equal block sizes and page formats, equal counts, every id in use in its pool,
// no destination written twice, no copy onto its own source) and only then enqueued, as a single
// enqueue_copies call. Runs of neighbouring ids inside one allocation on both sides (a contiguous
// pool, or one slab of a growing pool) become one copy, so a window of consecutive pages costs one
// large copy instead of many small ones. A copy never spans two slabs, even when their addresses
// happen to touch: CUDA refuses a copy whose range covers two allocations (cudaErrorInvalidValue),
// and small pinned allocations do come back to back (a converting tier's staging, always pages 0,
// 1, 2, ..., met such a pair of gradient homes on the H200).
//
// Generic over the stream type: the host stream in CPU builds, a CUDA stream (whose enqueue_copies
// is one cudaMemcpyBatchAsync) on the GPU, with the same code. Like the streams it feeds, a
// page_transfer is not internally synchronised; one per thread, or a lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/offload/stream.hpp"
#include "oomb/paging/page_shape.hpp"

OOMB_NAMESPACE_BEGIN

/// What one transfer moved.
struct transfer_report {
  std::size_t pages = 0;   ///< pool blocks (K/V page pairs) moved
  std::size_t copies = 0;  ///< copies enqueued after merging adjacent pages
  std::size_t bytes = 0;   ///< bytes moved
};

/// The format of the pages a pool holds, for transfers that check it: geometry and element size.
struct page_format {
  page_shape shape;
  std::size_t element_bytes = 2;

  /// Bytes of a K/V pair: what a pool block must hold at least.
  std::size_t pair_bytes() const noexcept {
    return static_cast<std::size_t>(shape.pair_elements()) * element_bytes;
  }
  friend bool operator==(const page_format& a, const page_format& b) noexcept {
    return a.shape == b.shape && a.element_bytes == b.element_bytes;
  }
  friend bool operator!=(const page_format& a, const page_format& b) noexcept { return !(a == b); }
};

/// Validates and enqueues batches of page copies from pool `src` to pool `dst`. Keeps its scratch
/// buffers between calls, so a steady state allocates nothing.
template <class DstResource, class SrcResource>
class page_transfer {
 public:
  using dst_pool_type = block_pool<DstResource>;
  using src_pool_type = block_pool<SrcResource>;

  /// Pages of both pools must have the same block size (throws invalid_argument naming both).
  page_transfer(dst_pool_type& dst, const src_pool_type& src) : dst_(&dst), src_(&src) {
    OOMB_EXPECTS(dst.block_bytes() == src.block_bytes(),
                 "page_transfer: block sizes differ: destination pool ", dst.block_bytes(),
                 " bytes, source pool ", src.block_bytes(), " bytes");
  }

  /// As above, and the page formats must be equal and fit the blocks.
  page_transfer(dst_pool_type& dst, const page_format& dst_format, const src_pool_type& src,
                const page_format& src_format)
      : page_transfer(dst, src) {
    dst_format.shape.validate();
    src_format.shape.validate();
    OOMB_EXPECTS(dst_format == src_format, "page_transfer: page formats differ: destination ",
                 describe(dst_format), ", source ", describe(src_format));
    OOMB_EXPECTS(src_format.pair_bytes() <= src.block_bytes(), "page_transfer: a page pair of ",
                 src_format.pair_bytes(), " bytes (", describe(src_format),
                 ") does not fit the pools' blocks of ", src.block_bytes(), " bytes");
  }

  /// Validates the batch and builds its copies (ops()); touches no stream. Throws
  /// invalid_argument naming the offending entry; then nothing is planned.
  transfer_report plan(id_span dst_ids, id_span src_ids) {
    ops_.clear();
    OOMB_EXPECTS(dst_ids.size() == src_ids.size(), "page_transfer: ", dst_ids.size(),
                 " destination ids but ", src_ids.size(), " source ids");
    const std::size_t n = dst_ids.size();
    const std::size_t bb = dst_->block_bytes();
    for (std::size_t i = 0; i < n; ++i) {
      OOMB_EXPECTS(dst_->owns(dst_ids[i]), "page_transfer: destination page ", dst_ids[i],
                   " (entry ", i, ") is not in use in its pool (reserved ", dst_->reserved(), ")");
      OOMB_EXPECTS(src_->owns(src_ids[i]), "page_transfer: source page ", src_ids[i], " (entry ", i,
                   ") is not in use in its pool (reserved ", src_->reserved(), ")");
    }
    // Sort by destination address: finds every run, and duplicates end up side by side.
    entries_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      entries_[i] = {dst_->address(dst_ids[i]), src_->address(src_ids[i]), i};
    std::sort(entries_.begin(), entries_.end(),
              [](const entry& a, const entry& b) { return a.dst < b.dst; });
    for (std::size_t k = 1; k < n; ++k)
      OOMB_EXPECTS(entries_[k].dst != entries_[k - 1].dst, "page_transfer: destination page ",
                   dst_ids[entries_[k].index], " appears twice (entries ", entries_[k - 1].index,
                   " and ", entries_[k].index, ")");
    if (same_pool()) {  // blocks of one pool overlap only when they are the same block
      for (std::size_t i = 0; i < n; ++i) {
        const std::byte* s = src_->address(src_ids[i]);
        const auto it = std::lower_bound(entries_.begin(), entries_.end(), s,
                                         [](const entry& e, const std::byte* p) { return e.dst < p; });
        OOMB_EXPECTS(it == entries_.end() || it->dst != s, "page_transfer: page ", src_ids[i],
                     " is both a source (entry ", i, ") and a destination (entry ", it->index,
                     ") of one batch in the same pool");
      }
    }
    for (std::size_t k = 0; k < n; ++k) {
      const entry& e = entries_[k];
      if (k > 0) {
        const std::size_t prev = entries_[k - 1].index;
        if (follows_in_slab(*dst_, dst_ids[prev], dst_ids[e.index]) &&
            follows_in_slab(*src_, src_ids[prev], src_ids[e.index])) {
          ops_.back().bytes += bb;
          continue;
        }
      }
      ops_.push_back(copy_op{e.dst, e.src, bb});
    }
    return {n, ops_.size(), n * bb};
  }

  /// plan(), then one stream.enqueue_copies() of the whole batch (nothing when it is empty).
  template <class Stream>
  transfer_report enqueue(Stream& stream, id_span dst_ids, id_span src_ids) {
    static_assert(is_stream_v<Stream>, "page_transfer::enqueue needs a stream (see offload/stream.hpp)");
    const transfer_report r = plan(dst_ids, src_ids);
    if (!ops_.empty()) stream.enqueue_copies(ops_.data(), ops_.size());
    return r;
  }

  /// The copies of the last plan(), merged and sorted by destination address.
  const std::vector<copy_op>& ops() const noexcept { return ops_; }
  dst_pool_type& dst() const noexcept { return *dst_; }
  const src_pool_type& src() const noexcept { return *src_; }

 private:
  struct entry {
    std::byte* dst;
    const std::byte* src;
    std::size_t index;
  };

  // Block b is the one after block a in the same allocation (a contiguous pool is one slab).
  template <class Pool>
  static bool follows_in_slab(const Pool& pool, std::int32_t a, std::int32_t b) noexcept {
    return b == a + 1 && a / pool.blocks_per_slab() == b / pool.blocks_per_slab();
  }

  bool same_pool() const noexcept {
    return static_cast<const void*>(dst_) == static_cast<const void*>(src_);
  }

  static std::string describe(const page_format& f) {
    std::ostringstream os;
    os << "{page_size " << f.shape.page_size << ", kv_heads " << f.shape.kv_heads << ", head_dim "
       << f.shape.head_dim << ", "
       << (f.shape.layout == kv_layout::head_major ? "head_major" : "token_major") << ", "
       << f.element_bytes << "-byte elements}";
    return os.str();
  }

  dst_pool_type* dst_;
  const src_pool_type* src_;
  std::vector<entry> entries_;
  std::vector<copy_op> ops_;
};

/// One-shot form: validates, merges and enqueues src_ids[i] -> dst_ids[i] as one batch on `stream`.
template <class Stream, class DstResource, class SrcResource>
transfer_report transfer_pages(Stream& stream, block_pool<DstResource>& dst, id_span dst_ids,
                               const block_pool<SrcResource>& src, id_span src_ids) {
  page_transfer<DstResource, SrcResource> t(dst, src);
  return t.enqueue(stream, dst_ids, src_ids);
}

/// One-shot form that also checks both pools hold pages of the same format.
template <class Stream, class DstResource, class SrcResource>
transfer_report transfer_pages(Stream& stream, block_pool<DstResource>& dst,
                               const page_format& dst_format, id_span dst_ids,
                               const block_pool<SrcResource>& src, const page_format& src_format,
                               id_span src_ids) {
  page_transfer<DstResource, SrcResource> t(dst, dst_format, src, src_format);
  return t.enqueue(stream, dst_ids, src_ids);
}

OOMB_NAMESPACE_END
