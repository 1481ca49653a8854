// oomb trainer — the training loop behind oomb-train: data, the optimizer step, log, checkpoints.
// Reads top to bottom: step() = sample a batch, the device trainer's step (loss and gradient of
// each sequence, average, norm, clip, AdamW: train/device_trainer.hpp), log.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "trainer/io/checkpoint.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/adamw.hpp"
#include "trainer/optim/schedule.hpp"
#include "trainer/train/cpu_trainer.hpp"
#include "trainer/train/device_trainer.hpp"
#include "trainer/train/options.hpp"
#include "trainer/train/synthetic.hpp"

namespace oomb_trainer {

/// What one optimizer step did (also one line of log.jsonl).
struct step_record {
  std::int64_t step = 0;  ///< 0-based index of the step just taken
  double loss = 0;  ///< mean over the batch of each sequence's mean loss
  double lr = 0, grad_norm = 0, seconds = 0, tokens_per_second = 0;
  std::int64_t tokens = 0;   ///< over the batch
  chunk_step_stats chunked;  ///< summed over the batch; zeros with --full-backprop
  tier_memory memory;
};

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

/// Throws, before anything is allocated, unless the checkpoint folder `dir` is one of a model of
/// config `c`: its config.json equal to c, its safetensors headers holding exactly c's tensors
/// (and moments) with c's shapes. load_checkpoint checks the same again when it reads.
inline void check_checkpoint_matches(const std::string& dir, const model_config& c) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OOMB_CHECK(fs::is_directory(dir, ec), oomb::format_error, dir, ": not a checkpoint folder");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string diff = first_difference(load_model_config(config_path), c);
  OOMB_CHECK(diff.empty(), oomb::format_error, config_path, ": field '", diff, "' differs from --config");
  const param_layout layout(c);
  std::vector<named_tensor<const float>> weights, moments;
  for (const auto& e : layout.entries()) {
    weights.push_back({e.name, e.shape, nullptr});
    moments.push_back({e.name + ".exp_avg", e.shape, nullptr});
    moments.push_back({e.name + ".exp_avg_sq", e.shape, nullptr});
  }
  detail::check_file_matches(safetensors_file::open((fs::path(dir) / "model.safetensors").string()), weights);
  detail::check_file_matches(safetensors_file::open((fs::path(dir) / "optimizer.safetensors").string()), moments);
}

/// A training run (see options.hpp for what each option means).
class training_run {
 public:
  /// `print` receives the human-readable lines (one per step, plus progress when enabled);
  /// `device` trains when --device is not cpu (empty: this build has none).
  explicit training_run(train_options o, std::function<void(const std::string&)> print = {},
                        device_trainer_maker device = {})
      : o_(std::move(o)), print_(std::move(print)), cfg_(checked_config(o_, device)),
        schedule_(o_.lr, o_.effective_min_lr(), o_.warmup, o_.steps) {
    namespace fs = std::filesystem;
    if (!o_.resume.empty()) check_checkpoint_matches(o_.resume, cfg_);  // before the state is allocated
    const trainer_setup setup = setup_of(o_, cfg_);
    trainer_ = o_.device == "cpu" ? std::make_unique<cpu_trainer>(setup) : device.make(setup);
    if (!o_.init.empty())
      trainer_->load_weights(o_.init);
    else if (o_.resume.empty())
      trainer_->init(o_.seed);
    if (!o_.resume.empty()) {
      const trainer_state st = trainer_->load(o_.resume);
      step_ = st.step;
      data_position_ = st.data_position;
      OOMB_EXPECTS(step_ <= o_.steps, o_.resume, ": checkpoint at step ", step_, " is past --steps ", o_.steps);
    }
    if (!o_.synthetic.empty()) {
      OOMB_EXPECTS(o_.chunk > 0, "--synthetic kv-recall needs --chunk (its records live in the first chunk)");
      kv_recall_options ko;
      ko.keys = o_.kv_keys;
      ko.values = o_.kv_values;
      ko.queries_per_chunk = o_.kv_queries;
      task_.emplace(cfg_.vocab_size, o_.seq_len, o_.chunk, o_.seed, ko);
    } else {
      tokens_.emplace(token_reader::open(o_.data, static_cast<std::uint32_t>(cfg_.vocab_size)),
                      static_cast<std::size_t>(o_.seq_len), false, data_position_);
    }
    fs::create_directories(o_.out);
    log_.open(fs::path(o_.out) / "log.jsonl", std::ios::app);
    OOMB_CHECK(log_.good(), oomb::error, o_.out, "/log.jsonl: cannot open for appending");
  }

  const model_config& config() const noexcept { return cfg_; }
  const train_options& options() const noexcept { return o_; }
  std::int64_t steps_taken() const noexcept { return step_; }
  bool done() const noexcept { return step_ >= o_.steps; }
  /// The master weights as a host copy (tests).
  qwen2_params<float> weights() const { return trainer_->weights(); }

  /// The next training sequence (advances the data position).
  sequence next_sequence() {
    if (task_) return task_->make(data_position_++);
    sequence s;
    s.tokens = tokens_->next();
    data_position_ = tokens_->position();
    return s;
  }

  /// One optimizer step: sample --batch sequences, the device trainer's step, log. A non-finite
  /// loss or gradient throws non_finite_error with nothing changed but the data position.
  step_record step() {
    OOMB_EXPECTS(!done(), "training_run: all ", o_.steps, " steps are taken");
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<sequence> batch;
    for (std::int32_t i = 0; i < o_.batch; ++i) batch.push_back(next_sequence());
    step_settings s;
    s.step = step_;
    s.lr = schedule_(step_);
    s.clip = o_.clip;
    if (!dumped_) s.dump_grads = o_.dump_grads;
    last_progress_ = t0;
    const step_measure m = trainer_->step(batch, s, [&](const chunk_progress& p) { progress(p); });
    dumped_ = true;
    step_record r;
    r.step = step_;
    r.loss = m.loss;
    r.grad_norm = m.grad_norm;
    r.lr = s.lr;
    for (const auto& q : batch) r.tokens += q.size();
    r.chunked = trainer_->last_stats();
    r.memory = trainer_->memory();
    ++step_;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.tokens_per_second = static_cast<double>(r.tokens) / r.seconds;
    log(r);
    if (o_.save_every > 0 && step_ % o_.save_every == 0 && !done()) save();
    return r;
  }

  /// Runs to --steps (or --stop-after steps of this run), saving a checkpoint at the end.
  void run() {
    if (print_) print_(banner());
    std::int64_t taken = 0;
    std::int32_t kv_high = 0, grad_high = 0;
    while (!done() && (o_.stop_after == 0 || taken < o_.stop_after)) {
      const step_record r = step();
      kv_high = std::max(kv_high, r.chunked.kv_pages_high_water);
      grad_high = std::max(grad_high, r.chunked.grad_pages_high_water);
      ++taken;
    }
    if (print_ && !o_.full_backprop) print_(memory_summary(kv_high, grad_high));
    save();
  }

  /// Memory per tier after a run: what the README's demo prints last.
  std::string memory_summary(std::int32_t kv_high, std::int32_t grad_high) const {
    const tier_memory m = trainer_->memory();
    std::string near = o_.offload ? fmt::format("{} K/V + {} gradient slots = {} (fixed)", m.near_kv_slots, m.near_grad_slots,
                                                human_bytes(double(m.near_bytes)))
                                  : std::string("none (attention reads the far tier in place)");
    return fmt::format("memory: near tier {}; far tier at most {} K/V pages ({}) + {} gradient pages ({}), {} reserved; "
                       "activations {} (one chunk, all layers)",
                       near, kv_high, human_bytes(double(kv_high) * double(m.kv_pair_bytes)), grad_high,
                       human_bytes(double(grad_high) * double(m.grad_pair_bytes)),
                       human_bytes(double(m.far_kv_reserved + m.far_grad_reserved)), human_bytes(double(m.activation_bytes)));
  }

  /// Writes <out>/checkpoint atomically: weights, AdamW moments, step and data position.
  void save() {
    trainer_state st;
    st.step = step_;
    st.data_position = data_position_;
    st.extra = {{"seed", o_.seed}, {"synthetic", o_.synthetic}, {"data", o_.data}};
    const auto dir = (std::filesystem::path(o_.out) / "checkpoint").string();
    trainer_->save(dir, st);
    if (print_) print_(fmt::format("checkpoint: {} (step {})", dir, step_));
  }

  std::string banner() const {
    const auto& c = cfg_;
    std::string mode = o_.full_backprop ? "full-sequence backprop (baseline)"
                                        : fmt::format("chunk-recurrent, chunk {} tokens, page {} tokens", o_.chunk, o_.page);
    if (o_.sparse) mode += fmt::format(", sparse (budget {} + sink {} + local {} pages per {}-query tile)", o_.budget, o_.sink, o_.local, o_.tile);
    if (o_.offload) mode += fmt::format(", offload (near tier {} + {} slots)", o_.near_pages, o_.near_pages);
    const std::string batch = o_.batch == 1 ? fmt::format("{} tokens per step", o_.seq_len)
                                            : fmt::format("{} sequences of {} tokens per step", o_.batch, o_.seq_len);
    return fmt::format("oomb-train: {} layers, hidden {}, {} heads / {} KV heads, vocab {}, {} parameters\n"
                       "  device: {}\n  {}, {}\n  data: {}; steps {} from {}",
                       c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
                       parameter_count(param_layout(c)), trainer_->describe(), batch, mode,
                       o_.synthetic.empty() ? o_.data : "synthetic " + o_.synthetic, o_.steps, step_);
  }

 private:
  /// The model's config, once the device asked for is known to run it (before anything is allocated).
  static model_config checked_config(const train_options& o, const device_trainer_maker& device) {
    model_config c = load_model_config(o.config);
    if (o.device == "cpu") return c;
    OOMB_EXPECTS(device.name == o.device && device.require && device.make, "--device ", o.device,
                 ": this oomb-train was built without CUDA (configure with -DOOMB_ENABLE_CUDA=ON); use --device cpu");
    device.require(c);
    return c;
  }

  static trainer_setup setup_of(const train_options& o, const model_config& c) {
    trainer_setup s;
    s.config = c;
    s.full_backprop = o.full_backprop;
    s.max_tokens = o.seq_len;
    s.adam.weight_decay = o.weight_decay;
    chunk_options& co = s.chunk;
    co.chunk = o.chunk;
    co.page = o.page;
    co.offload = o.offload;
    co.near_pages = o.near_pages;
    co.window_pages = o.window_pages;
    co.sparse = o.sparse;
    co.budget = o.budget;
    co.sink = o.sink;
    co.local = o.local;
    co.tile = o.tile;
    return s;
  }

  void progress(const chunk_progress& p) {
    if (o_.quiet || !print_) return;
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_progress_).count() < 2.0) return;
    last_progress_ = now;
    print_(fmt::format("  step {}: stage {} chunk {}/{}", step_ + 1, p.stage, p.stage == 1 ? p.chunk + 1 : p.chunks - p.chunk,
                       p.chunks));
  }

  void log(const step_record& r) {
    const auto& m = r.memory;
    const auto& s = r.chunked;
    const std::int64_t near = m.near_kv_slots + m.near_grad_slots;
    const std::int64_t far = std::int64_t(s.kv_pages_high_water) + s.grad_pages_high_water;
    const std::string loss_name = task_ ? "answer loss" : "loss";
    if (print_) {
      std::string line = fmt::format("step {:>5}/{} | {} {:.4f} | {:>8.0f} tok/s | {:.2f} s", r.step + 1, o_.steps, loss_name,
                                     r.loss, r.tokens_per_second, r.seconds);
      if (!o_.full_backprop) {
        line += fmt::format(" | near {} pages ({}) | far {} pages ({})", near, human_bytes(double(m.near_bytes)), far,
                            human_bytes(double(s.kv_pages_high_water) * double(m.kv_pair_bytes) +
                                        double(s.grad_pages_high_water) * double(m.grad_pair_bytes)));
        if (o_.offload) line += fmt::format(" | moved {}", human_bytes(double(s.bytes_to_near + s.bytes_to_far)));
      }
      line += fmt::format(" | lr {:.2e}", r.lr);
      print_(line);
    }
    nlohmann::json j = {{"step", r.step + 1},
                        {"loss", r.loss},
                        {"loss_kind", task_ ? "answer" : "all"},
                        {"lr", r.lr},
                        {"grad_norm", r.grad_norm},
                        {"tokens", r.tokens},
                        {"sequences", o_.batch},
                        {"seconds", r.seconds},
                        {"tokens_per_second", r.tokens_per_second}};
    if (!o_.full_backprop) {
      j["stage1_seconds"] = s.stage1_seconds;
      j["stage2_seconds"] = s.stage2_seconds;
      j["near_pages"] = near;
      j["near_bytes"] = m.near_bytes;
      j["far_kv_pages"] = s.kv_pages_high_water;
      j["far_grad_pages"] = s.grad_pages_high_water;
      j["far_bytes_reserved"] = m.far_kv_reserved + m.far_grad_reserved;
      j["bytes_to_near"] = s.bytes_to_near;
      j["bytes_to_far"] = s.bytes_to_far;
      j["activation_bytes"] = m.activation_bytes;
      if (o_.sparse) {
        j["sparse_pages_selected"] = s.sparse_pages_selected;
        j["sparse_pages_candidate"] = s.sparse_pages_candidate;
      }
    }
    log_ << j.dump() << '\n';
    log_.flush();
  }

  train_options o_;
  std::function<void(const std::string&)> print_;
  model_config cfg_;
  cosine_schedule schedule_;
  std::unique_ptr<device_trainer> trainer_;
  std::int64_t step_ = 0;
  std::uint64_t data_position_ = 0;
  std::optional<kv_recall> task_;
  std::optional<token_windows> tokens_;
  std::ofstream log_;
  bool dumped_ = false;
  std::chrono::steady_clock::time_point last_progress_{};
};

}  // namespace oomb_trainer
