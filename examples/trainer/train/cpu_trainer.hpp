// oomb trainer — --device cpu: the training state in host floats, loss and gradients by
// chunk_recurrent<cpu_backend<float>> (or full-sequence backprop), clipping and AdamW on the host.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "trainer/backend/cpu_backend.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/adamw.hpp"
#include "trainer/optim/clip.hpp"
#include "trainer/train/chunk_recurrent.hpp"
#include "trainer/train/device_trainer.hpp"
#include "trainer/train/full_sequence.hpp"

namespace oomb_trainer {

class cpu_trainer final : public device_trainer {
  using T = float;

 public:
  explicit cpu_trainer(const trainer_setup& s)
      : config_(s.config), params_(s.config), grads_(s.config), optimizer_(params_.named(), s.adam) {
    if (!s.full_backprop)
      chunked_ = std::make_unique<chunk_recurrent<cpu_backend<T>, oomb::belady_eviction>>(s.config, s.chunk, s.max_tokens);
  }

  void init(std::uint64_t seed) override { init_qwen2(params_, seed); }
  void load_weights(const std::string& path) override { oomb_trainer::load_weights(path, params_.named()); }
  trainer_state load(const std::string& dir) override {
    return load_checkpoint(dir, config_, params_.named(), optimizer_.state_tensors());
  }
  void save(const std::string& dir, const trainer_state& state) override {
    save_checkpoint(dir, config_, params_.named(), optimizer_.state_tensors(), state);
  }

  step_measure step(const std::vector<sequence>& batch, const step_settings& s,
                    const std::function<void(const chunk_progress&)>& progress) override {
    OOMB_EXPECTS(!batch.empty(), "cpu_trainer: a step needs at least one sequence");
    grads_.zero();
    stats_ = {};
    step_measure r;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      double loss = 0;
      if (chunked_) {
        loss = chunked_->loss_and_grad(params_, grads_, batch[i], progress);
        add_stats(stats_, chunked_->last_stats());
      } else {
        loss = full_sequence_loss_and_grad(params_, grads_, batch[i]);
      }
      check_loss(s, i, batch.size(), loss);
      r.loss += loss;
    }
    r.loss /= static_cast<double>(batch.size());
    if (batch.size() > 1) {
      const T inv = T(1) / static_cast<T>(batch.size());
      for (std::size_t k = 0; k < grads_.size(); ++k) grads_.data()[k] *= inv;
    }
    if (!s.dump_grads.empty())
      dump_gradients(s.dump_grads, grads_.named(), {{"step", std::to_string(s.step)}, {"loss", fmt::format("{:.9g}", r.loss)}});
    r.grad_norm = clip_grad_norm(grads_.named(), s.clip);  // a non-finite norm leaves the gradients be
    check_grad_norm<T>(s, r.loss, r.grad_norm, [&] { return std::as_const(grads_).named(); });
    optimizer_.set_steps_taken(s.step);
    optimizer_.step(s.lr, params_.named(), grads_.named());
    return r;
  }

  chunk_step_stats last_stats() const override { return stats_; }
  tier_memory memory() const override { return chunked_ ? chunked_->memory() : tier_memory{}; }
  qwen2_params<float> weights() const override { return params_; }
  std::string describe() const override { return "cpu"; }

 private:
  model_config config_;
  qwen2_params<T> params_, grads_;
  adamw<T> optimizer_;
  std::unique_ptr<chunk_recurrent<cpu_backend<T>, oomb::belady_eviction>> chunked_;
  chunk_step_stats stats_;
};

}  // namespace oomb_trainer
