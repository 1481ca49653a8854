// oomb trainer — chunk-recurrent training with recomputation on oomb's paged KV cache, gradient
// mirror, residency scheduler and sparse page selection (DESIGN, "The algorithm").
// SPDX-License-Identifier: Apache-2.0
//
// stage 1, chunks c = 0 .. n-1, no gradients: every layer computes q, k, v of the chunk, writes k
//   and v to the chunk's pages (far home, written once), (sparse: selects the past pages of each
//   query tile and keeps the selection), attends over the pages of chunks <= c, finishes the layer.
//   The last layer stops after writing K/V: nothing reads its output in stage 1.
// stage 2, chunks c = n-1 .. 0: recomputes chunk c with activations kept, reading K/V from the
//   cache; the head's loss is the chunk's token losses / (counted targets of the sequence); the
//   backward of each layer's attention adds dK/dV of every attended past page into its gradient
//   page, and the chunk's own dK/dV = local + its gradient pages (what chunks > c added); then
//   RoPE and the projections' backward. Parameter gradients accumulate over chunks; the chunk's
//   K/V pages and gradient pages are released.
//
// Attention runs over *windows*: the pages [0, end of chunk c) a layer needs, cut into runs of at
// most `window_pages` needed pages, forward results merged by log-sum-exp. The window plan depends
// only on the options and the selection, never on where pages live, so with offload (windows
// streamed through near-tier slots by the residency scheduler) the arithmetic is exactly that of
// the run without offload (windows read in place from the far pool): the same bits, only moved.
// Sparse attention with budget + sink + local covering every page needs every page, makes the
// same windows as dense and runs the same arithmetic: bit for bit equal to dense.
//
// CPU compute runs on the host thread; a host_stream stands for the compute stream the scheduler
// orders: after acquire() the host waits for an event of that stream (the copies have landed)
// before touching the slots, while later windows' copies proceed on the copy streams.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <oomb/memory/host_resource.hpp>
#include <oomb/offload/host_backend.hpp>
#include <oomb/paging/grad_mirror.hpp>
#include <oomb/paging/paged_kv_cache.hpp>
#include <oomb/sparse/page_summaries.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/cpu/attention.hpp"
#include "trainer/cpu/embedding.hpp"
#include "trainer/model/block.hpp"
#include "trainer/model/head.hpp"
#include "trainer/model/params.hpp"
#include "trainer/train/targets.hpp"

namespace oomb_trainer {

/// How the chunk-recurrent path runs.
struct chunk_options {
  std::int32_t chunk = 256;        ///< tokens per chunk: a multiple of `page`
  std::int32_t page = 16;          ///< tokens per page: a power of two >= 16
  oomb::kv_layout layout = oomb::kv_layout::head_major;
  /// Needed pages per attention window; 0 = one window per layer (no offload), or near_pages / 2
  /// with offload (one window computing while the next one streams in).
  std::int32_t window_pages = 0;
  bool offload = false;            ///< stream pages through near-tier slots (else read them in place)
  std::int32_t near_pages = 0;     ///< near-tier slots for K/V pages, and as many for gradient pages
  bool sparse = false;             ///< page-sparse attention over the past (oomb's selection)
  std::int32_t budget = 0, sink = 1, local = 1;
  std::int32_t tile = 128;         ///< queries per selection tile
  oomb::score_kind score = oomb::score_kind::quest;

  void validate() const {
    oomb::page_shape{page, 1, 2, layout}.validate();
    OOMB_EXPECTS(chunk > 0 && chunk % page == 0, "chunk size ", chunk, " must be a positive multiple of the page size ", page);
    OOMB_EXPECTS(window_pages >= 0, "window_pages must not be negative, got ", window_pages);
    if (offload) {
      OOMB_EXPECTS(near_pages >= chunk / page, "--near-pages ", near_pages, " is too small: the near tier must hold a chunk's ",
                   chunk / page, " pages of one layer (chunk ", chunk, " / page ", page, ")");
      OOMB_EXPECTS(window_pages == 0 || 2 * window_pages <= near_pages, "window of ", window_pages,
                   " pages needs ", 2 * window_pages, " near slots (one window computing, the next streaming), the near tier has ",
                   near_pages);
      OOMB_EXPECTS(near_pages >= 2, "the near tier needs at least 2 slots, got ", near_pages);
    }
    if (sparse) {
      OOMB_EXPECTS(budget >= 0 && sink >= 0 && local >= 0, "sparse budget/sink/local must not be negative (", budget, "/", sink,
                   "/", local, ")");
      OOMB_EXPECTS(tile > 0, "selection tile must be positive, got ", tile);
    }
  }
  std::int32_t effective_window() const noexcept {
    return window_pages > 0 ? window_pages : offload ? near_pages / 2 : std::numeric_limits<std::int32_t>::max();
  }
};

/// Where a step is, for progress reports within long steps.
struct chunk_progress {
  int stage = 1;              ///< 1 or 2
  std::int32_t chunk = 0;     ///< the chunk just finished
  std::int32_t chunks = 0;
};

/// What one step did.
struct chunk_step_stats {
  double loss = 0;
  std::int64_t tokens = 0;
  double stage1_seconds = 0, stage2_seconds = 0;
  std::uint64_t bytes_to_near = 0, bytes_to_far = 0;  ///< K/V and gradient pages, both directions
  std::int32_t kv_pages_high_water = 0;    ///< far tier: K/V page pairs in use at most
  std::int32_t grad_pages_high_water = 0;  ///< far tier: gradient page pairs in use at most
  std::int64_t sparse_pages_selected = 0;  ///< sum over tiles of selected past pages
  std::int64_t sparse_pages_candidate = 0; ///< sum over tiles of past pages
};

/// Bytes each tier holds.
struct tier_memory {
  std::size_t kv_pair_bytes = 0, grad_pair_bytes = 0;
  std::size_t far_kv_reserved = 0, far_grad_reserved = 0;  ///< host memory taken by the far pools
  std::int32_t far_kv_in_use = 0, far_grad_in_use = 0;     ///< page pairs now
  std::int32_t near_kv_slots = 0, near_grad_slots = 0;
  std::size_t near_bytes = 0;                              ///< both near pools (fixed)
  std::size_t activation_bytes = 0;                        ///< one chunk's activations, all layers
};

/// The chunk-recurrent trainer of one model shape. T: arithmetic; E: K/V page element; G:
/// gradient page element.
template <class T, class E = T, class G = T>
class chunk_recurrent {
  using resource = oomb::host_resource;
  using scheduler = oomb::host_residency_scheduler;

 public:
  chunk_recurrent(const model_config& cfg, const chunk_options& opt, std::int64_t max_tokens)
      : cfg_(cfg), D_(cfg), opt_((opt.validate(), opt)), max_tokens_(max_tokens) {
    OOMB_EXPECTS(max_tokens >= 2, "chunk_recurrent: max_tokens must be >= 2, got ", max_tokens);
    const std::int32_t L = cfg.num_hidden_layers;
    const std::int64_t pages_per_layer = (max_tokens + opt.page - 1) / opt.page;
    OOMB_EXPECTS(pages_per_layer * L < std::numeric_limits<std::int32_t>::max(), "chunk_recurrent: ", pages_per_layer * L,
                 " pages do not fit int32 ids");
    const auto capacity = static_cast<std::int32_t>(pages_per_layer * L);
    shape_ = oomb::page_shape{opt.page, D_.hkv, D_.d, opt.layout};
    oomb::page_pool_config pool;
    pool.max_pages = capacity;
    // In place, attention indexes the far pool (one range); streamed, only copies read it, so it
    // grows by slabs as the context does.
    pool.mode = opt.offload ? oomb::pool_mode::growing : oomb::pool_mode::contiguous;
    pool.pages_per_slab = std::max<std::int32_t>(1, std::min<std::int32_t>(capacity, 4 * (opt.chunk / opt.page) * L));
    oomb::paged_kv_config kc;
    kc.layers = L;
    kc.shape = shape_;
    kc.chunk_size = opt.chunk;
    kc.pool = pool;
    kc.record_changes = false;
    cache_ = std::make_unique<oomb::paged_kv_cache<E, resource>>(res_, kc);
    seq_ = cache_->add_sequence();
    oomb::grad_mirror_config gc;
    gc.shape = shape_;
    gc.kv_ids = capacity;
    gc.pool = pool;
    mirror_ = std::make_unique<oomb::grad_mirror<G, resource>>(res_, gc);
    if (opt.offload) {
      copy_in_ = std::make_unique<oomb::host_stream>();
      copy_out_ = std::make_unique<oomb::host_stream>();
      compute_ = std::make_unique<oomb::host_stream>();
      // The schedulers stream the cache's and the mirror's pools (which own the ids); the two
      // share the copy streams.
      kv_sched_ = std::make_unique<scheduler>(cache_->pool(), res_, opt.near_pages, *copy_in_, *copy_out_);
      grad_sched_ = std::make_unique<scheduler>(mirror_->pool(), res_, opt.near_pages, *copy_in_, *copy_out_);
      grad_map_.assign(static_cast<std::size_t>(opt.near_pages), -1);
    }
    if (opt.sparse) {
      summaries_ = std::make_unique<oomb::page_summaries>(D_.hkv, D_.d, capacity);
      oomb::tile_selection_config sc;
      sc.tile_queries = opt.tile;
      sc.kind = opt.score;
      sc.pages.budget = opt.budget;
      sc.pages.sink = opt.sink;
      sc.pages.local = opt.local;
      selector_ = std::make_unique<oomb::tile_selector>(sc, D_.hq, D_.hkv, D_.d);
    }
    acts_.resize(static_cast<std::size_t>(L));
    for (auto& a : acts_) a.resize(opt.chunk, D_);
  }

  const chunk_options& options() const noexcept { return opt_; }
  const chunk_step_stats& last_stats() const noexcept { return stats_; }

  /// Runs stages 1 and 2 over `seq`, returns its loss (mean over counted targets) and ADDS its
  /// gradient into `grads`. `progress` (may be empty) is called after every chunk of each stage.
  /// If it throws (bad tokens, out of memory), the cache may still hold pages of the sequence:
  /// discard the trainer object.
  double loss_and_grad(const qwen2_params<T>& p, qwen2_params<T>& grads, const sequence& seq,
                       const std::function<void(const chunk_progress&)>& progress = {}) {
    seq.validate();
    const std::int64_t N = seq.size();
    OOMB_EXPECTS(N <= max_tokens_, "chunk_recurrent: sequence of ", N, " tokens, built for at most ", max_tokens_);
    const std::int64_t counted = seq.counted_targets();
    OOMB_EXPECTS(counted > 0, "chunk_recurrent: the loss mask leaves no target");
    const std::int32_t L = cfg_.num_hidden_layers;
    const auto chunks = static_cast<std::int32_t>((N + opt_.chunk - 1) / opt_.chunk);
    stats_ = {};
    stats_.tokens = N;
    const auto moved0 = moved();
    selections_.assign(opt_.sparse ? static_cast<std::size_t>(chunks) * L : 0, oomb::sparse_page_table{});
    std::vector<T> x(static_cast<std::size_t>(opt_.chunk) * D_.H), dx(x.size());
    std::vector<std::int32_t> targets(static_cast<std::size_t>(opt_.chunk));

    // ---- stage 1: fill the cache, no gradients ----
    auto t0 = std::chrono::steady_clock::now();
    for (std::int32_t c = 0; c < chunks; ++c) {
      const std::int64_t p0 = std::int64_t(c) * opt_.chunk;
      const std::int64_t n = std::min<std::int64_t>(opt_.chunk, N - p0);
      cache_->append(seq_, n);
      const cpu::rope_table<T> rope(p0, n, D_.d, cfg_.rope_theta);
      cpu::embedding_forward(n, D_.H, cfg_.vocab_size, seq.tokens.data() + p0, p.embed(), x.data());
      auto& a = acts_[0];
      a.n = n;
      for (std::int32_t l = 0; l < L; ++l) {
        const bool last = l + 1 == L;
        block_forward(D_, p.layer(l), rope, x.data(), a, [&](block_acts<T>& b) {
          write_kv(l, c, p0, n, b);
          if (opt_.sparse) select(l, c, p0, n, b);
          if (!last) attend(l, c, p0, n, b);
        }, /*finish=*/!last);
      }
      stats_.kv_pages_high_water = std::max(stats_.kv_pages_high_water, cache_->pool().in_use());
      if (progress) progress({1, c, chunks});
    }
    auto t1 = std::chrono::steady_clock::now();
    stats_.stage1_seconds = std::chrono::duration<double>(t1 - t0).count();

    // ---- stage 2: reverse, recompute, backward ----
    const T scale = T(1) / T(counted);
    double loss_sum = 0;
    for (std::int32_t c = chunks; c-- > 0;) {
      const std::int64_t p0 = std::int64_t(c) * opt_.chunk;
      const std::int64_t n = std::min<std::int64_t>(opt_.chunk, N - p0);
      const cpu::rope_table<T> rope(p0, n, D_.d, cfg_.rope_theta);
      cpu::embedding_forward(n, D_.H, cfg_.vocab_size, seq.tokens.data() + p0, p.embed(), x.data());
      for (std::int32_t l = 0; l < L; ++l) {
        auto& a = acts_[static_cast<std::size_t>(l)];
        a.n = n;
        block_forward(D_, p.layer(l), rope, x.data(), a, [&](block_acts<T>& b) { attend(l, c, p0, n, b); });
      }
      seq.targets(p0, n, targets.data());
      loss_sum += static_cast<double>(head_forward_backward(p, &grads, n, x.data(), targets.data(), scale, dx.data(), head_));
      for (std::int32_t l = L; l-- > 0;) {
        block_backward(D_, p.layer(l), grads.layer(l), rope, acts_[static_cast<std::size_t>(l)], dx.data(), scratch_,
                       [&](block_acts<T>& b, const T* d_o, T* dq, T* dk, T* dv) {
                         attend_backward(l, c, p0, n, b, d_o, dq, dk, dv);
                       });
      }
      cpu::embedding_backward(n, D_.H, seq.tokens.data() + p0, dx.data(), grads.embed());
      stats_.grad_pages_high_water = std::max(stats_.grad_pages_high_water, mirror_->pool().in_use());
      release_chunk(c);
      if (progress) progress({2, c, chunks});
    }
    if (kv_sched_) {
      kv_sched_->drain();
      grad_sched_->drain();
    }
    stats_.stage2_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const auto moved1 = moved();
    stats_.bytes_to_near = moved1.first - moved0.first;
    stats_.bytes_to_far = moved1.second - moved0.second;
    stats_.loss = loss_sum / static_cast<double>(counted);
    return stats_.loss;
  }

  /// What each tier holds now (after a step: the far pools have returned every page, but keep the
  /// memory they reserved).
  tier_memory memory() const {
    tier_memory m;
    m.kv_pair_bytes = cache_->pair_bytes();
    m.grad_pair_bytes = mirror_->pair_bytes();
    m.far_kv_reserved = cache_->stats().reserved_bytes;
    m.far_grad_reserved = mirror_->stats().reserved_bytes;
    m.far_kv_in_use = cache_->pool().in_use();
    m.far_grad_in_use = mirror_->pool().in_use();
    if (kv_sched_) {
      m.near_kv_slots = kv_sched_->capacity();
      m.near_grad_slots = grad_sched_->capacity();
      m.near_bytes = kv_sched_->near_pool().stats().reserved_bytes + grad_sched_->near_pool().stats().reserved_bytes;
    }
    for (const auto& a : acts_) m.activation_bytes += a.bytes();
    return m;
  }

  /// Residency counters (offload only; zeros otherwise): K/V and gradient schedulers.
  oomb::residency_stats kv_residency() const { return kv_sched_ ? kv_sched_->stats() : oomb::residency_stats{}; }
  oomb::residency_stats grad_residency() const { return grad_sched_ ? grad_sched_->stats() : oomb::residency_stats{}; }

 private:
  /// A run of logical pages [first, first + count) attended together; `needed` lists the pages
  /// of the run that are read (all of them for dense), ascending.
  struct window {
    std::int32_t first = 0, count = 0;
    std::vector<std::int32_t> needed;
  };

  std::pair<std::uint64_t, std::uint64_t> moved() const {
    if (!kv_sched_) return {0, 0};
    const auto a = kv_sched_->stats(), b = grad_sched_->stats();
    return {a.bytes_to_near + b.bytes_to_near, a.bytes_to_far + b.bytes_to_far};
  }

  const oomb::sparse_page_table* selection(std::int32_t l, std::int32_t c) const {
    return opt_.sparse ? &selections_[static_cast<std::size_t>(c) * cfg_.num_hidden_layers + l] : nullptr;
  }

  // The windows of layer l for chunk c: logical pages [0, own_end), cut after every
  // effective_window() needed pages. Pages no tile selected are in a window's range but not needed.
  std::vector<window> plan_windows(std::int32_t l, std::int32_t c) const {
    const auto [own_first, own_end] = cache_->chunk_pages(seq_, c);
    std::vector<std::uint8_t> need(static_cast<std::size_t>(own_end), 1);
    if (const auto* sel = selection(l, c)) {
      std::fill(need.begin(), need.begin() + own_first, std::uint8_t(0));
      for (std::int32_t pg : sel->indices()) need[static_cast<std::size_t>(pg)] = 1;
    }
    const std::int32_t W = opt_.effective_window();
    std::vector<window> out(1);
    for (std::int32_t pg = 0; pg < own_end; ++pg) {
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

  std::vector<std::int32_t> far_ids(std::int32_t l, const std::vector<std::int32_t>& logical) const {
    std::vector<std::int32_t> ids(logical.size());
    for (std::size_t i = 0; i < logical.size(); ++i) ids[i] = cache_->page_id(seq_, l, logical[i]);
    return ids;
  }

  // The host may touch slots once the compute stream has passed the copies' events.
  void wait_compute() { compute_->record().wait(); }

  // Writes the chunk's K/V (RoPE applied) to its pages: in place in the far pool, or into
  // near slots written back home once.
  void write_kv(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, const block_acts<T>& b) {
    const auto [first, end] = cache_->chunk_pages(seq_, c);
    std::vector<std::int32_t> logical;
    for (std::int32_t pg = first; pg < end; ++pg) logical.push_back(pg);
    const auto ids = far_ids(l, logical);
    std::vector<std::int32_t> where = ids;
    oomb::page_pool_view<E> pool;
    if (kv_sched_) {
      kv_sched_->acquire(*compute_, ids, oomb::access::overwrite, where.data());
      wait_compute();
      pool = oomb::page_pool_view<E>::over(reinterpret_cast<E*>(kv_sched_->near_pool().base()), shape_);
    } else {
      pool = cache_->pool_view();
    }
    const std::int32_t P = opt_.page, kvd = D_.kvdim();
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t pos = p0 + t;
      const std::int32_t id = where[static_cast<std::size_t>(pos / P - first)];
      const auto tok = static_cast<std::int32_t>(pos % P);
      for (std::int32_t g = 0; g < D_.hkv; ++g) {
        E* kd = pool.k(id, tok, g);
        E* vd = pool.v(id, tok, g);
        const T* ks = b.k.data() + t * kvd + g * D_.d;
        const T* vs = b.v.data() + t * kvd + g * D_.d;
        for (std::int32_t i = 0; i < D_.d; ++i) {
          kd[i] = cpu::store<E>(ks[i]);
          vd[i] = cpu::store<E>(vs[i]);
        }
      }
    }
    if (kv_sched_) {
      kv_sched_->release(*compute_, ids);
      kv_sched_->write_back(ids);
    }
    if (summaries_) {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::int64_t start = std::int64_t(first + static_cast<std::int32_t>(i)) * P;
        const std::int64_t cnt = std::min<std::int64_t>(P, p0 + n - start);
        const oomb::tensor_view<const T, 3> keys(b.k.data() + (start - p0) * kvd, {cnt, D_.hkv, D_.d}, {kvd, D_.d, 1});
        summaries_->update(ids[i], 0, keys);
      }
    }
  }

  // Stage 1: the past pages each query tile of chunk c attends in layer l.
  void select(std::int32_t l, std::int32_t c, std::int64_t, std::int64_t n, const block_acts<T>& b) {
    auto& out = selections_[static_cast<std::size_t>(c) * cfg_.num_hidden_layers + l];
    out.clear();
    const std::int32_t past = cache_->chunk_pages(seq_, c).first;
    const oomb::tensor_view<const T, 3> q(b.q.data(), {n, D_.hq, D_.d}, {D_.qdim(), D_.d, 1});
    const auto ids = cache_->page_ids(seq_, l);
    selector_->select(summaries_->view(), q, ids.data(), past, out);
    stats_.sparse_pages_selected += out.num_entries();
    stats_.sparse_pages_candidate += std::int64_t(past) * out.num_tiles();
  }

  // Window tables: the table lists, for each logical page of the window, its id where it is read
  // (far id or near slot), or -1 for a page no tile needs (never read).
  struct table_storage {
    std::vector<std::int32_t> indptr{0, 0}, indices, last{0};
  };

  cpu::attention_args<T, E> window_args(const window& w, const std::vector<std::int32_t>& where, std::int32_t l,
                                        std::int32_t c, std::int64_t p0, std::int64_t n, const block_acts<T>& b,
                                        table_storage& ts) const {
    ts.indices.assign(static_cast<std::size_t>(w.count), -1);
    for (std::size_t i = 0; i < w.needed.size(); ++i) ts.indices[static_cast<std::size_t>(w.needed[i] - w.first)] = where[i];
    ts.indptr = {0, w.count};
    const std::int64_t end_pos = std::min<std::int64_t>(std::int64_t(w.first + w.count) * opt_.page, p0 + n);
    ts.last = {static_cast<std::int32_t>(end_pos - std::int64_t(w.first + w.count - 1) * opt_.page)};
    cpu::attention_args<T, E> a;
    a.q = b.q.data();
    a.q_start = p0;
    a.sq = static_cast<std::int32_t>(n);
    a.hq = D_.hq;
    a.hkv = D_.hkv;
    a.d = D_.d;
    a.scale = T(1) / std::sqrt(T(D_.d));
    if (kv_sched_)
      a.kv.pool = oomb::page_pool_view<const E>::over(reinterpret_cast<const E*>(kv_sched_->near_pool().base()), shape_);
    else
      a.kv.pool = oomb::page_pool_view<const E>::over(cache_->pool_view().base, shape_);
    a.kv.table.indptr = ts.indptr.data();
    a.kv.table.indices = ts.indices.data();
    a.kv.table.last_page_len = ts.last.data();
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = opt_.page;
    a.first_page = w.first;
    if (const auto* sel = selection(l, c)) {
      a.tile_indptr = sel->indptr().data();
      a.tile_pages = sel->indices().data();
      a.tile = opt_.tile;
    }
    return a;
  }

  // Forward attention of layer l over its windows, merged into b.o / b.lse.
  void attend(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, block_acts<T>& b) {
    const auto windows = plan_windows(l, c);
    std::fill(b.o.begin(), b.o.begin() + n * D_.qdim(), T(0));
    std::fill(b.lse.begin(), b.lse.begin() + n * D_.hq, -std::numeric_limits<T>::infinity());
    o_w_.resize(static_cast<std::size_t>(n * D_.qdim()));
    lse_w_.resize(static_cast<std::size_t>(n * D_.hq));
    table_storage ts;
    std::vector<std::int32_t> ids, next, where;
    if (kv_sched_ && !windows.empty()) kv_sched_->prefetch(far_ids(l, windows[0].needed));
    for (std::size_t wi = 0; wi < windows.size(); ++wi) {
      const window& w = windows[wi];
      ids = far_ids(l, w.needed);
      where = ids;
      if (kv_sched_) {
        kv_sched_->acquire(*compute_, ids, oomb::access::read, where.data());
        if (wi + 1 < windows.size()) kv_sched_->prefetch(far_ids(l, windows[wi + 1].needed));
        wait_compute();
      }
      const auto a = window_args(w, where, l, c, p0, n, b, ts);
      cpu::attention_forward(a, o_w_.data(), lse_w_.data());
      cpu::merge_partial(a.sq, D_.hq, D_.d, b.o.data(), b.lse.data(), o_w_.data(), lse_w_.data());
      if (kv_sched_) kv_sched_->release(*compute_, ids);
    }
  }

  // Gradient pages of the past pages among `logical` (their far KV ids `ids`): touched in the
  // mirror (zero-filled in place without offload; by the scheduler in a near slot with offload).
  std::vector<std::int32_t> past_grad_ids(std::int32_t own_first, const std::vector<std::int32_t>& logical,
                                          const std::vector<std::int32_t>& ids, std::vector<std::int32_t>* kv_index) {
    std::vector<std::int32_t> g;
    if (kv_index) kv_index->clear();
    for (std::size_t i = 0; i < logical.size(); ++i) {
      if (logical[i] >= own_first) continue;
      g.push_back(kv_sched_ ? mirror_->touch(ids[i]).grad_id : mirror_->touch_zeroed(ids[i]));
      if (kv_index) kv_index->push_back(static_cast<std::int32_t>(i));
    }
    return g;
  }

  // Backward attention of layer l: past pages' gradients into their gradient pages, the chunk's
  // own dK/dV = local + what later chunks added to its gradient pages.
  void attend_backward(std::int32_t l, std::int32_t c, std::int64_t p0, std::int64_t n, block_acts<T>& b, const T* d_o,
                       T* dq, T* dk, T* dv) {
    const auto windows = plan_windows(l, c);
    const std::int32_t own_first = cache_->chunk_pages(seq_, c).first;
    table_storage ts;
    std::vector<std::int32_t> ids, where, gids, gslots, kv_index;
    auto prefetch = [&](const window& w) {
      const auto nid = far_ids(l, w.needed);
      kv_sched_->prefetch(nid);
      grad_sched_->prefetch(past_grad_ids(own_first, w.needed, nid, nullptr));
    };
    if (kv_sched_ && !windows.empty()) prefetch(windows[0]);
    for (std::size_t wi = 0; wi < windows.size(); ++wi) {
      const window& w = windows[wi];
      ids = far_ids(l, w.needed);
      where = ids;
      gids = past_grad_ids(own_first, w.needed, ids, &kv_index);
      oomb::grad_mirror_view<G> gview;
      if (kv_sched_) {
        kv_sched_->acquire(*compute_, ids, oomb::access::read, where.data());
        gslots.resize(gids.size());
        grad_sched_->acquire(*compute_, gids, oomb::access::write, gslots.data());
        if (wi + 1 < windows.size()) prefetch(windows[wi + 1]);
        wait_compute();
        for (std::size_t j = 0; j < gids.size(); ++j)
          grad_map_[static_cast<std::size_t>(where[static_cast<std::size_t>(kv_index[j])])] = gslots[j];
        gview.pool = oomb::page_pool_view<G>::over(reinterpret_cast<G*>(grad_sched_->near_pool().base()), shape_);
        gview.grad_id = grad_map_.data();
        gview.num_kv_ids = static_cast<std::int32_t>(grad_map_.size());
      } else {
        gview = mirror_->view();
      }
      const auto a = window_args(w, where, l, c, p0, n, b, ts);
      cpu::attention_backward(a, b.o.data(), b.lse.data(), d_o, dq, dk, dv, gview);
      if (kv_sched_) {
        for (std::size_t j = 0; j < gids.size(); ++j) grad_map_[static_cast<std::size_t>(where[static_cast<std::size_t>(kv_index[j])])] = -1;
        kv_sched_->release(*compute_, ids);
        grad_sched_->release(*compute_, gids);
      }
    }
    // dK_c = local + mirror: what chunks > c added to the chunk's own gradient pages.
    const auto [first, end] = cache_->chunk_pages(seq_, c);
    std::vector<std::int32_t> own_kv, own_g, own_pages;
    for (std::int32_t pg = first; pg < end; ++pg) {
      const std::int32_t id = cache_->page_id(seq_, l, pg);
      if (!mirror_->touched(id)) continue;
      own_kv.push_back(id);
      own_g.push_back(mirror_->grad_id(id));
      own_pages.push_back(pg);
    }
    if (own_g.empty()) return;
    oomb::page_pool_view<const G> gpool;
    std::vector<std::int32_t> gwhere = own_g;
    if (grad_sched_) {
      grad_sched_->acquire(*compute_, own_g, oomb::access::read, gwhere.data());
      wait_compute();
      gpool = oomb::page_pool_view<const G>::over(reinterpret_cast<const G*>(grad_sched_->near_pool().base()), shape_);
    } else {
      gpool = oomb::page_pool_view<const G>::over(mirror_->pool_view().base, shape_);
    }
    const std::int32_t P = opt_.page, kvd = D_.kvdim();
    for (std::size_t i = 0; i < own_g.size(); ++i) {
      const std::int64_t start = std::int64_t(own_pages[i]) * P;
      const std::int64_t cnt = std::min<std::int64_t>(P, p0 + n - start);
      for (std::int64_t t = 0; t < cnt; ++t)
        for (std::int32_t g = 0; g < D_.hkv; ++g) {
          const std::int64_t row = (start - p0 + t) * kvd + g * D_.d;
          const G* mk = gpool.k(gwhere[i], static_cast<std::int32_t>(t), g);
          const G* mv = gpool.v(gwhere[i], static_cast<std::int32_t>(t), g);
          for (std::int32_t x = 0; x < D_.d; ++x) {
            dk[row + x] += cpu::load<T>(mk[x]);
            dv[row + x] += cpu::load<T>(mv[x]);
          }
        }
    }
    if (grad_sched_) grad_sched_->release(*compute_, own_g);
  }

  // Chunk c is done in stage 2: its K/V pages and their gradient pages are dead.
  void release_chunk(std::int32_t c) {
    const auto [first, end] = cache_->chunk_pages(seq_, c);
    std::vector<std::int32_t> kv, g;
    for (std::int32_t l = 0; l < cfg_.num_hidden_layers; ++l)
      for (std::int32_t pg = first; pg < end; ++pg) {
        const std::int32_t id = cache_->page_id(seq_, l, pg);
        kv.push_back(id);
        if (mirror_->touched(id)) g.push_back(mirror_->grad_id(id));
        if (summaries_) summaries_->clear(id);
      }
    if (kv_sched_) {
      kv_sched_->discard(kv);  // before the ids go back to their pools
      grad_sched_->discard(g);
    }
    for (std::int32_t id : kv) mirror_->release_if_touched(id);
    cache_->pop_chunk(seq_);
  }

  model_config cfg_;
  block_dims D_;
  chunk_options opt_;
  std::int64_t max_tokens_;
  oomb::page_shape shape_;
  resource res_;
  std::unique_ptr<oomb::paged_kv_cache<E, resource>> cache_;
  std::unique_ptr<oomb::grad_mirror<G, resource>> mirror_;
  std::int32_t seq_ = 0;
  std::unique_ptr<oomb::host_stream> copy_in_, copy_out_, compute_;
  std::unique_ptr<scheduler> kv_sched_, grad_sched_;
  std::vector<std::int32_t> grad_map_;  // near K/V slot -> near gradient slot, for one window
  std::unique_ptr<oomb::page_summaries> summaries_;
  std::unique_ptr<oomb::tile_selector> selector_;
  std::vector<oomb::sparse_page_table> selections_;  // [chunk][layer], made in stage 1
  std::vector<block_acts<T>> acts_;
  block_scratch<T> scratch_;
  head_scratch<T> head_;
  std::vector<T> o_w_, lse_w_;
  chunk_step_stats stats_;
};

}  // namespace oomb_trainer
