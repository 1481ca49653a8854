// oomb trainer — the training loop behind oomb-train: data, the optimizer step, log, checkpoints.
// Reads top to bottom: step() = sample a batch, the device trainer's step (loss and gradient of
// each sequence, average, norm, clip, AdamW: trainers/trainer.hpp), log. Before anything
// large is allocated: the device's checks, the memory plan (trainers/memory_plan.hpp), --out's and
// --resume's checks; then options.json, the log, checkpoint-<step> folders and `checkpoint`.
// Declarations: app/run.cpp (the oomb::trainer_cpu library) compiles the loop once.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "trainer/app/evaluation.hpp"
#include "trainer/app/options.hpp"
#include "trainer/data/synthetic.hpp"
#include "trainer/data/token_sequences.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/adamw.hpp"
#include "trainer/optim/schedule.hpp"
#include "trainer/trainers/cpu_trainer.hpp"
#include "trainer/trainers/memory_plan.hpp"
#include "trainer/trainers/trainer.hpp"

namespace oomb_trainer {

/// `b` bytes for people: "512 B", "16.8 MiB".
std::string human_bytes(double b);
/// A count for people: "512", "65.5K", "1.05M", "2.10B".
std::string human_count(double n);
/// Seconds for people: "42 s", "3m20s", "5h07m".
std::string human_duration(double seconds);

/// What one optimizer step did (also one line of log.jsonl).
struct step_record {
  std::int64_t step = 0;  ///< 0-based index of the step just taken
  double loss = 0;  ///< mean over the batch of each sequence's mean loss
  double lr = 0, grad_norm = 0, seconds = 0, tokens_per_second = 0;
  std::int64_t tokens = 0;   ///< over the batch
  std::int64_t padding_tokens = 0;     ///< --packing documents: the batch's padding (counted in `tokens`)
  std::int64_t sequences_skipped = 0;  ///< --data: sequences passed over because no target of theirs counts
  std::int64_t tokens_seen = 0;  ///< over the run's steps so far, this one included (every step is --batch x --seq-len)
  double eta_seconds = 0;        ///< the steps left to --steps at this process's mean step time
  chunk_step_stats chunked;  ///< summed over the batch; zeros with --full-backprop
  tier_memory memory;
  device_memory_use gpu;            ///< the device at the step's end (zeros on the CPU)
  std::uint64_t gpu_used_peak = 0;  ///< the most the device had in use at a chunk's end or the step's
};

/// The effective options of a run as JSON (<out>/options.json): every flag's value after defaults.
nlohmann::json options_json(const train_options& o);

/// What a checkpoint records of the run that wrote it, checked against the command line on
/// --resume (trainer_state.json's "extra").
nlohmann::json run_identity(const train_options& o);

/// Throws, naming the field, unless the checkpoint `dir` was written by a run of the same data,
/// seed and shape of sequences as `o` (fields a checkpoint lacks, from an older trainer, pass).
void check_resume_identity(const std::string& dir, const train_options& o);

/// The limits the run's memory plan is checked against: --host-memory or host_memory_default();
/// with cuda --gpu-memory or the device's free memory less gpu_memory_margin, and the optimizer
/// state split where it fits (capped by --optimizer-gpu-memory), as cuda_trainer keeps it.
plan_target plan_target_of(const train_options& o, const trainer_factory& device);

/// Throws, before anything is allocated, unless the checkpoint folder `dir` is one of a model of
/// config `c`: its config.json equal to c, its safetensors headers holding exactly c's tensors
/// (and moments) with c's shapes. load_checkpoint checks the same again when it reads.
void check_checkpoint_matches(const std::string& dir, const model_config& c);

/// A training run (see options.hpp for what each option means).
class training_run {
 public:
  /// `print` receives the human-readable lines (one per step, plus progress when enabled);
  /// `device` trains when --device is not cpu (empty: this build has none).
  explicit training_run(train_options o, std::function<void(const std::string&)> print = {},
                        trainer_factory device = {});

  /// What --plan prints: the device's checks, then the memory plan of `o` (not checked against
  /// the limits: describe() marks what does not fit). Allocates nothing large.
  static memory_plan plan(const train_options& o, const trainer_factory& device = {});
  /// plan()'s text, with the largest context that fits when this one does not.
  static std::string plan_text(const train_options& o, const trainer_factory& device = {});

  const model_config& config() const noexcept { return cfg_; }
  const train_options& options() const noexcept { return o_; }
  std::int64_t steps_taken() const noexcept { return step_; }
  bool done() const noexcept { return step_ >= o_.steps; }
  /// The master weights as a host copy (tests).
  model_params<float> weights() const { return trainer_->weights(); }
  /// The memory plan the run was checked against (empty with --full-backprop).
  const std::optional<memory_plan>& memory() const noexcept { return plan_; }

  /// The next training sequence (advances the data position).
  sequence next_sequence();
  /// Held-out sequence i of the evaluation: window i of --eval-data (its loss mask; with
  /// documents, no prediction across a document start counts), or the synthetic task's sequence
  /// from an index training never reaches. `position` receives each token's position in its
  /// document (in the sequence without documents).
  sequence eval_sequence(std::int32_t i, std::vector<std::int64_t>* position) const;
  /// A forward-only pass over the --eval-sequences held-out sequences; logs it (log.jsonl: an
  /// object with "step" and the eval_* fields) and prints its line.
  evaluation evaluate();

  /// One optimizer step: sample --batch sequences, the device trainer's step, log. A non-finite
  /// loss or gradient throws non_finite_error with nothing changed but the data position.
  step_record step();

  /// Runs to --steps (or --stop-after steps of this run), saving a checkpoint at the end. With
  /// `stop` (a signal handler's flag: the signal's number once one came), stops at the next step
  /// boundary after it is set, saves, and returns its number; 0 when the run ended otherwise.
  int run(const volatile std::sig_atomic_t* stop = nullptr);

  /// Memory per tier after a run: what the README's demo prints last.
  std::string memory_summary(std::int32_t kv_high, std::int32_t grad_high) const;

  /// Writes <out>/checkpoint-<step> atomically (weights, AdamW moments, step, data position, the
  /// run's identity), points <out>/checkpoint at it, and removes all but the newest --keep-last.
  void save();

  std::string banner() const;

 private:
  /// Where a step is (for the progress lines): tokens through each stage, the device's memory.
  struct step_meter {
    std::chrono::steady_clock::time_point start, last_print;
    std::int64_t total = 0;              ///< tokens of the batch
    std::int64_t forward = 0, backward = 0;  ///< tokens through stage 1 / stage 2 so far
    device_memory_use gpu;
    std::uint64_t gpu_peak = 0;
  };

  void sample_gpu();
  /// Tokens done, work-weighted: each stage's tokens count by its share of the last step's time
  /// (1 : 3 before a step is measured: stage 2 recomputes the forward, then runs the backward).
  double tokens_done() const;
  void progress(const chunk_progress& p);
  void log(const step_record& r);

  train_options o_;
  std::function<void(const std::string&)> print_;
  model_config cfg_;
  lr_schedule schedule_;
  std::function<device_memory_use()> memory_use_;
  std::optional<memory_plan> plan_;
  std::unique_ptr<trainer> trainer_;
  std::int64_t step_ = 0;
  std::uint64_t data_position_ = 0;
  std::optional<kv_recall> task_;
  std::optional<token_sequences> tokens_;
  std::int64_t batch_padding_ = 0, batch_skipped_ = 0;  // of the batch being drawn (next_sequence)
  std::optional<token_reader> eval_tokens_;
  std::ofstream log_;
  bool dumped_ = false;
  step_meter meter_;
  double stage_weight_[2] = {1.0, 3.0};
  double seconds_this_run_ = 0;  // the steps this process took, for the run's ETA
  std::int64_t steps_this_run_ = 0;
};

}  // namespace oomb_trainer
