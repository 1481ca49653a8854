// The shipped configs/ parse strictly and say what issue 3 says they say; parameter counts match
// the published model sizes.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <string>

#include "trainer/io/config.hpp"
#include "trainer/model/params.hpp"

namespace {
oomb_trainer::model_config load(const std::string& name) {
  return oomb_trainer::load_model_config(std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/" + name);
}
}  // namespace

TEST_CASE("configs: tiny, Qwen2.5-0.5B and Qwen2.5-7B") {
  const auto tiny = load("tiny.json");
  CHECK(tiny.num_hidden_layers == 2);
  CHECK(tiny.num_attention_heads / tiny.num_key_value_heads == 2);  // GQA
  CHECK(oomb_trainer::parameter_count(oomb_trainer::param_layout(tiny)) == 78400);

  const auto small = load("qwen2.5-0.5b.json");
  CHECK(small.hidden_size == 896);
  CHECK(small.intermediate_size == 4864);
  CHECK(small.num_hidden_layers == 24);
  CHECK(small.num_attention_heads == 14);
  CHECK(small.num_key_value_heads == 2);
  CHECK(small.head_dim == 64);
  CHECK(small.vocab_size == 151936);
  CHECK(small.tie_word_embeddings);
  CHECK(small.rope.theta == 1e6);
  CHECK(small.rms_norm_eps == 1e-6);
  // Qwen2.5-0.5B: 494,032,768 parameters (the embedding counted once: tied).
  CHECK(oomb_trainer::parameter_count(oomb_trainer::param_layout(small)) == 494032768);

  const auto big = load("qwen2.5-7b.json");
  CHECK(big.hidden_size == 3584);
  CHECK(big.intermediate_size == 18944);
  CHECK(big.num_hidden_layers == 28);
  CHECK(big.num_attention_heads == 28);
  CHECK(big.num_key_value_heads == 4);
  CHECK(big.head_dim == 128);
  CHECK(big.vocab_size == 152064);
  CHECK_FALSE(big.tie_word_embeddings);
  CHECK(big.rope.theta == 1e6);
  // Qwen2.5-7B: 7,615,616,512 parameters.
  CHECK(oomb_trainer::parameter_count(oomb_trainer::param_layout(big)) == 7615616512ull);
}

TEST_CASE("configs: Llama-3.1-8B (llama3 RoPE scaling) and Qwen3-8B (q/k norms, head_dim 128)") {
  using oomb_trainer::model_family;
  const auto llama = load("llama-3.1-8b.json");
  CHECK(llama.family == model_family::llama);
  CHECK(llama.head_dim == 128);
  CHECK_FALSE(llama.qkv_bias);
  CHECK_FALSE(llama.o_bias);
  CHECK_FALSE(llama.mlp_bias);
  CHECK(llama.rope.kind == oomb_trainer::rope_kind::llama3);
  CHECK(llama.rope.theta == 500000.0);
  CHECK(llama.rope.factor == 8.0);
  CHECK(llama.rope.original_max_position_embeddings == 8192);
  // Llama-3.1-8B: 8,030,261,248 parameters (untied head).
  CHECK(oomb_trainer::parameter_count(oomb_trainer::param_layout(llama)) == 8030261248ull);

  const auto qwen3 = load("qwen3-8b.json");
  CHECK(qwen3.family == model_family::qwen3);
  CHECK(qwen3.qk_norm);
  CHECK_FALSE(qwen3.qkv_bias);
  CHECK(qwen3.head_dim == 128);
  CHECK(qwen3.rope.kind == oomb_trainer::rope_kind::plain);
  CHECK(qwen3.rope.theta == 1e6);
  // Qwen3-8B: 8,190,735,360 parameters.
  CHECK(oomb_trainer::parameter_count(oomb_trainer::param_layout(qwen3)) == 8190735360ull);
}
