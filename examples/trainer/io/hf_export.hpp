// oomb trainer — model folders in the Hugging Face layout, as transformers' save_pretrained writes them.
// SPDX-License-Identifier: Apache-2.0
//
// What transformers 5.17 writes and reads (modeling_utils.save_pretrained, huggingface_hub's
// split_torch_state_dict_into_shards), followed here so that from_pretrained loads the folder as it is:
//   config.json                         the model's config, "dtype" set to the weights' dtype
//   model.safetensors                   every weight, when they fit in one shard; else
//   model-0000k-of-0000n.safetensors    the shards (each carries {"format": "pt"} in its metadata)
//   model.safetensors.index.json        {"metadata": {"total_parameters": P, "total_size": S},
//                                        "weight_map": {"<tensor>": "<shard file>", ...}}
//   tokenizer and generation files      copied from the folder the weights came from, when there
// Shards are cut as huggingface_hub cuts them: tensors in model order into the current shard until
// the next one would take it past the limit; a tensor larger than the limit gets a shard of its own,
// numbered before the shard being filled. The default limit is save_pretrained's, "50GB"
// (50 * 10^9 bytes). Sizes are the bytes of the output dtype.
#pragma once

#include <sys/stat.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"
#include "trainer/io/atomic_write.hpp"
#include "trainer/io/safetensors.hpp"

namespace oomb_trainer {

/// The layout of a checkpoint folder: the trainer's own (config.json, model.safetensors,
/// optimizer.safetensors, trainer_state.json) or an HF model folder (the file comment) with the
/// optimizer and trainer state beside it.
enum class checkpoint_layout { oomb, hf };

/// save_pretrained's default max_shard_size in transformers 5.17: "50GB", 50 * 10^9 bytes.
inline constexpr std::uint64_t hf_default_max_shard_bytes = 50'000'000'000ull;

/// The files transformers' save_pretrained and a tokenizer's save_pretrained write beside the
/// weights (tokenizers of every kind: fast, SentencePiece, BPE vocab + merges, chat templates),
/// copied from the source folder when present. Nothing in them depends on the weights.
inline const std::vector<std::string>& hf_companion_files() {
  static const std::vector<std::string> names = {
      "generation_config.json", "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
      "tokenizer.model",        "vocab.json",         "merges.txt",            "added_tokens.json",
      "chat_template.jinja",    "chat_template.json", "vocab.txt",             "preprocessor_config.json"};
  return names;
}

/// The dtype name config.json gives the weights ("bfloat16", "float32", "float64").
inline const char* hf_dtype_name(dtype t) {
  switch (t) {
    case dtype::bf16: return "bfloat16";
    case dtype::f32: return "float32";
    case dtype::f64: return "float64";
    case dtype::f16: return "float16";
    default: OOMB_FAIL(oomb::invalid_argument, "hf_dtype_name: ", dtype_name(t), " is not a weight dtype");
  }
}

/// --save-dtype: bfloat16 or float32 (the names config.json uses).
inline dtype parse_save_dtype(const std::string& v, const std::string& flag = "--save-dtype") {
  if (v == "bfloat16") return dtype::bf16;
  if (v == "float32") return dtype::f32;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown dtype '", v, "' (known: bfloat16, float32)");
}

/// A shard size: huggingface_hub's decimal units (5GB = 5 * 10^9, also KB, MB, TB) or parse_bytes'
/// binary ones (5G, 5GiB = 5 * 2^30, K, M, T, KiB, MiB, TiB) or plain bytes.
inline std::uint64_t parse_shard_size(const std::string& text, const std::string& flag = "--save-shard-size") {
  const std::string bad = flag + ": '" + text + "' is not a size (e.g. 5GB, 50GB, 500MB, 4GiB, 1000000)";
  OOMB_EXPECTS(!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])), bad);
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    OOMB_FAIL(oomb::invalid_argument, bad);
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::uint64_t mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kb") mult = 1000ull;
  else if (unit == "mb") mult = 1000'000ull;
  else if (unit == "gb") mult = 1000'000'000ull;
  else if (unit == "tb") mult = 1000'000'000'000ull;
  else if (unit == "k" || unit == "kib") mult = 1ull << 10;
  else if (unit == "m" || unit == "mib") mult = 1ull << 20;
  else if (unit == "g" || unit == "gib") mult = 1ull << 30;
  else if (unit == "t" || unit == "tib") mult = 1ull << 40;
  OOMB_EXPECTS(mult != 0, bad);
  OOMB_EXPECTS(n <= std::numeric_limits<std::uint64_t>::max() / mult, flag, ": '", text, "' is too large");
  OOMB_EXPECTS(n > 0, flag, " must be more than 0 bytes");
  return n * mult;
}

/// One shard: its file name, the indices (into the tensor list) of the tensors it holds in file
/// order, and their bytes.
struct hf_shard {
  std::string file;
  std::vector<std::size_t> tensors;
  std::uint64_t bytes = 0;
};

struct hf_shard_plan {
  std::vector<hf_shard> shards;
  std::uint64_t total_size = 0;  ///< the tensors' bytes, the index's metadata.total_size
  bool sharded() const noexcept { return shards.size() > 1; }
};

/// huggingface_hub's split_torch_state_dict_into_shards over tensors of `tensor_bytes` bytes, in
/// order: one shard is model.safetensors, several are model-<k>-of-<n>.safetensors (5 digits each).
inline hf_shard_plan plan_hf_shards(const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_shard_bytes) {
  OOMB_EXPECTS(max_shard_bytes > 0, "plan_hf_shards: the shard limit must be more than 0 bytes");
  hf_shard_plan p;
  hf_shard current;
  for (std::size_t i = 0; i < tensor_bytes.size(); ++i) {
    const std::uint64_t b = tensor_bytes[i];
    p.total_size += b;
    if (b > max_shard_bytes) {  // alone, and before the shard being filled (as huggingface_hub does)
      hf_shard big;
      big.tensors.push_back(i);
      big.bytes = b;
      p.shards.push_back(std::move(big));
      continue;
    }
    if (current.bytes + b > max_shard_bytes) {  // never true for an empty shard: b <= max here
      p.shards.push_back(std::move(current));
      current = {};
    }
    current.tensors.push_back(i);
    current.bytes += b;
  }
  if (!current.tensors.empty()) p.shards.push_back(std::move(current));
  const std::size_t n = p.shards.size();
  OOMB_EXPECTS(n <= 99999, "plan_hf_shards: ", n, " shards, more than the 5-digit names hold; raise the shard limit");
  auto five = [](std::size_t v) {  // n <= 99999: five digits
    std::string d = std::to_string(v);
    return std::string(5 - d.size(), '0') + d;
  };
  for (std::size_t k = 0; k < n; ++k)
    p.shards[k].file = n == 1 ? std::string("model.safetensors") : "model-" + five(k + 1) + "-of-" + five(n) + ".safetensors";
  return p;
}

/// The index file of a sharded folder, as save_pretrained writes it (keys sorted, indent 2).
inline nlohmann::json hf_index_json(const hf_shard_plan& p, const std::vector<std::string>& names,
                                    std::uint64_t total_parameters) {
  nlohmann::json j;
  j["metadata"] = {{"total_parameters", total_parameters}, {"total_size", p.total_size}};
  j["weight_map"] = nlohmann::json::object();
  for (const auto& s : p.shards)
    for (std::size_t i : s.tensors) j["weight_map"][names[i]] = s.file;
  return j;
}

/// config.json for weights of dtype `weights`: transformers 5 writes and reads "dtype" (and still
/// reads "torch_dtype", preferring "dtype"); "torch_dtype" is set too when the config has one, so
/// that transformers 4 readers see the same.
inline nlohmann::json hf_config_json(nlohmann::json config, dtype weights) {
  OOMB_EXPECTS(config.is_object(), "hf_config_json: the config must be a JSON object");
  config["dtype"] = hf_dtype_name(weights);
  if (config.contains("torch_dtype")) config["torch_dtype"] = hf_dtype_name(weights);
  return config;
}

/// The folder whose tokenizer and generation files go with weights read from `path` (an --init or
/// --resume argument): the folder itself, or the folder of a file.
inline std::string hf_companion_source(const std::string& path) {
  std::error_code ec;
  if (path.empty() || std::filesystem::is_directory(path, ec)) return path;
  return std::filesystem::path(path).parent_path().string();
}

/// Copies the companion files (hf_companion_files()) that `from` holds into folder `to`; returns
/// their names. Links are followed (an HF cache's snapshot links to its blobs); the copies get
/// ordinary permissions later (the caller's). An empty `from` copies nothing.
inline std::vector<std::string> copy_hf_companions(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  std::vector<std::string> copied;
  if (from.empty()) return copied;
  for (const auto& name : hf_companion_files()) {
    const fs::path src = fs::path(from) / name;
    std::error_code ec;
    if (!fs::is_regular_file(src, ec)) continue;  // follows links
    const fs::path dst = fs::path(to) / name;
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
    OOMB_CHECK(!ec, oomb::error, src.string(), ": cannot copy it to ", dst.string(), ": ", ec.message());
    copied.push_back(name);
  }
  return copied;
}

/// Writes `weights` into folder `dir` as an HF model's safetensors: model.safetensors, or shards of
/// at most `max_shard_bytes` (plan_hf_shards) and model.safetensors.index.json; in dtype `dt` (BF16
/// rounds to nearest even), each shard with {"format": "pt"} as transformers writes it. `done` is
/// called with each file's name once it is complete. Tensor: named_tensor<T> or streamed_tensor<T>
/// (a streamed one is copied out when its shard is written). Returns the plan it followed.
template <class Tensor>
hf_shard_plan write_hf_weights(const std::string& dir, const std::vector<Tensor>& weights, dtype dt,
                               std::uint64_t max_shard_bytes, const std::function<void(const std::string&)>& done = {}) {
  OOMB_EXPECTS(dt == dtype::bf16 || dt == dtype::f32 || dt == dtype::f64, "write_hf_weights: dtype ", dtype_name(dt),
               " is not one the writer makes (BF16, F32, F64)");
  std::vector<std::uint64_t> bytes;
  std::vector<std::string> names;
  std::uint64_t parameters = 0;
  for (const auto& t : weights) {
    bytes.push_back(t.numel() * dtype_size(dt));
    names.push_back(t.name);
    parameters += t.numel();
  }
  const hf_shard_plan plan = plan_hf_shards(bytes, max_shard_bytes);
  for (const auto& s : plan.shards) {
    safetensors_writer w;
    for (std::size_t i : s.tensors) w.add(weights[i], dt);
    w.set_metadata("format", "pt");  // what transformers expects of a model.safetensors
    w.write(dir + "/" + s.file);
    if (done) done(s.file);
  }
  if (plan.sharded()) {
    const std::string text = hf_index_json(plan, names, parameters).dump(2) + "\n";
    write_file_atomically(dir + "/model.safetensors.index.json", text.data(), text.size());
    if (done) done("model.safetensors.index.json");
  }
  return plan;
}

/// Whether `name` is a file an HF model folder written here holds (an --export may replace such a
/// folder, never one holding anything else).
inline bool is_hf_model_file(const std::string& name) {
  if (name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  for (const auto& c : hf_companion_files())
    if (name == c) return true;
  // model-00001-of-00002.safetensors
  if (name.size() != sizeof("model-00001-of-00002.safetensors") - 1 || name.compare(0, 6, "model-") != 0 ||
      name.compare(11, 4, "-of-") != 0 || name.compare(20, 12, ".safetensors") != 0)
    return false;
  for (std::size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19})
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

/// Refuses an export target that is not a folder, or a folder holding anything but the files of an
/// HF model folder (an export replaces the whole folder).
inline void check_hf_export_target(const std::string& dir, const std::string& flag = "--export") {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dir, ec))) return;
  OOMB_EXPECTS(fs::is_directory(dir, ec), flag, " ", dir, ": exists and is not a folder");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    OOMB_EXPECTS(is_hf_model_file(name) && e.is_regular_file(ec), flag, " ", dir, ": the folder holds '", name,
                 "', which is not a file of an HF model folder; the export replaces the whole folder, so give a new "
                 "folder (or one an earlier export wrote)");
  }
}

}  // namespace oomb_trainer
