// oomb-train's --device cuda through training_run (train/run.hpp + train/cuda_loss.cuh): three
// steps on the GPU give the CPU run's losses, gradient norms and weights within what bf16 explains,
// and the device's checks refuse a head_dim the kernels do not take before anything is allocated.
// SPDX-License-Identifier: Apache-2.0
//
// Tolerances: the first step's loss differs from the float CPU run's only by bf16 compute (and the
// weights rounded to bf16), 5e-3 relative as in test_cuda_backend.cu; later steps start from
// weights that already differ by one or two AdamW updates computed from gradients within 3e-2 of
// each other: 1e-2. Gradient norms (before clipping): 3e-2, the per-tensor gradient bound. Weights
// after three steps at lr 1e-3 (each element moves by at most ~3e-3 against an init of std 0.02):
// 2e-2 norm-wise relative.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "device_util.cuh"
#include "model_util.hpp"
#include "test_util.hpp"
#include "trainer/io/config.hpp"
#include "trainer/train/cuda_loss.cuh"
#include "trainer/train/run.hpp"

namespace {

namespace fs = std::filesystem;

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& tag) {
    std::random_device rd;
    path = fs::temp_directory_path() / ("oomb-cuda-training-" + tag + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// A config.json of a tiny model with head_dim d, written under dir.
std::string write_config(const fs::path& dir, std::int32_t d) {
  oomb_trainer::model_config c = trainer_test::tiny_config(/*hq=*/4, /*hkv=*/2, /*tied=*/false, d, /*layers=*/2,
                                                           /*vocab=*/300);
  c.intermediate_size = 384;
  const auto path = (dir / ("config-" + std::to_string(d) + ".json")).string();
  std::ofstream(path) << oomb_trainer::to_json(c).dump(2);
  return path;
}

oomb_trainer::train_options options(const std::string& config, const fs::path& out, const std::string& device) {
  return oomb_trainer::parse_train_options({"--config", config, "--synthetic", "kv-recall", "--seq-len", "96",
                                            "--chunk", "32", "--page", "16", "--steps", "3", "--lr", "1e-3",
                                            "--out", out.string(), "--quiet", "--device", device});
}

}  // namespace

TEST_CASE("oomb-train --device cuda: three steps through training_run match the CPU run within bf16's tolerance") {
  scratch_dir tmp("steps");
  const std::string config = write_config(tmp.path, 64);
  oomb_trainer::training_run cpu(options(config, tmp.path / "cpu", "cpu"));
  oomb_trainer::training_run gpu(options(config, tmp.path / "gpu", "cuda"), {}, oomb_trainer::cuda_device_loss());
  CHECK(gpu.banner().find("device: cuda") != std::string::npos);
  for (int s = 0; s < 3; ++s) {
    const auto want = cpu.step();
    const auto got = gpu.step();
    const double loss_err = std::abs(got.loss - want.loss) / std::abs(want.loss);
    const double norm_err = std::abs(got.grad_norm - want.grad_norm) / want.grad_norm;
    MESSAGE("step " << s + 1 << ": loss cpu " << want.loss << " cuda " << got.loss << " (rel " << loss_err
                    << "), grad norm cpu " << want.grad_norm << " cuda " << got.grad_norm << " (rel " << norm_err << ")");
    CHECK(std::isfinite(got.loss));
    CHECK(loss_err <= (s == 0 ? 5e-3 : 1e-2));
    CHECK(norm_err <= 3e-2);
    CHECK(got.chunked.kv_pages_high_water == want.chunked.kv_pages_high_water);
  }
  const double weight_err = trainer_test::rel_err(gpu.params().data(), cpu.params().data(), cpu.params().size());
  MESSAGE("weights after 3 steps: rel " << weight_err);
  CHECK(weight_err <= 2e-2);
  gpu.save();
  CHECK(fs::exists(tmp.path / "gpu" / "checkpoint" / "model.safetensors"));
  CHECK(fs::exists(tmp.path / "gpu" / "checkpoint" / "optimizer.safetensors"));
}

TEST_CASE("oomb-train --device cuda: a head_dim the kernels do not take is refused before anything is written") {
  scratch_dir tmp("head-dim");
  const std::string config = write_config(tmp.path, 32);
  const fs::path out = tmp.path / "out";
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(options(config, out, "cuda"), {}, oomb_trainer::cuda_device_loss()),
                       doctest::Contains("head_dim 32 is not supported (the attention kernels take 64 and 128)"),
                       oomb::invalid_argument);
  CHECK_FALSE(fs::exists(out));
}
