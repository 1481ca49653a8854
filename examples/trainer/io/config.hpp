// oomb trainer — the model configuration, read from and written as an HF config.json of the
// decoder families the trainer implements: qwen2, llama (Llama 3.x), mistral and qwen3.
// SPDX-License-Identifier: Apache-2.0
//
// The parser is strict on purpose: a field the model does not implement (sliding windows, another
// activation, dropout, dynamic RoPE) is rejected with its name, never silently ignored, because a
// model that quietly differs from the checkpoint's trains and evaluates something else. Fields the
// trainer does not need (architectures, dtype, bos/eos ids, ...) are ignored — and kept: the parsed
// object stays in model_config::source, and to_json() writes it back with only the fields that
// changed, so an export's config.json is the checkpoint's own. Both the transformers 4 layout
// (top-level rope_theta, rope_scaling) and the transformers 5 layout (rope_parameters,
// layer_types) are read (io/rope_config.hpp).
//
// What differs between the families, as transformers 5.17 builds them:
//   qwen2    biases on q, k, v; head_dim = hidden / heads
//   llama    attention_bias: biases on q, k, v and o; mlp_bias: on gate, up, down; head_dim free
//   mistral  no biases; head_dim free; sliding_window must be null (absent means 4096 to HF)
//   qwen3    attention_bias: on q, k, v and o; per-head RMSNorm of q and k before RoPE
//            (q_norm, k_norm over head_dim); head_dim free (absent means 128 to HF)
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
#include "trainer/io/rope_config.hpp"

namespace oomb_trainer {

/// The decoder families (HF model_type names).
enum class model_family { qwen2, llama, mistral, qwen3 };

inline const char* model_family_name(model_family f) noexcept {
  switch (f) {
    case model_family::llama: return "llama";
    case model_family::mistral: return "mistral";
    case model_family::qwen3: return "qwen3";
    case model_family::qwen2: break;
  }
  return "qwen2";
}

/// A decoder's shape. Every size is positive; head_dim is even; num_key_value_heads divides
/// num_attention_heads.
struct model_config {
  model_family family = model_family::qwen2;
  std::int32_t hidden_size = 0;
  std::int32_t intermediate_size = 0;
  std::int32_t num_hidden_layers = 0;
  std::int32_t num_attention_heads = 0;
  std::int32_t num_key_value_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t vocab_size = 0;
  double rms_norm_eps = 0.0;
  bool tie_word_embeddings = false;
  std::int64_t max_position_embeddings = 0;
  bool qkv_bias = true;   ///< q, k, v projections carry biases (qwen2; attention_bias elsewhere)
  bool o_bias = false;    ///< o projection carries a bias (llama and qwen3 attention_bias)
  bool mlp_bias = false;  ///< gate, up and down projections carry biases (llama mlp_bias)
  bool qk_norm = false;   ///< per-head RMSNorm of q and k before RoPE (qwen3)
  rope_config rope;
  /// The config.json object this was read from (null when built in code): to_json() keeps it.
  nlohmann::json source;

  /// Equal models: every field but `source`.
  friend bool operator==(const model_config& a, const model_config& b) {
    return a.family == b.family && a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
           a.num_hidden_layers == b.num_hidden_layers && a.num_attention_heads == b.num_attention_heads &&
           a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
           a.vocab_size == b.vocab_size && a.rms_norm_eps == b.rms_norm_eps &&
           a.tie_word_embeddings == b.tie_word_embeddings &&
           a.max_position_embeddings == b.max_position_embeddings && a.qkv_bias == b.qkv_bias &&
           a.o_bias == b.o_bias && a.mlp_bias == b.mlp_bias && a.qk_norm == b.qk_norm && a.rope == b.rope;
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

inline std::int32_t config_i32(const json& j, const char* name, const std::string& origin) {
  return static_cast<std::int32_t>(
      config_positive_int(j, name, origin, std::numeric_limits<std::int32_t>::max()));
}

inline bool config_bool(const json& j, const char* name, bool fallback, const std::string& origin) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  OOMB_CHECK(it->is_boolean(), oomb::format_error, origin, ": field '", name, "' must be true or false, got ",
             json_brief(*it));
  return it->get<bool>();
}

}  // namespace detail

/// Parses an HF config.json object of a qwen2, llama, mistral or qwen3 model (model_type absent:
/// qwen2). `origin` (usually the file name) prefixes every error. Throws oomb::format_error naming
/// the field that is missing, malformed or unsupported.
inline model_config parse_model_config(const nlohmann::json& j, const std::string& origin) {
  using detail::config_i32;
  using detail::json_brief;
  OOMB_CHECK(j.is_object(), oomb::format_error, origin, ": a config must be a JSON object, got ",
             j.type_name());

  model_config c;
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    const std::string t = it->is_string() ? it->get<std::string>() : "";
    if (t == "qwen2") c.family = model_family::qwen2;
    else if (t == "llama") c.family = model_family::llama;
    else if (t == "mistral") c.family = model_family::mistral;
    else if (t == "qwen3") c.family = model_family::qwen3;
    else
      OOMB_FAIL(oomb::format_error, origin, ": field 'model_type' = ", json_brief(*it),
                " is unsupported (qwen2, llama, mistral, qwen3)");
  }
  const model_family f = c.family;

  // Features the model does not implement: refused by name.
  if (f == model_family::qwen2 || f == model_family::qwen3)
    if (auto it = j.find("use_sliding_window"); it != j.end() && !it->is_null())
      OOMB_CHECK(it->is_boolean() && !it->get<bool>(), oomb::format_error, origin,
                 ": field 'use_sliding_window' = ", json_brief(*it),
                 " is unsupported (only false: full causal attention)");
  if (f == model_family::mistral) {
    auto it = j.find("sliding_window");
    OOMB_CHECK(it != j.end(), oomb::format_error, origin,
               ": field 'sliding_window' is missing, which transformers reads as a 4096-token window; "
               "only full causal attention is implemented: set it to null");
    OOMB_CHECK(it->is_null(), oomb::format_error, origin, ": field 'sliding_window' = ", json_brief(*it),
               " is unsupported: only full causal attention is implemented (a window would have each "
               "query skip keys the paged attention reads); set it to null");
  }
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    OOMB_CHECK(it->is_array(), oomb::format_error, origin, ": field 'layer_types' must be an array");
    for (const auto& t : *it)
      OOMB_CHECK(t.is_string() && t.get<std::string>() == "full_attention", oomb::format_error, origin,
                 ": field 'layer_types' holds ", json_brief(t), ", unsupported (only \"full_attention\")");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_string() && it->get<std::string>() == "silu", oomb::format_error, origin,
               ": field 'hidden_act' = ", json_brief(*it), " is unsupported (only \"silu\")");
  if (auto it = j.find("attention_dropout"); it != j.end() && !it->is_null())
    OOMB_CHECK(it->is_number() && it->get<double>() == 0.0, oomb::format_error, origin,
               ": field 'attention_dropout' = ", json_brief(*it), " is unsupported (only 0)");

  c.hidden_size = config_i32(j, "hidden_size", origin);
  c.intermediate_size = config_i32(j, "intermediate_size", origin);
  c.num_hidden_layers = config_i32(j, "num_hidden_layers", origin);
  c.num_attention_heads = config_i32(j, "num_attention_heads", origin);
  c.num_key_value_heads = config_i32(j, "num_key_value_heads", origin);
  c.vocab_size = config_i32(j, "vocab_size", origin);
  c.max_position_embeddings = detail::config_positive_int(
      j, "max_position_embeddings", origin, std::numeric_limits<std::int64_t>::max());
  c.rms_norm_eps = detail::config_positive_double(detail::config_field(j, "rms_norm_eps", origin),
                                                  "rms_norm_eps", origin);
  // HF's defaults: untied head in every family.
  c.tie_word_embeddings = detail::config_bool(j, "tie_word_embeddings", false, origin);

  // The projections' biases and the q/k norm, per family.
  if (f == model_family::llama || f == model_family::qwen3) {
    const bool attention_bias = detail::config_bool(j, "attention_bias", false, origin);
    c.qkv_bias = c.o_bias = attention_bias;
  } else {
    c.qkv_bias = f == model_family::qwen2;
    c.o_bias = false;
  }
  c.mlp_bias = f == model_family::llama && detail::config_bool(j, "mlp_bias", false, origin);
  c.qk_norm = f == model_family::qwen3;

  // head_dim: free in every family but qwen2 (whose attention computes it as hidden / heads);
  // absent, it is hidden / heads, except for qwen3 whose config defaults it to 128.
  const bool divides = c.hidden_size % c.num_attention_heads == 0;
  if (auto it = j.find("head_dim"); it != j.end() && !it->is_null()) {
    c.head_dim = config_i32(j, "head_dim", origin);
    if (f == model_family::qwen2) {
      OOMB_CHECK(divides && c.head_dim == c.hidden_size / c.num_attention_heads, oomb::format_error, origin,
                 ": field 'head_dim' = ", c.head_dim,
                 " is unsupported for qwen2: it must equal hidden_size / num_attention_heads = ",
                 divides ? std::to_string(c.hidden_size / c.num_attention_heads) : std::string("(not whole)"));
    }
  } else if (f == model_family::qwen3) {
    c.head_dim = 128;
  } else {
    OOMB_CHECK(divides, oomb::format_error, origin, ": field 'num_attention_heads' = ", c.num_attention_heads,
               " does not divide 'hidden_size' = ", c.hidden_size, " (and no 'head_dim' is given)");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  OOMB_CHECK(c.head_dim % 2 == 0, oomb::format_error, origin, ": field 'head_dim' = ", c.head_dim,
             " must be even (RoPE rotates pairs of dimensions)");
  OOMB_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, oomb::format_error, origin,
             ": field 'num_key_value_heads' = ", c.num_key_value_heads,
             " does not divide 'num_attention_heads' = ", c.num_attention_heads);
  c.rope = parse_rope_config(j, c.head_dim, c.max_position_embeddings, origin);
  c.source = j;
  return c;
}

/// The name of the first field where `a` and `b` differ, or "" when they are equal.
inline std::string first_difference(const model_config& a, const model_config& b) {
  if (a.family != b.family) return "model_type";
  if (a.hidden_size != b.hidden_size) return "hidden_size";
  if (a.intermediate_size != b.intermediate_size) return "intermediate_size";
  if (a.num_hidden_layers != b.num_hidden_layers) return "num_hidden_layers";
  if (a.num_attention_heads != b.num_attention_heads) return "num_attention_heads";
  if (a.num_key_value_heads != b.num_key_value_heads) return "num_key_value_heads";
  if (a.head_dim != b.head_dim) return "head_dim";
  if (a.vocab_size != b.vocab_size) return "vocab_size";
  if (a.rope.theta != b.rope.theta) return "rope_theta";
  if (a.rope != b.rope) return "rope_parameters";
  if (a.rms_norm_eps != b.rms_norm_eps) return "rms_norm_eps";
  if (a.tie_word_embeddings != b.tie_word_embeddings) return "tie_word_embeddings";
  if (a.max_position_embeddings != b.max_position_embeddings) return "max_position_embeddings";
  if (a.qkv_bias != b.qkv_bias || a.o_bias != b.o_bias) return "attention_bias";
  if (a.mlp_bias != b.mlp_bias) return "mlp_bias";
  if (a.qk_norm != b.qk_norm) return "model_type";
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

namespace detail {

/// What transformers' config class writes for `c` when there is no source file (a config built in
/// code), for the fields the model has.
inline nlohmann::json fresh_config_json(const model_config& c) {
  static constexpr const char* architectures[] = {"Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                                                  "Qwen3ForCausalLM"};
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({architectures[static_cast<int>(c.family)]});
  j["model_type"] = model_family_name(c.family);
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["rope_parameters"] = nlohmann::json::object();  // the transformers 5 layout (write_rope_config fills it)
  j["dtype"] = "float32";
  if (c.family == model_family::qwen2 || c.family == model_family::qwen3) j["use_sliding_window"] = false;
  if (c.family == model_family::mistral) j["sliding_window"] = nullptr;
  return j;
}

}  // namespace detail

/// The HF config.json of `c`: its source object (the file it was read from) with only the fields
/// that differ from it rewritten, or, for a config built in code, what transformers would write.
/// parse_model_config(to_json(c), ...) == c.
inline nlohmann::json to_json(const model_config& c) {
  const bool kept = c.source.is_object();
  nlohmann::json j = kept ? c.source : detail::fresh_config_json(c);
  model_config was;
  if (kept) was = parse_model_config(c.source, "the source config");
  auto set = [&](const char* key, auto value, bool differs) {
    if (!kept || differs) j[key] = value;
  };
  OOMB_EXPECTS(!kept || was.family == c.family, "to_json: a ", model_family_name(c.family),
               " config cannot be written over a ", model_family_name(was.family), " source");
  set("hidden_size", c.hidden_size, was.hidden_size != c.hidden_size);
  set("intermediate_size", c.intermediate_size, was.intermediate_size != c.intermediate_size);
  set("num_hidden_layers", c.num_hidden_layers, was.num_hidden_layers != c.num_hidden_layers);
  set("num_attention_heads", c.num_attention_heads, was.num_attention_heads != c.num_attention_heads);
  set("num_key_value_heads", c.num_key_value_heads, was.num_key_value_heads != c.num_key_value_heads);
  set("head_dim", c.head_dim, was.head_dim != c.head_dim);
  set("vocab_size", c.vocab_size, was.vocab_size != c.vocab_size);
  set("rms_norm_eps", c.rms_norm_eps, was.rms_norm_eps != c.rms_norm_eps);
  set("tie_word_embeddings", c.tie_word_embeddings, was.tie_word_embeddings != c.tie_word_embeddings);
  set("max_position_embeddings", c.max_position_embeddings, was.max_position_embeddings != c.max_position_embeddings);
  const bool biased = c.family == model_family::llama || c.family == model_family::qwen3;
  if (biased) set("attention_bias", c.o_bias, was.o_bias != c.o_bias);
  if (c.family == model_family::llama) set("mlp_bias", c.mlp_bias, was.mlp_bias != c.mlp_bias);
  OOMB_EXPECTS(c.qkv_bias == (c.family == model_family::qwen2 || (biased && c.o_bias)) && (biased || !c.o_bias) &&
                   c.mlp_bias == (c.family == model_family::llama && c.mlp_bias) &&
                   c.qk_norm == (c.family == model_family::qwen3),
               "to_json: the biases and norms of this config are not those of a ", model_family_name(c.family),
               " model");
  if (!kept || was.rope != c.rope || was.max_position_embeddings != c.max_position_embeddings)
    write_rope_config(j, c.rope);
  return j;
}

}  // namespace oomb_trainer
