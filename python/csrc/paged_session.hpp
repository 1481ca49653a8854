// The Python package's paged session: one sequence's pages as the C++ trainer keeps them, for both
// C-ABI libraries. liboomb_c runs it over the trainer's CPU backend (trainer/cpu/cpu_ops.hpp),
// liboomb_cuda over its CUDA attention backend (trainer/cuda/cuda_attention_ops.cuh): the same
// paged_attention (windows, prefetch, eviction order, selection, document bounds) either way, so the
// package has one algorithm for offload and page-sparse attention, and the CPU's tests drive it.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "c_abi_residency.hpp"
#include "oomb/core/error.hpp"
#include "oomb/offload/belady_eviction.hpp"
#include "oomb/sparse/sparse_page_table.hpp"
#include "oomb_c.h"
#include "trainer/algo/chunk_options.hpp"
#include "trainer/algo/paged_attention.hpp"
#include "trainer/io/config.hpp"

namespace oomb_c_abi {

namespace trainer = oomb_trainer;

#define OOMB_PAGED_EXPECTS(cond, ...) OOMB_EXPECTS(cond, "oomb paged session: ", __VA_ARGS__)

/// The model's attention shape and the options both configs (oomb_paged_config, oomb_cuda_paged_config)
/// share, checked; what only one of them has (home memory, determinism, kernels) the caller sets.
template <class Config>
std::pair<trainer::model_config, trainer::chunk_options> session_setup(const Config& c) {
  OOMB_PAGED_EXPECTS(c.layers > 0 && c.hq > 0 && c.hkv > 0 && c.hq % c.hkv == 0 && c.head_dim > 0, "bad heads: ",
                     c.layers, " layers, ", c.hq, " query heads, ", c.hkv, " KV heads of dim ", c.head_dim);
  OOMB_PAGED_EXPECTS(c.max_tokens > 0, "max_tokens must be positive, got ", c.max_tokens);
  OOMB_PAGED_EXPECTS(c.grad_homes >= 0 && c.grad_homes <= 2, "grad_homes ", c.grad_homes, " is not 0, 1 or 2");
  OOMB_PAGED_EXPECTS(c.scoring == 0 || c.scoring == 1, "scoring ", c.scoring, " is not 0 (Quest) or 1 (mean)");
  OOMB_PAGED_EXPECTS(c.near_pages >= 0 && c.window_pages >= 0, "near_pages ", c.near_pages, " and window_pages ",
                     c.window_pages, " must not be negative");
  trainer::model_config cfg;
  cfg.num_hidden_layers = c.layers;
  cfg.num_attention_heads = c.hq;
  cfg.num_key_value_heads = c.hkv;
  cfg.head_dim = c.head_dim;
  trainer::chunk_options o;
  o.chunk = c.chunk;
  o.page = c.page;
  o.offload = c.offload != 0;
  o.window_pages = c.window_pages;
  o.grad_homes = c.grad_homes == 1   ? trainer::page_home_format::bf16
                 : c.grad_homes == 2 ? trainer::page_home_format::bf16_stochastic
                                     : trainer::page_home_format::same;
  o.sparse = c.sparse != 0;
  o.budget = c.budget;
  o.sink = c.sink;
  o.local = c.local;
  o.tile = c.tile;
  o.score = c.scoring == 1 ? oomb::score_kind::mean : oomb::score_kind::quest;
  o.near_pages = o.offload ? (c.near_pages > 0 ? c.near_pages : trainer::default_near_pages(o)) : 0;
  return {cfg, o};
}

/// A selection as the C ABIs hand it out: sizes always, the arrays when their capacities hold them.
inline void copy_selection(const oomb::sparse_page_table& sel, std::int32_t* indptr, std::int64_t indptr_capacity,
                           std::int32_t* pages, std::int64_t pages_capacity, std::int64_t* tiles, std::int64_t* entries) {
  const auto ip = sel.indptr();
  const auto pg = sel.indices();
  *tiles = static_cast<std::int64_t>(ip.size()) - 1;
  *entries = static_cast<std::int64_t>(pg.size());
  if (indptr != nullptr && indptr_capacity >= static_cast<std::int64_t>(ip.size())) std::copy(ip.begin(), ip.end(), indptr);
  if (pages != nullptr && pages_capacity >= static_cast<std::int64_t>(pg.size())) std::copy(pg.begin(), pg.end(), pages);
}

namespace detail {
// B::take_page_report() where the backend has it (the CUDA one: page ids its kernels found bad).
template <class B>
auto take_page_report(B& b, int) -> decltype(b.take_page_report()) {
  return b.take_page_report();
}
template <class B>
void take_page_report(B&, ...) {}
}  // namespace detail

/// The trainer's paged_attention over backend B, with the checks a C caller needs and what a step
/// reports (oomb_paged_stats). Calls follow the trainer's order (oomb_c.h's paged session).
template <class B>
class paged_session {
 public:
  using T = typename B::value_type;
  using S = typename B::stat_type;

  paged_session(const trainer::model_config& cfg, const trainer::chunk_options& opt, std::int64_t max_tokens)
      : opt_(opt), layers_(cfg.num_hidden_layers), hkv_(cfg.num_key_value_heads), d_(cfg.head_dim),
        max_chunks_((max_tokens + opt.chunk - 1) / opt.chunk), attention_(be_, cfg, opt, max_tokens) {}

  B& backend() noexcept { return be_; }

  void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) {
    OOMB_PAGED_EXPECTS(chunks > 0 && chunks <= max_chunks_, "a step of ", chunks, " chunks; the plan holds 1 to ",
                       max_chunks_);
    OOMB_PAGED_EXPECTS(doc_starts.empty() || doc_starts.front() == 0, "documents must start at 0 first");
    for (std::size_t i = 1; i < doc_starts.size(); ++i)
      OOMB_PAGED_EXPECTS(doc_starts[i] > doc_starts[i - 1], "document starts must ascend (", doc_starts[i - 1], ", ",
                         doc_starts[i], ")");
    chunks_ = chunks;
    selected0_ = attention_.pages_selected();
    candidate0_ = attention_.pages_candidate();
    attention_.begin_step(chunks, doc_starts);
    if constexpr (trainer::has_transfer_wait_probe_v<B>) (void)be_.take_transfer_wait_seconds();  // what came before
  }
  void append(std::int64_t n) {
    OOMB_PAGED_EXPECTS(n > 0 && n <= opt_.chunk, "a chunk of ", n, " tokens; chunks hold 1 to ", opt_.chunk);
    attention_.append(n);
  }
  void write(std::int32_t l, std::int32_t c, std::int64_t n, const T* k, const T* v) {
    check(l, c, n);
    attention_.write(l, c, n, k, v);
  }
  void select(std::int32_t l, std::int32_t c, std::int64_t n, const T* q) {
    OOMB_PAGED_EXPECTS(opt_.sparse, "select on a dense session");
    check(l, c, n);
    attention_.select(l, c, n, q);
  }
  void expect_recompute(std::int32_t c) {
    check(0, c, 1);
    attention_.expect_recompute(c);
  }
  void forward(std::int32_t l, std::int32_t c, std::int64_t n, const T* q, T* o, S* lse) {
    check(l, c, n);
    attention_.forward(l, c, std::int64_t(c) * opt_.chunk, n, q, o, lse);
  }
  void backward(std::int32_t l, std::int32_t c, std::int64_t n, const T* q, const T* o, const S* lse, const T* d_o, T* dq,
                T* dk, T* dv) {
    check(l, c, n);
    attention_.backward(l, c, std::int64_t(c) * opt_.chunk, n, q, o, lse, d_o, dq, dk, dv);
  }
  void release_chunk(std::int32_t c) {
    check(0, c, 1);
    attention_.release_chunk(c);
  }
  const oomb::sparse_page_table& selection(std::int32_t l, std::int32_t c) const {
    OOMB_PAGED_EXPECTS(opt_.sparse, "a dense session has no selections");
    const auto& all = attention_.selections();
    const std::int64_t at = std::int64_t(c) * layers_ + l;
    OOMB_PAGED_EXPECTS(l >= 0 && l < layers_ && c >= 0 && at < static_cast<std::int64_t>(all.size()),
                       "no selection for layer ", l, ", chunk ", c, " in the last step (",
                       all.size() / std::size_t(layers_), " chunks)");
    return all[static_cast<std::size_t>(at)];
  }
  /// Waits for the step's copies (and kernels), throws what the backend reported, and says what
  /// is held and what moved.
  oomb_paged_stats end_step() {
    attention_.drain();
    detail::take_page_report(be_, 0);
    oomb_paged_stats r{};
    if constexpr (trainer::has_transfer_wait_probe_v<B>) r.exposed_transfer_seconds = be_.take_transfer_wait_seconds();
    const auto& kv = attention_.cache().pool();
    const auto& grads = attention_.mirror().pool();
    r.kv_in_use = kv.in_use();
    r.grad_in_use = grads.in_use();
    r.kv_high_water = kv.stats().high_water;
    r.grad_high_water = grads.stats().high_water;
    const std::int64_t pair_elements = 2 * std::int64_t(opt_.page) * hkv_ * d_;
    r.kv = residency_stats_of(attention_.kv().stats(), attention_.kv().near_slots(),
                              pair_elements * std::int64_t(sizeof(typename B::kv_type)));
    r.grad = residency_stats_of(attention_.grads().stats(), attention_.grads().near_slots(),
                                pair_elements * std::int64_t(sizeof(typename B::grad_type)));
    r.near_bytes = static_cast<std::int64_t>(attention_.kv().near_bytes() + attention_.grads().near_bytes());
    r.far_bytes = static_cast<std::int64_t>(attention_.cache().stats().reserved_bytes +
                                            attention_.mirror().stats().reserved_bytes);
    r.sparse_pages_selected = attention_.pages_selected() - selected0_;
    r.sparse_pages_candidate = attention_.pages_candidate() - candidate0_;
    return r;
  }

 private:
  // A call for layer l of chunk c with n of its tokens: in range of the plan and of this step.
  void check(std::int32_t l, std::int32_t c, std::int64_t n) const {
    OOMB_PAGED_EXPECTS(l >= 0 && l < layers_, "layer ", l, " out of range [0, ", layers_, ")");
    OOMB_PAGED_EXPECTS(c >= 0 && c < chunks_, "chunk ", c, " out of range [0, ", chunks_, ") of this step");
    OOMB_PAGED_EXPECTS(n > 0 && n <= opt_.chunk, n, " tokens; a chunk holds 1 to ", opt_.chunk);
  }

  trainer::chunk_options opt_;
  std::int32_t layers_, hkv_, d_;
  std::int64_t max_chunks_;
  std::int32_t chunks_ = 0;  // of the step begun last
  B be_;
  trainer::paged_attention<B, oomb::belady_eviction> attention_;
  std::int64_t selected0_ = 0, candidate0_ = 0;
};

}  // namespace oomb_c_abi
