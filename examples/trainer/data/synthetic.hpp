// oomb trainer — a synthetic long-range task whose answers only an earlier chunk holds.
// SPDX-License-Identifier: Apache-2.0
//
// kv-recall: a sequence stores `keys` records in its first chunk, each one token "key k has value
// v" (values drawn uniformly from `values`, independently per key and per sequence). Later chunks
// ask: a query token "?k" followed by the answer, which is the record token itself (so answering
// is attending to the right record and copying it). Only answer tokens count in the loss (the
// answer mask). Everything else is filler drawn uniformly from the remaining tokens.
//
// Why it needs information to cross chunks: a chunk with a query holds no record of the queried
// key (records live in chunk 0 only; a key is asked at most once per chunk, so no earlier answer
// to it sits in the same chunk; other answers belong to other keys, whose values are
// independent). So a model that cannot see earlier chunks predicts the answer from a distribution
// independent of the value: its expected answer loss is at least the entropy ln(values) of a
// uniform value. Falling below half of that is only possible by reading an earlier chunk.
//
// Token ids (vocabulary V, K keys, M values):
//   [0, K*M)          record and answer "key k has value v" = k * M + v
//   [K*M, K*M + K)    query "?k"
//   the rest          filler
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/data/targets.hpp"

namespace oomb_trainer {

struct kv_recall_options {
  std::int32_t keys = 8;
  std::int32_t values = 6;
  std::int32_t queries_per_chunk = 8;  ///< at most `keys`: each key at most once per chunk
};

/// The kv-recall task over sequences of `seq_len` tokens cut in chunks of `chunk` tokens.
class kv_recall {
 public:
  kv_recall(std::int32_t vocab, std::int64_t seq_len, std::int32_t chunk, std::uint64_t seed,
            kv_recall_options o = {})
      : vocab_(vocab), seq_len_(seq_len), chunk_(chunk), seed_(seed), o_(o) {
    OOMB_EXPECTS(o.keys > 0 && o.values > 1, "kv-recall: needs keys > 0 and values > 1, got ", o.keys, " and ", o.values);
    OOMB_EXPECTS(o.queries_per_chunk > 0 && o.queries_per_chunk <= o.keys, "kv-recall: queries per chunk must be in [1, keys = ",
                 o.keys, "], got ", o.queries_per_chunk);
    OOMB_EXPECTS(filler_first() < vocab, "kv-recall: ", o.keys, " keys and ", o.values, " values need a vocabulary of more than ",
                 filler_first(), " tokens (records, queries, answers, filler); the model has ", vocab);
    OOMB_EXPECTS(chunk >= o.keys, "kv-recall: the first chunk (", chunk, " tokens) must hold the ", o.keys, " records");
    OOMB_EXPECTS(seq_len > chunk, "kv-recall: sequences of ", seq_len, " tokens have no chunk after the first (chunk ", chunk,
                 "): nothing to ask");
    OOMB_EXPECTS(2 * o.queries_per_chunk <= std::min<std::int64_t>(chunk, seq_len - chunk),
                 "kv-recall: ", o.queries_per_chunk, " queries (2 tokens each) do not fit a chunk of ",
                 std::min<std::int64_t>(chunk, seq_len - chunk), " tokens");
  }

  /// Number of possible answers: the entropy of an answer is ln(values).
  std::int32_t possible_answers() const noexcept { return o_.values; }

  /// Sequence number `index` (a pure function of the seed and the index, so a resumed run sees
  /// the same data).
  sequence make(std::uint64_t index) const {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + index);
    auto uniform = [&](std::int64_t n) { return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)); };
    sequence s;
    s.tokens.resize(static_cast<std::size_t>(seq_len_));
    s.mask.assign(s.tokens.size(), 0);
    const std::int32_t filler = vocab_ - filler_first();
    for (auto& t : s.tokens) t = filler_first() + static_cast<std::int32_t>(uniform(filler));
    std::vector<std::int32_t> value(static_cast<std::size_t>(o_.keys));
    for (auto& v : value) v = static_cast<std::int32_t>(uniform(o_.values));
    // Records at distinct random positions of chunk 0.
    std::vector<std::int64_t> pos(static_cast<std::size_t>(chunk_));
    std::iota(pos.begin(), pos.end(), 0);
    for (std::int32_t k = 0; k < o_.keys; ++k) {
      std::swap(pos[static_cast<std::size_t>(k)], pos[static_cast<std::size_t>(k + uniform(chunk_ - k))]);
      s.tokens[static_cast<std::size_t>(pos[static_cast<std::size_t>(k)])] = k * o_.values + value[static_cast<std::size_t>(k)];
    }
    // Each later chunk asks queries_per_chunk distinct keys at non-overlapping slots of 2 tokens.
    std::vector<std::int32_t> keys(static_cast<std::size_t>(o_.keys));
    for (std::int64_t c0 = chunk_; c0 < seq_len_; c0 += chunk_) {
      const std::int64_t len = std::min<std::int64_t>(chunk_, seq_len_ - c0);
      const std::int64_t slots = len / 2;
      if (slots < o_.queries_per_chunk) continue;
      std::iota(keys.begin(), keys.end(), 0);
      std::vector<std::int64_t> slot(static_cast<std::size_t>(slots));
      std::iota(slot.begin(), slot.end(), 0);
      for (std::int32_t q = 0; q < o_.queries_per_chunk; ++q) {
        std::swap(keys[static_cast<std::size_t>(q)], keys[static_cast<std::size_t>(q + uniform(o_.keys - q))]);
        std::swap(slot[static_cast<std::size_t>(q)], slot[static_cast<std::size_t>(q + uniform(slots - q))]);
        const std::int32_t k = keys[static_cast<std::size_t>(q)];
        const auto at = static_cast<std::size_t>(c0 + 2 * slot[static_cast<std::size_t>(q)]);
        s.tokens[at] = o_.keys * o_.values + k;
        s.tokens[at + 1] = k * o_.values + value[static_cast<std::size_t>(k)];
        s.mask[at + 1] = 1;
      }
    }
    return s;
  }

 private:
  std::int32_t filler_first() const noexcept { return o_.keys * o_.values + o_.keys; }

  std::int32_t vocab_;
  std::int64_t seq_len_;
  std::int32_t chunk_;
  std::uint64_t seed_;
  kv_recall_options o_;
};

}  // namespace oomb_trainer
