// oomb trainer — cpu_trainer (trainers/cpu_trainer.hpp), compiled once: the oomb::trainer_cpu library.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/trainers/cpu_trainer.hpp"

#include <utility>

#include <fmt/core.h>

#include <oomb/offload/belady_eviction.hpp>

#include "trainer/algo/chunk_recurrent.hpp"
#include "trainer/cpu/cpu_ops.hpp"
#include "trainer/cpu/full_sequence.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/optim/clip.hpp"

namespace oomb_trainer {

class cpu_trainer::chunked : public chunk_recurrent<cpu_ops<float>, oomb::belady_eviction> {
 public:
  using chunk_recurrent::chunk_recurrent;
};

cpu_trainer::cpu_trainer(const trainer_setup& s)
    : config_(s.config), params_(s.config), grads_(s.config), optimizer_(params_.named(), s.adam) {
  if (!s.full_backprop) chunked_ = std::make_unique<chunked>(s.config, s.chunk, s.max_tokens);
}

cpu_trainer::~cpu_trainer() = default;

void cpu_trainer::init(std::uint64_t seed) { init_hf(params_, seed); }

void cpu_trainer::load_weights(const std::string& path) { oomb_trainer::load_weights(path, params_.named()); }

trainer_state cpu_trainer::load(const std::string& dir) {
  return load_checkpoint(dir, config_, params_.named(), optimizer_.state_tensors());
}

void cpu_trainer::save(const std::string& dir, const trainer_state& state) {
  save_checkpoint(dir, config_, params_.named(), optimizer_.state_tensors(), state, save_options());
}

step_measure cpu_trainer::step(const std::vector<sequence>& batch, const step_settings& s,
                               const std::function<void(const chunk_progress&)>& progress) {
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

std::vector<double> cpu_trainer::evaluate(const sequence& seq, const std::function<void(const chunk_progress&)>& progress) {
  OOMB_EXPECTS(chunked_ != nullptr, "evaluation runs chunk-recurrent stage 1: not with --full-backprop");
  return chunked_->evaluate(params_, seq, progress);
}

tier_memory cpu_trainer::memory() const { return chunked_ ? chunked_->memory() : tier_memory{}; }

}  // namespace oomb_trainer
