// model_config: HF Qwen2 config.json (transformers 4 and 5 layouts), every missing or unsupported
// field named.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include "io_test_util.hpp"
#include "trainer/io/config.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using nlohmann::json;

namespace {

// Qwen2.5-0.5B's config.json as published (transformers 4 layout).
const char* qwen05b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// What transformers 5 writes for a tiny Qwen2Config.
const char* tiny_v5 = R"({
  "attention_dropout": 0.0, "bos_token_id": null, "eos_token_id": null, "hidden_act": "silu",
  "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 40,
  "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 128,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": null,
  "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 64})";

}  // namespace

TEST_CASE("config: Qwen2.5-0.5B (transformers 4 layout) and a transformers 5 config parse") {
  const auto c = parse_model_config(json::parse(qwen05b), "qwen05b.json");
  CHECK(c.hidden_size == 896);
  CHECK(c.intermediate_size == 4864);
  CHECK(c.num_hidden_layers == 24);
  CHECK(c.num_attention_heads == 14);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 151936);
  CHECK(c.rope.theta == 1e6);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 32768);

  const auto t = parse_model_config(json::parse(tiny_v5), "tiny.json");
  CHECK(t.hidden_size == 32);
  CHECK(t.head_dim == 8);
  CHECK(t.rope.theta == 10000.0);
  CHECK(!t.tie_word_embeddings);

  // to_json round trip, through a file.
  io_test::temp_dir dir;
  const std::string text = to_json(c).dump(2);
  io_test::write_bytes(dir / "config.json", text);
  CHECK(load_model_config(dir / "config.json") == c);
  CHECK(parse_model_config(to_json(t), "x") == t);
  CHECK(first_difference(c, c).empty());
  auto c2 = c;
  c2.rms_norm_eps = 1e-5;
  CHECK(first_difference(c, c2) == "rms_norm_eps");
  CHECK(c2 != c);
}

TEST_CASE("config: each missing required field is named") {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                            "rope_theta"}) {
    CAPTURE(field);
    auto j = json::parse(qwen05b);
    j.erase(field);
    expect_error([&] { (void)parse_model_config(j, "cfg.json"); },
                 {"cfg.json", std::string("'") + field + "' is missing"});
  }
  auto j = json::parse(qwen05b);
  j["vocab_size"] = nullptr;
  expect_error([&] { (void)parse_model_config(j, "cfg.json"); }, {"'vocab_size' is missing"});
  // transformers 5 keeps rope_theta inside rope_parameters only.
  auto v5 = json::parse(tiny_v5);
  v5["rope_parameters"].erase("rope_theta");
  expect_error([&] { (void)parse_model_config(v5, "v5.json"); }, {"v5.json", "'rope_theta' is missing"});
  // HF defaults: no head_dim -> hidden / heads; no tie_word_embeddings -> untied.
  auto d = json::parse(qwen05b);
  d.erase("tie_word_embeddings");
  d.erase("head_dim");
  CHECK(!parse_model_config(d, "d").tie_word_embeddings);
}

TEST_CASE("config: each unsupported or inconsistent field is rejected by name") {
  struct bad_case {
    const char* key;
    json value;
    const char* named;
  };
  const bad_case cases[] = {
      {"rope_scaling", json{{"type", "dynamic"}, {"factor", 4.0}}, "'rope_scaling.rope_type' = \"dynamic\" cannot be trained"},
      {"rope_scaling", json{{"type", "su"}, {"factor", 4.0}}, "'rope_scaling.rope_type' = \"su\" is unsupported"},
      {"rope_scaling", json{{"type", "linear"}}, "needs field 'rope_scaling.factor'"},
      {"rope_scaling", json{{"type", "linear"}, {"factor", 2.0}, {"beta_fast", 3.0}}, "'rope_scaling.beta_fast' is not a parameter"},
      {"rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}}, "needs field 'rope_scaling.high_freq_factor'"},
      {"rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0}}, "must exceed"},
      {"rope_scaling", json{{"rope_type", "longrope"}, {"short_factor", json::array({1.0})}, {"long_factor", json::array({1.0})}}, "has 1 values, the model needs head_dim / 2 = 32"},
      {"rope_scaling", json{{"rope_type", "yarn"}, {"factor", -4.0}}, "'rope_scaling.factor' must be finite and positive"},
      {"rope_scaling", json{{"rope_type", "yarn"}, {"partial_rotary_factor", 0.5}}, "'rope_scaling.partial_rotary_factor' = 0.5 is unsupported"},
      {"rope_scaling", json::array(), "'rope_scaling' must be an object"},
      {"use_sliding_window", true, "'use_sliding_window'"},
      {"hidden_act", "gelu", "'hidden_act'"},
      {"attention_dropout", 0.1, "'attention_dropout'"},
      {"model_type", "gemma", "'model_type' = \"gemma\" is unsupported"},
      {"head_dim", 128, "'head_dim' = 128"},
      {"num_key_value_heads", 4, "'num_key_value_heads' = 4 does not divide"},
      {"num_attention_heads", 13, "'num_attention_heads' = 13 does not divide"},
      {"hidden_size", 0, "'hidden_size' must be positive"},
      {"intermediate_size", -5, "'intermediate_size' must be positive"},
      {"num_hidden_layers", 2.5, "'num_hidden_layers' must be an integer"},
      {"vocab_size", "many", "'vocab_size' must be an integer"},
      {"vocab_size", 4294967296LL, "'vocab_size' = 4294967296 is too large"},
      {"rms_norm_eps", 0.0, "'rms_norm_eps' must be finite and positive"},
      {"rope_theta", -1.0, "'rope_theta' must be finite and positive"},
      {"tie_word_embeddings", 1, "'tie_word_embeddings' must be true or false"},
      {"layer_types", json::array({"full_attention", "sliding_attention"}), "'layer_types'"},
      {"rope_parameters", json{{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 5.0}}, "disagrees"},
      {"rope_parameters", json{{"rope_type", "default"}, {"rope_theta", 1e6}, {"factor", 2.0}},
       "'rope_parameters.factor'"},
      {"rope_parameters", json{{"rope_type", "default"}, {"rope_theta", 1e4}}, "disagrees"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.key);
    auto j = json::parse(qwen05b);
    j[c.key] = c.value;
    expect_error([&] { (void)parse_model_config(j, "cfg.json"); }, {"cfg.json", c.named});
  }
  // An odd head_dim cannot be rotated in pairs.
  auto j = json::parse(qwen05b);
  j["hidden_size"] = 14 * 3;
  j["head_dim"] = 3;
  expect_error([&] { (void)parse_model_config(j, "cfg.json"); }, {"'head_dim' = 3 must be even"});
  expect_error([&] { (void)parse_model_config(json::array(), "cfg.json"); }, {"JSON object"});
}

TEST_CASE("config files: unreadable, malformed, deeply nested") {
  io_test::temp_dir dir;
  expect_error([&] { (void)load_model_config(dir / "none.json"); }, {"none.json", "cannot open"});
  io_test::write_bytes(dir / "bad.json", "{\"hidden_size\": 32,");
  expect_error([&] { (void)load_model_config(dir / "bad.json"); }, {"bad.json", "malformed JSON"});
  io_test::write_bytes(dir / "deep.json", std::string(100, '[') + std::string(100, ']'));
  expect_error([&] { (void)load_model_config(dir / "deep.json"); }, {"deep.json", "deeper"});
}
