// oomb trainer — the model configuration, read from and written as an HF Qwen2 config.json.
// SPDX-License-Identifier: Apache-2.0
//
// The parser is strict on purpose: a field the model does not implement (rope scaling, sliding
// windows, another activation, dropout) is rejected with its name, never silently ignored, because
// a model that quietly differs from the checkpoint's trains and evaluates something else.
// Fields the trainer does not need (architectures, torch_dtype, bos/eos ids, ...) are ignored.
// Both the transformers 4 layout (top-level rope_theta, rope_scaling) and the transformers 5
// layout (rope_parameters {rope_type, rope_theta}, layer_types) are read.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"
#include "trainer/io/json_util.hpp"

namespace oomb_trainer {

/// The Qwen2 decoder's shape. Every size is positive; head_dim == hidden_size / num_attention_heads;
/// num_key_value_heads divides num_attention_heads.
struct model_config {
  std::int32_t hidden_size = 0;
  std::int32_t intermediate_size = 0;
  std::int32_t num_hidden_layers = 0;
  std::int32_t num_attention_heads = 0;
  std::int32_t num_key_value_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t vocab_size = 0;
  double rope_theta = 0.0;
  double rms_norm_eps = 0.0;
  bool tie_word_embeddings = false;
  std::int64_t max_position_embeddings = 0;

  friend bool operator==(const model_config& a, const model_config& b) {
    return a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
           a.num_hidden_layers == b.num_hidden_layers &&
           a.num_attention_heads == b.num_attention_heads &&
           a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
           a.vocab_size == b.vocab_size && a.rope_theta == b.rope_theta &&
           a.rms_norm_eps == b.rms_norm_eps && a.tie_word_embeddings == b.tie_word_embeddings &&
           a.max_position_embeddings == b.max_position_embeddings;
  }
  friend bool operator!=(const model_config& a, const model_config& b) { return !(a == b); }
};

namespace detail {

using json = nlohmann::json;

inline const json& config_field(const json& j, const char* name, const std::string& origin) {
  auto it = j.find(name);
  OOMB_CHECK(it != j.end() && !it->is_null(), oomb::format_error, origin,
             ": required field '", name, "' is missing");
  return *it;
}

// An integer field in [1, max]; floats such as 896.0 are refused (HF never writes them).
inline std::int64_t config_positive_int(const json& j, const char* name, const std::string& origin,
                                        std::int64_t max) {
  const json& v = config_field(j, name, origin);
  OOMB_CHECK(v.is_number_integer(), oomb::format_error, origin, ": field '", name,
             "' must be an integer, got ", json_brief(v));
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    OOMB_CHECK(u <= static_cast<std::uint64_t>(max), oomb::format_error, origin, ": field '", name,
               "' = ", u, " is too large (at most ", max, ")");
    x = static_cast<std::int64_t>(u);
  } else {
    x = v.get<std::int64_t>();
  }
  OOMB_CHECK(x > 0, oomb::format_error, origin, ": field '", name, "' must be positive, got ", x);
  OOMB_CHECK(x <= max, oomb::format_error, origin, ": field '", name, "' = ", x,
             " is too large (at most ", max, ")");
  return x;
}

inline double config_positive_double(const json& v, const char* name, const std::string& origin) {
  OOMB_CHECK(v.is_number(), oomb::format_error, origin, ": field '", name,
             "' must be a number, got ", json_brief(v));
  const double x = v.get<double>();
  OOMB_CHECK(std::isfinite(x) && x > 0.0, oomb::format_error, origin, ": field '", name,
             "' must be finite and positive, got ", x);
  return x;
}

// rope_theta from the top level (transformers 4) or from rope_parameters (transformers 5);
// only plain RoPE ("default") is implemented, and the two places must agree when both are given.
inline double config_rope_theta(const json& j, const std::string& origin) {
  double theta = 0.0;
  bool have = false;
  if (auto it = j.find("rope_theta"); it != j.end() && !it->is_null()) {
    theta = config_positive_double(*it, "rope_theta", origin);
    have = true;
  }
  if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    OOMB_CHECK(rp->is_object(), oomb::format_error, origin,
               ": field 'rope_parameters' must be an object, got ", json_brief(*rp));
    // The kind of RoPE first: it explains any extra parameters better than they do themselves.
    if (auto rt = rp->find("rope_type"); rt != rp->end() && !rt->is_null())
      OOMB_CHECK(rt->is_string() && rt->get<std::string>() == "default", oomb::format_error, origin,
                 ": field 'rope_parameters.rope_type' = ", json_brief(*rt),
                 " is unsupported (only \"default\": plain RoPE)");
    for (const auto& item : rp->items()) {
      const std::string& k = item.key();
      if (k == "rope_type") {
        continue;
      } else if (k == "rope_theta") {
        const double t = config_positive_double(item.value(), "rope_parameters.rope_theta", origin);
        OOMB_CHECK(!have || t == theta, oomb::format_error, origin,
                   ": field 'rope_parameters.rope_theta' = ", t, " disagrees with 'rope_theta' = ", theta);
        theta = t;
        have = true;
      } else {
        OOMB_FAIL(oomb::format_error, origin, ": field 'rope_parameters.", k,
                  "' is unsupported (plain RoPE takes only rope_type and rope_theta)");
      }
    }
  }
  OOMB_CHECK(have, oomb::format_error, origin, ": required field 'rope_theta' is missing",
             " (neither at the top level nor in 'rope_parameters')");
  return theta;
}

inline std::int32_t config_i32(const json& j, const char* name, const std::string& origin) {
  return static_cast<std::int32_t>(
      config_positive_int(j, name, origin, std::numeric_limits<std::int32_t>::max()));
}

}  // namespace detail

/// Parses an HF Qwen2 config.json object. `origin` (usually the file name) prefixes every error.
/// Throws oomb::format_error naming the field that is missing, malformed or unsupported.
inline model_config parse_model_config(const nlohmann::json& j, const std::string& origin) {
  using detail::config_i32;
  OOMB_CHECK(j.is_object(), oomb::format_error, origin, ": a config must be a JSON object, got ",
             j.type_name());

  // Features the model does not implement: refused by name.
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_string() && it->get<std::string>() == "qwen2", oomb::format_error, origin,
               ": field 'model_type' = ", detail::json_brief(*it), " is unsupported (only \"qwen2\")");
  if (auto it = j.find("rope_scaling"); it != j.end())
    OOMB_CHECK(it->is_null(), oomb::format_error, origin, ": field 'rope_scaling' = ", detail::json_brief(*it),
               " is unsupported (only null: plain RoPE)");
  if (auto it = j.find("use_sliding_window"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_boolean() && !it->get<bool>(), oomb::format_error, origin,
               ": field 'use_sliding_window' = ", detail::json_brief(*it),
               " is unsupported (only false: full causal attention)");
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    OOMB_CHECK(it->is_array(), oomb::format_error, origin, ": field 'layer_types' must be an array");
    for (const auto& t : *it)
      OOMB_CHECK(t.is_string() && t.get<std::string>() == "full_attention", oomb::format_error, origin,
                 ": field 'layer_types' holds ", detail::json_brief(t),
                 ", unsupported (only \"full_attention\")");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_string() && it->get<std::string>() == "silu", oomb::format_error, origin,
               ": field 'hidden_act' = ", detail::json_brief(*it), " is unsupported (only \"silu\")");
  if (auto it = j.find("attention_dropout"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_number() && it->get<double>() == 0.0, oomb::format_error, origin,
               ": field 'attention_dropout' = ", detail::json_brief(*it), " is unsupported (only 0)");

  model_config c;
  c.hidden_size = config_i32(j, "hidden_size", origin);
  c.intermediate_size = config_i32(j, "intermediate_size", origin);
  c.num_hidden_layers = config_i32(j, "num_hidden_layers", origin);
  c.num_attention_heads = config_i32(j, "num_attention_heads", origin);
  c.num_key_value_heads = config_i32(j, "num_key_value_heads", origin);
  c.vocab_size = config_i32(j, "vocab_size", origin);
  c.max_position_embeddings = detail::config_positive_int(
      j, "max_position_embeddings", origin, std::numeric_limits<std::int64_t>::max());
  c.rope_theta = detail::config_rope_theta(j, origin);
  c.rms_norm_eps = detail::config_positive_double(detail::config_field(j, "rms_norm_eps", origin),
                                                  "rms_norm_eps", origin);

  // HF's Qwen2Config defaults: untied head, head_dim = hidden / heads.
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    OOMB_CHECK(it->is_boolean(), oomb::format_error, origin,
               ": field 'tie_word_embeddings' must be true or false, got ", detail::json_brief(*it));
    c.tie_word_embeddings = it->get<bool>();
  }
  OOMB_CHECK(c.hidden_size % c.num_attention_heads == 0, oomb::format_error, origin,
             ": field 'num_attention_heads' = ", c.num_attention_heads,
             " does not divide 'hidden_size' = ", c.hidden_size);
  const std::int32_t derived_head_dim = c.hidden_size / c.num_attention_heads;
  c.head_dim = derived_head_dim;
  if (auto it = j.find("head_dim"); it != j.end() && !it->is_null()) {
    c.head_dim = config_i32(j, "head_dim", origin);
    OOMB_CHECK(c.head_dim == derived_head_dim, oomb::format_error, origin, ": field 'head_dim' = ",
               c.head_dim, " is unsupported: it must equal hidden_size / num_attention_heads = ",
               derived_head_dim);
  }
  OOMB_CHECK(c.head_dim % 2 == 0, oomb::format_error, origin, ": field 'head_dim' = ", c.head_dim,
             " must be even (RoPE rotates pairs of dimensions)");
  OOMB_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, oomb::format_error, origin,
             ": field 'num_key_value_heads' = ", c.num_key_value_heads,
             " does not divide 'num_attention_heads' = ", c.num_attention_heads);
  return c;
}

/// The name of the first field where `a` and `b` differ, or "" when they are equal.
inline std::string first_difference(const model_config& a, const model_config& b) {
  if (a.hidden_size != b.hidden_size) return "hidden_size";
  if (a.intermediate_size != b.intermediate_size) return "intermediate_size";
  if (a.num_hidden_layers != b.num_hidden_layers) return "num_hidden_layers";
  if (a.num_attention_heads != b.num_attention_heads) return "num_attention_heads";
  if (a.num_key_value_heads != b.num_key_value_heads) return "num_key_value_heads";
  if (a.head_dim != b.head_dim) return "head_dim";
  if (a.vocab_size != b.vocab_size) return "vocab_size";
  if (a.rope_theta != b.rope_theta) return "rope_theta";
  if (a.rms_norm_eps != b.rms_norm_eps) return "rms_norm_eps";
  if (a.tie_word_embeddings != b.tie_word_embeddings) return "tie_word_embeddings";
  if (a.max_position_embeddings != b.max_position_embeddings) return "max_position_embeddings";
  return "";
}

/// Reads and parses a config.json file; errors name the file (and the field).
inline model_config load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OOMB_CHECK(in.good(), oomb::format_error, path, ": cannot open the config file");
  nlohmann::json j;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  j = detail::parse_json_bounded(text.data(), text.data() + text.size(), 64, path, "config");
  return parse_model_config(j, path);
}

/// The HF Qwen2 config.json for `c` (what transformers' Qwen2Config writes, for the fields the
/// model has); parse_model_config(to_json(c), ...) == c.
inline nlohmann::json to_json(const model_config& c) {
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({"Qwen2ForCausalLM"});
  j["model_type"] = "qwen2";
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_scaling"] = nullptr;
  j["use_sliding_window"] = false;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace oomb_trainer
