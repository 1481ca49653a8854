// The only instantiations of the trainers compiled_trainer.hpp declares.
// SPDX-License-Identifier: Apache-2.0
#include "compiled_trainer.hpp"

#include "trainer/algo/chunk_recurrent.hpp"

namespace trainer_test {

template <class B, class E>
compiled_trainer<B, E>::compiled_trainer(const oomb_trainer::model_config& cfg, const oomb_trainer::chunk_options& opt,
                                         std::int64_t max_tokens)
    : trainer_(std::make_unique<oomb_trainer::chunk_recurrent<B, E>>(cfg, opt, max_tokens)) {}

template <class B, class E>
compiled_trainer<B, E>::~compiled_trainer() = default;

template <class B, class E>
double compiled_trainer<B, E>::loss_and_grad(const params_type& p, grads_type& grads, const oomb_trainer::sequence& seq,
                                             const std::function<void(const oomb_trainer::chunk_progress&)>& progress) {
  return trainer_->loss_and_grad(p, grads, seq, progress);
}

template <class B, class E>
std::vector<double> compiled_trainer<B, E>::evaluate(const params_type& p, const oomb_trainer::sequence& seq) {
  return trainer_->evaluate(p, seq);
}

template <class B, class E>
const oomb_trainer::chunk_step_stats& compiled_trainer<B, E>::last_stats() const noexcept {
  return trainer_->last_stats();
}

template <class B, class E>
const B& compiled_trainer<B, E>::backend() const noexcept {
  return trainer_->backend();
}

template <class B, class E>
oomb_trainer::tier_memory compiled_trainer<B, E>::memory() const {
  return trainer_->memory();
}

template <class B, class E>
const std::vector<oomb::sparse_page_table>& compiled_trainer<B, E>::selections() const noexcept {
  return trainer_->selections();
}

template <class B, class E>
oomb::residency_stats compiled_trainer<B, E>::kv_residency() const {
  return trainer_->kv_residency();
}

template <class B, class E>
oomb::residency_stats compiled_trainer<B, E>::grad_residency() const {
  return trainer_->grad_residency();
}

template class compiled_trainer<oomb_trainer::cpu_ops<double>>;
template class compiled_trainer<oomb_trainer::cpu_ops<double>, oomb::belady_eviction>;
template class compiled_trainer<oomb_trainer::cpu_ops<double, oomb::bf16, float>>;
template class compiled_trainer<oomb_trainer::cpu_ops<float>, oomb::belady_eviction>;

}  // namespace trainer_test
