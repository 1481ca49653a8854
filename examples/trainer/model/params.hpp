// oomb trainer — a Qwen2 model's parameters: one allocation carved into tensors with HF names.
// SPDX-License-Identifier: Apache-2.0
//
// The same class holds weights and gradients (and could hold optimizer moments): the layout depends
// only on the config, so a gradient is "the parameters' shape, zeroed". Tensors appear in HF's
// order and under HF's names; with tied embeddings there is no lm_head tensor and the head reads
// (and its gradient adds into) model.embed_tokens.weight.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/io/config.hpp"
#include "trainer/io/named_tensor.hpp"

namespace oomb_trainer {

/// One tensor's place in the allocation.
struct param_entry {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;
  std::size_t numel = 0;
};

/// Pointers to one decoder layer's tensors (HF layout: linear weights are [out][in]).
template <class T>
struct layer_params {
  T* input_norm;  ///< [H]
  T* q_w;         ///< [hq * d][H]
  T* q_b;         ///< [hq * d]
  T* k_w;         ///< [hkv * d][H]
  T* k_b;         ///< [hkv * d]
  T* v_w;         ///< [hkv * d][H]
  T* v_b;         ///< [hkv * d]
  T* o_w;         ///< [H][hq * d]
  T* post_norm;   ///< [H]
  T* gate_w;      ///< [I][H]
  T* up_w;        ///< [I][H]
  T* down_w;      ///< [H][I]
};

/// Where each tensor of a model of config `c` lives, in HF order.
class param_layout {
 public:
  static constexpr int per_layer = 12;

  explicit param_layout(const model_config& c) {
    OOMB_EXPECTS(c.num_hidden_layers > 0 && c.hidden_size > 0 && c.vocab_size > 0 &&
                     c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 &&
                     c.intermediate_size > 0,
                 "param_layout: every size of the config must be positive");
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    const std::int64_t qd = std::int64_t(c.num_attention_heads) * c.head_dim;
    const std::int64_t kvd = std::int64_t(c.num_key_value_heads) * c.head_dim;
    add("model.embed_tokens.weight", {V, H});
    for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {H});
      add(p + "self_attn.q_proj.weight", {qd, H});
      add(p + "self_attn.q_proj.bias", {qd});
      add(p + "self_attn.k_proj.weight", {kvd, H});
      add(p + "self_attn.k_proj.bias", {kvd});
      add(p + "self_attn.v_proj.weight", {kvd, H});
      add(p + "self_attn.v_proj.bias", {kvd});
      add(p + "self_attn.o_proj.weight", {H, qd});
      add(p + "post_attention_layernorm.weight", {H});
      add(p + "mlp.gate_proj.weight", {I, H});
      add(p + "mlp.up_proj.weight", {I, H});
      add(p + "mlp.down_proj.weight", {H, I});
    }
    add("model.norm.weight", {H});
    tied_ = c.tie_word_embeddings;
    if (!tied_) add("lm_head.weight", {V, H});
    layers_ = c.num_hidden_layers;
  }

  const std::vector<param_entry>& entries() const noexcept { return entries_; }
  std::size_t total() const noexcept { return total_; }
  bool tied() const noexcept { return tied_; }
  std::int32_t layers() const noexcept { return layers_; }

  std::size_t embed_offset() const { return entries_[0].offset; }
  std::size_t layer_entry(std::int32_t l, int k) const { return 1 + std::size_t(l) * per_layer + std::size_t(k); }
  std::size_t final_norm_entry() const { return 1 + std::size_t(layers_) * per_layer; }
  std::size_t lm_head_offset() const { return tied_ ? embed_offset() : entries_.back().offset; }

  /// Index of the tensor called `name`; throws invalid_argument when there is none.
  std::size_t find(const std::string& name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].name == name) return i;
    OOMB_FAIL(oomb::invalid_argument, "the model has no tensor '", name, "'");
  }

 private:
  void add(std::string name, std::vector<std::int64_t> shape) {
    param_entry e;
    e.name = std::move(name);
    e.numel = static_cast<std::size_t>(shape_numel(shape));
    e.shape = std::move(shape);
    // Each tensor starts on a 64-byte boundary (16 floats / 8 doubles): whole vector registers.
    total_ = (total_ + 15) / 16 * 16;
    e.offset = total_;
    total_ += e.numel;
    entries_.push_back(std::move(e));
  }

  std::vector<param_entry> entries_;
  std::size_t total_ = 0;
  bool tied_ = false;
  std::int32_t layers_ = 0;
};

/// Number of parameters (without the alignment padding between tensors).
inline std::uint64_t parameter_count(const param_layout& l) {
  std::uint64_t n = 0;
  for (const auto& e : l.entries()) n += e.numel;
  return n;
}

/// All tensors of a Qwen2 model in one zero-initialised allocation.
template <class T>
class qwen2_params {
 public:
  explicit qwen2_params(const model_config& c) : config_(c), layout_(c), data_(layout_.total(), T(0)) {}

  const model_config& config() const noexcept { return config_; }
  const param_layout& layout() const noexcept { return layout_; }
  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  std::size_t size() const noexcept { return data_.size(); }
  void zero() { std::fill(data_.begin(), data_.end(), T(0)); }

  T* embed() noexcept { return data_.data() + layout_.embed_offset(); }
  const T* embed() const noexcept { return data_.data() + layout_.embed_offset(); }
  /// The LM head [V][H]: the embedding table itself when tied.
  T* lm_head() noexcept { return data_.data() + layout_.lm_head_offset(); }
  const T* lm_head() const noexcept { return data_.data() + layout_.lm_head_offset(); }
  T* final_norm() noexcept { return at(layout_.final_norm_entry()); }
  const T* final_norm() const noexcept { return const_cast<qwen2_params*>(this)->final_norm(); }

  layer_params<T> layer(std::int32_t l) noexcept {
    T* p[param_layout::per_layer];
    for (int k = 0; k < param_layout::per_layer; ++k) p[k] = at(layout_.layer_entry(l, k));
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
  }
  layer_params<const T> layer(std::int32_t l) const noexcept {
    const auto m = const_cast<qwen2_params*>(this)->layer(l);
    return {m.input_norm, m.q_w, m.q_b, m.k_w, m.k_b, m.v_w, m.v_b, m.o_w, m.post_norm, m.gate_w, m.up_w, m.down_w};
  }

  /// Every tensor under its HF name (for checkpoints, the optimizer, gradient dumps).
  std::vector<named_tensor<T>> named() {
    std::vector<named_tensor<T>> out;
    for (const auto& e : layout_.entries()) out.push_back({e.name, e.shape, data_.data() + e.offset});
    return out;
  }
  std::vector<named_tensor<const T>> named() const {
    std::vector<named_tensor<const T>> out;
    for (const auto& e : layout_.entries()) out.push_back({e.name, e.shape, data_.data() + e.offset});
    return out;
  }
  /// The tensor called `name` (throws when there is none).
  T* tensor(const std::string& name) { return data_.data() + layout_.entries()[layout_.find(name)].offset; }

 private:
  T* at(std::size_t entry) noexcept { return data_.data() + layout_.entries()[entry].offset; }

  model_config config_;
  param_layout layout_;
  std::vector<T> data_;
};

/// Deterministic normal samples (Box–Muller over mt19937_64), the same on every platform.
class normal_sampler {
 public:
  explicit normal_sampler(std::uint64_t seed) : rng_(seed) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double two_pi = 6.283185307179586476925286766559;
    const double u1 = (double((rng_() >> 11) + 1)) * 0x1.0p-53;  // (0, 1]
    const double u2 = double(rng_() >> 11) * 0x1.0p-53;          // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(two_pi * u2);
    has_spare_ = true;
    return r * std::cos(two_pi * u2);
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

/// HF's Qwen2 initialisation: matrices and the embedding ~ N(0, std^2), biases 0, norm weights 1.
template <class T>
void init_qwen2(qwen2_params<T>& p, std::uint64_t seed, double std_dev = 0.02) {
  normal_sampler normal(seed);
  for (auto& t : p.named()) {
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (std::uint64_t i = 0; i < t.numel(); ++i)
      t.data[i] = norm ? T(1) : bias ? T(0) : static_cast<T>(std_dev * normal());
  }
}

/// A model in which every parameter matters (tests): matrices ~ N(0, std^2), biases ~ N(0, std^2),
/// norm weights 1 + N(0, 0.1^2).
template <class T>
void init_perturbed(qwen2_params<T>& p, std::uint64_t seed, double std_dev = 0.2) {
  normal_sampler normal(seed);
  for (auto& t : p.named()) {
    const bool norm = t.name.find("norm") != std::string::npos;
    for (std::uint64_t i = 0; i < t.numel(); ++i)
      t.data[i] = norm ? static_cast<T>(1.0 + 0.1 * normal()) : static_cast<T>(std_dev * normal());
  }
}

}  // namespace oomb_trainer
