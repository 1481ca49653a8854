// oomb trainer — the training state of one model where it trains, and the optimizer step over it:
// what training_run (app/run.hpp) drives, the CPU's (trainers/cpu_trainer.hpp) and the GPU's
// (trainers/cuda_trainer.cuh) alike.
// SPDX-License-Identifier: Apache-2.0
//
// A device trainer owns the master weights, the AdamW moments, the gradients (and on a GPU the
// bf16 compute weights). One call of step() is one optimizer step over a batch of sequences:
// zero the gradients, add each sequence's loss gradient, average, take the global norm, stop if
// anything is not finite, clip, update. The host sees the loss and the norm; weights and moments
// cross to the host only in save() and load(), as the same checkpoint files on every device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/data/targets.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/io/config.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/adamw.hpp"

namespace oomb_trainer {

/// What a device trainer is built for (all of it known before anything is allocated).
struct trainer_setup {
  model_config config;
  chunk_options chunk;         ///< unused with full_backprop
  bool full_backprop = false;  ///< plain full-sequence backprop (the CPU's baseline)
  std::int64_t max_tokens = 0; ///< tokens of the longest sequence
  adamw_options adam;
  /// cuda: the tensors (layout order) whose optimizer state is on the GPU, the rest in pinned host
  /// memory: the memory plan's split (optim/optimizer_split.hpp); -1: all of them.
  std::int64_t optimizer_gpu_tensors = -1;
};

/// One step's inputs besides the sequences.
struct step_settings {
  std::int64_t step = 0;  ///< 0-based index of the step being taken (AdamW's t is step + 1)
  double lr = 0;
  double clip = 0;        ///< max global gradient norm; <= 0: no clipping
  std::string dump_grads; ///< not empty: write the averaged gradient (before clipping) to this file
};

/// What one step measured: the loss is the mean over the batch of each sequence's loss (itself the
/// mean over its counted targets), so every sequence weighs the same whatever its mask; the
/// gradient is that loss's, the norm taken before clipping.
struct step_measure {
  double loss = 0;
  double grad_norm = 0;
};

/// A non-finite loss or gradient: the step stopped before the optimizer touched the weights.
class non_finite_error : public oomb::error {
 public:
  using oomb::error::error;
};

/// The training state of one model on one device (see the file comment).
class trainer {
 public:
  virtual ~trainer() = default;

  /// HF's initialisation from `seed` (the CPU draws mt19937_64 in order, the GPU Philox by tensor
  /// offset: the same distribution, other numbers), moments zero.
  virtual void init(std::uint64_t seed) = 0;
  /// Weights from a checkpoint_reader path (--init), converted to fp32; moments unchanged.
  virtual void load_weights(const std::string& path) = 0;
  /// Weights and moments from a checkpoint folder (--resume); returns its state.
  virtual trainer_state load(const std::string& dir) = 0;
  /// Writes a checkpoint folder as save_options() say (by default the oomb layout: weights and
  /// moments as F32, the same files on every device).
  virtual void save(const std::string& dir, const trainer_state& state) = 0;
  /// How save() writes its folder: layout, weights' dtype, shard size, where the tokenizer files
  /// come from (--save-format, --save-dtype, --save-shard-size, --export: training_run sets them).
  void set_save_options(checkpoint_options o) { save_options_ = std::move(o); }
  const checkpoint_options& save_options() const noexcept { return save_options_; }

  /// One optimizer step over `batch` (see step_measure). Throws non_finite_error, naming the step
  /// and what was not finite, before any weight or moment changes.
  virtual step_measure step(const std::vector<sequence>& batch, const step_settings& s,
                            const std::function<void(const chunk_progress&)>& progress) = 0;
  /// Forward only, the weights unchanged: the loss of predicting each token t + 1 of `seq`, NaN
  /// where the mask does not count it (chunk_recurrent::evaluate). Throws with full backprop.
  virtual std::vector<double> evaluate(const sequence& seq, const std::function<void(const chunk_progress&)>& progress) = 0;

  /// The last step's chunk-recurrent counters, summed over its sequences (high-water marks: the
  /// largest); zeros with full backprop.
  virtual chunk_step_stats last_stats() const = 0;
  virtual tier_memory memory() const = 0;
  /// The fp32 master weights as a host copy (tests, small models: it is the whole model).
  virtual model_params<float> weights() const = 0;
  /// What the banner says runs where.
  virtual std::string describe() const = 0;

 private:
  checkpoint_options save_options_;
};

/// A device's memory as its driver reports it (cudaMemGetInfo): the whole device, every process.
struct device_memory_use {
  std::uint64_t used = 0, free = 0, total = 0;
};

/// How a build reaches a device other than the CPU (trainers/cuda_factory.hpp for --device cuda).
struct trainer_factory {
  std::string name;  ///< the --device value it serves
  /// Throws, naming what is missing, unless the device can train as `s` says: the model, the
  /// attention's options (called before any allocation).
  std::function<void(const trainer_setup& s)> require;
  std::function<std::unique_ptr<trainer>(const trainer_setup&)> make;
  /// The device's memory now (the memory plan's default limit, the progress lines); may be empty.
  std::function<device_memory_use()> memory_use;
};

// ---- pieces every device trainer shares ----

/// The AdamW moments of a model laid out as `layout`, as adamw::state_tensors names and orders
/// them ("<param>.exp_avg", "<param>.exp_avg_sq" per parameter), over host arrays of
/// layout.total() elements each: the optimizer.safetensors of every device.
inline std::vector<named_tensor<float>> moment_tensors(const param_layout& layout, float* exp_avg, float* exp_avg_sq) {
  std::vector<named_tensor<float>> out;
  for (const auto& e : layout.entries()) {
    out.push_back({e.name + ".exp_avg", e.shape, exp_avg + e.offset});
    out.push_back({e.name + ".exp_avg_sq", e.shape, exp_avg_sq + e.offset});
  }
  return out;
}

/// Adds one sequence's chunk-recurrent counters into a step's.
inline void add_stats(chunk_step_stats& sum, const chunk_step_stats& s) {
  sum.loss += s.loss;
  sum.tokens += s.tokens;
  sum.stage1_seconds += s.stage1_seconds;
  sum.stage2_seconds += s.stage2_seconds;
  sum.bytes_to_near += s.bytes_to_near;
  sum.bytes_to_far += s.bytes_to_far;
  sum.exposed_transfer_seconds += s.exposed_transfer_seconds;
  sum.kv_pages_high_water = std::max(sum.kv_pages_high_water, s.kv_pages_high_water);
  sum.grad_pages_high_water = std::max(sum.grad_pages_high_water, s.grad_pages_high_water);
  sum.sparse_pages_selected += s.sparse_pages_selected;
  sum.sparse_pages_candidate += s.sparse_pages_candidate;
  sum.sparse_pages_predicted += s.sparse_pages_predicted;
  sum.sparse_pages_predicted_used += s.sparse_pages_predicted_used;
  for (int k = 0; k < op_kinds; ++k) sum.op_time[static_cast<std::size_t>(k)] += s.op_time[static_cast<std::size_t>(k)];
  sum.attention_host.residency += s.attention_host.residency;
  sum.attention_host.kernels += s.attention_host.kernels;
  sum.attention_host.selection += s.attention_host.selection;
  sum.attention_host.selection_wait += s.attention_host.selection_wait;
  sum.attention_host.total += s.attention_host.total;
}

/// Throws non_finite_error unless sequence i's loss is finite.
inline void check_loss(const step_settings& s, std::size_t i, std::size_t batch, double loss) {
  if (std::isfinite(loss)) return;
  OOMB_FAIL(non_finite_error, "step ", s.step + 1, ": the loss of sequence ", i + 1, " of ", batch, " is ", loss,
            "; stopped before the optimizer update (weights, moments and the last checkpoint untouched)");
}

/// Throws non_finite_error unless the gradient norm is finite, naming the first gradient tensor
/// (HF order) holding a non-finite value; `grads` are read only then.
template <class T>
void check_grad_norm(const step_settings& s, double loss, double norm,
                     const std::function<std::vector<named_tensor<const T>>()>& grads) {
  if (std::isfinite(norm)) return;
  std::string where = "none found";
  for (const auto& g : grads()) {
    bool finite = true;
    for (std::uint64_t k = 0; k < g.numel() && finite; ++k) finite = std::isfinite(static_cast<double>(g.data[k]));
    if (!finite) {
      where = g.name;
      break;
    }
  }
  OOMB_FAIL(non_finite_error, "step ", s.step + 1, ": the gradient norm is ", norm, " (loss ", loss,
            "; first non-finite gradient: ", where,
            "); stopped before the optimizer update (weights, moments and the last checkpoint untouched)");
}

}  // namespace oomb_trainer
