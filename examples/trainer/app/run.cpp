// oomb trainer — training_run (app/run.hpp), compiled once: the oomb::trainer_cpu library.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/app/run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <utility>

#include "trainer/trainers/cpu_trainer.hpp"

namespace oomb_trainer {

namespace {

trainer_setup setup_of(const train_options& o, const model_config& c) {
  trainer_setup s;
  s.config = c;
  s.full_backprop = o.full_backprop;
  s.max_tokens = o.seq_len;
  s.adam.weight_decay = o.weight_decay;
  s.adam.beta1 = o.adam_beta1;
  s.adam.beta2 = o.adam_beta2;
  s.adam.eps = o.adam_epsilon;
  s.chunk = chunk_options_of(o);
  return s;
}

/// --config with --rope-theta and --rope-scaling applied, and max_position_embeddings raised to
/// --seq-len where it is shorter, so every saved config.json describes the model as trained.
model_config run_config(const train_options& o) {
  model_config c = load_model_config(o.config);
  if (!o.rope_scaling.empty()) {
    nlohmann::json j = {{"rope_theta", c.rope.theta}};
    if (o.rope_scaling != "none") {
      j["rope_scaling"] = detail::parse_json_bounded(o.rope_scaling.data(), o.rope_scaling.data() + o.rope_scaling.size(),
                                                     8, "--rope-scaling", "RoPE scaling");
      OOMB_EXPECTS(j["rope_scaling"].is_object(), "--rope-scaling takes a JSON object (as HF's rope_scaling) or none, got ",
                   o.rope_scaling);
    }
    c.rope = parse_rope_config(j, c.head_dim, c.max_position_embeddings, "--rope-scaling");
  }
  if (o.rope_theta > 0) c.rope.theta = o.rope_theta;
  c.max_position_embeddings = std::max(c.max_position_embeddings, o.seq_len);
  return c;
}

/// The model's config, once the device asked for is known to run it (before anything is allocated).
model_config checked_config(const train_options& o, const trainer_factory& device) {
  model_config c = run_config(o);
  if (o.device == "cpu") return c;
  OOMB_EXPECTS(device.name == o.device && device.require && device.make, "--device ", o.device,
               ": this oomb-train was built without CUDA (configure with -DOOMB_ENABLE_CUDA=ON); use --device cpu");
  device.require(setup_of(o, c));
  return c;
}

/// An --out holding a log is another run's unless --resume continues one: never mixed silently.
void check_out_is_ours(const train_options& o) {
  namespace fs = std::filesystem;
  if (!o.resume.empty()) return;
  std::error_code ec;
  const fs::path log = fs::path(o.out) / "log.jsonl";
  OOMB_EXPECTS(!fs::exists(log, ec) || fs::file_size(log, ec) == 0, "--out ", o.out,
               " holds another run's log.jsonl: continue it with --resume ", (fs::path(o.out) / "checkpoint").string(),
               ", or give a new --out (nothing was written)");
}

/// Keeps the lines of the log at `path` up to step `step` (1-based "step" fields): the steps after
/// the checkpoint a run resumes from are taken again, and logged once.
void keep_log_through(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const bool later = !j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                       j["step"].get<std::int64_t>() > step;
    if (later) dropped = true;
    else kept += line + '\n';
  }
  in.close();
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    OOMB_CHECK(out.good(), oomb::error, tmp, ": cannot write");
  }
  std::filesystem::rename(tmp, path);
}

/// <out>/checkpoint becomes a link to `name` (replaced in one rename; a folder of that name from
/// an older trainer is removed first).
void point_latest_at(const std::filesystem::path& out, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path latest = out / "checkpoint", tmp = out / "checkpoint.link-tmp";
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(latest, ec))) fs::remove_all(latest);
  fs::remove(tmp, ec);
  fs::create_directory_symlink(name, tmp);
  fs::rename(tmp, latest);
}

/// Removes checkpoint-<step> folders of `out` but the newest `keep` (and `current`).
void prune_checkpoints(const std::filesystem::path& out, std::int32_t keep, const std::string& current) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    constexpr std::size_t prefix = sizeof("checkpoint-") - 1;
    if (n.size() <= prefix || n.compare(0, prefix, "checkpoint-") != 0 || !e.is_directory()) continue;
    const std::string digits = n.substr(prefix);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < found.size(); ++i)
    if (found[i].second.filename() != current) fs::remove_all(found[i].second);
}

/// Where a checkpoint's tokenizer and generation files come from: the --init folder (or the folder
/// of an --init file), else the --resume folder; when that folder is gone (an older checkpoint
/// pruned by --keep-last), the run's latest checkpoint, which holds the copies.
std::string companion_source_of(const train_options& o) {
  namespace fs = std::filesystem;
  const std::string from = hf_companion_source(!o.init.empty() ? o.init : o.resume);
  std::error_code ec;
  if (from.empty() || fs::is_directory(from, ec)) return from;
  const fs::path latest = fs::path(o.out) / "checkpoint";
  return fs::is_directory(latest, ec) ? latest.string() : std::string();
}

/// How the checkpoint-<step> folders are written (--save-format, --save-dtype, --save-shard-size).
checkpoint_options checkpoint_options_of(const train_options& o) {
  checkpoint_options c;
  c.layout = o.save_format;
  if (o.save_format == checkpoint_layout::hf) c.tensor_dtype = o.hf_dtype();
  c.max_shard_bytes = o.hf_shard_bytes();
  c.companion_source = companion_source_of(o);
  return c;
}

/// How --export is written: an HF model folder without optimizer or trainer state.
checkpoint_options export_options_of(const train_options& o) {
  checkpoint_options c = checkpoint_options_of(o);
  c.layout = checkpoint_layout::hf;
  c.tensor_dtype = o.hf_dtype();
  c.model_only = true;
  return c;
}

/// Host memory the far tier holds with a GPU and offload (pinned or pageable, --home-memory): page
/// homes, kept outputs.
std::uint64_t home_host_bytes(const tier_memory& m) {
  return m.far_kv_reserved + m.far_grad_reserved + m.far_outputs_reserved;
}

}  // namespace

std::string human_count(double n) {
  if (n < 1e3) return fmt::format("{:.0f}", n);
  if (n < 1e6) return fmt::format("{:.1f}K", n / 1e3);
  if (n < 1e9) return fmt::format("{:.2f}M", n / 1e6);
  return fmt::format("{:.2f}B", n / 1e9);
}

std::string human_duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

nlohmann::json options_json(const train_options& o) {
  return {{"config", o.config},         {"data", o.data},
          {"packing", packing_name(o.packing)},
          {"synthetic", o.synthetic},   {"init", o.init},
          {"resume", o.resume},         {"out", o.out},
          {"seq_len", o.seq_len},       {"batch", o.batch},
          {"rope_theta", o.rope_theta > 0 ? nlohmann::json(o.rope_theta) : nlohmann::json()},
          {"rope_scaling", o.rope_scaling.empty() ? nlohmann::json() : nlohmann::json(o.rope_scaling)},
          {"chunk", o.chunk},           {"page", o.page},
          {"sparse", o.sparse},         {"sparse_budget", o.budget},
          {"sink", o.sink},             {"local", o.local},
          {"tile", o.tile},             {"scoring", oomb::to_string(o.scoring)},
          {"offload", o.offload},       {"grad_homes", grad_homes_name(o.grad_homes)},
          {"home_memory", home_memory_name(o.homes)},
          {"attention_kernels", attention_kernels_name(o.attention_kernels)},
          {"deterministic", o.deterministic},
          {"near_pages", o.near_pages}, {"window_pages", o.window_pages},
          {"keep_attention_outputs", o.keep_attention_outputs},
          {"prefetch_last_selection", o.prefetch_last_selection && o.sparse && o.offload},
          {"full_backprop", o.full_backprop},
          {"device", o.device},         {"steps", o.steps},
          {"lr", o.lr},                 {"min_lr", o.effective_min_lr()},
          {"warmup", o.warmup},         {"weight_decay", o.weight_decay},
          {"schedule", lr_schedule_name(o.schedule)},
          {"adam_beta1", o.adam_beta1}, {"adam_beta2", o.adam_beta2},
          {"adam_epsilon", o.adam_epsilon},
          {"clip", o.clip},             {"seed", o.seed},
          {"eval_data", o.eval_data},   {"eval_every", o.eval_every},
          {"eval_sequences", o.eval_sequences},
          {"save_every", o.save_every}, {"keep_last", o.keep_last},
          {"save_format", save_format_name(o.save_format)},
          {"save_dtype", o.save_format == checkpoint_layout::hf || !o.export_dir.empty() ? hf_dtype_name(o.hf_dtype()) : "float32"},
          {"save_shard_size", o.hf_shard_bytes()}, {"export", o.export_dir},
          {"stop_after", o.stop_after}, {"kv_keys", o.kv_keys},
          {"kv_values", o.kv_values},   {"kv_queries", o.kv_queries},
          {"host_memory", o.host_memory}, {"gpu_memory", o.gpu_memory},
          {"optimizer_gpu_memory", o.optimizer_gpu_memory}};
}

nlohmann::json run_identity(const train_options& o) {
  return {{"seed", o.seed}, {"synthetic", o.synthetic}, {"data", o.data}, {"packing", packing_name(o.packing)},
          {"seq_len", o.seq_len},
          {"batch", o.batch}, {"chunk", o.chunk}, {"page", o.page}};
}

void check_resume_identity(const std::string& dir, const train_options& o) {
  const std::string path = (std::filesystem::path(dir) / "trainer_state.json").string();
  const trainer_state st = parse_trainer_state(detail::read_json_file(path, "trainer state"), path);
  const nlohmann::json want = run_identity(o);
  for (const auto& [key, value] : want.items()) {
    const auto it = st.extra.find(key);
    if (it == st.extra.end()) continue;
    OOMB_CHECK(*it == value, oomb::invalid_argument, "--resume ", dir, ": the checkpoint's run had ", key, " ", it->dump(),
               ", the command line says ", value.dump(), "; resume with the same ", key, " (or start a new --out)");
  }
}

plan_target plan_target_of(const train_options& o, const trainer_factory& device) {
  plan_target t;
  t.device = o.device;
  t.host = o.host_memory > 0 ? host_limit{o.host_memory, "--host-memory"} : host_memory_default();
  if (o.device != "cpu") {
    t.optimizer = optimizer_placement::split;
    if (o.optimizer_gpu_memory >= 0) t.optimizer_gpu_cap = static_cast<std::uint64_t>(o.optimizer_gpu_memory);
    if (o.gpu_memory > 0) {
      t.gpu_bytes = o.gpu_memory;
    } else {
      OOMB_EXPECTS(bool(device.memory_use), "--device ", o.device, ": the device does not report its memory; pass --gpu-memory");
      const device_memory_use m = device.memory_use();
      OOMB_EXPECTS(m.free > gpu_memory_margin, "--device ", o.device, ": ", human_bytes(double(m.free)),
                   " of GPU memory free, less than the margin of ", human_bytes(double(gpu_memory_margin)),
                   " (another process holds the GPU?); pass --gpu-memory to plan anyway");
      t.gpu_bytes = m.free - gpu_memory_margin;
    }
  }
  return t;
}

void check_checkpoint_matches(const std::string& dir, const model_config& c) {
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
  detail::check_reader_matches(checkpoint_reader(dir), weights);  // model.safetensors or an HF folder's shards
  check_exact_weights<float>(dir, "--resume " + dir);
  detail::check_file_matches(safetensors_file::open((fs::path(dir) / "optimizer.safetensors").string()), moments);
}

training_run::training_run(train_options o, std::function<void(const std::string&)> print, trainer_factory device)
    : o_(std::move(o)), print_(std::move(print)), cfg_(checked_config(o_, device)),
      schedule_(o_.schedule, o_.lr, o_.effective_min_lr(), o_.warmup, std::max<std::int64_t>(o_.steps, 1)),
      memory_use_(o_.device != "cpu" ? device.memory_use : std::function<device_memory_use()>{}) {
  namespace fs = std::filesystem;
  // Everything that can refuse the run does so here, before the state is allocated.
  trainer_setup setup = setup_of(o_, cfg_);
  if (!o_.full_backprop) plan_ = checked_memory_plan(cfg_, setup.chunk, o_.seq_len, plan_target_of(o_, device));
  if (plan_ && plan_->device == "cuda") setup.optimizer_gpu_tensors = plan_->optimizer_groups_on_gpu;
  check_out_is_ours(o_);
  if (!o_.export_dir.empty()) check_hf_export_target(o_.export_dir);
  if (!o_.resume.empty()) {
    check_checkpoint_matches(o_.resume, cfg_);
    check_resume_identity(o_.resume, o_);
  }
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
    tokens_.emplace(token_reader::open(o_.data, static_cast<std::uint32_t>(cfg_.vocab_size)), o_.seq_len, o_.packing,
                    o_.seed, data_position_);
  }
  if (!o_.eval_data.empty()) {
    eval_tokens_.emplace(token_reader::open(o_.eval_data, static_cast<std::uint32_t>(cfg_.vocab_size)));
    const std::uint64_t need = std::uint64_t(o_.eval_sequences) * std::uint64_t(o_.seq_len);
    OOMB_EXPECTS(eval_tokens_->size() >= need, "--eval-data ", o_.eval_data, " holds ", eval_tokens_->size(),
                 " tokens: ", o_.eval_sequences, " sequences of ", o_.seq_len, " need ", need);
  }
  fs::create_directories(o_.out);
  detail::write_json_file((fs::path(o_.out) / "options.json").string(), options_json(o_));
  const std::string log_path = (fs::path(o_.out) / "log.jsonl").string();
  if (!o_.resume.empty()) keep_log_through(log_path, step_);
  log_.open(log_path, std::ios::app);
  OOMB_CHECK(log_.good(), oomb::error, o_.out, "/log.jsonl: cannot open for appending");
}

memory_plan training_run::plan(const train_options& o, const trainer_factory& device) {
  const model_config c = checked_config(o, device);
  OOMB_EXPECTS(!o.full_backprop, "--plan: the memory plan is chunk-recurrent training's (not --full-backprop)");
  return plan_memory(c, setup_of(o, c).chunk, o.seq_len, plan_target_of(o, device));
}

std::string training_run::plan_text(const train_options& o, const trainer_factory& device) {
  const memory_plan p = plan(o, device);
  std::string s = p.describe();
  if (!p.fits()) {
    const model_config c = run_config(o);
    const std::int64_t largest = largest_fitting_tokens(c, setup_of(o, c).chunk, plan_target_of(o, device));
    s += fmt::format("does not fit: the largest --seq-len that fits is {} tokens\n", largest);
  }
  return s;
}

sequence training_run::eval_sequence(std::int32_t i, std::vector<std::int64_t>* position) const {
  const auto n = static_cast<std::size_t>(o_.seq_len);
  position->resize(n);
  std::iota(position->begin(), position->end(), std::int64_t(0));
  if (task_) return task_->make(std::numeric_limits<std::uint64_t>::max() - std::uint64_t(i));  // never a training index
  const std::uint64_t w0 = std::uint64_t(i) * n;
  sequence s;
  s.tokens = eval_tokens_->read(w0, n);
  if (eval_tokens_->has_mask()) s.mask = eval_tokens_->read_mask(w0, n);
  if (eval_tokens_->has_documents()) {
    // Positions in the document; a prediction across a document start does not count.
    const auto& starts = eval_tokens_->document_starts();
    auto d = std::upper_bound(starts.begin(), starts.end(), w0) - 1;  // starts[0] == 0
    if (s.mask.empty()) s.mask.assign(n, 1);
    for (std::size_t t = 0; t < n; ++t) {
      if (d + 1 != starts.end() && *(d + 1) == w0 + t) {
        ++d;
        s.mask[t] = 0;
      }
      (*position)[t] = std::int64_t(w0 + t - *d);
    }
  }
  return s;
}

evaluation training_run::evaluate() {
  OOMB_EXPECTS(o_.evaluates(), "training_run: the run has no evaluation (--eval-data, or --eval-every with --synthetic)");
  const auto t0 = std::chrono::steady_clock::now();
  evaluation e;
  std::vector<std::int64_t> position;
  for (std::int32_t i = 0; i < o_.eval_sequences; ++i) {
    const sequence s = eval_sequence(i, &position);
    e.add(trainer_->evaluate(s, {}), &position);
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool answers = task_.has_value();
  nlohmann::json j = e.to_json(answers);
  j["step"] = step_;
  log_ << j.dump() << '\n';
  log_.flush();
  if (print_) print_(fmt::format("{} | after step {}", e.line(answers), step_));
  return e;
}

sequence training_run::next_sequence() {
  if (task_) return task_->make(data_position_++);
  sequence s = tokens_->next();
  data_position_ = tokens_->position();
  batch_padding_ += tokens_->last_padding();
  batch_skipped_ += tokens_->last_skipped();
  return s;
}

step_record training_run::step() {
  OOMB_EXPECTS(!done(), "training_run: all ", o_.steps, " steps are taken");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<sequence> batch;
  batch_padding_ = batch_skipped_ = 0;
  for (std::int32_t i = 0; i < o_.batch; ++i) batch.push_back(next_sequence());
  step_settings s;
  s.step = step_;
  s.lr = schedule_(step_);
  s.clip = o_.clip;
  if (!dumped_) s.dump_grads = o_.dump_grads;
  meter_ = {};
  meter_.start = meter_.last_print = t0;
  for (const auto& q : batch) meter_.total += static_cast<std::int64_t>(q.size());
  const step_measure m = trainer_->step(batch, s, [&](const chunk_progress& p) { progress(p); });
  dumped_ = true;
  step_record r;
  r.step = step_;
  r.loss = m.loss;
  r.grad_norm = m.grad_norm;
  r.lr = s.lr;
  r.tokens = meter_.total;
  r.padding_tokens = batch_padding_;
  r.sequences_skipped = batch_skipped_;
  r.chunked = trainer_->last_stats();
  r.memory = trainer_->memory();
  sample_gpu();
  r.gpu = meter_.gpu;
  r.gpu_used_peak = meter_.gpu_peak;
  ++step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_second = static_cast<double>(r.tokens) / r.seconds;
  r.tokens_seen = step_ * r.tokens;
  seconds_this_run_ += r.seconds;
  ++steps_this_run_;
  r.eta_seconds = double(o_.steps - step_) * seconds_this_run_ / double(steps_this_run_);
  if (r.chunked.stage1_seconds > 0 && r.chunked.stage2_seconds > 0) {
    stage_weight_[0] = r.chunked.stage1_seconds;
    stage_weight_[1] = r.chunked.stage2_seconds;
  }
  log(r);
  if (o_.save_every > 0 && step_ % o_.save_every == 0 && !done()) save();
  return r;
}

int training_run::run(const volatile std::sig_atomic_t* stop) {
  if (print_) print_(banner());
  std::int64_t taken = 0;
  std::int32_t kv_high = 0, grad_high = 0;
  int signal = 0;
  while (!done() && (o_.stop_after == 0 || taken < o_.stop_after)) {
    if (stop && *stop != 0) {
      signal = static_cast<int>(*stop);
      if (print_) print_(fmt::format("signal {}: stopping at step {}", signal, step_));
      break;
    }
    const step_record r = step();
    kv_high = std::max(kv_high, r.chunked.kv_pages_high_water);
    grad_high = std::max(grad_high, r.chunked.grad_pages_high_water);
    ++taken;
    if (o_.evaluates() && o_.eval_every > 0 && step_ % o_.eval_every == 0) evaluate();
  }
  if (o_.steps == 0) {  // evaluation only: nothing trained, nothing saved
    evaluate();
    return signal;
  }
  if (o_.evaluates() && done() && (o_.eval_every == 0 || step_ % o_.eval_every != 0)) evaluate();
  if (print_ && !o_.full_backprop && taken > 0) print_(memory_summary(kv_high, grad_high));
  save();
  if (done() && !o_.export_dir.empty()) {  // the finished model; an interrupted run exports when it finishes
    namespace fs = std::filesystem;
    trainer_state st;
    st.step = step_;
    st.data_position = data_position_;
    const fs::path parent = fs::path(o_.export_dir).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    trainer_->set_save_options(export_options_of(o_));
    trainer_->save(o_.export_dir, st);
    if (print_)
      print_(fmt::format("export: {} (HF model folder, {} weights, step {})", o_.export_dir, hf_dtype_name(o_.hf_dtype()), step_));
  }
  return signal;
}

std::string training_run::memory_summary(std::int32_t kv_high, std::int32_t grad_high) const {
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

void training_run::save() {
  namespace fs = std::filesystem;
  trainer_state st;
  st.step = step_;
  st.data_position = data_position_;
  st.extra = run_identity(o_);
  const fs::path out(o_.out);
  const std::string name = fmt::format("checkpoint-{}", step_);
  trainer_->set_save_options(checkpoint_options_of(o_));
  trainer_->save((out / name).string(), st);
  point_latest_at(out, name);
  prune_checkpoints(out, o_.keep_last, name);
  if (print_) print_(fmt::format("checkpoint: {} (step {})", (out / name).string(), step_));
}

std::string training_run::banner() const {
  const auto& c = cfg_;
  std::string mode = o_.full_backprop ? "full-sequence backprop (baseline)"
                                      : fmt::format("chunk-recurrent, chunk {} tokens, page {} tokens", o_.chunk, o_.page);
  if (o_.sparse)
    mode += fmt::format(", sparse (budget {} + sink {} + local {} pages per {}-query tile, {} scoring)", o_.budget, o_.sink,
                        o_.local, o_.tile, oomb::to_string(o_.scoring));
  if (o_.offload)
    mode += fmt::format(", offload (near tier {} + {} slots{}{})", o_.near_pages, o_.near_pages,
                        bf16_homes(o_.grad_homes) ? fmt::format(", {} gradient homes", grad_homes_name(o_.grad_homes)) : "",
                        o_.homes == home_memory::pageable ? ", pageable homes" : "");
  if (o_.keep_attention_outputs) mode += ", attention outputs kept for stage 2";
  const std::string batch = o_.batch == 1 ? fmt::format("{} tokens per step", o_.seq_len)
                                          : fmt::format("{} sequences of {} tokens per step", o_.batch, o_.seq_len);
  std::string plan;
  if (plan_)
    plan = plan_->device == "cuda"
               ? fmt::format("\n  memory plan: GPU {} of {}, host {} of {}\n  optimizer state: {}",
                             human_bytes(double(plan_->gpu_total())), human_bytes(double(plan_->gpu_limit)),
                             human_bytes(double(plan_->host_total())), human_bytes(double(plan_->host_allowed.bytes)),
                             plan_->optimizer_summary())
               : fmt::format("\n  memory plan: host {} of {}", human_bytes(double(plan_->host_total())),
                             human_bytes(double(plan_->host_allowed.bytes)));
  if (o_.save_format == checkpoint_layout::hf)
    plan += fmt::format("\n  checkpoints: HF model folders, {} weights{}", hf_dtype_name(o_.hf_dtype()),
                        o_.hf_dtype() == dtype::f32 ? " (resumable)" : " (not resumable: --save-dtype float32 is)");
  if (!o_.export_dir.empty())
    plan += fmt::format("\n  export at step {}: {} (HF model folder, {} weights)", o_.steps, o_.export_dir,
                        hf_dtype_name(o_.hf_dtype()));
  // Past the pre-training length with plain RoPE the positions are extrapolated: allowed (with a
  // larger --rope-theta it is how ABF extends a context; random-weight benchmarks need no more),
  // but said, since a scaled RoPE is what most context extensions of a checkpoint want.
  const std::int64_t trained_positions = load_model_config(o_.config).max_position_embeddings;
  std::string note;
  if (o_.seq_len > trained_positions && !c.rope.scaled())
    note = fmt::format("\n  note: --seq-len {} is beyond the config's max_position_embeddings {} with plain RoPE{}: "
                       "positions past {} are extrapolated (--rope-scaling extends the context by a scaled RoPE)",
                       o_.seq_len, trained_positions, o_.rope_theta > 0 ? " (--rope-theta given)" : "", trained_positions);
  return fmt::format("oomb-train: {} model, {} layers, hidden {}, {} heads / {} KV heads of {}, vocab {}, {} parameters\n"
                     "  RoPE: {}{}\n  device: {}\n  {}, {}\n  data: {}; steps {} from {}{}",
                     model_family_name(c.family), c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.vocab_size, parameter_count(param_layout(c)), c.rope.describe(),
                     note, trainer_->describe(), batch, mode,
                     tokens_ ? o_.data + " (" + tokens_->describe() + ")" : "synthetic " + o_.synthetic,
                     o_.steps, step_, plan);
}

void training_run::sample_gpu() {
  if (!memory_use_) return;
  meter_.gpu = memory_use_();
  meter_.gpu_peak = std::max(meter_.gpu_peak, meter_.gpu.used);
}

double training_run::tokens_done() const {
  const double w1 = stage_weight_[0], w2 = stage_weight_[1];
  return (w1 * double(meter_.forward) + w2 * double(meter_.backward)) / (w1 + w2);
}

void training_run::progress(const chunk_progress& p) {
  const std::int64_t n = std::min<std::int64_t>(o_.chunk, o_.seq_len - std::int64_t(p.chunk) * o_.chunk);
  (p.stage == 1 ? meter_.forward : meter_.backward) += n;
  sample_gpu();
  if (o_.quiet || !print_) return;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - meter_.last_print).count() < 2.0) return;
  meter_.last_print = now;
  const double elapsed = std::chrono::duration<double>(now - meter_.start).count();
  const double done = tokens_done(), rate = elapsed > 0 ? done / elapsed : 0;
  const double eta = rate > 0 ? (double(meter_.total) - done) / rate : 0;
  std::string line = fmt::format("  step {}: {:.0f}/{} tokens ({} chunk {}/{}) | {:.0f} tok/s | ETA {:.1f} s", step_ + 1,
                                 done, meter_.total, p.stage == 1 ? "forward" : "backward",
                                 p.stage == 1 ? p.chunk + 1 : p.chunks - p.chunk, p.chunks, rate, eta);
  if (memory_use_)
    line += fmt::format(" | GPU {} in use, peak {}", human_bytes(double(meter_.gpu.used)), human_bytes(double(meter_.gpu_peak)));
  if (o_.device != "cpu" && o_.offload)
    line += fmt::format(" | {} homes {}", home_memory_name(o_.homes), human_bytes(double(home_host_bytes(trainer_->memory()))));
  print_(line);
}

void training_run::log(const step_record& r) {
  const auto& m = r.memory;
  const auto& s = r.chunked;
  const std::int64_t near = m.near_kv_slots + m.near_grad_slots;
  const std::int64_t far = std::int64_t(s.kv_pages_high_water) + s.grad_pages_high_water;
  const bool data_mask = tokens_ && tokens_->reader().has_mask();  // the token file's loss mask (e.g. assistant tokens)
  const std::string loss_name = task_ ? "answer loss" : data_mask ? "masked loss" : "loss";
  const double h2d = double(s.bytes_to_near) / r.seconds / 1e9, d2h = double(s.bytes_to_far) / r.seconds / 1e9;
  const bool homes_on_host = o_.device != "cpu" && o_.offload;
  if (print_) {
    std::string line = fmt::format("step {:>5}/{} | {} {:.4f} | grad norm {:.3g} | {:>8.0f} tok/s | {:.2f} s", r.step + 1,
                                   o_.steps, loss_name, r.loss, r.grad_norm, r.tokens_per_second, r.seconds);
    if (!o_.full_backprop) {
      line += fmt::format(" | near {} pages ({}) | far {} pages ({})", near, human_bytes(double(m.near_bytes)), far,
                          human_bytes(double(s.kv_pages_high_water) * double(m.kv_pair_bytes) +
                                      double(s.grad_pages_high_water) * double(m.grad_pair_bytes)));
      if (o_.offload) line += fmt::format(" | moved {}", human_bytes(double(s.bytes_to_near + s.bytes_to_far)));
      if (homes_on_host)
        line += fmt::format(" (H2D {:.1f} GB/s, D2H {:.1f} GB/s, exposed {:.3f} s)", h2d, d2h, s.exposed_transfer_seconds);
    }
    if (memory_use_) line += fmt::format(" | GPU peak {}", human_bytes(double(r.gpu_used_peak)));
    line += fmt::format(" | lr {:.2e} | {} tokens seen | run ETA {}", r.lr, human_count(double(r.tokens_seen)),
                        human_duration(r.eta_seconds));
    print_(line);
  }
  nlohmann::json j = {{"step", r.step + 1},
                      {"loss", r.loss},
                      {"loss_kind", task_ ? "answer" : data_mask ? "mask" : "all"},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens", r.tokens},
                      {"tokens_seen", r.tokens_seen},
                      {"eta_seconds", r.eta_seconds},
                      {"sequences", o_.batch},
                      {"seconds", r.seconds},
                      {"tokens_per_second", r.tokens_per_second}};
  if (tokens_) {
    j["sequences_skipped"] = r.sequences_skipped;
    if (o_.packing == packing_kind::documents) j["padding_tokens"] = r.padding_tokens;
  }
  if (!o_.full_backprop) {
    j["stage1_seconds"] = s.stage1_seconds;
    j["stage2_seconds"] = s.stage2_seconds;
    j["near_pages"] = near;
    j["near_bytes"] = m.near_bytes;
    j["far_kv_pages"] = s.kv_pages_high_water;
    j["far_grad_pages"] = s.grad_pages_high_water;
    j["far_bytes_reserved"] = m.far_kv_reserved + m.far_grad_reserved;
    j["far_attention_output_bytes"] = m.far_outputs_reserved;
    j["bytes_to_near"] = s.bytes_to_near;
    j["bytes_to_far"] = s.bytes_to_far;
    j["h2d_gb_per_second"] = h2d;
    j["d2h_gb_per_second"] = d2h;
    j["exposed_transfer_seconds"] = s.exposed_transfer_seconds;
    const attention_host_seconds& h = s.attention_host;
    j["attention_host_seconds"] = {{"residency", h.residency}, {"kernels", h.kernels}, {"selection", h.selection},
                                   {"selection_wait", h.selection_wait}, {"total", h.total}};
    j["activation_bytes"] = m.activation_bytes;
    const bool pinned = homes_on_host && o_.homes == home_memory::pinned;
    j["pinned_host_bytes"] = pinned ? home_host_bytes(m) : 0;
    j["pageable_host_bytes"] = homes_on_host && !pinned ? home_host_bytes(m) : 0;
    if (o_.sparse) {
      j["sparse_pages_selected"] = s.sparse_pages_selected;
      j["sparse_pages_candidate"] = s.sparse_pages_candidate;
      if (o_.offload) {
        j["sparse_pages_predicted"] = s.sparse_pages_predicted;
        j["sparse_pages_predicted_used"] = s.sparse_pages_predicted_used;
      }
    }
  }
  if (memory_use_) {
    j["gpu_bytes_in_use"] = r.gpu.used;
    j["gpu_bytes_in_use_peak"] = r.gpu_used_peak;
    j["gpu_bytes_total"] = r.gpu.total;
  }
  log_ << j.dump() << '\n';
  log_.flush();
}

}  // namespace oomb_trainer
