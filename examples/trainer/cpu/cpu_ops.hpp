// oomb trainer — the CPU backend: the trainer's ops on the host thread, pages in host pools.
// SPDX-License-Identifier: Apache-2.0
//
// The reference every other backend is checked against: it wraps the CPU ops of trainer/cpu/
// (fixed summation order, so the same values give the same bits wherever they live) and adds
// nothing of its own but the loops that move rows between activations and pages. T is the
// arithmetic (float or double), E the K/V page element, G the gradient page element.
//
// Ops run on the calling thread. host_streams stand for the streams of a device: the residency
// scheduler orders the copy streams against `compute()`, and every op that touches pages first
// waits (on the host) for an event of the compute stream, so it sees the copies acquire() ordered
// before it — what stream order gives a GPU for free.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <oomb/attention/reference.hpp>
#include <oomb/core/error.hpp>
#include <oomb/core/tensor.hpp>
#include <oomb/memory/host_resource.hpp>
#include <oomb/offload/bf16_codec.hpp>
#include <oomb/offload/converting_host_backend.hpp>
#include <oomb/offload/host_backend.hpp>
#include <oomb/sparse/page_summaries.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/cpu/embedding.hpp"
#include "trainer/cpu/linear.hpp"
#include "trainer/cpu/lm_head.hpp"
#include "trainer/cpu/rmsnorm.hpp"
#include "trainer/cpu/rope.hpp"
#include "trainer/cpu/swiglu.hpp"
#include "trainer/model/params.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

/// Page-sparse selection on the host: oomb's page summaries (one per K/V page id) and tile scores.
template <class T>
class cpu_page_selector {
 public:
  /// Summaries of `capacity` page ids of `page` tokens, `hkv` heads of dim `d`; queries have `hq`
  /// heads. (The backend is the device's context; the host needs none.)
  template <class Backend>
  cpu_page_selector(Backend&, std::int32_t page, std::int32_t hq, std::int32_t hkv, std::int32_t d, std::int32_t capacity,
                    const oomb::tile_selection_config& config)
      : page_(page), hkv_(hkv), d_(d), qdim_(hq * d), summaries_(hkv, d, capacity), selector_(config, hq, hkv, d) {}

  /// Page ids[i] holds keys rows [i * page, min(n, (i + 1) * page)) of k [n][hkv * d].
  void summarize(oomb::id_span ids, std::int64_t n, const T* k) {
    const std::int64_t kvd = std::int64_t(hkv_) * d_;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int64_t start = std::int64_t(i) * page_;
      const std::int64_t cnt = std::min<std::int64_t>(page_, n - start);
      const oomb::tensor_view<const T, 3> keys(k + start * kvd, {cnt, hkv_, d_}, {kvd, d_, 1});
      summaries_.update(ids[i], 0, keys);
    }
  }
  /// The past pages (the first `past` of the layer's `ids`, from tile_first[t] on for tile t, or
  /// from 0 when null) each query tile of q [n][hq * d] attends.
  void select(const T* q, std::int64_t n, oomb::id_span ids, std::int32_t past, const std::int32_t* tile_first,
              oomb::sparse_page_table& out) {
    out.clear();
    const oomb::tensor_view<const T, 3> queries(q, {n, qdim_ / d_, d_}, {qdim_, d_, 1});
    if (tile_first != nullptr)
      selector_.select(summaries_.view(), queries, ids.data(), past, tile_first, out);
    else
      selector_.select(summaries_.view(), queries, ids.data(), past, out);
  }
  /// Page `id` holds no keys any more.
  void forget(std::int32_t id) noexcept { summaries_.clear(id); }

 private:
  std::int32_t page_, hkv_, d_, qdim_;
  oomb::page_summaries summaries_;
  oomb::tile_selector selector_;
};

/// The CPU ops backend (see ops_backend.hpp for what each member guarantees).
template <class T, class E = T, class G = T>
class cpu_ops {
 public:
  using value_type = T;
  using stat_type = T;
  using kv_type = E;
  using grad_type = G;
  template <class X>
  using buffer = std::vector<X>;
  using params_type = model_params<T>;
  using grads_type = model_params<T>;
  using rope_type = cpu::rope_table<T>;
  using residency_backend = oomb::host_backend;
  /// The residency backend of a tier of X pages over bf16 homes (page_tier, --grad-homes bf16).
  template <class X>
  using bf16_home_residency = oomb::converting_host_backend<oomb::bf16_codec<X>>;
  using selector_type = cpu_page_selector<T>;

  /// Scratch for a chunk of shape s, in bytes, as reserve() allocates it and the memory plan counts
  /// it: the window's partial output [rows][qd] and lse [rows][hq] (attention), and the head's
  /// normed rows and their gradient [rows][H], rstd [rows], one row of logits and its gradient
  /// [vocab] (head).
  struct scratch {
    std::uint64_t attention = 0, head = 0;
  };
  static scratch scratch_for(const chunk_shape& s) noexcept {
    const std::uint64_t n = std::uint64_t(s.rows), t = sizeof(T);
    return {(n * std::uint64_t(s.dims.qdim()) + n * std::uint64_t(s.dims.hq)) * t,
            (2 * n * std::uint64_t(s.dims.H) + n + 2 * std::uint64_t(s.vocab)) * t};
  }

  cpu_ops() = default;
  cpu_ops(const cpu_ops&) = delete;
  cpu_ops& operator=(const cpu_ops&) = delete;

  // ---- residency ----
  oomb::host_resource& far_memory() noexcept { return far_; }
  oomb::host_resource& near_memory() noexcept { return near_; }
  oomb::host_stream& copy_in() noexcept { return copy_in_; }
  oomb::host_stream& copy_out() noexcept { return copy_out_; }
  oomb::host_stream_view compute() noexcept { return compute_; }

  // ---- dense ops ----
  void embedding_forward(std::int64_t n, std::int32_t H, std::int32_t vocab, const std::int32_t* tokens, const T* table,
                         T* x) {
    cpu::embedding_forward(n, H, vocab, tokens, table, x);
  }
  void embedding_backward(std::int64_t n, std::int32_t H, const std::int32_t* tokens, const T* dx, T* dtable) {
    cpu::embedding_backward(n, H, tokens, dx, dtable);
  }
  rope_type rope(const std::int64_t* positions, std::int64_t count, const rope_frequencies& f) const {
    return rope_type::at_positions(positions, count, f);
  }
  void rope_forward(std::int64_t n, std::int32_t heads, std::int32_t d, T* x, const rope_type& r) {
    cpu::rope_forward(n, heads, d, x, r);
  }
  void rope_backward(std::int64_t n, std::int32_t heads, std::int32_t d, T* dx, const rope_type& r) {
    cpu::rope_backward(n, heads, d, dx, r);
  }
  void rmsnorm_forward(std::int64_t n, std::int32_t H, const T* x, const T* w, T eps, T* y, T* rstd) {
    cpu::rmsnorm_forward(n, H, x, w, eps, y, rstd);
  }
  void rmsnorm_backward(std::int64_t n, std::int32_t H, const T* x, const T* w, const T* rstd, const T* dy, T* dx,
                        T* dw) {
    cpu::rmsnorm_backward(n, H, x, w, rstd, dy, dx, dw);
  }
  void linear_forward(std::int64_t n, std::int32_t in, std::int32_t out, const T* x, const T* W, const T* b, T* y) {
    cpu::linear_forward(n, in, out, x, W, b, y);
  }
  void linear_backward(std::int64_t n, std::int32_t in, std::int32_t out, const T* x, const T* W, const T* dy, T* dx,
                       T* dW, T* db) {
    cpu::linear_backward(n, in, out, x, W, dy, dx, dW, db);
  }
  void swiglu_forward(std::int64_t n, const T* g, const T* u, T* h) { cpu::swiglu_forward(n, g, u, h); }
  void swiglu_backward(std::int64_t n, const T* g, const T* u, const T* dh, T* dg, T* du) {
    cpu::swiglu_backward(n, g, u, dh, dg, du);
  }
  void copy(std::int64_t n, const T* src, T* dst) { std::copy(src, src + n, dst); }
  /// copy() into or out of memory an acquire just handed out (ordered after its copies).
  template <class X>
  void copy_block(std::int64_t n, const X* src, X* dst) {
    wait_compute();
    std::copy(src, src + n, dst);
  }
  void add(std::int64_t n, const T* src, T* dst) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void fill(std::int64_t n, T value, T* dst) { std::fill(dst, dst + n, value); }
  void head_loss_and_grad(const params_type& p, grads_type* grads, std::int64_t n, const T* x,
                          const std::int32_t* targets, T scale, T* dx) {
    loss_ += static_cast<double>(head_forward_backward(p, grads, n, x, targets, scale, dx, head_));
  }
  double take_loss() noexcept { return std::exchange(loss_, 0.0); }
  /// Forward only: each row's loss into the host array `out` (0 where targets[t] < 0); the step's
  /// loss is unchanged.
  void head_row_losses(const params_type& p, std::int64_t n, const T* x, const std::int32_t* targets, double* out) {
    rows_.resize(static_cast<std::size_t>(n));
    (void)head_forward_backward(p, static_cast<grads_type*>(nullptr), n, x, targets, T(1), static_cast<T*>(nullptr), head_,
                                rows_.data());
    for (std::int64_t t = 0; t < n; ++t) out[t] = static_cast<double>(rows_[static_cast<std::size_t>(t)]);
  }

  // ---- page ops ----
  void write_pages(const oomb::page_pool_view<E>& pool, oomb::id_span where, std::int64_t n, const T* k, const T* v) {
    wait_compute();
    const std::int32_t P = pool.page_size, hkv = pool.kv_heads, d = pool.head_dim;
    check_rows(where, n, P, "write_pages");
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int32_t id = where[static_cast<std::size_t>(t / P)];
      const auto tok = static_cast<std::int32_t>(t % P);
      for (std::int32_t g = 0; g < hkv; ++g) {
        E* kd = pool.k(id, tok, g);
        E* vd = pool.v(id, tok, g);
        const T* ks = k + (t * hkv + g) * d;
        const T* vs = v + (t * hkv + g) * d;
        for (std::int32_t i = 0; i < d; ++i) {
          kd[i] = cpu::store<E>(ks[i]);
          vd[i] = cpu::store<E>(vs[i]);
        }
      }
    }
  }
  void add_from_pages(const oomb::page_pool_view<const G>& pool, oomb::id_span where, std::int64_t n, T* dk, T* dv) {
    wait_compute();
    const std::int32_t P = pool.page_size, hkv = pool.kv_heads, d = pool.head_dim;
    check_rows(where, n, P, "add_from_pages");
    for (std::size_t i = 0; i < where.size(); ++i) {
      if (where[i] < 0) continue;
      const std::int64_t start = std::int64_t(i) * P;
      const std::int64_t cnt = std::min<std::int64_t>(P, n - start);
      for (std::int64_t t = 0; t < cnt; ++t)
        for (std::int32_t g = 0; g < hkv; ++g) {
          const std::int64_t row = ((start + t) * hkv + g) * d;
          const G* mk = pool.k(where[i], static_cast<std::int32_t>(t), g);
          const G* mv = pool.v(where[i], static_cast<std::int32_t>(t), g);
          for (std::int32_t x = 0; x < d; ++x) {
            dk[row + x] += cpu::load<T>(mk[x]);
            dv[row + x] += cpu::load<T>(mv[x]);
          }
        }
    }
  }
  void zero_page(const oomb::page_pool_view<G>& pool, std::int32_t id) {
    wait_compute();
    std::memset(pool.k(id, 0, 0), 0, static_cast<std::size_t>(pool.pair_stride) * sizeof(G));
  }

  // ---- scratch up front (ops_backend.hpp's reserve) ----
  /// Allocates scratch_for(s): no op of a chunk of that shape grows a buffer afterwards.
  void reserve(const chunk_shape& s) {
    const auto n = static_cast<std::size_t>(s.rows);
    o_w_.reserve(n * static_cast<std::size_t>(s.dims.qdim()));
    lse_w_.reserve(n * static_cast<std::size_t>(s.dims.hq));
    const auto H = static_cast<std::size_t>(s.dims.H), V = static_cast<std::size_t>(s.vocab);
    head_.xf.reserve(n * H);
    head_.dxf.reserve(n * H);
    head_.rstd.reserve(n);
    head_.logits.reserve(V);
    head_.dlogits.reserve(V);
  }
  /// The scratch held now, in bytes as scratch_for counts it (capacities: what is allocated).
  scratch scratch_held() const noexcept {
    const std::uint64_t t = sizeof(T);
    return {(o_w_.capacity() + lse_w_.capacity()) * t,
            (head_.xf.capacity() + head_.dxf.capacity() + head_.rstd.capacity() + head_.logits.capacity() +
             head_.dlogits.capacity()) * t};
  }

  // ---- attention over one window ----
  void attention_forward(const attention_chunk<T>& c, const oomb::page_pool_view<const E>& kv, const window_table& w,
                         T* o_acc, T* lse_acc) {
    wait_compute();
    const auto a = args(c, kv, w);
    o_w_.resize(static_cast<std::size_t>(std::int64_t(c.sq) * c.hq * c.d));
    lse_w_.resize(static_cast<std::size_t>(std::int64_t(c.sq) * c.hq));
    oomb::attention::reference::attention_forward(a, o_w_.data(), lse_w_.data());
    oomb::attention::reference::merge_partial(a.sq, c.hq, c.d, o_acc, lse_acc, o_w_.data(), lse_w_.data());
  }
  void attention_backward_begin(const attention_chunk<T>&, const T*, const T*) {}
  void attention_backward(const attention_chunk<T>& c, const oomb::page_pool_view<const E>& kv, const window_table& w,
                          const oomb::page_pool_view<G>& grads, const T* o, const T* lse, const T* d_o, T* dq, T* dk,
                          T* dv) {
    wait_compute();
    OOMB_EXPECTS(w.grad_ids != nullptr || w.pages == 0, "cpu_ops::attention_backward: the window has no grad_ids");
    oomb::window_grad_view<G> dpast;
    dpast.pool = grads;
    dpast.grad_page = w.grad_ids;
    dpast.pages = w.pages;
    oomb::attention::reference::attention_backward(args(c, kv, w), o, lse, d_o, dq, dk, dv, dpast);
  }

 private:
  void wait_compute() { compute_.record().wait(); }

  static void check_rows(oomb::id_span where, std::int64_t n, std::int32_t P, const char* what) {
    OOMB_EXPECTS(n >= 0 && (n + P - 1) / P <= static_cast<std::int64_t>(where.size()), "cpu_ops::", what, ": ", n,
                 " rows need ", (n + P - 1) / P, " pages, given ", where.size());
  }

  oomb::attention::reference::attention_args<T, E> args(const attention_chunk<T>& c, const oomb::page_pool_view<const E>& kv,
                                 const window_table& w) {
    OOMB_EXPECTS(w.pages >= 0 && (w.ids != nullptr || w.pages == 0), "cpu_ops: a window of ", w.pages,
                 " pages needs ids");
    indptr_[1] = w.pages;
    last_ = w.last_page_len;
    oomb::attention::reference::attention_args<T, E> a;
    a.q = c.q;
    a.q_start = c.q_start;
    a.sq = c.sq;
    a.hq = c.hq;
    a.hkv = c.hkv;
    a.d = c.d;
    a.scale = T(1) / std::sqrt(T(c.d));
    a.kv.pool = kv;
    a.kv.table.indptr = indptr_;
    a.kv.table.indices = w.ids;
    a.kv.table.last_page_len = &last_;
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = kv.page_size;
    a.first_page = w.first_page;
    a.key_lower = c.key_lower;
    if (c.selection != nullptr) {
      a.tile_indptr = c.selection->indptr().data();
      a.tile_pages = c.selection->indices().data();
      a.tile = c.tile;
    }
    return a;
  }

  oomb::host_stream copy_in_, copy_out_, compute_;
  oomb::host_resource far_, near_;
  head_scratch<T> head_;
  std::vector<T> rows_;  // head_row_losses
  double loss_ = 0;  // added by head_loss_and_grad since the last take_loss
  std::vector<T> o_w_, lse_w_;
  std::int32_t indptr_[2] = {0, 0};
  std::int32_t last_ = 0;
};

static_assert(is_ops_backend_v<cpu_ops<float>>);
static_assert(is_ops_backend_v<cpu_ops<double, oomb::bf16, float>>);

}  // namespace oomb_trainer
