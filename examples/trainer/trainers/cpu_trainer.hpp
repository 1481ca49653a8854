// oomb trainer — --device cpu: the training state in host floats, loss and gradients by
// chunk_recurrent<cpu_ops<float>> (or full-sequence backprop), clipping and AdamW on the host.
// Declarations only: trainers/cpu_trainer.cpp (the oomb::trainer_cpu library) compiles the trainer
// once, so what includes this header does not compile chunk_recurrent and the CPU ops again.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/params.hpp"
#include "trainer/optim/adamw.hpp"
#include "trainer/trainers/trainer.hpp"

namespace oomb_trainer {

class cpu_trainer final : public trainer {
  using T = float;

 public:
  explicit cpu_trainer(const trainer_setup& s);
  ~cpu_trainer() override;

  void init(std::uint64_t seed) override;
  void load_weights(const std::string& path) override;
  trainer_state load(const std::string& dir) override;
  void save(const std::string& dir, const trainer_state& state) override;
  step_measure step(const std::vector<sequence>& batch, const step_settings& s,
                    const std::function<void(const chunk_progress&)>& progress) override;
  std::vector<double> evaluate(const sequence& seq, const std::function<void(const chunk_progress&)>& progress) override;
  chunk_step_stats last_stats() const override { return stats_; }
  tier_memory memory() const override;
  model_params<float> weights() const override { return params_; }
  std::string describe() const override { return "cpu"; }

 private:
  class chunked;  // chunk_recurrent<cpu_ops<T>, oomb::belady_eviction>, in cpu_trainer.cpp

  model_config config_;
  model_params<T> params_, grads_;
  adamw<T> optimizer_;
  std::unique_ptr<chunked> chunked_;  // empty with full backprop
  chunk_step_stats stats_;
};

}  // namespace oomb_trainer
