// One step of the double trainer, chunk-recurrent or full-sequence, on fresh state: the loss and
// the gradient the equivalence tests compare, and what the chunk-recurrent step reported. Compiled
// once, in gradient_runs.cpp (the oomb_trainer_test_support library).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include <oomb/offload/residency_scheduler.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/cpu/full_sequence.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/model/params.hpp"

namespace trainer_test {

struct gradient_run {
  double loss = 0;
  std::vector<double> grads;  ///< the whole gradient, in the parameters' layout
};

struct chunked_run : gradient_run {
  oomb_trainer::chunk_step_stats stats;
  oomb_trainer::tier_memory memory;   ///< after the step
  oomb::residency_stats grad_tier;    ///< the gradient pages' residency counters (zeros without offload)
  oomb_trainer::selection_mask mask;  ///< sparse: the step's selections, as the full sequence's mask
};

/// A fresh chunk_recurrent<cpu_ops<double>> with `opt` over `seq`. Checks that every far page
/// went back to its pool.
chunked_run run_chunked(const oomb_trainer::model_params<double>& p, const oomb_trainer::sequence& seq,
                        const oomb_trainer::chunk_options& opt);

/// Full-sequence backprop over `seq` (full_sequence_loss_and_grad, which throws what it throws);
/// with `mask`, attention sees only what it marks visible.
gradient_run run_full_sequence(const oomb_trainer::model_params<double>& p, const oomb_trainer::sequence& seq,
                               const oomb_trainer::selection_mask* mask = nullptr);

/// The equivalence tests' check: `run` equals `reference` (worst parameter tensor within 1e-10,
/// norm-wise, the worst one captured by name; the loss within 1e-12 relative). Returns the worst
/// tensor's error, for the tests that report the worst over their cases.
double check_equals_reference(const oomb_trainer::model_params<double>& p, const gradient_run& run,
                              const gradient_run& reference);

}  // namespace trainer_test
