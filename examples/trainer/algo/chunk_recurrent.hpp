// oomb trainer — chunk-recurrent training with recomputation on oomb's paged KV cache, gradient
// mirror, residency scheduler and sparse page selection (docs/trainer.md, "The algorithm").
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
//   RoPE and the projections' backward. With keep_attention_outputs, stage 1 keeps every layer's
//   attention output (algo/attention_outputs.hpp) and stage 2 reads it instead of attending again. Parameter gradients accumulate over chunks; the chunk's
//   K/V pages and gradient pages are released.
//
// Attention runs over windows of pages (algo/paged_attention.hpp); where the pages live (in place,
// or streamed through near slots: algo/page_tier.hpp) changes no bit. Every op, buffer and stream
// comes from the backend B (ops/ops_backend.hpp): this file is the algorithm only, the
// same on the host (cpu_ops) and on a GPU.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "trainer/algo/attention_outputs.hpp"
#include "trainer/algo/chunk_options.hpp"
#include "trainer/algo/paged_attention.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/model/block.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

/// The chunk-recurrent trainer of one model shape on backend B; Eviction: the K/V pages' eviction
/// policy with offload (oomb::lru_eviction, or oomb::belady_eviction fed the order of each chunk's
/// stage-2 windows).
template <class B, class Eviction = oomb::lru_eviction>
class chunk_recurrent {
  static_assert(is_ops_backend_v<B>, "chunk_recurrent needs an ops backend");
  using T = typename B::value_type;

 public:
  using backend_type = B;
  using params_type = typename B::params_type;
  using grads_type = typename B::grads_type;

  chunk_recurrent(const model_config& cfg, const chunk_options& opt, std::int64_t max_tokens)
      : cfg_(cfg), D_(cfg), opt_((opt.validate(), opt)), max_tokens_(max_tokens),
        attn_((check_tokens(max_tokens), be_), cfg, opt, max_tokens) {
    if (opt.keep_attention_outputs) kept_ = std::make_unique<attention_outputs<B>>(be_, cfg, opt, max_tokens);
    if constexpr (has_op_clock_v<B>) be_.time_ops(opt.time_ops);
    if constexpr (has_attention_plan_v<B>) {
      oomb::attention::plan_options po;
      po.kernels = opt.attention_kernels;
      po.deterministic = opt.deterministic;
      be_.attention_plan(po);
    }
    if constexpr (has_reserve_v<B>) be_.reserve(chunk_shape_of(cfg, opt, max_tokens));
    acts_.resize(static_cast<std::size_t>(cfg.num_hidden_layers));
    for (auto& a : acts_) a.resize(opt.chunk, D_);
    x_.resize(static_cast<std::size_t>(opt.chunk) * D_.H);
    dx_.resize(x_.size());
  }

  const chunk_options& options() const noexcept { return opt_; }
  const chunk_step_stats& last_stats() const noexcept { return stats_; }

  /// Runs stages 1 and 2 over `seq`, returns its loss (mean over counted targets) and ADDS its
  /// gradient into `grads`. `progress` (may be empty) is called after every chunk of each stage.
  /// If it throws (bad tokens, out of memory), the cache may still hold pages of the sequence:
  /// discard the trainer object.
  double loss_and_grad(const params_type& p, grads_type& grads, const sequence& seq,
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
    const std::int64_t selected0 = attn_.pages_selected(), candidate0 = attn_.pages_candidate();
    const std::int64_t predicted0 = attn_.pages_predicted(), predicted_used0 = attn_.pages_predicted_used();
    attn_.begin_step(chunks, seq.doc_starts);
    if constexpr (has_transfer_wait_probe_v<B>) be_.take_transfer_wait_seconds();  // drops what came before
    if constexpr (has_op_clock_v<B>) be_.take_op_seconds();
    T* x = x_.data();
    T* dx = dx_.data();
    const rope_frequencies freqs = rope_frequencies_for(cfg_.rope, D_.d, seq.longest_document());
    std::vector<std::int32_t> targets(static_cast<std::size_t>(opt_.chunk));

    // ---- stage 1: fill the cache, no gradients ----
    auto t0 = std::chrono::steady_clock::now();
    for (std::int32_t c = 0; c < chunks; ++c) {
      forward_chunk(p, seq, c, freqs, /*evaluating=*/false);
      stats_.kv_pages_high_water = std::max(stats_.kv_pages_high_water, attn_.cache().pool().in_use());
      if (progress) progress({1, c, chunks});
    }
    auto t1 = std::chrono::steady_clock::now();
    stats_.stage1_seconds = std::chrono::duration<double>(t1 - t0).count();

    // ---- stage 2: reverse, recompute, backward ----
    using S = typename B::stat_type;  // scalars in fp32 even where activations are bf16
    const S scale = S(1) / S(counted);
    be_.take_loss();  // drops what a step that threw may have left
    for (std::int32_t c = chunks; c-- > 0;) {
      const std::int64_t p0 = std::int64_t(c) * opt_.chunk;
      const std::int64_t n = std::min<std::int64_t>(opt_.chunk, N - p0);
      attn_.expect_recompute(c);
      const auto rope = be_.rope(positions(seq, p0, n), n, freqs);
      be_.embedding_forward(n, D_.H, cfg_.vocab_size, seq.tokens.data() + p0, p.embed(), x);
      for (std::int32_t l = 0; l < L; ++l) {
        auto& a = acts_[static_cast<std::size_t>(l)];
        a.n = n;
        block_forward(be_, D_, p.layer(l), rope, x, a, [&](block_acts<B>& b) {
          if (kept_ && l + 1 < L)
            kept_->take(l, c, n, b.o.data(), b.lse.data());
          else
            attn_.forward(l, c, p0, n, b.q.data(), b.o.data(), b.lse.data());
        });
      }
      seq.targets(p0, n, targets.data());
      be_.head_loss_and_grad(p, &grads, n, x, targets.data(), scale, dx);
      for (std::int32_t l = L; l-- > 0;) {
        block_backward(be_, D_, p.layer(l), grads.layer(l), rope, acts_[static_cast<std::size_t>(l)], dx, scratch_,
                       [&](block_acts<B>& b, const T* d_o, T* dq, T* dk, T* dv) {
                         attn_.backward(l, c, p0, n, b.q.data(), b.o.data(), b.lse.data(), d_o, dq, dk, dv);
                       });
      }
      be_.embedding_backward(n, D_.H, seq.tokens.data() + p0, dx, grads.embed());
      stats_.grad_pages_high_water = std::max(stats_.grad_pages_high_water, attn_.mirror().pool().in_use());
      attn_.release_chunk(c);
      if (kept_) kept_->release_chunk(c);
      if (progress) progress({2, c, chunks});
    }
    attn_.drain();
    if (kept_) kept_->drain();
    stats_.stage2_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const auto moved1 = moved();
    stats_.bytes_to_near = moved1.first - moved0.first;
    stats_.bytes_to_far = moved1.second - moved0.second;
    stats_.sparse_pages_selected = attn_.pages_selected() - selected0;
    stats_.sparse_pages_candidate = attn_.pages_candidate() - candidate0;
    stats_.sparse_pages_predicted = attn_.pages_predicted() - predicted0;
    stats_.sparse_pages_predicted_used = attn_.pages_predicted_used() - predicted_used0;
    stats_.loss = be_.take_loss() / static_cast<double>(counted);
    if constexpr (has_transfer_wait_probe_v<B>) stats_.exposed_transfer_seconds = be_.take_transfer_wait_seconds();
    if constexpr (has_op_clock_v<B>) stats_.op_time = be_.take_op_seconds();
    stats_.attention_host = attn_.host_seconds();
    return stats_.loss;
  }

  /// Forward only (evaluation): stage 1 with every layer finished and the head's loss, no
  /// gradient and no gradient page. Returns the loss of each position's prediction: entry t is the
  /// loss of predicting token t + 1 (natural log), NaN where the loss mask does not count it (and
  /// for the last token, which predicts nothing). The cache holds nothing afterwards.
  std::vector<double> evaluate(const params_type& p, const sequence& seq,
                               const std::function<void(const chunk_progress&)>& progress = {}) {
    seq.validate();
    const std::int64_t N = seq.size();
    OOMB_EXPECTS(N <= max_tokens_, "chunk_recurrent: sequence of ", N, " tokens, built for at most ", max_tokens_);
    const auto chunks = static_cast<std::int32_t>((N + opt_.chunk - 1) / opt_.chunk);
    attn_.begin_step(chunks, seq.doc_starts);
    const rope_frequencies freqs = rope_frequencies_for(cfg_.rope, D_.d, seq.longest_document());
    std::vector<std::int32_t> targets(static_cast<std::size_t>(opt_.chunk));
    std::vector<double> losses(static_cast<std::size_t>(N), std::numeric_limits<double>::quiet_NaN());
    for (std::int32_t c = 0; c < chunks; ++c) {
      const std::int64_t p0 = std::int64_t(c) * opt_.chunk;
      const std::int64_t n = std::min<std::int64_t>(opt_.chunk, N - p0);
      forward_chunk(p, seq, c, freqs, /*evaluating=*/true);
      seq.targets(p0, n, targets.data());
      be_.head_row_losses(p, n, x_.data(), targets.data(), losses.data() + p0);
      for (std::int64_t t = 0; t < n; ++t)
        if (targets[static_cast<std::size_t>(t)] < 0) losses[static_cast<std::size_t>(p0 + t)] = std::numeric_limits<double>::quiet_NaN();
      if (progress) progress({1, c, chunks});
    }
    for (std::int32_t c = chunks; c-- > 0;) attn_.release_chunk(c);
    attn_.drain();
    return losses;
  }

  /// The ops backend the steps run on (its scratch, for the memory plan's tests).
  const B& backend() const noexcept { return be_; }

  /// What each tier holds now (after a step: the far pools have returned every page, but keep the
  /// memory they reserved).
  tier_memory memory() const {
    tier_memory m;
    m.kv_pair_bytes = attn_.cache().pair_bytes();
    m.grad_pair_bytes = attn_.mirror().pair_bytes();
    m.far_kv_reserved = attn_.cache().stats().reserved_bytes;
    m.far_grad_reserved = attn_.mirror().stats().reserved_bytes;
    m.far_kv_in_use = attn_.cache().pool().in_use();
    m.far_grad_in_use = attn_.mirror().pool().in_use();
    m.near_kv_slots = attn_.kv().near_slots();
    m.near_grad_slots = attn_.grads().near_slots();
    m.near_bytes = attn_.kv().near_bytes() + attn_.grads().near_bytes();
    for (const auto& a : acts_) m.activation_bytes += a.bytes();
    if (kept_) {
      m.far_outputs_reserved = kept_->far_reserved_bytes();
      m.near_bytes += kept_->near_bytes();
    }
    return m;
  }

  /// Sparse: the past pages each query tile attended in the last step, [chunk][layer] (the
  /// selection_mask of full_sequence.hpp's reference); empty when dense.
  const std::vector<oomb::sparse_page_table>& selections() const noexcept { return attn_.selections(); }

  /// Residency counters (offload only; zeros otherwise): K/V and gradient pages.
  oomb::residency_stats kv_residency() const { return attn_.kv().stats(); }
  oomb::residency_stats grad_residency() const { return attn_.grads().stats(); }

 private:
  /// Stage 1 of chunk c (and evaluation's pass): embeds it into x_, runs every layer writing K/V to
  /// the chunk's pages (and selecting, sparse) and attending over the cache. Training stops the last
  /// layer after its K/V (nothing reads its output in stage 1) and keeps the attention outputs when
  /// asked; evaluating finishes every layer, so x_ holds the final hidden states for the head.
  void forward_chunk(const params_type& p, const sequence& seq, std::int32_t c, const rope_frequencies& freqs,
                     bool evaluating) {
    const std::int64_t p0 = std::int64_t(c) * opt_.chunk;
    const std::int64_t n = std::min<std::int64_t>(opt_.chunk, seq.size() - p0);
    const std::int32_t L = cfg_.num_hidden_layers;
    attn_.append(n);
    const auto rope = be_.rope(positions(seq, p0, n), n, freqs);
    T* x = x_.data();
    be_.embedding_forward(n, D_.H, cfg_.vocab_size, seq.tokens.data() + p0, p.embed(), x);
    auto& a = acts_[0];
    a.n = n;
    for (std::int32_t l = 0; l < L; ++l) {
      const bool finish = evaluating || l + 1 < L;
      block_forward(be_, D_, p.layer(l), rope, x, a, [&](block_acts<B>& b) {
        attn_.write(l, c, n, b.k.data(), b.v.data());
        if (opt_.sparse) attn_.select(l, c, n, b.q.data());
        if (!finish) return;
        attn_.forward(l, c, p0, n, b.q.data(), b.o.data(), b.lse.data());
        if (kept_ && !evaluating) kept_->keep(l, c, n, b.o.data(), b.lse.data());
      }, finish);
    }
  }

  /// The RoPE positions of tokens [p0, p0 + n) (positions_, valid until the next call): each
  /// token's offset in its document, so they restart at every document of a packed sequence.
  const std::int64_t* positions(const sequence& seq, std::int64_t p0, std::int64_t n) {
    positions_.resize(static_cast<std::size_t>(n));
    document_starts_of(seq.doc_starts, p0, n, positions_.data());
    for (std::int64_t t = 0; t < n; ++t) positions_[static_cast<std::size_t>(t)] = p0 + t - positions_[static_cast<std::size_t>(t)];
    return positions_.data();
  }

  static void check_tokens(std::int64_t max_tokens) {
    OOMB_EXPECTS(max_tokens >= 2, "chunk_recurrent: max_tokens must be >= 2, got ", max_tokens);
  }

  std::pair<std::uint64_t, std::uint64_t> moved() const {
    const auto a = kv_residency(), b = grad_residency();
    const auto o = kept_ ? kept_->stats() : oomb::residency_stats{};
    return {a.bytes_to_near + b.bytes_to_near + o.bytes_to_near, a.bytes_to_far + b.bytes_to_far + o.bytes_to_far};
  }

  model_config cfg_;
  block_dims D_;
  chunk_options opt_;
  std::int64_t max_tokens_;
  B be_;  // before attn_, which streams through its memory and streams
  paged_attention<B, Eviction> attn_;
  std::unique_ptr<attention_outputs<B>> kept_;  // keep_attention_outputs only
  std::vector<block_acts<B>> acts_;
  block_scratch<B> scratch_;
  typename B::template buffer<T> x_, dx_;
  std::vector<std::int64_t> positions_;  // positions()'s
  chunk_step_stats stats_;
};

}  // namespace oomb_trainer
