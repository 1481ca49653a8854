// oomb trainer — every layer's attention over the paged KV cache, the gradient mirror and (sparse)
// the page selection, in windows, for an ops backend B.
// SPDX-License-Identifier: Apache-2.0
//
// Attention runs over *windows*: the pages [0, end of chunk c) a layer needs, cut into runs of at
// most `window_pages` needed pages, forward results merged by log-sum-exp. The window plan depends
// only on the options and the selection, never on where pages live, so with offload (windows
// streamed through near-tier slots, page_tier) the arithmetic is exactly that of the run without
// offload (windows read in place from the far pool): the same bits, only moved. Sparse attention
// whose budget + sink + local cover every page needs every page, makes the same windows as dense
// and runs the same arithmetic: bit for bit equal to dense.
//
// Packed documents (begin_step's doc_starts): each query attends only its own document's keys,
// through the attention's per-query bounds (attention_chunk::key_lower). A chunk's windows start
// at the page holding its first query's document start (no query of the chunk sees a page below
// it, so none is listed, moved or read), and a tile selects among its document's past pages only.
//
// This file handles page ids only (host integers: which pages, in which order, where acquire put
// them); the backend reads and writes the pages, and turns each window_table into the tables its
// kernels read.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <oomb/paging/grad_mirror.hpp>
#include <oomb/paging/paged_kv_cache.hpp>
#include <oomb/sparse/sparse_page_table.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/algo/page_tier.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/io/config.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

namespace detail {
/// Adds the seconds between its construction and destruction to `into`.
class host_clock {
 public:
  explicit host_clock(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  host_clock(const host_clock&) = delete;
  host_clock& operator=(const host_clock&) = delete;
  ~host_clock() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

template <class Selector, class = void>
struct has_wait_seconds : std::false_type {};
template <class Selector>
struct has_wait_seconds<Selector, std::void_t<decltype(double(std::declval<const Selector&>().wait_seconds()))>>
    : std::true_type {};
}  // namespace detail

/// The K/V pages, gradient pages and selections of one sequence of at most `max_tokens` tokens.
/// Eviction: the K/V scheduler's policy (oomb::lru_eviction or oomb::belady_eviction).
template <class B, class Eviction = oomb::lru_eviction>
class paged_attention {
  static_assert(is_attention_backend_v<B>, "paged_attention needs an attention backend");
  using T = typename B::value_type;
  using S = typename B::stat_type;
  using E = typename B::kv_type;
  using G = typename B::grad_type;
  using far_resource = typename B::residency_backend::far_resource;

 public:
  paged_attention(B& backend, const model_config& cfg, const chunk_options& opt, std::int64_t max_tokens)
      : be_(&backend), opt_(opt), layers_(cfg.num_hidden_layers), hq_(cfg.num_attention_heads),
        hkv_(cfg.num_key_value_heads), d_(cfg.head_dim) {
    const std::int64_t pages_per_layer = (max_tokens + opt.page - 1) / opt.page;
    OOMB_EXPECTS(pages_per_layer * layers_ < std::numeric_limits<std::int32_t>::max(), "chunk_recurrent: ",
                 pages_per_layer * layers_, " pages do not fit int32 ids");
    const auto capacity = static_cast<std::int32_t>(pages_per_layer * layers_);
    shape_ = oomb::page_shape{opt.page, hkv_, d_, opt.layout};
    oomb::page_pool_config pool;
    pool.max_pages = capacity;
    // In place, attention indexes the far pool (one range); streamed, only copies read it, so it
    // grows by slabs as the context does.
    pool.mode = opt.offload ? oomb::pool_mode::growing : oomb::pool_mode::contiguous;
    pool.pages_per_slab = std::max<std::int32_t>(1, std::min<std::int32_t>(capacity, 4 * (opt.chunk / opt.page) * layers_));
    oomb::paged_kv_config kc;
    kc.layers = layers_;
    kc.shape = shape_;
    kc.chunk_size = opt.chunk;
    kc.pool = pool;
    kc.record_changes = false;
    cache_ = std::make_unique<oomb::paged_kv_cache<E, far_resource>>(backend.far_memory(), kc);
    seq_ = cache_->add_sequence();
    oomb::grad_mirror_config gc;
    gc.shape = shape_;
    gc.kv_ids = capacity;
    gc.pool = pool;
    if (bf16_homes(opt.grad_homes)) gc.home_element_bytes = sizeof(oomb::bf16);  // the slots stay G
    mirror_ = std::make_unique<oomb::grad_mirror<G, far_resource>>(backend.far_memory(), gc);
    // The two tiers share the backend's copy streams.
    const std::int32_t near = opt.offload ? opt.near_pages : 0;
    kv_ = std::make_unique<page_tier<B, E, Eviction>>(backend, cache_->pool(), shape_, near);
    grad_ = std::make_unique<page_tier<B, G>>(backend, mirror_->pool(), shape_, near, opt.grad_homes);
    if (opt.sparse) {
      oomb::tile_selection_config sc;
      sc.tile_queries = opt.tile;
      sc.kind = opt.score;
      sc.pages.budget = opt.budget;
      sc.pages.sink = opt.sink;
      sc.pages.local = opt.local;
      selector_ = std::make_unique<typename B::selector_type>(backend, opt.page, hq_, hkv_, d_, capacity, sc);
    }
  }

  /// A new step of `chunks` chunks over a sequence whose documents start at `doc_starts`
  /// (sequence::doc_starts; empty: one stream). The selections of the last step are dropped.
  void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) {
    doc_starts_ = doc_starts;
    selections_.assign(opt_.sparse ? static_cast<std::size_t>(chunks) * layers_ : 0, oomb::sparse_page_table{});
    host_ = {};
    ahead_ = {};
    wait0_ = selector_wait_seconds();
  }
  /// The host's time in this step's attention work so far (attention_host_seconds).
  attention_host_seconds host_seconds() const {
    attention_host_seconds h = host_;
    h.selection_wait = selector_wait_seconds() - wait0_;
    return h;
  }
  /// Chunk c of n tokens gets its pages in every layer.
  void append(std::int64_t n) { cache_->append(seq_, n); }

  /// Writes the chunk's K/V (RoPE applied, [n][hkv*d]) to its pages (written back home once),
  /// and (sparse) summarises them.
  void write(std::int32_t l, std::int32_t c, std::int64_t n, const T* k, const T* v) {
    const detail::host_clock total(host_.total);
    const auto [first, end] = cache_->chunk_pages(seq_, c);
    ids_ = far_ids(l, first, end);
    residency([&] { kv_->acquire(ids_, oomb::access::overwrite, where_); });
    kernels([&] { be_->write_pages(kv_->view(), where_, n, k, v); });
    residency([&] {
      kv_->release(ids_);
      kv_->write_back(ids_);
    });
    if (selector_) {
      const detail::host_clock t(host_.selection);
      selector_->summarize(ids_, n, k);
    }
  }

  /// Stage 1, sparse: the past pages each query tile of chunk c (q [n][hq*d]) attends in layer l.
  void select(std::int32_t l, std::int32_t c, std::int64_t n, const T* q) {
    const detail::host_clock total(host_.total);
    auto& out = selections_[static_cast<std::size_t>(c) * layers_ + l];
    const std::int32_t past = cache_->chunk_pages(seq_, c).first;
    // Packed documents: tile t selects from the page holding its first query's document start.
    const std::int64_t* lower = key_lower(std::int64_t(c) * opt_.chunk, n);
    tile_first_.clear();
    if (lower != nullptr)
      for (std::int64_t q0 = 0; q0 < n; q0 += opt_.tile) tile_first_.push_back(static_cast<std::int32_t>(lower[q0] / opt_.page));
    predict(l, c, past);
    {
      const detail::host_clock t(host_.selection);
      selector_->select(q, n, cache_->page_ids(seq_, l), past, lower != nullptr ? tile_first_.data() : nullptr, out);
    }
    if (!predicted_.empty())
      for (const std::int32_t pg : out.indices())
        if (predicted_[static_cast<std::size_t>(pg)] == 1) {
          predicted_[static_cast<std::size_t>(pg)] = 2;  // counted once
          ++pages_predicted_used_;
        }
    pages_selected_ += out.num_entries();
    for (std::int32_t t = 0; t < out.num_tiles(); ++t)
      pages_candidate_ += lower != nullptr ? std::max(0, past - tile_first_[static_cast<std::size_t>(t)]) : past;
  }

  /// Stage 2 of chunk c calls forward for layers 0 .. L-1 (the recomputation; only the last
  /// layer when stage 1 kept the outputs), then backward for layers L-1 .. 0. Their windows' K/V
  /// pages, in that order, are declared to the eviction policy; and streamed, each of these calls
  /// ends by prefetching the first window of the next one, so its copies run behind the rest of
  /// the current layer's work instead of in front of the next layer's attention.
  void expect_recompute(std::int32_t c) {
    ahead_ = {};
    if (!kv_->streamed()) return;
    const detail::host_clock total(host_.total);
    ahead_.chunk = c;
    for (std::int32_t l = opt_.keep_attention_outputs ? layers_ - 1 : 0; l < layers_; ++l) ahead_.calls.push_back({false, l});
    for (std::int32_t l = layers_; l-- > 0;) ahead_.calls.push_back({true, l});
    if (!kv_->wants_order()) return;
    order_.clear();
    for (const stage2_call& call : ahead_.calls)
      for (const window& w : plan_windows(call.layer, c))
        for (std::int32_t pg : w.needed) order_.push_back(cache_->page_id(seq_, call.layer, pg));
    residency([&] { kv_->expect(order_); });
  }

  /// Forward attention of layer l for chunk c over its windows: o [n][hq*d], lse [hq][n].
  void forward(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, const T* q, T* o, S* lse) {
    const detail::host_clock total(host_.total);
    const auto windows = plan_windows(l, c);
    const auto chunk = chunk_of(l, c, p0, n, q);
    kernels([&] {
      be_->fill(n * hq_ * d_, T(0), o);
      be_->fill(n * hq_, -std::numeric_limits<S>::infinity(), lse);
    });
    residency([&] { kv_->prefetch(far_ids(l, windows[0].needed)); });
    for (std::size_t wi = 0; wi < windows.size(); ++wi) {
      const window& w = windows[wi];
      ids_ = far_ids(l, w.needed);
      residency([&] {
        kv_->acquire(ids_, oomb::access::read, where_);
        if (wi + 1 < windows.size()) kv_->prefetch(far_ids(l, windows[wi + 1].needed));
      });
      const window_table t = table(w, p0, n);
      kernels([&] { be_->attention_forward(chunk, read_view(*kv_), t, o, lse); });
      residency([&] { kv_->release(ids_); });
    }
    prefetch_next_call({false, l}, c);
  }

  /// Backward attention of layer l for chunk c: dq, dk, dv (the chunk's own keys) as the
  /// backend's attention_backward adds them; past pages' gradients go into their gradient pages,
  /// and the chunk's own dK/dV gets what chunks > c added to its gradient pages.
  void backward(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, const T* q, const T* o, const S* lse,
                const T* d_o, T* dq, T* dk, T* dv) {
    const detail::host_clock total(host_.total);
    const auto windows = plan_windows(l, c);
    const auto chunk = chunk_of(l, c, p0, n, q);
    const auto own = cache_->chunk_pages(seq_, c);  // not a structured binding: the lambda below
    const std::int32_t own_first = own.first, own_end = own.second;  // captures it (C++20 only)
    kernels([&] { be_->attention_backward_begin(chunk, o, d_o); });
    auto prefetch = [&](const window& w) { prefetch_backward_window(l, own_first, w); };
    prefetch(windows[0]);
    for (std::size_t wi = 0; wi < windows.size(); ++wi) {
      const window& w = windows[wi];
      ids_ = far_ids(l, w.needed);
      gids_ = past_grad_ids(own_first, w.needed, ids_, &kv_index_);
      residency([&] {
        kv_->acquire(ids_, oomb::access::read, where_);
        grad_->acquire(gids_, oomb::access::write, gwhere_);
      });
      if (wi + 1 < windows.size()) prefetch(windows[wi + 1]);
      window_table t = table(w, p0, n);
      table_grads_.assign(static_cast<std::size_t>(w.count), -1);
      for (std::size_t j = 0; j < gids_.size(); ++j)
        table_grads_[static_cast<std::size_t>(w.needed[static_cast<std::size_t>(kv_index_[j])] - w.first)] = gwhere_[j];
      t.grad_ids = table_grads_.data();
      kernels([&] { be_->attention_backward(chunk, read_view(*kv_), t, grad_->view(), o, lse, d_o, dq, dk, dv); });
      residency([&] {
        kv_->release(ids_);
        grad_->release(gids_);
      });
    }
    // dK_c = local + mirror: what chunks > c added to the chunk's own gradient pages.
    gids_.clear();
    kv_index_.clear();
    for (std::int32_t pg = own_first; pg < own_end; ++pg) {
      const std::int32_t id = cache_->page_id(seq_, l, pg);
      if (!mirror_->touched(id)) continue;
      gids_.push_back(mirror_->grad_id(id));
      kv_index_.push_back(pg - own_first);
    }
    if (!gids_.empty()) {
      residency([&] { grad_->acquire(gids_, oomb::access::read, gwhere_); });
      own_where_.assign(static_cast<std::size_t>(own_end - own_first), -1);
      for (std::size_t i = 0; i < gids_.size(); ++i) own_where_[static_cast<std::size_t>(kv_index_[i])] = gwhere_[i];
      kernels([&] { be_->add_from_pages(read_view(*grad_), own_where_, n, dk, dv); });
      residency([&] { grad_->release(gids_); });
    }
    prefetch_next_call({true, l}, c);
  }

  /// Chunk c is done in stage 2: its K/V pages and their gradient pages are dead.
  void release_chunk(std::int32_t c) {
    const detail::host_clock total(host_.total);
    ahead_ = {};
    const auto [first, end] = cache_->chunk_pages(seq_, c);
    ids_.clear();
    gids_.clear();
    for (std::int32_t l = 0; l < layers_; ++l)
      for (std::int32_t pg = first; pg < end; ++pg) {
        const std::int32_t id = cache_->page_id(seq_, l, pg);
        ids_.push_back(id);
        if (mirror_->touched(id)) gids_.push_back(mirror_->grad_id(id));
        if (selector_) selector_->forget(id);
      }
    residency([&] {
      kv_->discard(ids_);  // before the ids go back to their pools
      grad_->discard(gids_);
    });
    for (std::int32_t id : ids_) mirror_->release_if_touched(id);
    cache_->pop_chunk(seq_);
  }

  /// The end of a step: every copy has landed.
  void drain() {
    const detail::host_clock total(host_.total);
    residency([&] {
      kv_->drain();
      grad_->drain();
    });
  }

  const page_tier<B, E, Eviction>& kv() const noexcept { return *kv_; }
  const page_tier<B, G>& grads() const noexcept { return *grad_; }
  const oomb::paged_kv_cache<E, far_resource>& cache() const noexcept { return *cache_; }
  const oomb::grad_mirror<G, far_resource>& mirror() const noexcept { return *mirror_; }
  /// Sparse: the selections of the last step, [chunk][layer] (empty when dense).
  const std::vector<oomb::sparse_page_table>& selections() const noexcept { return selections_; }
  /// Sums over tiles since construction: selected past pages, and past pages.
  std::int64_t pages_selected() const noexcept { return pages_selected_; }
  std::int64_t pages_candidate() const noexcept { return pages_candidate_; }
  /// Sums since construction (prefetch_last_selection): distinct pages stage 1 prefetched on the
  /// last chunk's selection before a selection was known (predict()), and of them the pages it
  /// then selected.
  std::int64_t pages_predicted() const noexcept { return pages_predicted_; }
  std::int64_t pages_predicted_used() const noexcept { return pages_predicted_used_; }

 private:
  /// A run of logical pages [first, first + count) attended together; `needed` lists the pages
  /// of the run that are read (all of them for dense), ascending.
  struct window {
    std::int32_t first = 0, count = 0;
    std::vector<std::int32_t> needed;
  };

  /// One attention call of stage 2, and what expect_recompute(chunk) said comes after it.
  struct stage2_call {
    bool backward = false;
    std::int32_t layer = 0;
  };
  struct look_ahead {
    std::int32_t chunk = -1;          // -1: not in stage 2's calls (stage 1, or in place)
    std::vector<stage2_call> calls;   // in order
    std::size_t next = 0;             // calls[next] is the call expected now
  };

  // The call `done` of chunk c finished enqueuing: if it is the one expected, the first window of
  // the next expected call starts streaming (K/V, and for a backward its gradient pages).
  void prefetch_next_call(stage2_call done, std::int32_t c) {
    if (ahead_.chunk != c || ahead_.next >= ahead_.calls.size()) return;
    const stage2_call& expected = ahead_.calls[ahead_.next];
    if (expected.backward != done.backward || expected.layer != done.layer) {
      ahead_ = {};  // called out of the declared order: stop guessing for this chunk
      return;
    }
    if (++ahead_.next == ahead_.calls.size()) return;
    const stage2_call& call = ahead_.calls[ahead_.next];
    const window first = plan_windows(call.layer, c).front();
    if (call.backward)
      prefetch_backward_window(call.layer, cache_->chunk_pages(seq_, c).first, first);
    else
      residency([&] { kv_->prefetch(far_ids(call.layer, first.needed)); });
  }

  // A backward window's K/V pages and the gradient pages of its past ones start streaming.
  void prefetch_backward_window(std::int32_t l, std::int32_t own_first, const window& w) {
    const auto nid = far_ids(l, w.needed);
    residency([&] { kv_->prefetch(nid); });
    const auto gid = past_grad_ids(own_first, w.needed, nid, nullptr);
    residency([&] { grad_->prefetch(gid); });
  }

  /// Stage 1, sparse, streamed, chunk_options::prefetch_last_selection: before chunk c's selection
  /// in layer l is known (select() waits for it), prefetches the distinct pages chunk c - 1
  /// selected in layer l, at most a window's, ascending as the first window takes them. Where
  /// adjacent chunks share pages, their copies overlap the selection instead of following it; a
  /// page not selected after all only took a copy and a slot the eviction policy reclaims.
  void predict(std::int32_t l, std::int32_t c, std::int32_t past) {
    predicted_.clear();
    if (!opt_.prefetch_last_selection || c == 0 || !kv_->streamed()) return;
    predicted_.assign(static_cast<std::size_t>(past), 0);
    for (const std::int32_t pg : selection(l, c - 1)->indices()) predicted_[static_cast<std::size_t>(pg)] = 1;
    logical_.clear();
    const auto W = static_cast<std::size_t>(opt_.effective_window());
    for (std::int32_t pg = 0; pg < past && logical_.size() < W; ++pg)
      if (predicted_[static_cast<std::size_t>(pg)] == 1) logical_.push_back(pg);
    for (std::int32_t pg = logical_.empty() ? 0 : logical_.back() + 1; pg < past; ++pg)
      predicted_[static_cast<std::size_t>(pg)] = 0;  // past the window: not prefetched
    pages_predicted_ += static_cast<std::int64_t>(logical_.size());
    residency([&] { kv_->prefetch(far_ids(l, logical_)); });
  }

  const oomb::sparse_page_table* selection(std::int32_t l, std::int32_t c) const {
    return opt_.sparse ? &selections_[static_cast<std::size_t>(c) * layers_ + l] : nullptr;
  }

  // Runs f, its host time added to the part it belongs to.
  template <class F>
  void residency(F&& f) {
    const detail::host_clock t(host_.residency);
    f();
  }
  template <class F>
  void kernels(F&& f) {
    const detail::host_clock t(host_.kernels);
    f();
  }
  double selector_wait_seconds() const {
    if constexpr (detail::has_wait_seconds<typename B::selector_type>::value)
      return selector_ ? selector_->wait_seconds() : 0.0;
    else
      return 0.0;
  }

  // Packed documents: the start of the document of each position [p0, p0 + n) (lower_, valid
  // until the next call); null without documents.
  const std::int64_t* key_lower(std::int64_t p0, std::int64_t n) {
    if (doc_starts_.empty()) return nullptr;
    lower_.resize(static_cast<std::size_t>(n));
    document_starts_of(doc_starts_, p0, n, lower_.data());
    return lower_.data();
  }
  // The first logical page a query of chunk c may see: the one holding its first query's document start.
  std::int32_t first_visible_page(std::int32_t c) const {
    std::int64_t start = 0;
    document_starts_of(doc_starts_, std::int64_t(c) * opt_.chunk, 1, &start);
    return static_cast<std::int32_t>(start / opt_.page);
  }

  attention_chunk<T> chunk_of(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, const T* q) {
    attention_chunk<T> a;
    a.q = q;
    a.q_start = p0;
    a.sq = static_cast<std::int32_t>(n);
    a.hq = hq_;
    a.hkv = hkv_;
    a.d = d_;
    a.selection = selection(l, c);
    a.tile = opt_.tile;
    a.key_lower = key_lower(p0, n);
    return a;
  }

  // The windows of layer l for chunk c: logical pages [first visible, own_end), cut after every
  // effective_window() needed pages. Pages no tile selected are in a window's range but not needed.
  std::vector<window> plan_windows(std::int32_t l, std::int32_t c) const {
    const auto [own_first, own_end] = cache_->chunk_pages(seq_, c);
    const std::int32_t begin = first_visible_page(c);  // <= own_first: a document starts at or before its query
    std::vector<std::uint8_t> need(static_cast<std::size_t>(own_end), 1);
    if (const auto* sel = selection(l, c)) {
      std::fill(need.begin(), need.begin() + own_first, std::uint8_t(0));
      for (std::int32_t pg : sel->indices()) need[static_cast<std::size_t>(pg)] = 1;
    }
    const std::int32_t W = opt_.effective_window();
    std::vector<window> out(1);
    out[0].first = begin;
    for (std::int32_t pg = begin; pg < own_end; ++pg) {
      if (need[static_cast<std::size_t>(pg)] && static_cast<std::int32_t>(out.back().needed.size()) == W) {
        window w;
        w.first = pg;
        out.push_back(std::move(w));
      }
      out.back().count = pg + 1 - out.back().first;
      if (need[static_cast<std::size_t>(pg)]) out.back().needed.push_back(pg);
    }
    return out;
  }

  // The window's table: for each logical page, where acquire put it (where_), -1 if not needed.
  window_table table(const window& w, std::int64_t p0, std::int64_t n) {
    table_ids_.assign(static_cast<std::size_t>(w.count), -1);
    for (std::size_t i = 0; i < w.needed.size(); ++i) table_ids_[static_cast<std::size_t>(w.needed[i] - w.first)] = where_[i];
    const std::int64_t end_pos = std::min<std::int64_t>(std::int64_t(w.first + w.count) * opt_.page, p0 + n);
    window_table t;
    t.first_page = w.first;
    t.pages = w.count;
    t.last_page_len = static_cast<std::int32_t>(end_pos - std::int64_t(w.first + w.count - 1) * opt_.page);
    t.ids = table_ids_.data();
    return t;
  }

  template <class Tier>
  auto read_view(const Tier& tier) const {
    using X = std::remove_pointer_t<decltype(tier.view().base)>;
    return oomb::page_pool_view<const X>::over(tier.view().base, shape_);
  }

  std::vector<std::int32_t> far_ids(std::int32_t l, const std::vector<std::int32_t>& logical) const {
    std::vector<std::int32_t> ids(logical.size());
    for (std::size_t i = 0; i < logical.size(); ++i) ids[i] = cache_->page_id(seq_, l, logical[i]);
    return ids;
  }
  std::vector<std::int32_t> far_ids(std::int32_t l, std::int32_t first, std::int32_t end) const {
    std::vector<std::int32_t> ids;
    for (std::int32_t pg = first; pg < end; ++pg) ids.push_back(cache_->page_id(seq_, l, pg));
    return ids;
  }

  // Gradient pages of the past pages among `logical` (their far K/V ids `ids`), touched in the
  // mirror (fresh ones read as zeros); kv_index[j] = the entry of logical the j-th one belongs to.
  std::vector<std::int32_t> past_grad_ids(std::int32_t own_first, const std::vector<std::int32_t>& logical,
                                          const std::vector<std::int32_t>& ids, std::vector<std::int32_t>* kv_index) {
    std::vector<std::int32_t> g;
    if (kv_index) kv_index->clear();
    for (std::size_t i = 0; i < logical.size(); ++i) {
      if (logical[i] >= own_first) continue;
      g.push_back(mirror_->touch(ids[i], [&](std::int32_t fresh) { grad_->zero_fresh(fresh); }).grad_id);
      if (kv_index) kv_index->push_back(static_cast<std::int32_t>(i));
    }
    return g;
  }

  B* be_;
  chunk_options opt_;
  std::int32_t layers_, hq_, hkv_, d_;
  oomb::page_shape shape_;
  std::unique_ptr<oomb::paged_kv_cache<E, far_resource>> cache_;
  std::unique_ptr<oomb::grad_mirror<G, far_resource>> mirror_;
  std::int32_t seq_ = 0;
  std::unique_ptr<page_tier<B, E, Eviction>> kv_;
  std::unique_ptr<page_tier<B, G>> grad_;
  std::unique_ptr<typename B::selector_type> selector_;
  std::vector<oomb::sparse_page_table> selections_;  // [chunk][layer], made in stage 1
  std::vector<std::int32_t> doc_starts_;             // the step's sequence's documents (empty: one stream)
  std::vector<std::int64_t> lower_;                  // key_lower's
  std::vector<std::int32_t> tile_first_;             // select's, per tile
  std::int64_t pages_selected_ = 0, pages_candidate_ = 0;
  std::int64_t pages_predicted_ = 0, pages_predicted_used_ = 0;
  std::vector<std::uint8_t> predicted_;  // predict()'s, per logical page: 1 prefetched, 2 then selected
  std::vector<std::int32_t> logical_;    // predict()'s logical pages
  attention_host_seconds host_{};  // this step's (begin_step resets it)
  double wait0_ = 0;               // the selector's wait seconds at begin_step
  look_ahead ahead_;               // stage 2's calls of the chunk at hand (streamed only)
  // Id lists of the window at hand (reused, never freed within a step).
  std::vector<std::int32_t> ids_, where_, gids_, gwhere_, kv_index_, table_ids_, table_grads_, own_where_, order_;
};

}  // namespace oomb_trainer
