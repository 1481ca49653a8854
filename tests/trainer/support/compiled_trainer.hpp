// chunk_recurrent<B, Eviction> behind a seam whose members are defined only in
// compiled_trainer.cpp (the oomb_trainer_test_support library), for the backends the tests use: a
// test file that drives a trainer through it does not compile the trainer again. The trainer
// compiles at -O3 (-O1 under the sanitizers) in every build and CI builds the tests three times;
// `extern template chunk_recurrent<...>` is not enough, g++ still compiles its inline members where
// it optimises (test_memory_plan.cpp kept a private copy of loss_and_grad).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <oomb/offload/belady_eviction.hpp>
#include <oomb/offload/residency_scheduler.hpp>
#include <oomb/sparse/sparse_page_table.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/cpu/cpu_ops.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/io/config.hpp"

namespace oomb_trainer {
template <class B, class Eviction>
class chunk_recurrent;
}  // namespace oomb_trainer

namespace trainer_test {

/// chunk_recurrent<B, Eviction>'s interface, the trainer's own documentation applies.
/// compiled_trainer.cpp instantiates it for cpu_ops<double> (LRU and Belady eviction),
/// cpu_ops<double, bf16, float> and cpu_ops<float> with Belady eviction (oomb-train --device cpu's).
template <class B, class Eviction = oomb::lru_eviction>
class compiled_trainer {
 public:
  using params_type = typename B::params_type;
  using grads_type = typename B::grads_type;

  compiled_trainer(const oomb_trainer::model_config& cfg, const oomb_trainer::chunk_options& opt, std::int64_t max_tokens);
  ~compiled_trainer();

  double loss_and_grad(const params_type& p, grads_type& grads, const oomb_trainer::sequence& seq,
                       const std::function<void(const oomb_trainer::chunk_progress&)>& progress = {});
  std::vector<double> evaluate(const params_type& p, const oomb_trainer::sequence& seq);
  const oomb_trainer::chunk_step_stats& last_stats() const noexcept;
  oomb_trainer::tier_memory memory() const;
  const B& backend() const noexcept;
  const std::vector<oomb::sparse_page_table>& selections() const noexcept;
  oomb::residency_stats kv_residency() const;
  oomb::residency_stats grad_residency() const;

 private:
  std::unique_ptr<oomb_trainer::chunk_recurrent<B, Eviction>> trainer_;
};

}  // namespace trainer_test
