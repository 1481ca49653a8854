// Helpers of the training-loop tests shared by the CPU (test_training.cpp) and GPU
// (test_cuda_trainer.cu) suites: scratch folders, a checkpoint with one poisoned weight, file bytes.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "trainer/app/run.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/model/params.hpp"
#include "trainer/trainers/trainer.hpp"

namespace training_test {

namespace fs = std::filesystem;

/// The objects of a run's log.jsonl, one per line.
inline std::vector<nlohmann::json> log_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// A fresh folder under the temporary directory, removed at the end of the test.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag) {
    std::random_device rd;
    path = fs::temp_directory_path() / ("oomb-trainer-" + tag + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

/// The bytes of a file (to check that a checkpoint was not rewritten).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Copies the checkpoint folder `from` of a model of config `c` to `to` with element 0 of tensor
/// `name` set to NaN (everything else, moments and state included, as saved).
inline void write_poisoned_checkpoint(const std::string& from, const std::string& to, const oomb_trainer::model_config& c,
                                      const std::string& name) {
  oomb_trainer::model_params<float> p(c);
  std::vector<float> m(p.size()), v(p.size());
  const auto moments = oomb_trainer::moment_tensors(p.layout(), m.data(), v.data());
  const oomb_trainer::trainer_state st = oomb_trainer::load_checkpoint(from, c, p.named(), moments);
  p.tensor(name)[0] = std::numeric_limits<float>::quiet_NaN();
  oomb_trainer::save_checkpoint(to, c, p.named(), moments, st);
}

/// A run on `device` (empty: --device cpu) saves at step 1; resumed from a copy of that checkpoint
/// with a NaN norm weight, it stops at step 2 naming the step and the loss, before the optimizer
/// changed a weight, and the run's own checkpoint is not rewritten.
inline void check_non_finite_stop(oomb_trainer::train_options o, const oomb_trainer::trainer_factory& device,
                                  const temp_dir& tmp) {
  const oomb_trainer::model_config c = oomb_trainer::load_model_config(o.config);
  o.out = tmp / "run";
  o.stop_after = 1;
  oomb_trainer::training_run(o, {}, device).run();
  const std::string saved = tmp / "run/checkpoint";
  write_poisoned_checkpoint(saved, tmp / "poisoned", c, "model.layers.0.input_layernorm.weight");
  const std::string model_before = file_bytes(saved + "/model.safetensors");
  const std::string optimizer_before = file_bytes(saved + "/optimizer.safetensors");

  o.resume = tmp / "poisoned";
  o.stop_after = 0;
  oomb_trainer::training_run run(o, {}, device);
  const oomb_trainer::model_params<float> before = run.weights();
  std::string message;
  try {
    run.run();
  } catch (const oomb_trainer::non_finite_error& e) {
    message = e.what();
  }
  MESSAGE("non-finite stop: " << message);
  // The CPU's loss is NaN; on the H200 the GPU's forward left the loss finite (5.45) while the
  // gradient was NaN (an open question: some GPU op drops a NaN in the forward), and the norm check
  // stopped it. Either way the step is named and nothing is updated.
  CHECK((message.find("step 2: the loss of sequence 1 of 1 is") != std::string::npos ||
         message.find("step 2: the gradient norm is") != std::string::npos));
  CHECK(message.find("nan") != std::string::npos);
  CHECK(message.find("stopped before the optimizer update") != std::string::npos);
  CHECK(run.steps_taken() == 1);
  const oomb_trainer::model_params<float> after = run.weights();
  CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);  // NaN included
  CHECK(file_bytes(saved + "/model.safetensors") == model_before);
  CHECK(file_bytes(saved + "/optimizer.safetensors") == optimizer_before);
}

/// --resume from a checkpoint of another shape is refused, naming the field or the tensor, before
/// the training state is allocated or --out created.
inline void check_mismatched_checkpoint(oomb_trainer::train_options o, const oomb_trainer::trainer_factory& device,
                                        const temp_dir& tmp) {
  const oomb_trainer::model_config c = oomb_trainer::load_model_config(o.config);
  oomb_trainer::model_config other = c;
  other.intermediate_size += 16;
  oomb_trainer::model_params<float> p(other);
  std::vector<float> m(p.size()), v(p.size());
  oomb_trainer::trainer_state st;
  st.step = 1;
  const std::string dir = tmp / "other";
  oomb_trainer::save_checkpoint(dir, other, p.named(), oomb_trainer::moment_tensors(p.layout(), m.data(), v.data()), st);
  o.resume = dir;
  o.out = tmp / "never";
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(o, {}, device),
                       doctest::Contains("field 'intermediate_size' differs from --config"), oomb::format_error);
  // The config says the model's shape, the tensors another: the first tensor that disagrees.
  std::ofstream(fs::path(dir) / "config.json") << oomb_trainer::to_json(c).dump(2);
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(o, {}, device), doctest::Contains("mlp.gate_proj.weight' has shape"),
                       oomb::format_error);
  CHECK_FALSE(fs::exists(o.out));
}

}  // namespace training_test
