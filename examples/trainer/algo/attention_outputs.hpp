// oomb trainer — each layer's attention output and lse kept from stage 1 for stage 2
// (chunk_options::keep_attention_outputs).
// SPDX-License-Identifier: Apache-2.0
//
// Stage 2 recomputes chunk c's forward to get the activations its backward needs. Most of that is
// cheap (projections, norms, MLP: O(chunk)); the attention forward is not: it reads the whole past,
// O(context) per chunk, a third of dense attention's work in a step. Its results, o [n][hq*d] and
// lse [hq][n], are the same bits in both stages (the same inputs, a deterministic forward), so this
// keeps them instead: one block per (layer, chunk), written once in stage 1 and read once in
// stage 2, then freed. The last layer's attention is not run in stage 1 (nothing reads its output
// there), so it has no block and stage 2 computes it.
//
// Where the blocks live follows the pages: in place, a pool in compute memory the backend's ops
// address directly; with offload, homes in the far tier (pinned host memory on a GPU) streamed
// through a few near slots by a residency scheduler of its own on the backend's copy streams —
// written back right after they are filled, prefetched one layer ahead in stage 2. The GPU holds
// the slots only; the far tier grows by hq * d * sizeof(T) + hq * sizeof(S) bytes per token and
// layer (0.5B: 43 KiB a token; 7B: 196 KiB), which is host memory the K/V homes cannot use.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <oomb/core/error.hpp>
#include <oomb/memory/block_pool.hpp>
#include <oomb/offload/residency_scheduler.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/io/config.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

template <class B>
class attention_outputs {
  static_assert(is_ops_backend_v<B>, "attention_outputs needs an ops backend");
  using T = typename B::value_type;
  using S = typename B::stat_type;
  using residency = typename B::residency_backend;
  using far_pool = oomb::block_pool<typename residency::far_resource>;
  using scheduler = oomb::residency_scheduler<residency>;

 public:
  /// Slots of the near tier with offload: the block in use, the next one prefetched, and two whose
  /// write-backs may still be in flight.
  static constexpr std::int32_t near_slots = 4;

  /// Bytes of one (layer, chunk) block for `chunk`-token chunks: o, then lse at a 256-byte boundary.
  static std::size_t block_bytes(const model_config& cfg, std::int32_t chunk) {
    return lse_offset(cfg, chunk) + round_up(std::size_t(chunk) * cfg.num_attention_heads * sizeof(S));
  }

  attention_outputs(B& backend, const model_config& cfg, const chunk_options& opt, std::int64_t max_tokens)
      : be_(&backend), layers_(cfg.num_hidden_layers - 1), hq_(cfg.num_attention_heads), d_(cfg.head_dim),
        lse_at_(lse_offset(cfg, opt.chunk)) {
    const auto chunks = static_cast<std::int32_t>((max_tokens + opt.chunk - 1) / opt.chunk);
    OOMB_EXPECTS(layers_ > 0, "keep_attention_outputs: a model of one layer keeps nothing (its only attention "
                              "runs in stage 2)");
    const std::int64_t capacity = std::int64_t(layers_) * chunks;
    OOMB_EXPECTS(capacity < (std::int64_t(1) << 31), "keep_attention_outputs: ", capacity, " blocks do not fit int32 ids");
    pool_ = std::make_unique<far_pool>(far_pool::growing(backend.far_memory(), block_bytes(cfg, opt.chunk), layers_,
                                                         static_cast<std::int32_t>(capacity)));
    if (opt.offload)
      scheduler_ = std::make_unique<scheduler>(*pool_, backend.near_memory(), near_slots, backend.copy_in(),
                                               backend.copy_out());
    ids_.assign(static_cast<std::size_t>(capacity), -1);
  }

  /// Stage 1: keeps layer l's o and lse of chunk c (n tokens), enqueued after the work that made them.
  void keep(std::int32_t l, std::int32_t c, std::int64_t n, const T* o, const S* lse) {
    std::int32_t& id = ids_[index(l, c)];
    OOMB_EXPECTS(id < 0, "attention_outputs: layer ", l, " chunk ", c, " is kept already");
    id = pool_->acquire();
    std::byte* block = address(id, oomb::access::overwrite);
    be_->copy_block(n * hq_ * d_, o, reinterpret_cast<T*>(block));
    be_->copy_block(std::int64_t(hq_) * n, lse, reinterpret_cast<S*>(block + lse_at_));
    if (!scheduler_) return;
    scheduler_->release(be_->compute(), oomb::id_span(&id, 1));
    scheduler_->write_back(oomb::id_span(&id, 1));
  }

  /// Stage 2: layer l's o and lse of chunk c, as keep() was given them; prefetches layer l + 1's.
  void take(std::int32_t l, std::int32_t c, std::int64_t n, T* o, S* lse) {
    const std::int32_t id = ids_[index(l, c)];
    OOMB_EXPECTS(id >= 0, "attention_outputs: layer ", l, " chunk ", c, " was not kept");
    if (scheduler_ && l == 0) scheduler_->prefetch(oomb::id_span(&id, 1));
    const std::byte* block = address(id, oomb::access::read);
    if (scheduler_ && l + 1 < layers_) scheduler_->prefetch(oomb::id_span(&ids_[index(l + 1, c)], 1));
    be_->copy_block(n * hq_ * d_, reinterpret_cast<const T*>(block), o);
    be_->copy_block(std::int64_t(hq_) * n, reinterpret_cast<const S*>(block + lse_at_), lse);
    if (scheduler_) scheduler_->release(be_->compute(), oomb::id_span(&id, 1));
  }

  /// Chunk c is done in stage 2: its blocks are dead.
  void release_chunk(std::int32_t c) {
    dead_.clear();
    for (std::int32_t l = 0; l < layers_; ++l) {
      std::int32_t& id = ids_[index(l, c)];
      if (id >= 0) dead_.push_back(id);
      id = -1;
    }
    if (scheduler_) scheduler_->discard(dead_);  // before the ids go back to the pool
    for (std::int32_t id : dead_) pool_->release(id);
  }

  /// The edge of a step: every copy has landed.
  void drain() {
    if (scheduler_) scheduler_->drain();
  }

  /// Bytes the far pool took, and the near slots (0 in place).
  std::size_t far_reserved_bytes() const noexcept { return pool_->stats().reserved_bytes; }
  std::size_t near_bytes() const noexcept { return scheduler_ ? scheduler_->near_pool().stats().reserved_bytes : 0; }
  oomb::residency_stats stats() const { return scheduler_ ? scheduler_->stats() : oomb::residency_stats{}; }

 private:
  static std::size_t round_up(std::size_t b) { return (b + 255) / 256 * 256; }
  static std::size_t lse_offset(const model_config& cfg, std::int32_t chunk) {
    return round_up(std::size_t(chunk) * cfg.num_attention_heads * cfg.head_dim * sizeof(T));
  }
  std::size_t index(std::int32_t l, std::int32_t c) const {
    OOMB_EXPECTS(l >= 0 && l < layers_, "attention_outputs: layer ", l, " has no block (", layers_, " layers kept)");
    return static_cast<std::size_t>(c) * layers_ + l;
  }
  /// Where the backend's ops address block `id` for work enqueued next (pinned until release).
  std::byte* address(std::int32_t id, oomb::access mode) {
    if (!scheduler_) return pool_->address(id);
    std::int32_t slot = -1;
    scheduler_->acquire(be_->compute(), oomb::id_span(&id, 1), mode, &slot);
    return scheduler_->near_pool().address(slot);
  }

  B* be_;
  std::int32_t layers_, hq_, d_;
  std::size_t lse_at_;
  std::unique_ptr<far_pool> pool_;
  std::unique_ptr<scheduler> scheduler_;
  std::vector<std::int32_t> ids_;   // [chunk][layer] block id, -1: none
  std::vector<std::int32_t> dead_;  // scratch of release_chunk
};

}  // namespace oomb_trainer
