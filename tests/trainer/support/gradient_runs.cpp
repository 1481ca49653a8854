// SPDX-License-Identifier: Apache-2.0
#include "gradient_runs.hpp"

#include <cmath>
#include <string>

#include <doctest/doctest.h>

#include "../test_util.hpp"
#include "compiled_trainer.hpp"

namespace trainer_test {

chunked_run run_chunked(const oomb_trainer::model_params<double>& p, const oomb_trainer::sequence& seq,
                        const oomb_trainer::chunk_options& opt) {
  compiled_trainer<oomb_trainer::cpu_ops<double>> trainer(p.config(), opt, seq.size());
  oomb_trainer::model_params<double> g(p.config());
  chunked_run r;
  r.loss = trainer.loss_and_grad(p, g, seq);
  r.grads.assign(g.data(), g.data() + g.size());
  r.stats = trainer.last_stats();
  r.memory = trainer.memory();
  r.grad_tier = trainer.grad_residency();
  r.mask.chunk = opt.chunk;
  r.mask.page = opt.page;
  r.mask.tile = opt.tile;
  r.mask.layers = p.config().num_hidden_layers;
  r.mask.tables = trainer.selections();
  CHECK(r.memory.far_kv_in_use == 0);
  CHECK(r.memory.far_grad_in_use == 0);
  return r;
}

gradient_run run_full_sequence(const oomb_trainer::model_params<double>& p, const oomb_trainer::sequence& seq,
                               const oomb_trainer::selection_mask* mask) {
  oomb_trainer::model_params<double> g(p.config());
  gradient_run r;
  r.loss = oomb_trainer::full_sequence_loss_and_grad(p, g, seq, mask);
  r.grads.assign(g.data(), g.data() + g.size());
  return r;
}

double check_equals_reference(const oomb_trainer::model_params<double>& p, const gradient_run& run,
                              const gradient_run& reference) {
  std::string which;
  const double err = worst_tensor_error(p, run.grads, reference.grads, &which);
  CAPTURE(which);
  CHECK(err <= 1e-10);
  CHECK(std::abs(run.loss - reference.loss) <= 1e-12 * std::abs(reference.loss));
  return err;
}

}  // namespace trainer_test
