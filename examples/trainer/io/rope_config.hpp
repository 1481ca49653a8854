// oomb trainer — a model's rotary position embedding as its HF config.json states it: rope_theta
// and the context-extension scaling (transformers 4's `rope_scaling`, transformers 5's
// `rope_parameters`), read strictly and written back in the layout it came in.
// SPDX-License-Identifier: Apache-2.0
//
// The types transformers implements for training-time use are taken: "default" (plain RoPE),
// "linear", "yarn", "llama3" and "longrope". "dynamic" (dynamic NTK) is refused: it recomputes
// the frequencies from the length of each sequence it is given, so a model trained with it at one
// length is another function at every other length. The frequencies themselves are computed by
// model/rope_frequencies.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"
#include "trainer/io/json_util.hpp"

namespace oomb_trainer {

/// The kinds of RoPE (HF's rope_type names: "default", "linear", "yarn", "llama3", "longrope").
enum class rope_kind { plain, linear, yarn, llama3, longrope };

inline const char* rope_kind_name(rope_kind k) noexcept {
  switch (k) {
    case rope_kind::linear: return "linear";
    case rope_kind::yarn: return "yarn";
    case rope_kind::llama3: return "llama3";
    case rope_kind::longrope: return "longrope";
    case rope_kind::plain: break;
  }
  return "default";
}

/// RoPE's parameters, resolved: every value transformers would derive (factor from the lengths,
/// original_max_position_embeddings from max_position_embeddings) is filled in.
struct rope_config {
  rope_kind kind = rope_kind::plain;
  double theta = 0.0;
  /// linear, yarn, llama3, longrope: the context extension factor.
  double factor = 1.0;
  /// yarn, llama3, longrope: the context length the model was pre-trained at.
  std::int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 0.0, high_freq_factor = 0.0;  ///< llama3
  double beta_fast = 32.0, beta_slow = 1.0;               ///< yarn
  bool truncate = true;                                   ///< yarn: integer correction range
  std::optional<double> mscale, mscale_all_dim;           ///< yarn (DeepSeek's attention factor)
  /// yarn, longrope: the factor on cos and sin; unset: derived (model/rope_frequencies.hpp).
  std::optional<double> attention_factor;
  std::vector<double> short_factor, long_factor;  ///< longrope: [head_dim / 2] each

  friend bool operator==(const rope_config& a, const rope_config& b) {
    return a.kind == b.kind && a.theta == b.theta && a.factor == b.factor &&
           a.original_max_position_embeddings == b.original_max_position_embeddings &&
           a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
           a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.truncate == b.truncate &&
           a.mscale == b.mscale && a.mscale_all_dim == b.mscale_all_dim && a.attention_factor == b.attention_factor &&
           a.short_factor == b.short_factor && a.long_factor == b.long_factor;
  }
  friend bool operator!=(const rope_config& a, const rope_config& b) { return !(a == b); }

  /// True for the kinds that extend the context past the pre-training length.
  bool scaled() const noexcept { return kind != rope_kind::plain; }
  /// "yarn (factor 4, from 32768)" and the like, for banners and errors.
  std::string describe() const {
    std::string s = rope_kind_name(kind);
    if (kind == rope_kind::plain) return "plain RoPE (theta " + json_number(theta) + ")";
    s += " (theta " + json_number(theta) + ", factor " + json_number(factor);
    if (kind != rope_kind::linear) s += ", from " + std::to_string(original_max_position_embeddings) + " tokens";
    return s + ")";
  }

 private:
  static std::string json_number(double x) { return nlohmann::json(x).dump(); }
};

namespace detail {

using json = nlohmann::json;

inline double rope_number(const json& v, const std::string& name, const std::string& origin, bool positive = true) {
  OOMB_CHECK(v.is_number(), oomb::format_error, origin, ": field '", name, "' must be a number, got ", json_brief(v));
  const double x = v.get<double>();
  OOMB_CHECK(std::isfinite(x) && (!positive || x > 0.0), oomb::format_error, origin, ": field '", name,
             "' must be finite", positive ? " and positive" : "", ", got ", x);
  return x;
}

inline std::vector<double> rope_factor_list(const json& v, const std::string& name, std::int32_t head_dim,
                                            const std::string& origin) {
  OOMB_CHECK(v.is_array(), oomb::format_error, origin, ": field '", name, "' must be an array of numbers, got ",
             json_brief(v));
  OOMB_CHECK(v.size() == std::size_t(head_dim / 2), oomb::format_error, origin, ": field '", name, "' has ",
             v.size(), " values, the model needs head_dim / 2 = ", head_dim / 2);
  std::vector<double> out;
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(rope_number(v[i], name + "[" + std::to_string(i) + "]", origin));
  return out;
}

}  // namespace detail

/// Reads a RoPE from the config object `j`: top-level rope_theta with rope_scaling (transformers 4)
/// and/or rope_parameters (transformers 5); where both give a value they must agree. `head_dim` and
/// `max_position_embeddings` are the model's (longrope's factor lists and the derived lengths need
/// them). Throws oomb::format_error naming the field.
inline rope_config parse_rope_config(const nlohmann::json& j, std::int32_t head_dim,
                                     std::int64_t max_position_embeddings, const std::string& origin) {
  using detail::json;
  using detail::json_brief;
  rope_config r;
  bool have_theta = false;
  if (auto it = j.find("rope_theta"); it != j.end() && !it->is_null()) {
    r.theta = detail::rope_number(*it, "rope_theta", origin);
    have_theta = true;
  }
  // The two places a scaling may be stated; a transformers 5 file may carry both.
  std::vector<std::pair<std::string, const json*>> blocks;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      OOMB_CHECK(it->is_object(), oomb::format_error, origin, ": field '", key, "' must be an object, got ",
                 json_brief(*it));
      blocks.emplace_back(key, &*it);
    }
  std::optional<rope_config> first;
  std::string first_key;
  for (const auto& place : blocks) {
    const std::string& key = place.first;  // (a lambda below captures it: no structured binding in C++17)
    rope_config b;
    b.theta = r.theta;
    const json& p = *place.second;
    auto name = [&](const std::string& k) { return key + "." + k; };
    // The kind first: it explains the other fields better than they do themselves.
    std::string type = "default";
    for (const char* k : {"rope_type", "type"})
      if (auto t = p.find(k); t != p.end() && !t->is_null()) {
        OOMB_CHECK(t->is_string(), oomb::format_error, origin, ": field '", name(k), "' must be a string, got ",
                   json_brief(*t));
        OOMB_CHECK(type == "default" || type == t->get<std::string>(), oomb::format_error, origin, ": fields '",
                   name("rope_type"), "' and '", name("type"), "' disagree");
        type = t->get<std::string>();
      }
    if (type == "default") b.kind = rope_kind::plain;
    else if (type == "linear") b.kind = rope_kind::linear;
    else if (type == "yarn") b.kind = rope_kind::yarn;
    else if (type == "llama3") b.kind = rope_kind::llama3;
    else if (type == "longrope") b.kind = rope_kind::longrope;
    else if (type == "dynamic")
      OOMB_FAIL(oomb::format_error, origin, ": field '", name("rope_type"),
                "' = \"dynamic\" cannot be trained: dynamic NTK rescales the frequencies with the length of "
                "each sequence, so the model learns a different function at every length (use \"yarn\" or "
                "\"linear\" to extend the context)");
    else
      OOMB_FAIL(oomb::format_error, origin, ": field '", name("rope_type"), "' = ", json_brief(json(type)),
                " is unsupported (default, linear, yarn, llama3, longrope)");

    const auto kind = b.kind;
    bool have_factor = false, have_low = false, have_high = false, have_short = false, have_long = false;
    for (const auto& item : p.items()) {
      const std::string& k = item.key();
      const json& v = item.value();
      if (k == "rope_type" || k == "type" || v.is_null()) continue;
      auto takes = [&](std::initializer_list<rope_kind> kinds) {
        for (auto x : kinds)
          if (x == kind) return;
        OOMB_FAIL(oomb::format_error, origin, ": field '", name(k), "' is not a parameter of rope_type \"", type,
                  "\"");
      };
      if (k == "rope_theta") {
        const double t = detail::rope_number(v, name(k), origin);
        OOMB_CHECK(!have_theta || t == r.theta, oomb::format_error, origin, ": field '", name(k), "' = ", t,
                   " disagrees with 'rope_theta' = ", r.theta);
        b.theta = t;
      } else if (k == "partial_rotary_factor") {
        OOMB_CHECK(v.is_number() && v.get<double>() == 1.0, oomb::format_error, origin, ": field '", name(k),
                   "' = ", json_brief(v), " is unsupported (only 1: every dimension rotates)");
      } else if (k == "factor") {
        takes({rope_kind::linear, rope_kind::yarn, rope_kind::llama3, rope_kind::longrope});
        b.factor = detail::rope_number(v, name(k), origin);
        have_factor = true;
      } else if (k == "original_max_position_embeddings") {
        takes({rope_kind::yarn, rope_kind::llama3, rope_kind::longrope});
        OOMB_CHECK(v.is_number_integer() && v.get<std::int64_t>() > 0, oomb::format_error, origin, ": field '",
                   name(k), "' must be a positive integer, got ", json_brief(v));
        b.original_max_position_embeddings = v.get<std::int64_t>();
      } else if (k == "low_freq_factor" || k == "high_freq_factor") {
        takes({rope_kind::llama3});
        (k == "low_freq_factor" ? b.low_freq_factor : b.high_freq_factor) = detail::rope_number(v, name(k), origin);
        (k == "low_freq_factor" ? have_low : have_high) = true;
      } else if (k == "beta_fast" || k == "beta_slow") {
        takes({rope_kind::yarn});
        (k == "beta_fast" ? b.beta_fast : b.beta_slow) = detail::rope_number(v, name(k), origin);
      } else if (k == "truncate") {
        takes({rope_kind::yarn});
        OOMB_CHECK(v.is_boolean(), oomb::format_error, origin, ": field '", name(k), "' must be true or false");
        b.truncate = v.get<bool>();
      } else if (k == "mscale" || k == "mscale_all_dim") {
        takes({rope_kind::yarn});
        (k == "mscale" ? b.mscale : b.mscale_all_dim) = detail::rope_number(v, name(k), origin, false);
      } else if (k == "attention_factor") {
        takes({rope_kind::yarn, rope_kind::longrope});
        b.attention_factor = detail::rope_number(v, name(k), origin);
      } else if (k == "short_factor" || k == "long_factor") {
        takes({rope_kind::longrope});
        (k == "short_factor" ? b.short_factor : b.long_factor) = detail::rope_factor_list(v, name(k), head_dim, origin);
        (k == "short_factor" ? have_short : have_long) = true;
      } else {
        OOMB_FAIL(oomb::format_error, origin, ": field '", name(k), "' is unsupported");
      }
    }
    // What transformers derives when a field is absent.
    if (kind != rope_kind::plain && kind != rope_kind::linear) {
      // Phi-3 style: a top-level original_max_position_embeddings takes priority (as transformers).
      if (auto it = j.find("original_max_position_embeddings"); it != j.end() && !it->is_null()) {
        OOMB_CHECK(it->is_number_integer() && it->get<std::int64_t>() > 0, oomb::format_error, origin,
                   ": field 'original_max_position_embeddings' must be a positive integer, got ", json_brief(*it));
        b.original_max_position_embeddings = it->get<std::int64_t>();
      }
      if (b.original_max_position_embeddings == 0) b.original_max_position_embeddings = max_position_embeddings;
    }
    const char* need = nullptr;
    if (kind == rope_kind::linear && !have_factor) need = "factor";
    if (kind == rope_kind::llama3 && !have_factor) need = "factor";
    if (kind == rope_kind::llama3 && !have_low) need = "low_freq_factor";
    if (kind == rope_kind::llama3 && !have_high) need = "high_freq_factor";
    if (kind == rope_kind::longrope && !have_short) need = "short_factor";
    if (kind == rope_kind::longrope && !have_long) need = "long_factor";
    OOMB_CHECK(need == nullptr, oomb::format_error, origin, ": rope_type \"", type, "\" needs field '", name(need),
               "'");
    if (!have_factor && (kind == rope_kind::yarn || kind == rope_kind::longrope))
      b.factor = double(max_position_embeddings) / double(b.original_max_position_embeddings);
    if (kind == rope_kind::llama3)
      OOMB_CHECK(b.high_freq_factor > b.low_freq_factor, oomb::format_error, origin, ": field '",
                 name("high_freq_factor"), "' = ", b.high_freq_factor, " must exceed 'low_freq_factor' = ",
                 b.low_freq_factor);
    if (first && b.theta == 0.0) b.theta = first->theta;
    if (first && first->theta == 0.0) first->theta = b.theta;
    if (!first) {
      first = b;
      first_key = key;
    } else {
      OOMB_CHECK(*first == b, oomb::format_error, origin, ": fields '", first_key, "' and '", key,
                 "' describe different RoPE");
    }
  }
  if (first) r = *first;
  OOMB_CHECK(r.theta > 0.0, oomb::format_error, origin, ": required field 'rope_theta' is missing",
             " (neither at the top level nor in 'rope_parameters')");
  return r;
}

/// Writes `r` into the config object `j` in the layout `j` uses: rope_parameters when it has that
/// field (transformers 5), top-level rope_theta and rope_scaling otherwise. Every resolved value is
/// written, so the file means the same whatever max_position_embeddings says.
inline void write_rope_config(nlohmann::json& j, const rope_config& r) {
  nlohmann::json p = nlohmann::json::object();
  p["rope_type"] = rope_kind_name(r.kind);
  if (r.kind != rope_kind::plain) p["factor"] = r.factor;
  if (r.kind == rope_kind::yarn || r.kind == rope_kind::llama3 || r.kind == rope_kind::longrope)
    p["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.kind == rope_kind::llama3) {
    p["low_freq_factor"] = r.low_freq_factor;
    p["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.kind == rope_kind::yarn) {
    p["beta_fast"] = r.beta_fast;
    p["beta_slow"] = r.beta_slow;
    p["truncate"] = r.truncate;
    if (r.mscale) p["mscale"] = *r.mscale;
    if (r.mscale_all_dim) p["mscale_all_dim"] = *r.mscale_all_dim;
  }
  if (r.attention_factor) p["attention_factor"] = *r.attention_factor;
  if (r.kind == rope_kind::longrope) {
    p["short_factor"] = r.short_factor;
    p["long_factor"] = r.long_factor;
  }
  j.erase("original_max_position_embeddings");  // now inside the block (a Phi-3 style top-level copy would win)
  if (j.contains("rope_parameters")) {
    p["rope_theta"] = r.theta;
    j["rope_parameters"] = p;
    j.erase("rope_scaling");
    j.erase("rope_theta");
  } else {
    j["rope_theta"] = r.theta;
    if (r.kind == rope_kind::plain)
      j["rope_scaling"] = nullptr;
    else
      j["rope_scaling"] = p;
  }
}

}  // namespace oomb_trainer
