// oomb trainer — training checkpoints: save and load the whole training state as one folder.
// SPDX-License-Identifier: Apache-2.0
//
// Layout of a checkpoint folder (see docs/formats.md):
//   config.json              the model's HF config (to_json(model_config)), "dtype" = the weights'
//   model.safetensors        the weights under their HF names; F32 for a float model, F64 for a
//                            double one (lossless either way, so resume is bit-exact)
//   optimizer.safetensors    the optimizer's tensors under the caller's names (AdamW:
//                            "<param>.exp_avg", "<param>.exp_avg_sq"), same dtype rule
//   trainer_state.json       step, data position, RNG state, caller's extra fields
//   tokenizer files, generation_config.json   copied from checkpoint_options::companion_source
// With checkpoint_layout::hf the weights are an HF model folder's instead (io/hf_export.hpp: BF16
// by default, sharded past a size limit, with model.safetensors.index.json), the optimizer state
// stays in the trainer's dtype, and model_only leaves out optimizer and trainer state (an export).
// Every file gets ordinary permissions (0666 less the umask), the folder 0777 less the umask.
// Atomicity: the folder is written as "<dir>.tmp-XXXXXX" beside the target, every file fsynced,
// then swapped in for `dir` in one rename (atomic_directory). A crash at any point leaves the
// previous checkpoint (or none) at `dir`, never a mix of two; only a stray .tmp- folder remains.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"
#include "trainer/io/atomic_write.hpp"
#include "trainer/io/checkpoint_reader.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/hf_export.hpp"
#include "trainer/io/json_util.hpp"
#include "trainer/io/named_tensor.hpp"
#include "trainer/io/safetensors.hpp"

namespace oomb_trainer {

/// What a checkpoint holds besides tensors.
struct trainer_state {
  std::int64_t step = 0;            // optimizer steps taken
  std::uint64_t data_position = 0;  // token index where the next training window starts
  std::string rng_state;            // the trainer's RNG as text (operator<< of a std engine)
  nlohmann::json extra = nlohmann::json::object();  // anything else the trainer wants back
};

inline nlohmann::json to_json(const trainer_state& s) {
  return {{"format", "oomb-trainer-state"}, {"version", 1},         {"step", s.step},
          {"data_position", s.data_position}, {"rng_state", s.rng_state}, {"extra", s.extra}};
}

/// Parses trainer_state.json; errors name `origin` and the field.
inline trainer_state parse_trainer_state(const nlohmann::json& j, const std::string& origin) {
  OOMB_CHECK(j.is_object(), oomb::format_error, origin, ": must be a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    auto it = j.find(name);
    OOMB_CHECK(it != j.end(), oomb::format_error, origin, ": required field '", name, "' is missing");
    return *it;
  };
  const auto& fmt = field("format");
  OOMB_CHECK(fmt.is_string() && fmt.get<std::string>() == "oomb-trainer-state", oomb::format_error, origin,
             ": field 'format' = ", detail::json_brief(fmt), ", expected \"oomb-trainer-state\"");
  const auto& ver = field("version");
  OOMB_CHECK(ver.is_number_unsigned() && ver.get<std::uint64_t>() == 1, oomb::format_error, origin,
             ": field 'version' = ", detail::json_brief(ver), " is unsupported (only 1)");
  trainer_state s;
  const auto& step = field("step");
  OOMB_CHECK(step.is_number_unsigned() &&
                 step.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX),
             oomb::format_error, origin, ": field 'step' must be a non-negative integer, got ",
             detail::json_brief(step));
  s.step = static_cast<std::int64_t>(step.get<std::uint64_t>());
  const auto& pos = field("data_position");
  OOMB_CHECK(pos.is_number_unsigned(), oomb::format_error, origin,
             ": field 'data_position' must be a non-negative integer, got ", detail::json_brief(pos));
  s.data_position = pos.get<std::uint64_t>();
  const auto& rng = field("rng_state");
  OOMB_CHECK(rng.is_string(), oomb::format_error, origin, ": field 'rng_state' must be a string, got ",
             detail::json_brief(rng));
  s.rng_state = rng.get<std::string>();
  if (auto it = j.find("extra"); it != j.end()) {
    OOMB_CHECK(it->is_object(), oomb::format_error, origin, ": field 'extra' must be an object");
    s.extra = *it;
  }
  return s;
}

struct checkpoint_options {
  /// The folder's layout: the trainer's (model.safetensors as the weights are trained) or an HF
  /// model folder (sharded safetensors in `tensor_dtype`, BF16 by default).
  checkpoint_layout layout = checkpoint_layout::oomb;
  /// Dtype of the weights; with the oomb layout of optimizer.safetensors too (with the hf layout the
  /// optimizer state stays in the trainer's dtype). Default: oomb, F32 for float and F64 for double
  /// (lossless); hf, BF16.
  std::optional<dtype> tensor_dtype;
  /// hf: the most bytes of one shard (a larger tensor gets a shard of its own); default
  /// save_pretrained's 50 GB.
  std::uint64_t max_shard_bytes = hf_default_max_shard_bytes;
  /// A folder whose tokenizer and generation files (hf_companion_files()) are copied into the
  /// checkpoint when it holds them; empty: none.
  std::string companion_source;
  /// Only the model (config, weights, companions): no optimizer.safetensors, no trainer_state.json.
  bool model_only = false;
  /// Called with each file's name once it is complete in the temporary folder (progress; tests
  /// throw or _exit from it to simulate a crash mid-checkpoint).
  std::function<void(const std::string& file)> after_file;
};

namespace detail {

template <class T>
dtype native_dtype() {
  return std::is_same_v<std::remove_const_t<T>, double> ? dtype::f64 : dtype::f32;
}

template <class T>
bool has_data(const named_tensor<T>& t) {
  return t.data != nullptr || t.numel() == 0;
}
template <class T>
bool has_data(const streamed_tensor<T>& t) {
  return t.copy_out && t.copy_in;
}

/// Reads tensor t from f (a safetensors_file or a checkpoint_reader): in place, or for a streamed
/// one through a buffer of that tensor.
template <class Source, class T>
void read_tensor(const Source& f, const named_tensor<T>& t) {
  f.read(t.name, t.shape, t.data);
}
template <class Source, class T>
void read_tensor(const Source& f, const streamed_tensor<T>& t) {
  const std::vector<T> host = f.template read<T>(t.name, t.shape);
  t.copy_in(host.data());
}

/// Tensor: named_tensor<T> or streamed_tensor<T>.
template <class Tensor>
void check_tensor_list(const std::vector<Tensor>& list, const char* what) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    OOMB_EXPECTS(!list[i].name.empty(), what, ": tensor ", i, " has no name");
    OOMB_EXPECTS(has_data(list[i]), what, ": tensor '", list[i].name, "' has no data");
    for (std::size_t k = 0; k < i; ++k)
      OOMB_EXPECTS(list[k].name != list[i].name, what, ": tensor '", list[i].name, "' listed twice");
  }
}

inline nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  OOMB_CHECK(in.good(), oomb::format_error, path, ": missing or unreadable (", what, ")");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_json_bounded(text.data(), text.data() + text.size(), 64, path, what);
}

inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  write_file_atomically(path, text.data(), text.size());
}

/// Gives every file in `dir` the permissions creat() would (0666 less the umask): atomic_file's
/// temporaries are 0600 and copies keep their source's (a read-only HF cache's 0444).
inline void set_ordinary_file_permissions(const std::string& dir) {
  const mode_t mode = 0666 & ~process_umask();
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    OOMB_CHECK(::chmod(e.path().c_str(), mode) == 0, oomb::error, e.path().string(), ": cannot set its permissions: ",
               std::strerror(errno));
  }
}

/// The weights' tensors (the reader's) must be exactly those of `list`, with their shapes.
template <class Tensor>
void check_reader_matches(const checkpoint_reader& r, const std::vector<Tensor>& list) {
  for (const auto& t : list) {
    const tensor_info& info = r.info(t.name);  // names the file and tensor when missing
    OOMB_CHECK(info.shape == t.shape, oomb::format_error, r.file_of(t.name), ": tensor '", t.name, "' has shape ",
               shape_string(info.shape), ", expected ", shape_string(t.shape));
  }
  const std::vector<std::string> names = r.names();
  if (names.size() != list.size()) {
    for (const auto& name : names) {
      bool known = false;
      for (const auto& t : list) known = known || t.name == name;
      OOMB_CHECK(known, oomb::format_error, r.file_of(name), ": tensor '", name, "' is not a tensor of this model");
    }
  }
}

/// The file must hold exactly the tensors of `list`, with their shapes and a floating dtype.
template <class Tensor>
void check_file_matches(const safetensors_file& f, const std::vector<Tensor>& list) {
  for (const auto& t : list) {
    const tensor_info& info = f.info(t.name);  // names the file and tensor when missing
    OOMB_CHECK(info.shape == t.shape, oomb::format_error, f.path(), ": tensor '", t.name, "' has shape ",
               shape_string(info.shape), ", expected ", shape_string(t.shape));
  }
  if (f.tensors().size() != list.size()) {
    for (const auto& info : f.tensors()) {
      bool known = false;
      for (const auto& t : list) known = known || t.name == info.name;
      OOMB_CHECK(known, oomb::format_error, f.path(), ": tensor '", info.name,
                 "' is not a tensor of this model/optimizer");
    }
  }
}

}  // namespace detail

/// Writes a checkpoint folder at `dir` (replacing an existing one atomically). Tensor is
/// named_tensor<T> or streamed_tensor<T>, T float or double. `optimizer_state` may be empty (then no
/// optimizer.safetensors is written).
template <class Tensor>
void save_checkpoint(const std::string& dir, const model_config& config, const std::vector<Tensor>& weights,
                     const std::vector<Tensor>& optimizer_state, const trainer_state& state,
                     const checkpoint_options& options = {}) {
  detail::check_tensor_list(weights, "save_checkpoint: weights");
  detail::check_tensor_list(optimizer_state, "save_checkpoint: optimizer state");
  OOMB_EXPECTS(!weights.empty(), "save_checkpoint: no weights");
  const bool hf = options.layout == checkpoint_layout::hf;
  const dtype native = detail::native_dtype<typename Tensor::value_type>();
  const dtype dt = options.tensor_dtype.value_or(hf ? dtype::bf16 : native);
  const dtype optimizer_dt = hf ? native : dt;
  auto done = [&](const std::string& file) {
    if (options.after_file) options.after_file(file);
  };

  atomic_directory out(dir);
  detail::write_json_file(out.file("config.json"), hf_config_json(to_json(config), dt));
  done("config.json");
  if (hf) {
    write_hf_weights(out.temporary_path(), weights, dt, options.max_shard_bytes, done);
  } else {
    safetensors_writer w;
    for (const auto& t : weights) w.add(t, dt);
    w.set_metadata("format", "pt");  // what transformers expects of a model.safetensors
    w.write(out.file("model.safetensors"));
    done("model.safetensors");
  }
  for (const auto& name : copy_hf_companions(options.companion_source, out.temporary_path())) done(name);
  if (!options.model_only) {
    if (!optimizer_state.empty()) {
      safetensors_writer w;
      for (const auto& t : optimizer_state) w.add(t, optimizer_dt);
      w.set_metadata("format", "oomb-optimizer");
      w.write(out.file("optimizer.safetensors"));
      done("optimizer.safetensors");
    }
    detail::write_json_file(out.file("trainer_state.json"), to_json(state));
    done("trainer_state.json");
  }
  detail::set_ordinary_file_permissions(out.temporary_path());
  out.commit();
}

/// Reads the config.json of a checkpoint folder.
inline model_config read_checkpoint_config(const std::string& dir) {
  return load_model_config((std::filesystem::path(dir) / "config.json").string());
}

/// Loads a checkpoint folder (either layout) into the caller's tensors and returns its trainer
/// state. Its config must equal `config`, the weights (model.safetensors, or the shards of
/// model.safetensors.index.json) must be exactly `weights` (names, shapes) and, when
/// `optimizer_state` is not empty, optimizer.safetensors exactly those. Everything is validated
/// before any tensor is read; an error names the file and the tensor or field. Weights stored in
/// another dtype are converted (check_exact_weights refuses that where it matters). Tensor as
/// save_checkpoint's.
template <class Tensor>
trainer_state load_checkpoint(const std::string& dir, const model_config& config, const std::vector<Tensor>& weights,
                              const std::vector<Tensor>& optimizer_state) {
  namespace fs = std::filesystem;
  static_assert(!std::is_const_v<typename Tensor::value_type>, "load_checkpoint writes into the tensors");
  detail::check_tensor_list(weights, "load_checkpoint: weights");
  detail::check_tensor_list(optimizer_state, "load_checkpoint: optimizer state");
  std::error_code ec;
  OOMB_CHECK(fs::is_directory(dir, ec), oomb::format_error, dir, ": not a checkpoint folder");

  const std::string config_path = (fs::path(dir) / "config.json").string();
  const model_config saved = load_model_config(config_path);
  const std::string diff = first_difference(saved, config);
  OOMB_CHECK(diff.empty(), oomb::format_error, config_path, ": field '", diff,
             "' differs from the model being loaded into");

  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  OOMB_CHECK(fs::exists(state_path, ec), oomb::format_error, state_path, ": missing: ", dir,
             " is a model folder without training state (an --export, or a model from elsewhere), not a checkpoint "
             "to continue; --init takes its weights");
  const trainer_state state =
      parse_trainer_state(detail::read_json_file(state_path, "trainer state"), state_path);

  const checkpoint_reader model(dir);
  detail::check_reader_matches(model, weights);
  std::optional<safetensors_file> optim;
  if (!optimizer_state.empty()) {
    optim = safetensors_file::open((fs::path(dir) / "optimizer.safetensors").string());
    detail::check_file_matches(*optim, optimizer_state);
  }
  for (const auto& t : weights) detail::read_tensor(model, t);
  if (optim)
    for (const auto& t : optimizer_state) detail::read_tensor(*optim, t);
  return state;
}

/// Throws unless checkpoint folder `dir` stores its weights in the dtype a trainer of T trains in
/// (F32 for float, F64 for double): only then does a run continue from it exactly. Weights saved in
/// BF16 (an HF folder's default, --save-dtype bfloat16) are the master weights rounded. `what`
/// starts the message (e.g. "--resume DIR").
template <class T>
void check_exact_weights(const std::string& dir, const std::string& what) {
  const dtype native = detail::native_dtype<T>();
  const checkpoint_reader r(dir);
  for (const auto& name : r.names()) {
    const dtype stored = r.info(name).type;
    OOMB_CHECK(stored == native, oomb::invalid_argument, what, ": its weights are ", dtype_name(stored), " (tensor '", name,
               "' in ", r.file_of(name), "), not the ", dtype_name(native), " the trainer keeps: they are the master "
               "weights rounded (--save-dtype ", stored == dtype::bf16 ? "bfloat16" : dtype_name(stored),
               "), and a run cannot continue from them exactly. Resume from a checkpoint saved with --save-dtype float32 "
               "(or --save-format oomb), or start a new run from these weights with --init (a fresh optimizer)");
  }
}

/// Loads model weights from any checkpoint checkpoint_reader opens (an HF folder, sharded or not,
/// or a file), converting from F32/BF16/F16/F64. Every tensor of `weights` must be there with its
/// shape; tensors in the files that `weights` does not name are an error unless `allow_unused`.
template <class T>
void load_weights(const std::string& path, const std::vector<named_tensor<T>>& weights, bool allow_unused = false) {
  static_assert(!std::is_const_v<T>, "load_weights writes into the tensors");
  detail::check_tensor_list(weights, "load_weights");
  const checkpoint_reader r(path);
  for (const auto& t : weights) {
    const tensor_info& info = r.info(t.name);
    OOMB_CHECK(info.shape == t.shape, oomb::format_error, r.file_of(t.name), ": tensor '", t.name,
               "' has shape ", shape_string(info.shape), ", expected ", shape_string(t.shape));
  }
  if (!allow_unused) {
    for (const auto& name : r.names()) {
      bool known = false;
      for (const auto& t : weights) known = known || t.name == name;
      OOMB_CHECK(known, oomb::format_error, r.file_of(name), ": tensor '", name,
                 "' is not a parameter of this model");
    }
  }
  for (const auto& t : weights) r.read(t.name, t.shape, t.data);
}

/// `--dump-grads FILE`: one step's gradients as F32 safetensors under the parameter names, written
/// atomically. `metadata` goes to __metadata__ (e.g. step, loss).
template <class T>
void dump_gradients(const std::string& path, const std::vector<named_tensor<T>>& grads,
                    const std::map<std::string, std::string>& metadata = {}) {
  detail::check_tensor_list(grads, "dump_gradients");
  safetensors_writer w;
  for (const auto& g : grads) w.add(g, dtype::f32);
  for (const auto& kv : metadata) w.set_metadata(kv.first, kv.second);
  w.write(path);
}

}  // namespace oomb_trainer
