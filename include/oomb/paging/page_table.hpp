// oomb — the page table: (sequence, layer, logical page) -> int32 page id, exported as CSR and as
// a change log.
// SPDX-License-Identifier: Apache-2.0
//
// Thread safety: a page_table is NOT internally synchronised. Every non-const call needs external
// synchronisation against every other call on the same table; const calls may run concurrently
// with each other.
//
// Errors: every mutating call checks all of its preconditions before it changes anything, so a
// throwing call leaves the table exactly as it was (strong guarantee).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/paging/views.hpp"

OOMB_NAMESPACE_BEGIN

/// One entry of the change log: logical page `page` of (`seq`, `layer`) now holds page `id`, or was
/// removed when `id` is page_table::no_page (-1).
struct page_delta {
  std::int32_t seq = 0;
  std::int32_t layer = 0;
  std::int32_t page = 0;
  std::int32_t id = -1;
  bool removed() const noexcept { return id < 0; }
  friend bool operator==(const page_delta& a, const page_delta& b) noexcept {
    return a.seq == b.seq && a.layer == b.layer && a.page == b.page && a.id == b.id;
  }
};

/// Sequence `seq` now holds `tokens` tokens (in every layer). add_sequence() logs {seq, 0}.
struct length_delta {
  std::int32_t seq = 0;
  std::int64_t tokens = 0;
  friend bool operator==(const length_delta& a, const length_delta& b) noexcept {
    return a.seq == b.seq && a.tokens == b.tokens;
  }
};

/// What changed since the log was last cleared, in the order it happened. Replaying `pages` in
/// order onto a copy indexed by (layer, seq, logical page), and taking each sequence's last
/// `lengths` entry, reproduces the table (see docs/paging.md).
struct page_table_changes {
  std::vector<page_delta> pages;
  std::vector<length_delta> lengths;
  bool empty() const noexcept { return pages.empty() && lengths.empty(); }
  void clear() noexcept {
    pages.clear();
    lengths.clear();
  }
};

/// One layer of a page table in CSR form, owning its arrays. view() points into them, so it
/// dangles when this object is destroyed or exported into again.
struct page_table_csr {
  std::vector<std::int32_t> indptr;         ///< [num_seqs + 1]
  std::vector<std::int32_t> indices;        ///< [indptr.back()]
  std::vector<std::int32_t> last_page_len;  ///< [num_seqs]; 0 for a sequence with no page
  std::int32_t page_size = 0;

  std::int32_t num_seqs() const noexcept {
    return indptr.empty() ? 0 : static_cast<std::int32_t>(indptr.size() - 1);
  }
  page_table_view view() const noexcept {
    page_table_view v;
    v.indptr = indptr.data();
    v.indices = indices.data();
    v.last_page_len = last_page_len.data();
    v.num_seqs = num_seqs();
    v.page_size = page_size;
    return v;
  }
};

/// Maps (sequence, layer, logical page) to page ids for a batch of sequences over `layers` layers.
///
/// A sequence has ONE length shared by all layers: an append adds the same number of tokens, hence
/// the same number of pages, to every layer (the trainer appends a chunk to all layers at once).
/// The table never allocates pages: the caller acquires ids (pages_needed() says how many) and the
/// table hands back the ids a pop frees. Ids passed to append are laid out layer-major:
/// `ids[l * n + i]` is the i-th new page of layer l, n = pages_needed(seq, tokens); pop returns
/// (or visits) freed ids in the same order, so pop undoes append id for id.
class page_table {
 public:
  /// The id a removed page gets in the change log.
  static constexpr std::int32_t no_page = -1;

  /// Throws invalid_argument for layers <= 0 or a page size that is not a power of two >= 16.
  page_table(std::int32_t layers, std::int32_t page_size, bool record_changes = true)
      : layers_(layers), page_size_(page_size), recording_(record_changes) {
    OOMB_EXPECTS(layers > 0, "page_table: layers must be positive, got ", layers);
    OOMB_EXPECTS(page_size >= 16 && (page_size & (page_size - 1)) == 0,
                 "page_table: page_size must be a power of two >= 16, got ", page_size);
  }

  std::int32_t num_layers() const noexcept { return layers_; }
  std::int32_t page_size() const noexcept { return page_size_; }
  std::int32_t num_seqs() const noexcept { return static_cast<std::int32_t>(len_.size()); }
  /// Pages held in one layer, summed over sequences (every layer holds as many).
  std::int64_t pages_per_layer() const noexcept { return pages_per_layer_; }
  /// Pages held in all layers together.
  std::int64_t total_pages() const noexcept { return pages_per_layer_ * layers_; }

  /// Tokens held by sequence `seq` (in every layer).
  std::int64_t seq_len(std::int32_t seq) const {
    check_seq(seq, "seq_len");
    return len_[static_cast<std::size_t>(seq)];
  }
  /// Pages held by sequence `seq` in each layer.
  std::int32_t num_pages(std::int32_t seq) const {
    check_seq(seq, "num_pages");
    return pages_of(len_[static_cast<std::size_t>(seq)]);
  }
  /// Tokens in the last page of `seq` (1..page_size), or 0 when it holds no page.
  std::int32_t last_page_len(std::int32_t seq) const {
    check_seq(seq, "last_page_len");
    return last_len_of(len_[static_cast<std::size_t>(seq)]);
  }

  /// Adds an empty sequence and returns its index (0, 1, 2, ... in order).
  std::int32_t add_sequence() {
    OOMB_CHECK(num_seqs() < std::numeric_limits<std::int32_t>::max(), out_of_memory,
               "page_table: cannot add another sequence (", num_seqs(), " held)");
    const auto seq = num_seqs();
    make_room(len_, 1);
    make_room(ids_, static_cast<std::size_t>(layers_));
    if (recording_) make_room(changes_.lengths, 1);
    len_.push_back(0);
    ids_.resize(ids_.size() + static_cast<std::size_t>(layers_));
    if (recording_) changes_.lengths.push_back({seq, 0});
    return seq;
  }

  /// New pages each layer of `seq` needs to hold `tokens` more tokens (0 while they fit in the
  /// partial last page). Throws invalid_argument for a bad sequence or a negative / too large count.
  std::int32_t pages_needed(std::int32_t seq, std::int64_t tokens) const {
    check_seq(seq, "pages_needed");
    const std::int64_t len = len_[static_cast<std::size_t>(seq)];
    check_growth(seq, len, tokens);
    return pages_of(len + tokens) - pages_of(len);
  }

  /// Appends `tokens` tokens to `seq` in every layer. `ids` holds `count` ids, which must be
  /// `pages_needed(seq, tokens) * num_layers()`, layer-major (see the class comment); each id must
  /// be >= 0 and not held elsewhere in the table (the pool that hands them out guarantees that; the
  /// table does not check it). Strong guarantee.
  void append(std::int32_t seq, std::int64_t tokens, const std::int32_t* ids, std::size_t count) {
    const std::int32_t n = pages_needed(seq, tokens);
    const auto want = static_cast<std::size_t>(n) * static_cast<std::size_t>(layers_);
    OOMB_EXPECTS(count == want, "page_table: append of ", tokens, " tokens to sequence ", seq,
                 " (holding ", len_[static_cast<std::size_t>(seq)], ") needs ", n,
                 " new pages in each of ", layers_, " layers = ", want, " ids, got ", count);
    OOMB_EXPECTS(want == 0 || ids != nullptr, "page_table: append got a null id array for ", want,
                 " ids");
    OOMB_EXPECTS(pages_per_layer_ + n <= std::numeric_limits<std::int32_t>::max(),
                 "page_table: append of ", n, " pages per layer would exceed the int32 CSR limit (",
                 pages_per_layer_, " pages per layer held)");
    for (std::size_t k = 0; k < want; ++k)
      OOMB_EXPECTS(ids[k] >= 0, "page_table: append got page id ", ids[k], " at position ", k,
                   " (layer ", k / static_cast<std::size_t>(n), "); ids must be >= 0");

    // Everything that can throw (allocation) happens before the first change.
    const std::int32_t old_pages = pages_of(len_[static_cast<std::size_t>(seq)]);
    for (std::int32_t l = 0; l < layers_; ++l) {
      auto& v = slot(seq, l);
      make_room(v, static_cast<std::size_t>(n));
    }
    if (recording_) {
      make_room(changes_.pages, want);
      make_room(changes_.lengths, 1);
    }

    // The log grows by one resize and plain stores: a push_back per page costs several times the
    // append itself (bench/page_table_bench.cpp).
    page_delta* log = nullptr;
    if (recording_) {
      changes_.pages.resize(changes_.pages.size() + want);
      log = changes_.pages.data() + (changes_.pages.size() - want);
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      auto& v = slot(seq, l);
      const std::int32_t* src = ids + static_cast<std::size_t>(l) * static_cast<std::size_t>(n);
      v.insert(v.end(), src, src + n);
      if (log != nullptr)
        for (std::int32_t i = 0; i < n; ++i) *log++ = {seq, l, old_pages + i, src[i]};
    }
    len_[static_cast<std::size_t>(seq)] += tokens;
    pages_per_layer_ += n;
    if (recording_ && tokens != 0) changes_.lengths.push_back({seq, len_[static_cast<std::size_t>(seq)]});
  }
  void append(std::int32_t seq, std::int64_t tokens, const std::vector<std::int32_t>& ids) {
    append(seq, tokens, ids.data(), ids.size());
  }

  /// Pages each layer of `seq` frees when its last `tokens` tokens are popped.
  std::int32_t pages_freed(std::int32_t seq, std::int64_t tokens) const {
    check_pop(seq, tokens, "pages_freed");
    const std::int64_t len = len_[static_cast<std::size_t>(seq)];
    return pages_of(len) - pages_of(len - tokens);
  }

  /// Removes the last `tokens` tokens of `seq` from every layer. `on_free(layer, logical_page, id)`
  /// is called for each page that no longer holds a token, layer-major, ascending pages, before
  /// the table changes: if it throws, the table is unchanged (pages it already handled are the
  /// caller's to account for). Throws invalid_argument when `tokens` is negative or more than the
  /// sequence holds.
  template <class F>
  void pop(std::int32_t seq, std::int64_t tokens, F&& on_free) {
    check_pop(seq, tokens, "pop");
    const std::int64_t len = len_[static_cast<std::size_t>(seq)];
    const std::int32_t keep = pages_of(len - tokens);
    const std::int32_t n = pages_of(len) - keep;
    if (recording_) {
      make_room(changes_.pages, static_cast<std::size_t>(n) * static_cast<std::size_t>(layers_));
      make_room(changes_.lengths, 1);
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      const auto& v = slot(seq, l);
      for (std::int32_t i = keep; i < keep + n; ++i) on_free(l, i, v[static_cast<std::size_t>(i)]);
    }
    page_delta* log = nullptr;
    if (recording_) {
      const auto count = static_cast<std::size_t>(n) * static_cast<std::size_t>(layers_);
      changes_.pages.resize(changes_.pages.size() + count);
      log = changes_.pages.data() + (changes_.pages.size() - count);
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (log != nullptr)
        for (std::int32_t i = keep; i < keep + n; ++i) *log++ = {seq, l, i, no_page};
      slot(seq, l).resize(static_cast<std::size_t>(keep));
    }
    len_[static_cast<std::size_t>(seq)] = len - tokens;
    pages_per_layer_ -= n;
    if (recording_ && tokens != 0) changes_.lengths.push_back({seq, len - tokens});
  }

  /// As pop(seq, tokens, on_free), returning the freed ids layer-major (the layout append takes).
  std::vector<std::int32_t> pop(std::int32_t seq, std::int64_t tokens) {
    std::vector<std::int32_t> freed;
    freed.reserve(static_cast<std::size_t>(pages_freed(seq, tokens)) * static_cast<std::size_t>(layers_));
    pop(seq, tokens, [&](std::int32_t, std::int32_t, std::int32_t id) { freed.push_back(id); });
    return freed;
  }

  /// Id of logical page `i` of (`seq`, `layer`).
  std::int32_t page(std::int32_t seq, std::int32_t layer, std::int32_t i) const {
    const id_span s = pages(seq, layer);
    OOMB_EXPECTS(i >= 0 && static_cast<std::size_t>(i) < s.size(), "page_table: page ", i,
                 " of sequence ", seq, " layer ", layer, " out of range [0, ", s.size(), ")");
    return s[static_cast<std::size_t>(i)];
  }
  /// All ids of (`seq`, `layer`) in logical order; the span dangles after the next append or pop
  /// of `seq`.
  id_span pages(std::int32_t seq, std::int32_t layer) const {
    check_seq(seq, "pages");
    check_layer(layer, "pages");
    const auto& v = slot(seq, layer);
    return id_span(v.data(), v.size());
  }
  /// Calls `f(i, id)` for logical pages i in [first, last) of (`seq`, `layer`).
  template <class F>
  void for_each_page(std::int32_t seq, std::int32_t layer, std::int32_t first, std::int32_t last,
                     F&& f) const {
    const id_span s = pages(seq, layer);
    OOMB_EXPECTS(0 <= first && first <= last && static_cast<std::size_t>(last) <= s.size(),
                 "page_table: page range [", first, ", ", last, ") of sequence ", seq, " layer ",
                 layer, " not within [0, ", s.size(), "]");
    for (std::int32_t i = first; i < last; ++i) f(i, s[static_cast<std::size_t>(i)]);
  }

  /// Layer `layer` as CSR, written into `out` (its buffers are reused, no allocation once they are
  /// large enough).
  void export_csr(std::int32_t layer, page_table_csr& out) const {
    check_layer(layer, "export_csr");
    const auto seqs = static_cast<std::size_t>(num_seqs());
    out.page_size = page_size_;
    out.indptr.resize(seqs + 1);
    out.last_page_len.resize(seqs);
    out.indices.resize(static_cast<std::size_t>(pages_per_layer_));
    std::int32_t at = 0;
    out.indptr[0] = 0;
    for (std::size_t s = 0; s < seqs; ++s) {
      const auto& v = ids_[s * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(layer)];
      std::copy(v.begin(), v.end(), out.indices.begin() + at);
      at += static_cast<std::int32_t>(v.size());
      out.indptr[s + 1] = at;
      out.last_page_len[s] = last_len_of(len_[s]);
    }
  }
  page_table_csr export_csr(std::int32_t layer) const {
    page_table_csr out;
    export_csr(layer, out);
    return out;
  }

  /// Whether mutations are logged. Turning logging off clears the log.
  bool recording_changes() const noexcept { return recording_; }
  void record_changes(bool on) noexcept {
    recording_ = on;
    if (!on) changes_.clear();
  }
  /// Changes since the last clear_changes() / take_changes() (the export mark). A consumer that
  /// keeps a device copy exports once, clears, and from then on applies the log and clears again.
  const page_table_changes& changes() const noexcept { return changes_; }
  void clear_changes() noexcept { changes_.clear(); }
  /// Returns the log and starts a new, empty one.
  page_table_changes take_changes() noexcept {
    page_table_changes out = std::move(changes_);
    changes_.clear();
    return out;
  }

 private:
  // Reserves room for `extra` more elements, growing geometrically: reserve(size + extra) alone
  // would reallocate on every append and make a sequence's growth quadratic.
  template <class T>
  static void make_room(std::vector<T>& v, std::size_t extra) {
    if (v.capacity() - v.size() >= extra) return;
    v.reserve(std::max(v.size() + extra, 2 * v.capacity()));
  }
  std::int32_t pages_of(std::int64_t tokens) const noexcept {
    return static_cast<std::int32_t>((tokens + page_size_ - 1) / page_size_);
  }
  std::int32_t last_len_of(std::int64_t tokens) const noexcept {
    return tokens == 0 ? 0 : static_cast<std::int32_t>(tokens - std::int64_t(pages_of(tokens) - 1) * page_size_);
  }
  std::vector<std::int32_t>& slot(std::int32_t seq, std::int32_t layer) noexcept {
    return ids_[static_cast<std::size_t>(seq) * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(layer)];
  }
  const std::vector<std::int32_t>& slot(std::int32_t seq, std::int32_t layer) const noexcept {
    return ids_[static_cast<std::size_t>(seq) * static_cast<std::size_t>(layers_) + static_cast<std::size_t>(layer)];
  }
  void check_seq(std::int32_t seq, const char* where) const {
    OOMB_EXPECTS(seq >= 0 && seq < num_seqs(), "page_table::", where, ": sequence ", seq,
                 " out of range [0, ", num_seqs(), ")");
  }
  void check_layer(std::int32_t layer, const char* where) const {
    OOMB_EXPECTS(layer >= 0 && layer < layers_, "page_table::", where, ": layer ", layer,
                 " out of range [0, ", layers_, ")");
  }
  void check_growth(std::int32_t seq, std::int64_t len, std::int64_t tokens) const {
    OOMB_EXPECTS(tokens >= 0, "page_table: cannot append a negative token count (", tokens,
                 ") to sequence ", seq);
    // A sequence holds at most INT32_MAX pages, so its page count fits an int32.
    const std::int64_t max_len = std::int64_t(std::numeric_limits<std::int32_t>::max()) * page_size_;
    OOMB_EXPECTS(tokens <= max_len - len, "page_table: append of ", tokens, " tokens to sequence ",
                 seq, " (holding ", len, ") exceeds the most a sequence can hold (", max_len, ")");
  }
  void check_pop(std::int32_t seq, std::int64_t tokens, const char* where) const {
    check_seq(seq, where);
    const std::int64_t len = len_[static_cast<std::size_t>(seq)];
    OOMB_EXPECTS(tokens >= 0 && tokens <= len, "page_table::", where, ": cannot pop ", tokens,
                 " tokens from sequence ", seq, " which holds ", len);
  }

  std::int32_t layers_;
  std::int32_t page_size_;
  bool recording_;
  std::int64_t pages_per_layer_ = 0;
  std::vector<std::int64_t> len_;                 // per sequence, tokens
  std::vector<std::vector<std::int32_t>> ids_;    // [seq * layers + layer] -> ids in logical order
  page_table_changes changes_;
};

OOMB_NAMESPACE_END
