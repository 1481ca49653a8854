// Tiny model configs and sequences for the trainer tests.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trainer/data/targets.hpp"
#include "trainer/io/config.hpp"

namespace trainer_test {

inline oomb_trainer::model_config tiny_config(std::int32_t hq, std::int32_t hkv, bool tied, std::int32_t d = 4,
                                              std::int32_t layers = 2, std::int32_t vocab = 11) {
  oomb_trainer::model_config c;
  c.hidden_size = hq * d;
  c.intermediate_size = 2 * hq * d + 3;
  c.num_hidden_layers = layers;
  c.num_attention_heads = hq;
  c.num_key_value_heads = hkv;
  c.head_dim = d;
  c.vocab_size = vocab;
  c.rope.theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = 1 << 20;
  return c;
}

/// The tiny model the GPU trainer's tests run (head_dim d: 64 or 128 for the kernels; 4 query and 2
/// KV heads, 2 layers, vocabulary 300, intermediate 384) as config-<d>.json under dir; its path.
inline std::string write_gpu_config(const std::filesystem::path& dir, std::int32_t d) {
  oomb_trainer::model_config c = tiny_config(/*hq=*/4, /*hkv=*/2, /*tied=*/false, d, /*layers=*/2, /*vocab=*/300);
  c.intermediate_size = 384;
  const auto path = (dir / ("config-" + std::to_string(d) + ".json")).string();
  std::ofstream(path) << oomb_trainer::to_json(c).dump(2);
  return path;
}

/// Random tokens; with `masked`, a random half of the targets count.
inline oomb_trainer::sequence random_sequence(std::int64_t n, std::int32_t vocab, std::uint64_t seed,
                                              bool masked = false) {
  std::mt19937_64 rng(seed);
  oomb_trainer::sequence s;
  s.tokens.resize(static_cast<std::size_t>(n));
  for (auto& t : s.tokens) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  if (masked) {
    s.mask.resize(s.tokens.size());
    for (auto& m : s.mask) m = static_cast<std::uint8_t>(rng() & 1u);
    s.mask[s.mask.size() - 1] = 1;  // at least one target counts
  }
  return s;
}

}  // namespace trainer_test
