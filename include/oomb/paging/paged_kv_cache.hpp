// oomb — the paged KV cache: L layers of K/V pages from one pool, named by a page_table.
// SPDX-License-Identifier: Apache-2.0
//
// Thread safety: a paged_kv_cache is NOT internally synchronised. Every non-const call (append,
// pop, add_sequence, take/clear_changes) needs external synchronisation against every other call
// on the same cache; const calls may run concurrently with each other, except view(), which
// refreshes a per-layer CSR buffer and so counts as non-const. Page memory is the caller's to
// order: the cache never reads or writes K/V values.
//
// Errors: a throwing call leaves the cache exactly as it was (strong guarantee); in particular an
// append that runs out of pages changes nothing in any layer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/paging/page_pool_config.hpp"
#include "oomb/paging/page_shape.hpp"
#include "oomb/paging/page_table.hpp"
#include "oomb/paging/views.hpp"

OOMB_NAMESPACE_BEGIN

/// What a paged_kv_cache holds and where its pages come from.
struct paged_kv_config {
  std::int32_t layers = 1;
  page_shape shape{};               ///< page_size a power of two >= 16, kv_heads and head_dim > 0
  std::int32_t chunk_size = 4096;   ///< tokens per append; a multiple of shape.page_size
  page_pool_config pool{};          ///< capacity in K/V page pairs, all layers together
  bool record_changes = true;       ///< keep the page table's change log (see page_table)

  /// Throws invalid_argument naming the first bad value.
  void validate() const {
    OOMB_EXPECTS(layers > 0, "paged_kv_cache: layers must be positive, got ", layers);
    shape.validate();
    OOMB_EXPECTS(chunk_size > 0 && chunk_size % shape.page_size == 0,
                 "paged_kv_cache: chunk_size ", chunk_size,
                 " must be a positive multiple of page_size ", shape.page_size);
    pool.validate("paged_kv_cache");
  }
};

/// K/V pages of `layers` layers for a batch of sequences.
///
/// One block_pool of K/V page *pairs* (block = 2 * page_elements * sizeof(E): the K page, then the
/// V page) serves all layers; a page_table maps (sequence, layer, logical page) to pair ids.
/// Sequences grow chunk by chunk: append(seq, tokens) adds 1..chunk_size tokens to every layer and
/// is allowed only while the sequence's length is a multiple of chunk_size (so every chunk but the
/// last of a sequence is full and chunk boundaries are page boundaries); pops remove whole chunks
/// from the end. Token position p of a sequence lives in logical page p / page_size, token
/// p % page_size of it, in every layer.
template <class E, class Resource>
class paged_kv_cache {
 public:
  using element_type = E;
  using resource_type = Resource;
  /// One K (or V) page, indexed [kv_head][token][dim] whatever the layout (strides differ).
  using page_view = tensor_view<E, 3>;

  paged_kv_cache(Resource& resource, const paged_kv_config& config)
      : config_(validated(config)),
        pool_(detail::make_page_pool(resource, pair_bytes_of(config.shape), config.pool)),
        table_(config.layers, config.shape.page_size, config.record_changes),
        csr_(static_cast<std::size_t>(config.layers)),
        csr_version_(static_cast<std::size_t>(config.layers), 0) {}

  paged_kv_cache(const paged_kv_cache&) = delete;
  paged_kv_cache& operator=(const paged_kv_cache&) = delete;
  paged_kv_cache(paged_kv_cache&&) noexcept = default;
  paged_kv_cache& operator=(paged_kv_cache&&) noexcept = default;

  const paged_kv_config& config() const noexcept { return config_; }
  const page_shape& shape() const noexcept { return config_.shape; }
  std::int32_t num_layers() const noexcept { return config_.layers; }
  std::int32_t page_size() const noexcept { return config_.shape.page_size; }
  std::int32_t chunk_size() const noexcept { return config_.chunk_size; }
  /// Bytes of one pool block: a K page and a V page.
  std::size_t pair_bytes() const noexcept { return pair_bytes_of(config_.shape); }

  std::int32_t num_seqs() const noexcept { return table_.num_seqs(); }
  std::int64_t seq_len(std::int32_t seq) const { return table_.seq_len(seq); }
  std::int32_t num_pages(std::int32_t seq) const { return table_.num_pages(seq); }
  /// Chunks sequence `seq` holds (the last may be partial).
  std::int32_t num_chunks(std::int32_t seq) const {
    return static_cast<std::int32_t>((table_.seq_len(seq) + config_.chunk_size - 1) / config_.chunk_size);
  }
  /// Logical pages [first, last) of chunk `chunk` of `seq` (the same in every layer).
  std::pair<std::int32_t, std::int32_t> chunk_pages(std::int32_t seq, std::int32_t chunk) const {
    const std::int32_t chunks = num_chunks(seq);
    OOMB_EXPECTS(chunk >= 0 && chunk < chunks, "paged_kv_cache: chunk ", chunk, " of sequence ", seq,
                 " out of range [0, ", chunks, ")");
    const std::int32_t per_chunk = config_.chunk_size / page_size();
    const std::int32_t first = chunk * per_chunk;
    return {first, std::min(first + per_chunk, table_.num_pages(seq))};
  }

  std::int32_t add_sequence() {
    const std::int32_t s = table_.add_sequence();
    ++version_;
    return s;
  }

  /// Pages (per layer) an append of `tokens` to `seq` would take; num_layers() times that from the
  /// pool in all.
  std::int32_t pages_needed(std::int32_t seq, std::int64_t tokens) const {
    return table_.pages_needed(seq, tokens);
  }

  /// Appends `tokens` (1..chunk_size) tokens to `seq` in every layer, taking the pages all layers
  /// need from the pool at once; returns the position of the first new token. All or nothing:
  /// throws out_of_memory (naming pages asked and left) with nothing changed when the pool cannot
  /// provide them, invalid_argument for a bad sequence, a count outside 1..chunk_size, or a
  /// sequence whose last chunk is partial.
  std::int64_t append(std::int32_t seq, std::int64_t tokens) {
    const std::int64_t len = table_.seq_len(seq);
    OOMB_EXPECTS(tokens >= 1 && tokens <= config_.chunk_size, "paged_kv_cache: append of ", tokens,
                 " tokens to sequence ", seq, ": a chunk holds 1..", config_.chunk_size, " tokens");
    OOMB_EXPECTS(len % config_.chunk_size == 0, "paged_kv_cache: append to sequence ", seq,
                 " which holds ", len, " tokens, not a multiple of chunk_size ", config_.chunk_size,
                 " (only a sequence's last chunk may be partial)");
    const std::int32_t n = table_.pages_needed(seq, tokens);
    const std::int64_t want = std::int64_t(n) * config_.layers;
    OOMB_CHECK(want <= pool_.available(), out_of_memory, "paged_kv_cache: append of ", tokens,
               " tokens to sequence ", seq, " needs ", n, " pages in each of ", config_.layers,
               " layers = ", want, " page pairs of ", pair_bytes(), " bytes; the pool has ",
               pool_.available(), " left of ", pool_.capacity(), " (", pool_.in_use(), " in use)");
    scratch_.resize(static_cast<std::size_t>(want));
    pool_.acquire(static_cast<std::int32_t>(want), scratch_.data());
    try {
      table_.append(seq, tokens, scratch_.data(), scratch_.size());
    } catch (...) {
      for (std::int32_t id : scratch_) pool_.release(id);
      throw;
    }
    ++version_;
    return len;
  }

  /// Removes the last `tokens` tokens of `seq` from every layer and returns the pages that no
  /// longer hold a token to the pool. Then calls `on_release(id)` for each of them, layer-major,
  /// ascending logical pages (e.g. to release its gradient page); if it throws, the cache is
  /// already consistent and the remaining ids are not visited. The remaining length must be a
  /// multiple of chunk_size: pops take whole chunks from the end (the last one may be partial).
  template <class F>
  void pop(std::int32_t seq, std::int64_t tokens, F&& on_release) {
    check_pop(seq, tokens);
    // A local list, so that on_release may call back into the cache.
    const std::vector<std::int32_t> freed = table_.pop(seq, tokens);
    ++version_;
    for (std::int32_t id : freed) pool_.release(id);
    for (std::int32_t id : freed) on_release(id);
  }
  void pop(std::int32_t seq, std::int64_t tokens) {
    pop(seq, tokens, [](std::int32_t) {});
  }
  /// Pops the last chunk of `seq` (partial or full) and returns how many tokens it held (0 when the
  /// sequence is empty).
  template <class F>
  std::int64_t pop_chunk(std::int32_t seq, F&& on_release) {
    const std::int64_t len = table_.seq_len(seq);
    const std::int64_t tokens = len == 0 ? 0 : len - (len - 1) / config_.chunk_size * config_.chunk_size;
    pop(seq, tokens, std::forward<F>(on_release));
    return tokens;
  }
  std::int64_t pop_chunk(std::int32_t seq) {
    return pop_chunk(seq, [](std::int32_t) {});
  }

  /// First of head_dim contiguous elements of K at (seq, layer, token position, kv head).
  /// Throws invalid_argument for any index out of range.
  E* k(std::int32_t seq, std::int32_t layer, std::int64_t pos, std::int32_t head) const {
    return element(seq, layer, pos, head, 0);
  }
  /// As k(), for V.
  E* v(std::int32_t seq, std::int32_t layer, std::int64_t pos, std::int32_t head) const {
    return element(seq, layer, pos, head, config_.shape.page_elements());
  }

  /// Id of logical page `i` of (seq, layer).
  std::int32_t page_id(std::int32_t seq, std::int32_t layer, std::int32_t i) const {
    return table_.page(seq, layer, i);
  }
  /// All page ids of (seq, layer) in logical order; dangles after the next append/pop of seq.
  id_span page_ids(std::int32_t seq, std::int32_t layer) const { return table_.pages(seq, layer); }
  /// Ids of logical pages [first, last) of (seq, layer): a window for prefetch lists and kernels.
  id_span page_ids(std::int32_t seq, std::int32_t layer, std::int32_t first, std::int32_t last) const {
    const id_span all = table_.pages(seq, layer);
    OOMB_EXPECTS(0 <= first && first <= last && static_cast<std::size_t>(last) <= all.size(),
                 "paged_kv_cache: page range [", first, ", ", last, ") of sequence ", seq, " layer ",
                 layer, " not within [0, ", all.size(), "]");
    return id_span(all.data() + first, static_cast<std::size_t>(last - first));
  }
  /// Calls `f(pos, id, token, count)` for each page holding positions [begin, end) of (seq,
  /// layer), in order: tokens [token, token + count) of page `id` hold positions [pos, pos + count).
  /// The way to write a chunk's K/V page by page.
  template <class F>
  void for_each_span(std::int32_t seq, std::int32_t layer, std::int64_t begin, std::int64_t end, F&& f) const {
    const std::int64_t len = table_.seq_len(seq);
    OOMB_EXPECTS(layer >= 0 && layer < config_.layers, "paged_kv_cache: layer ", layer,
                 " out of range [0, ", config_.layers, ")");
    OOMB_EXPECTS(0 <= begin && begin <= end && end <= len, "paged_kv_cache: position range [", begin,
                 ", ", end, ") of sequence ", seq, " not within [0, ", len, "]");
    const id_span ids = table_.pages(seq, layer);
    const std::int64_t p = page_size();
    for (std::int64_t pos = begin; pos < end;) {
      const auto token = static_cast<std::int32_t>(pos % p);
      const auto count = static_cast<std::int32_t>(std::min<std::int64_t>(p - token, end - pos));
      f(pos, ids[static_cast<std::size_t>(pos / p)], token, count);
      pos += count;
    }
  }
  /// Calls `f(logical_page, id)` for logical pages [first, last) of (seq, layer).
  template <class F>
  void for_each_page(std::int32_t seq, std::int32_t layer, std::int32_t first, std::int32_t last,
                     F&& f) const {
    table_.for_each_page(seq, layer, first, last, std::forward<F>(f));
  }

  /// The K page of pair `id` as a view [kv_head][token][dim]. Throws for an id not in use.
  page_view k_page(std::int32_t id) const { return page_of(id, 0); }
  page_view v_page(std::int32_t id) const { return page_of(id, config_.shape.page_elements()); }
  page_view k_page(std::int32_t seq, std::int32_t layer, std::int32_t i) const { return k_page(page_id(seq, layer, i)); }
  page_view v_page(std::int32_t seq, std::int32_t layer, std::int32_t i) const { return v_page(page_id(seq, layer, i)); }

  /// The pool as kernels address it. Needs a contiguous pool (throws invalid_argument otherwise).
  page_pool_view<E> pool_view() const {
    OOMB_EXPECTS(pool_.is_contiguous(), "paged_kv_cache: pool_view()/view() need a contiguous pool ",
                 "(config.pool.mode = pool_mode::contiguous)");
    return page_pool_view<E>::over(reinterpret_cast<E*>(pool_.base()), config_.shape);
  }
  /// Layer `layer` as kernels and CPU references read it: the pool plus the layer's CSR table. The
  /// table lives in host buffers owned by the cache, valid until the next append, pop or
  /// add_sequence (a GPU user copies export_csr() / the change log to the device instead).
  paged_kv_view<E> view(std::int32_t layer) const {
    paged_kv_view<E> v;
    v.pool = pool_view();
    v.table = csr(layer).view();
    return v;
  }
  /// Layer `layer`'s CSR table (cached until the next change); see view().
  const page_table_csr& csr(std::int32_t layer) const {
    OOMB_EXPECTS(layer >= 0 && layer < config_.layers, "paged_kv_cache: layer ", layer,
                 " out of range [0, ", config_.layers, ")");
    const auto l = static_cast<std::size_t>(layer);
    if (csr_version_[l] != version_ + 1) {
      table_.export_csr(layer, csr_[l]);
      csr_version_[l] = version_ + 1;  // +1 so a fresh cache (all 0) counts as stale
    }
    return csr_[l];
  }

  const page_table& table() const noexcept { return table_; }
  /// The page table's change log since the last clear (see page_table::changes()).
  const page_table_changes& changes() const noexcept { return table_.changes(); }
  page_table_changes take_changes() noexcept { return table_.take_changes(); }
  void clear_changes() noexcept { table_.clear_changes(); }

  const block_pool<Resource>& pool() const noexcept { return pool_; }
  /// The pool itself, for a residency scheduler that moves page contents. Acquiring or releasing
  /// through it bypasses the table and breaks the cache's accounting: don't.
  block_pool<Resource>& pool() noexcept { return pool_; }
  block_pool_stats stats() const noexcept { return pool_.stats(); }

 private:
  static const paged_kv_config& validated(const paged_kv_config& c) {
    c.validate();
    return c;
  }
  static std::size_t pair_bytes_of(const page_shape& s) noexcept {
    return static_cast<std::size_t>(s.pair_elements()) * sizeof(E);
  }

  void check_pop(std::int32_t seq, std::int64_t tokens) const {
    const std::int64_t len = table_.seq_len(seq);
    OOMB_EXPECTS(tokens >= 0 && tokens <= len, "paged_kv_cache: cannot pop ", tokens,
                 " tokens from sequence ", seq, " which holds ", len);
    OOMB_EXPECTS((len - tokens) % config_.chunk_size == 0, "paged_kv_cache: popping ", tokens,
                 " tokens from sequence ", seq, " (holding ", len, ") would leave ", len - tokens,
                 ", not a multiple of chunk_size ", config_.chunk_size, " (pops take whole chunks)");
  }

  E* element(std::int32_t seq, std::int32_t layer, std::int64_t pos, std::int32_t head,
             std::int64_t kv_offset) const {
    const std::int64_t len = table_.seq_len(seq);
    OOMB_EXPECTS(layer >= 0 && layer < config_.layers, "paged_kv_cache: layer ", layer,
                 " out of range [0, ", config_.layers, ")");
    OOMB_EXPECTS(pos >= 0 && pos < len, "paged_kv_cache: position ", pos, " of sequence ", seq,
                 " out of range [0, ", len, ")");
    OOMB_EXPECTS(head >= 0 && head < config_.shape.kv_heads, "paged_kv_cache: kv head ", head,
                 " out of range [0, ", config_.shape.kv_heads, ")");
    const auto& s = config_.shape;
    const std::int32_t id = table_.pages(seq, layer)[static_cast<std::size_t>(pos / s.page_size)];
    const std::int64_t token = pos % s.page_size;
    return reinterpret_cast<E*>(pool_.address(id)) + kv_offset + token * s.stride_token() +
           std::int64_t(head) * s.stride_head();
  }

  page_view page_of(std::int32_t id, std::int64_t kv_offset) const {
    OOMB_EXPECTS(pool_.owns(id), "paged_kv_cache: page id ", id, " is not in use (reserved ",
                 pool_.reserved(), ")");
    const auto& s = config_.shape;
    return page_view(reinterpret_cast<E*>(pool_.address(id)) + kv_offset,
                     {s.kv_heads, s.page_size, s.head_dim}, {s.stride_head(), s.stride_token(), 1},
                     Resource::kind);
  }

  paged_kv_config config_;
  block_pool<Resource> pool_;
  page_table table_;
  std::vector<std::int32_t> scratch_;                    // ids of the append in flight
  std::uint64_t version_ = 0;                            // bumped by every change of the table
  mutable std::vector<page_table_csr> csr_;              // per layer, exported lazily by csr()
  mutable std::vector<std::uint64_t> csr_version_;
};

OOMB_NAMESPACE_END
