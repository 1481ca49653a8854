// oomb-train's --device: parsed and checked before anything is allocated, the banner names the
// device, and training_run's device path (a trainer_factory) runs the same loop as the CPU one.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/trainers/cpu_trainer.hpp"

namespace {

namespace fs = std::filesystem;

const std::vector<std::string> minimal{"--config", "c.json", "--synthetic", "kv-recall", "--seq-len", "64",
                                       "--chunk", "16", "--steps", "3", "--out", "o"};

std::vector<std::string> with(std::vector<std::string> extra) {
  auto a = minimal;
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

fs::path fresh_dir(const std::string& tag) {
  std::random_device rd;
  return fs::temp_directory_path() / ("oomb-device-flag-" + tag + "-" + std::to_string(rd()));
}

oomb_trainer::train_options tiny_run(const fs::path& out, const std::string& device) {
  auto o = oomb_trainer::parse_train_options(
      {"--config", std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json", "--synthetic", "kv-recall", "--seq-len",
       "64", "--chunk", "16", "--steps", "3", "--out", out.string(), "--quiet", "--device", device});
  return o;
}

}  // namespace

TEST_CASE("--device: cpu by default, cuda accepted by the parser with offload and sparse, anything else and --full-backprop named") {
  using oomb_trainer::parse_train_options;
  CHECK(parse_train_options(minimal).device == "cpu");
  CHECK(parse_train_options(with({"--device", "cuda"})).device == "cuda");
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--device", "tpu"})), doctest::Contains("unknown device 'tpu' (known: cpu, cuda)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--device"})), doctest::Contains("--device needs a value"),
                       oomb::invalid_argument);
  const auto streamed = parse_train_options(with({"--device", "cuda", "--offload", "--sparse-budget", "0"}));
  CHECK(streamed.offload);
  CHECK(streamed.sparse);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--device", "cuda", "--full-backprop"})),
                       doctest::Contains("--full-backprop is the CPU's baseline"), oomb::invalid_argument);
  CHECK(parse_train_options(with({"--offload"})).device == "cpu");  // the CPU keeps every mode
}

TEST_CASE("--device cuda without a device of this build is refused before anything is allocated or written") {
  const fs::path out = fresh_dir("none");
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(tiny_run(out, "cuda")), doctest::Contains("built without CUDA"),
                       oomb::invalid_argument);
  // A device whose check fails (no GPU, an unsupported head_dim): its message, and nothing written.
  oomb_trainer::trainer_factory absent;
  absent.name = "cuda";
  absent.require = [](const oomb_trainer::trainer_setup& s) {
    OOMB_EXPECTS(s.config.head_dim == 64, "test device: head_dim ", s.config.head_dim, " is not supported");
  };
  absent.make = [](const oomb_trainer::trainer_setup&) -> std::unique_ptr<oomb_trainer::trainer> { return nullptr; };
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(tiny_run(out, "cuda"), {}, absent),
                       doctest::Contains("head_dim 16 is not supported"), oomb::invalid_argument);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("--device: the device path runs the same loop (same losses as the CPU run) and the banner names it") {
  const fs::path a = fresh_dir("cpu"), b = fresh_dir("dev");
  // A "device" that is the CPU's trainer behind the maker: the plumbing alone, checkable anywhere.
  oomb_trainer::trainer_factory host;
  host.name = "cuda";
  host.require = [](const oomb_trainer::trainer_setup&) {};
  host.memory_use = [] { return oomb_trainer::device_memory_use{1ull << 30, 100ull << 30, 101ull << 30}; };
  host.make = [](const oomb_trainer::trainer_setup& s) -> std::unique_ptr<oomb_trainer::trainer> {
    return std::make_unique<oomb_trainer::cpu_trainer>(s);
  };
  oomb_trainer::training_run cpu(tiny_run(a, "cpu"));
  oomb_trainer::training_run dev(tiny_run(b, "cuda"), {}, host);
  CHECK(cpu.banner().find("device: cpu\n") != std::string::npos);
  CHECK(dev.banner().find("device: cpu\n") != std::string::npos);  // the trainer names where it runs
  while (!cpu.done()) {
    const auto x = cpu.step();
    const auto y = dev.step();
    CHECK(x.loss == y.loss);  // the same float computation behind either path
    CHECK(x.grad_norm == y.grad_norm);
    CHECK(y.chunked.kv_pages_high_water == x.chunked.kv_pages_high_water);
  }
  dev.save();
  CHECK(fs::exists(b / "checkpoint" / "model.safetensors"));
  CHECK(fs::read_symlink(b / "checkpoint") == "checkpoint-3");
  std::error_code ec;
  fs::remove_all(a, ec);
  fs::remove_all(b, ec);
}
