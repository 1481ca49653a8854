// oomb trainer — full-sequence forward and backward: the baseline the chunk-recurrent path equals.
// SPDX-License-Identifier: Apache-2.0
//
// Plain backprop over the whole sequence with every activation kept (memory O(N) per layer): what
// a framework does without oomb, and the reference of the gradient-equivalence tests. It runs on
// the CPU backend only: the oracle stays on the host. Given a selection_mask (the page selections a
// sparse chunk-recurrent step made), its attention sees only what the page-sparse path attends:
// the reference for partial selections. A packed sequence (sequence::doc_starts) gets a
// block-diagonal causal mask over the whole matrix and RoPE positions restarting at each document.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <oomb/sparse/sparse_page_table.hpp>

#include "trainer/cpu/causal_attention.hpp"
#include "trainer/cpu/cpu_ops.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/model/block.hpp"
#include "trainer/model/params.hpp"

namespace oomb_trainer {

/// The keys each query sees under page-sparse attention: query i of chunk c = i / chunk (tile
/// t = (i - c * chunk) / tile) sees the keys of its own chunk causally and, before the chunk, the
/// keys of the logical pages tile t of tables[c * layers + l] lists in layer l
/// (chunk_recurrent::selections() after a sparse step, with that step's chunk, page and tile).
struct selection_mask {
  std::int32_t chunk = 0, page = 0, tile = 0, layers = 0;
  std::vector<oomb::sparse_page_table> tables;  ///< [chunk][layer]

  /// Throws invalid_argument unless the tables fit a sequence of n tokens of a model of `model_layers` layers.
  void validate(std::int64_t n, std::int32_t model_layers) const {
    OOMB_EXPECTS(layers == model_layers, "selection_mask: made for ", layers, " layers, the model has ", model_layers);
    OOMB_EXPECTS(chunk > 0 && page > 0 && tile > 0 && chunk % page == 0, "selection_mask: chunk ", chunk, ", page ", page,
                 ", tile ", tile, " must be positive, chunk a multiple of page");
    const std::int64_t chunks = (n + chunk - 1) / chunk;
    OOMB_EXPECTS(std::int64_t(tables.size()) == chunks * layers, "selection_mask: ", tables.size(), " tables for ", chunks,
                 " chunks of ", layers, " layers");
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t rows = std::min<std::int64_t>(chunk, n - c * chunk);
      for (std::int32_t l = 0; l < layers; ++l) {
        const auto& t = tables[static_cast<std::size_t>(c * layers + l)];
        OOMB_EXPECTS(t.num_tiles() == (rows + tile - 1) / tile, "selection_mask: chunk ", c, " layer ", l, " has ",
                     t.num_tiles(), " tiles, its ", rows, " queries need ", (rows + tile - 1) / tile);
        const std::int32_t last = t.num_entries() == 0 ? -1 : *std::max_element(t.indices().begin(), t.indices().end());
        OOMB_EXPECTS(last < c * chunk / page, "selection_mask: chunk ", c, " layer ", l, " selects page ", last,
                     ", not before the chunk");
      }
    }
  }

  /// Whether query i sees key j <= i in layer l.
  bool visible(std::int32_t l, std::int64_t i, std::int64_t j) const {
    const std::int64_t c = i / chunk;
    if (j >= c * chunk) return true;
    const auto [begin, end] = tables[static_cast<std::size_t>(c * layers + l)].tile(static_cast<std::int32_t>((i - c * chunk) / tile));
    return std::binary_search(begin, end, static_cast<std::int32_t>(j / page));
  }
};

/// Returns the sequence's loss (mean over counted targets) and ADDS its gradient into `grads`.
/// Attention sees only keys of the query's own document, and with `mask` only the keys it marks visible.
template <class T>
double full_sequence_loss_and_grad(const model_params<T>& p, model_params<T>& grads, const sequence& seq,
                                   const selection_mask* mask = nullptr) {
  seq.validate();
  const auto& c = p.config();
  if (mask) mask->validate(seq.size(), c.num_hidden_layers);
  using backend = cpu_ops<T>;
  backend be;
  const block_dims D(c);
  const std::int64_t N = seq.size();
  const std::int64_t counted = seq.counted_targets();
  OOMB_EXPECTS(counted > 0, "full_sequence: the loss mask leaves no target");
  const T scale = T(1) / T(counted);
  // doc[j]: the first token of j's document (0 without documents); its RoPE position is j - doc[j].
  std::vector<std::int64_t> doc(static_cast<std::size_t>(N)), pos(doc.size());
  document_starts_of(seq.doc_starts, 0, N, doc.data());
  for (std::int64_t j = 0; j < N; ++j) pos[static_cast<std::size_t>(j)] = j - doc[static_cast<std::size_t>(j)];
  const auto rope = be.rope(pos.data(), N, rope_frequencies_for(c.rope, D.d, seq.longest_document()));
  const T attn_scale = T(1) / std::sqrt(T(D.d));
  auto visible_in = [&](std::int32_t l) {
    return [&, l](std::int64_t i, std::int64_t j) {
      return j >= doc[static_cast<std::size_t>(i)] && (mask == nullptr || mask->visible(l, i, j));
    };
  };

  std::vector<T> x(static_cast<std::size_t>(N * D.H));
  be.embedding_forward(N, D.H, c.vocab_size, seq.tokens.data(), p.embed(), x.data());
  std::vector<block_acts<backend>> acts(static_cast<std::size_t>(c.num_hidden_layers));
  for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
    auto& a = acts[static_cast<std::size_t>(l)];
    a.resize(N, D);
    block_forward(be, D, p.layer(l), rope, x.data(), a, [&](block_acts<backend>& b) {
      cpu::masked_causal_attention_forward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(), b.v.data(),
                                           b.o.data(), b.lse.data(), visible_in(l));
    });
  }
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  seq.targets(0, N, targets.data());
  std::vector<T> dx(x.size());
  be.head_loss_and_grad(p, &grads, N, x.data(), targets.data(), scale, dx.data());
  block_scratch<backend> bs;
  for (std::int32_t l = c.num_hidden_layers; l-- > 0;) {
    block_backward(be, D, p.layer(l), grads.layer(l), rope, acts[static_cast<std::size_t>(l)], dx.data(), bs,
                   [&](block_acts<backend>& b, const T* d_o, T* dq, T* dk, T* dv) {
                     cpu::masked_causal_attention_backward(N, D.hq, D.hkv, D.d, attn_scale, b.q.data(), b.k.data(),
                                                           b.v.data(), b.o.data(), b.lse.data(), d_o, dq, dk, dv,
                                                           visible_in(l));
                   });
  }
  be.embedding_backward(N, D.H, seq.tokens.data(), dx.data(), grads.embed());
  return be.take_loss() / static_cast<double>(counted);
}

}  // namespace oomb_trainer
