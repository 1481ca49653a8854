// The trainer's folders are layers: a file includes only its own folder and the folders below it
// (docs/trainer.md, "Layout"). Read from the sources themselves, so a new include that climbs
// a layer fails here, by file and line.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

/// The folders of examples/trainer, lowest first: each may include only those before it (and itself).
const std::vector<std::string> layers = {"io", "model", "data", "optim", "ops", "cpu",
                                         "cuda/ops", "cuda", "algo", "trainers", "app", ""};

/// The layer of a path relative to examples/trainer ("cuda/ops/gemm.cuh" -> "cuda/ops"; "main.cpp" -> "").
std::string folder_of(const std::string& rel) {
  const auto slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

long rank_of(const std::string& folder) {
  const auto it = std::find(layers.begin(), layers.end(), folder);
  return it == layers.end() ? -1 : static_cast<long>(it - layers.begin());
}

/// "" when `from` may include `to`, else why not.
std::string violation(const std::string& from, const std::string& to) {
  const long a = rank_of(folder_of(from)), b = rank_of(folder_of(to));
  if (a < 0) return from + " is in no layer";
  if (b < 0) return to + " is in no layer";
  if (b > a) return from + " includes " + to + ", a layer above it";
  return {};
}

}  // namespace

TEST_CASE("layers: the rule itself") {
  CHECK(violation("algo/chunk_recurrent.hpp", "ops/ops_backend.hpp").empty());
  CHECK(violation("cuda/cuda_ops.cuh", "cuda/ops/gemm.cuh").empty());
  CHECK(violation("main.cpp", "app/run.hpp").empty());
  CHECK_FALSE(violation("cuda/ops/gemm.cuh", "cuda/device_buffer.cuh").empty());
  CHECK_FALSE(violation("model/block.hpp", "algo/chunk_options.hpp").empty());
  CHECK_FALSE(violation("tools/x.hpp", "io/config.hpp").empty());
}

TEST_CASE("layers: no file of examples/trainer includes a layer above its own") {
  const fs::path root = fs::path(OOMB_TRAINER_SOURCE_DIR) / "examples" / "trainer";
  REQUIRE(fs::is_directory(root));
  const std::string prefix = "#include \"trainer/";
  int files = 0, includes = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".hpp" && ext != ".cuh" && ext != ".cpp" && ext != ".cu")) continue;
    const std::string rel = fs::relative(e.path(), root).generic_string();
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string to = line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size());
      ++includes;
      const std::string why = violation(rel, to);
      const std::string where = rel + ":" + std::to_string(number);
      INFO(where);
      CHECK_MESSAGE(why.empty(), why);
    }
  }
  CHECK(files > 50);
  CHECK(includes > 100);
}
