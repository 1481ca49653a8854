// oomb trainer — AdamW: Adam with decoupled weight decay and bias correction.
// SPDX-License-Identifier: Apache-2.0
//
// Per step t (1-based), for each element of a tensor with gradient g:
//   p <- p * (1 - lr * weight_decay)                 (only tensors that decay)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// which is PyTorch's torch.optim.AdamW (amsgrad off). Coefficients are computed in double; the
// elementwise update runs in T. The moments are owned here and exposed as named tensors
// ("<param>.exp_avg", "<param>.exp_avg_sq") for checkpoints.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "oomb/core/error.hpp"
#include "trainer/io/named_tensor.hpp"

namespace oomb_trainer {

struct adamw_options {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  /// Weight decay applies to tensors of rank >= 2 (projections, embeddings); rank-0/1 tensors
  /// (biases, norm weights) decay only when this is set, as is common practice for transformers.
  bool decay_vectors = false;
};

template <class T>
class adamw {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "adamw runs in float or double");

 public:
  /// Registers `params` (names and shapes; the data pointers are not kept); moments start at zero.
  explicit adamw(const std::vector<named_tensor<T>>& params, adamw_options options = {})
      : opt_(options) {
    OOMB_EXPECTS(options.beta1 >= 0 && options.beta1 < 1, "adamw: beta1 must be in [0, 1), got ", options.beta1);
    OOMB_EXPECTS(options.beta2 >= 0 && options.beta2 < 1, "adamw: beta2 must be in [0, 1), got ", options.beta2);
    OOMB_EXPECTS(options.eps > 0, "adamw: eps must be positive, got ", options.eps);
    OOMB_EXPECTS(options.weight_decay >= 0, "adamw: weight_decay must be >= 0, got ", options.weight_decay);
    for (const auto& p : params) {
      for (const auto& s : slots_)
        OOMB_EXPECTS(s.name != p.name, "adamw: parameter '", p.name, "' registered twice");
      slot s;
      s.name = p.name;
      s.shape = p.shape;
      s.decay = p.shape.size() >= 2 || options.decay_vectors;
      const auto n = static_cast<std::size_t>(p.numel());
      s.m.assign(n, T(0));
      s.v.assign(n, T(0));
      slots_.push_back(std::move(s));
    }
  }

  const adamw_options& options() const noexcept { return opt_; }
  std::size_t size() const noexcept { return slots_.size(); }
  /// Steps taken so far (t of the last update); the checkpoint's "step".
  std::int64_t steps_taken() const noexcept { return t_; }
  /// For resuming: the step count that goes with moments loaded from a checkpoint.
  void set_steps_taken(std::int64_t t) {
    OOMB_EXPECTS(t >= 0, "adamw: negative step count ", t);
    t_ = t;
  }
  bool decays(std::size_t i) const { return slots_.at(i).decay; }

  /// One update of every parameter, in registration order: params[i] and grads[i] must have the
  /// name and shape of parameter i.
  void step(double lr, const std::vector<named_tensor<T>>& params, const std::vector<named_tensor<T>>& grads) {
    OOMB_EXPECTS(std::isfinite(lr) && lr >= 0, "adamw: learning rate must be finite and >= 0, got ", lr);
    OOMB_EXPECTS(params.size() == slots_.size() && grads.size() == slots_.size(), "adamw: ", slots_.size(),
                 " parameters registered, step given ", params.size(), " parameters and ", grads.size(),
                 " gradients");
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      check_matches(slots_[i], params[i], "parameter");
      check_matches(slots_[i], grads[i], "gradient");
    }
    ++t_;
    const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(t_));
    const T step_size = static_cast<T>(lr / bc1);
    const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
    const T b1 = static_cast<T>(opt_.beta1), one_minus_b1 = static_cast<T>(1.0 - opt_.beta1);
    const T b2 = static_cast<T>(opt_.beta2), one_minus_b2 = static_cast<T>(1.0 - opt_.beta2);
    const T eps = static_cast<T>(opt_.eps);
    const T shrink = static_cast<T>(1.0 - lr * opt_.weight_decay);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slot& s = slots_[i];
      T* p = params[i].data;
      const T* g = grads[i].data;
      T* m = s.m.data();
      T* v = s.v.data();
      const bool decay = s.decay && opt_.weight_decay != 0.0;
      const std::size_t n = s.m.size();
      for (std::size_t k = 0; k < n; ++k) {
        if (decay) p[k] *= shrink;
        m[k] = b1 * m[k] + one_minus_b1 * g[k];
        v[k] = b2 * v[k] + one_minus_b2 * (g[k] * g[k]);
        p[k] -= step_size * m[k] / (std::sqrt(v[k]) * inv_sqrt_bc2 + eps);
      }
    }
  }

  /// The moments as named tensors (pointing into this optimizer), for save/load_checkpoint:
  /// for each parameter in order "<name>.exp_avg" then "<name>.exp_avg_sq".
  std::vector<named_tensor<T>> state_tensors() {
    std::vector<named_tensor<T>> out;
    for (auto& s : slots_) {
      out.push_back({s.name + ".exp_avg", s.shape, s.m.data()});
      out.push_back({s.name + ".exp_avg_sq", s.shape, s.v.data()});
    }
    return out;
  }
  const std::vector<T>& exp_avg(std::size_t i) const { return slots_.at(i).m; }
  const std::vector<T>& exp_avg_sq(std::size_t i) const { return slots_.at(i).v; }

 private:
  struct slot {
    std::string name;
    std::vector<std::int64_t> shape;
    bool decay = true;
    std::vector<T> m, v;
  };

  static void check_matches(const slot& s, const named_tensor<T>& t, const char* what) {
    OOMB_EXPECTS(t.name == s.name && t.shape == s.shape, "adamw: ", what, " '", t.name, "' ",
                 shape_string(t.shape), " given where parameter '", s.name, "' ", shape_string(s.shape),
                 " was registered");
    OOMB_EXPECTS(t.data != nullptr || s.m.empty(), "adamw: ", what, " '", t.name, "' has no data");
  }

  adamw_options opt_;
  std::vector<slot> slots_;
  std::int64_t t_ = 0;
};

}  // namespace oomb_trainer
