// oomb trainer — a decoder's parameters: one allocation carved into tensors with HF names.
// SPDX-License-Identifier: Apache-2.0
//
// The same class holds weights and gradients (and could hold optimizer moments): the layout depends
// only on the config, so a gradient is "the parameters' shape, zeroed". Tensors appear under HF's
// names; with tied embeddings there is no lm_head tensor and the head reads (and its gradient adds
// into) model.embed_tokens.weight. Which tensors a layer has depends on the family
// (io/config.hpp): q/k/v biases, an o bias, MLP biases, q/k norms; a tensor the model lacks is a
// null pointer in layer_params.
#pragma once

#include <algorithm>
#include <array>
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

/// The tensors a decoder layer may have, in the order they are laid out (for qwen2: the order of
/// every earlier version of this trainer, so seeded initialisations stay the same).
enum class layer_tensor : int {
  input_norm, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, o_b, post_norm,
  gate_w, gate_b, up_w, up_b, down_w, down_b,
};
inline constexpr int layer_tensors = 18;

/// Pointers to one decoder layer's tensors (HF layout: linear weights are [out][in]); null where
/// the model has no such tensor.
template <class T>
struct layer_params {
  T* input_norm;  ///< [H]
  T* q_w;         ///< [hq * d][H]
  T* q_b;         ///< [hq * d]
  T* k_w;         ///< [hkv * d][H]
  T* k_b;         ///< [hkv * d]
  T* v_w;         ///< [hkv * d][H]
  T* v_b;         ///< [hkv * d]
  T* q_norm;      ///< [d] (qwen3)
  T* k_norm;      ///< [d] (qwen3)
  T* o_w;         ///< [H][hq * d]
  T* o_b;         ///< [H]
  T* post_norm;   ///< [H]
  T* gate_w;      ///< [I][H]
  T* gate_b;      ///< [I]
  T* up_w;        ///< [I][H]
  T* up_b;        ///< [I]
  T* down_w;      ///< [H][I]
  T* down_b;      ///< [H]
};

/// Where each tensor of a model of config `c` lives.
class param_layout {
 public:
  explicit param_layout(const model_config& c) {
    OOMB_EXPECTS(c.num_hidden_layers > 0 && c.hidden_size > 0 && c.vocab_size > 0 &&
                     c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 &&
                     c.intermediate_size > 0,
                 "param_layout: every size of the config must be positive");
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, d = c.head_dim;
    const std::int64_t qd = std::int64_t(c.num_attention_heads) * d;
    const std::int64_t kvd = std::int64_t(c.num_key_value_heads) * d;
    add("model.embed_tokens.weight", {V, H});
    slots_.assign(std::size_t(c.num_hidden_layers) * layer_tensors, -1);
    for (std::int32_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      auto put = [&](layer_tensor k, const std::string& name, std::vector<std::int64_t> shape) {
        slots_[std::size_t(l) * layer_tensors + std::size_t(k)] = static_cast<std::int32_t>(entries_.size());
        add(p + name, std::move(shape));
      };
      using k = layer_tensor;
      put(k::input_norm, "input_layernorm.weight", {H});
      put(k::q_w, "self_attn.q_proj.weight", {qd, H});
      if (c.qkv_bias) put(k::q_b, "self_attn.q_proj.bias", {qd});
      put(k::k_w, "self_attn.k_proj.weight", {kvd, H});
      if (c.qkv_bias) put(k::k_b, "self_attn.k_proj.bias", {kvd});
      put(k::v_w, "self_attn.v_proj.weight", {kvd, H});
      if (c.qkv_bias) put(k::v_b, "self_attn.v_proj.bias", {kvd});
      if (c.qk_norm) {
        put(k::q_norm, "self_attn.q_norm.weight", {d});
        put(k::k_norm, "self_attn.k_norm.weight", {d});
      }
      put(k::o_w, "self_attn.o_proj.weight", {H, qd});
      if (c.o_bias) put(k::o_b, "self_attn.o_proj.bias", {H});
      put(k::post_norm, "post_attention_layernorm.weight", {H});
      put(k::gate_w, "mlp.gate_proj.weight", {I, H});
      if (c.mlp_bias) put(k::gate_b, "mlp.gate_proj.bias", {I});
      put(k::up_w, "mlp.up_proj.weight", {I, H});
      if (c.mlp_bias) put(k::up_b, "mlp.up_proj.bias", {I});
      put(k::down_w, "mlp.down_proj.weight", {H, I});
      if (c.mlp_bias) put(k::down_b, "mlp.down_proj.bias", {H});
    }
    final_norm_ = entries_.size();
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
  /// True when layer tensor `k` exists (the same in every layer).
  bool has(layer_tensor k) const noexcept { return slots_[std::size_t(k)] >= 0; }
  /// The entry of tensor `k` of layer `l`; throws invalid_argument when the model has none.
  std::size_t layer_entry(std::int32_t l, layer_tensor k) const {
    OOMB_EXPECTS(l >= 0 && l < layers_, "param_layout: no layer ", l);
    const std::int32_t e = slots_[std::size_t(l) * layer_tensors + std::size_t(k)];
    OOMB_EXPECTS(e >= 0, "param_layout: the model's layers have no tensor ", int(k));
    return std::size_t(e);
  }
  std::size_t final_norm_entry() const { return final_norm_; }
  std::size_t lm_head_offset() const { return tied_ ? embed_offset() : entries_.back().offset; }

  /// The tensors of layer `l` in the allocation at `base` (host or device memory).
  template <class X>
  layer_params<X> layer_at(X* base, std::int32_t l) const noexcept {
    std::array<X*, layer_tensors> p{};
    for (int k = 0; k < layer_tensors; ++k) {
      const std::int32_t e = slots_[std::size_t(l) * layer_tensors + std::size_t(k)];
      p[std::size_t(k)] = e < 0 ? nullptr : base + entries_[std::size_t(e)].offset;
    }
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
            p[9], p[10], p[11], p[12], p[13], p[14], p[15], p[16], p[17]};
  }

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
  std::vector<std::int32_t> slots_;  // [layer][layer_tensor] -> entry, -1: none
  std::size_t final_norm_ = 0;
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

/// All tensors of a model in one zero-initialised allocation.
template <class T>
class model_params {
 public:
  explicit model_params(const model_config& c) : config_(c), layout_(c), data_(layout_.total(), T(0)) {}

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
  const T* final_norm() const noexcept { return const_cast<model_params*>(this)->final_norm(); }

  layer_params<T> layer(std::int32_t l) noexcept { return layout_.layer_at(data_.data(), l); }
  layer_params<const T> layer(std::int32_t l) const noexcept { return layout_.layer_at(data_.data(), l); }

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

/// HF's initialisation (every family here): matrices and the embedding ~ N(0, std^2), biases 0,
/// norm weights 1.
template <class T>
void init_hf(model_params<T>& p, std::uint64_t seed, double std_dev = 0.02) {
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
void init_perturbed(model_params<T>& p, std::uint64_t seed, double std_dev = 0.2) {
  normal_sampler normal(seed);
  for (auto& t : p.named()) {
    const bool norm = t.name.find("norm") != std::string::npos;
    for (std::uint64_t i = 0; i < t.numel(); ++i)
      t.data[i] = norm ? static_cast<T>(1.0 + 0.1 * normal()) : static_cast<T>(std_dev * normal());
  }
}

}  // namespace oomb_trainer
