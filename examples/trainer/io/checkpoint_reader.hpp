// oomb trainer — reads model weights from one safetensors file or a sharded HF checkpoint.
// SPDX-License-Identifier: Apache-2.0
//
// Given a folder, a .safetensors file or a model.safetensors.index.json, it opens every file the
// checkpoint consists of, validates them all up front (and that each tensor the index names is in
// the shard it says), and then reads tensors by name wherever they live.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"
#include "trainer/io/safetensors.hpp"

namespace oomb_trainer {

class checkpoint_reader {
 public:
  /// `path`: a folder (holding model.safetensors.index.json or model.safetensors), a .safetensors
  /// file, or an index .json file. Throws oomb::format_error for a malformed index or shard.
  explicit checkpoint_reader(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::string file = path;
    if (fs::is_directory(path, ec)) {
      const std::string index = (fs::path(path) / "model.safetensors.index.json").string();
      const std::string single = (fs::path(path) / "model.safetensors").string();
      if (fs::exists(index, ec))
        file = index;
      else if (fs::exists(single, ec))
        file = single;
      else
        OOMB_FAIL(oomb::format_error, path,
                  ": holds neither model.safetensors.index.json nor model.safetensors");
    }
    origin_ = file;
    if (file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0)
      open_index(file);
    else
      open_single(file);
  }

  /// The file errors are reported against for tensors not found: the index or the single file.
  const std::string& path() const noexcept { return origin_; }
  std::size_t shard_count() const noexcept { return shards_.size(); }

  /// Every tensor name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : where_) out.push_back(kv.first);
    return out;
  }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }

  const tensor_info& info(const std::string& name) const { return shard_of(name).info(name); }
  /// The file holding tensor `name`.
  const std::string& file_of(const std::string& name) const { return shard_of(name).path(); }

  template <class T>
  void read(const std::string& name, const std::vector<std::int64_t>& expected_shape, T* out) const {
    shard_of(name).read(name, expected_shape, out);
  }
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& expected_shape) const {
    return shard_of(name).template read<T>(name, expected_shape);
  }

 private:
  const safetensors_file& shard_of(const std::string& name) const {
    auto it = where_.find(name);
    OOMB_CHECK(it != where_.end(), oomb::format_error, origin_, ": tensor '", name, "' is missing");
    return shards_[it->second];
  }

  void open_single(const std::string& file) {
    shards_.push_back(safetensors_file::open(file));
    for (const auto& t : shards_.back().tensors()) where_[t.name] = 0;
  }

  void open_index(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    OOMB_CHECK(in.good(), oomb::error, file, ": cannot open the index");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json j =
        detail::parse_json_bounded(text.data(), text.data() + text.size(), 16, file, "index");
    OOMB_CHECK(j.is_object(), oomb::format_error, file, ": the index must be a JSON object");
    auto wm = j.find("weight_map");
    OOMB_CHECK(wm != j.end(), oomb::format_error, file, ": field 'weight_map' is missing");
    OOMB_CHECK(wm->is_object(), oomb::format_error, file, ": field 'weight_map' must be an object");
    const auto dir = std::filesystem::path(file).parent_path();
    std::map<std::string, std::size_t> shard_ids;
    for (const auto& item : wm->items()) {
      OOMB_CHECK(item.value().is_string(), oomb::format_error, file, ": tensor '", item.key(),
                 "': weight_map entry must be a file name, got ", detail::json_brief(item.value()));
      const std::string shard = item.value().get<std::string>();
      // Shards are plain names beside the index: never a path that leaves the folder.
      OOMB_CHECK(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos &&
                     shard.find('\\') == std::string::npos,
                 oomb::format_error, file, ": tensor '", item.key(), "': shard name '", shard,
                 "' is not a plain file name");
      auto sid = shard_ids.find(shard);
      if (sid == shard_ids.end()) {
        shards_.push_back(safetensors_file::open((dir / shard).string()));
        sid = shard_ids.emplace(shard, shards_.size() - 1).first;
      }
      OOMB_CHECK(shards_[sid->second].contains(item.key()), oomb::format_error, file, ": tensor '",
                 item.key(), "' is mapped to shard '", shard, "', which does not contain it");
      where_[item.key()] = sid->second;
    }
  }

  std::string origin_;
  std::vector<safetensors_file> shards_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace oomb_trainer
