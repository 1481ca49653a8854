// oomb — what one GPU attention call works on: the queries of a chunk against one window of
// key pages. Mirrors reference::attention_args (include/oomb/attention/reference.hpp) with device pointers,
// bf16 queries and an fp32 scale, so a test can run both on the same data.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "oomb/core/bf16.hpp"
#include "oomb/paging/views.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention {

/// Every pointer is device memory. Query i of the chunk sits at absolute position q_start + i;
/// query head h reads KV head h / (hq / hkv). Sequence 0 of kv.table lists the window's pages, the
/// logical pages first_page, first_page + 1, ... of the sequence. Causal everywhere; with
/// key_lower, block-diagonal causal (packed documents).
struct attention_args {
  const bf16* q = nullptr;  ///< [sq][hq][d], RoPE applied
  std::int64_t q_start = 0;
  std::int32_t sq = 0;
  std::int32_t hq = 0;
  std::int32_t hkv = 0;
  std::int32_t d = 0;
  float scale = 0.0f;  ///< usually 1/sqrt(d)
  paged_kv_view<const bf16> kv{};
  std::int32_t first_page = 0;
  /// kv.table.num_pages(0), known on the host (the backward's grid is sized from it, so a launch
  /// never reads the device table back). Must equal the device table's count.
  std::int32_t window_pages = 0;
  /// Optional page-sparse past: per tile of `tile` consecutive queries, the sorted (strictly
  /// increasing) logical page indices of the past pages (wholly before q_start) it attends; entries
  /// outside the window are ignored. The chunk's own pages are always attended causally.
  /// nullptr = dense. tile * (hq / hkv) must be a multiple of 128.
  /// A past page of the window that no tile selects is never read, forward or backward: its table
  /// id may be -1 (the trainer's table for a page it did not bring in), its memory anything, NaN
  /// included, and it gets no gradient (its window_grad_view entry is never read). Dense, every id must be
  /// a valid page.
  const std::int32_t* tile_indptr = nullptr;  ///< [ceil(sq / tile) + 1]
  const std::int32_t* tile_pages = nullptr;
  std::int32_t tile = 128;
  /// Optional per-document bounds (the reference's contract): query i sees only keys at absolute
  /// positions >= key_lower[i], the start of its document. Non-decreasing in i and at most
  /// q_start + i. So a block of rows whose first query is i0 needs no key below key_lower[i0]
  /// (skip whole tiles and pages below it; mask per row above it), and the queries that see a key
  /// block [k0, k1) are contiguous: from the causal start up to the first i with key_lower[i] >= k1.
  /// Pages wholly below key_lower[0] are read by no row: their table ids may be -1, also dense, and
  /// their gradient pages are not touched. nullptr = no bound. Device memory, 8-byte aligned; the
  /// kernels trust the contract (the CPU reference checks it).
  const std::int64_t* key_lower = nullptr;  ///< [sq]
};

}  // namespace attention
OOMB_NAMESPACE_END
