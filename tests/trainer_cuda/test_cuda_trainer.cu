// oomb-train --device cuda through training_run (app/run.hpp + trainers/cuda_trainer.cuh): the
// training state on the GPU. Three steps against the CPU run from the same weights (--batch 1 and
// 2), a checkpoint round trip CPU -> GPU -> CPU, resume on the GPU against the uninterrupted GPU
// run, the optimizer state split to pinned host memory (--optimizer-gpu-memory) against all of it
// on the GPU and its checkpoints, the NaN stop, a mismatched checkpoint and a head_dim the kernels
// do not take refused before anything is allocated.
// SPDX-License-Identifier: Apache-2.0
//
// Tolerances against the CPU (float): the first step's loss differs only by bf16 compute (and the
// weights rounded to bf16), 5e-3 relative as in test_cuda_ops.cu; later steps start from
// weights that already differ by one or two AdamW updates computed from gradients within 3e-2 of
// each other: 1e-2. Gradient norms (before clipping): 3e-2, the per-tensor gradient bound. Weights
// after three steps at lr 1e-3 (each element moves by at most ~3e-3 against an init of std 0.02):
// 2e-2 norm-wise relative. GPU against GPU: checkpoints hold fp32 masters and moments, so save and
// load are bit-exact, and so is the forward (the first step's loss); the attention backward adds dQ
// with atomics, so gradients, and the weights after an update, differ by summation order only:
// 1e-3 (losses and weights). With --deterministic (pages of 128: the Hopper kernels) dQ is added in
// key block order: two runs, and a stopped-and-resumed one, are the same bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "device_util.cuh"
#include "model_util.hpp"
#include "test_util.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/config.hpp"
#include "trainer/trainers/cuda_factory.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::temp_dir;

/// init_hf's weights of `config` (seed 1234) as an HF folder: both devices' --init.
std::string write_init(const fs::path& dir, const std::string& config) {
  const oomb_trainer::model_config c = oomb_trainer::load_model_config(config);
  oomb_trainer::model_params<float> p(c);
  oomb_trainer::init_hf(p, 1234);
  const auto path = (dir / "init").string();
  oomb_trainer::save_checkpoint(path, c, p.named(), std::vector<oomb_trainer::named_tensor<float>>{}, {});
  return path;
}

oomb_trainer::train_options options(const std::string& config, const fs::path& out, const std::string& device,
                                    const std::string& init = {}) {
  auto o = oomb_trainer::parse_train_options({"--config", config, "--synthetic", "kv-recall", "--seq-len", "96",
                                              "--chunk", "32", "--page", "16", "--steps", "3", "--lr", "1e-3",
                                              "--out", out.string(), "--quiet", "--device", device});
  o.init = init;
  return o;
}

double rel(double got, double want) { return std::abs(got - want) / std::abs(want); }

double weight_err(const oomb_trainer::training_run& a, const oomb_trainer::training_run& b) {
  const auto x = a.weights(), y = b.weights();
  return trainer_test::rel_err(x.data(), y.data(), y.size());
}

}  // namespace

TEST_CASE("oomb-train --device cuda: three steps (--batch 1 and 2) match the CPU run from the same weights") {
  temp_dir tmp("cuda-steps");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const std::string init = write_init(tmp.path, config);
  for (const std::int32_t batch : {1, 2}) {
    CAPTURE(batch);
    auto oc = options(config, tmp.path / ("cpu" + std::to_string(batch)), "cpu", init);
    auto og = options(config, tmp.path / ("gpu" + std::to_string(batch)), "cuda", init);
    oc.batch = og.batch = batch;
    oomb_trainer::training_run cpu(oc);
    oomb_trainer::training_run gpu(og, {}, oomb_trainer::cuda_trainer_factory());
    CHECK(gpu.banner().find("device: cuda (fp32 master weights") != std::string::npos);
    CHECK(weight_err(gpu, cpu) == 0.0);  // both loaded the same fp32 file
    for (int s = 0; s < 3; ++s) {
      const auto want = cpu.step();
      const auto got = gpu.step();
      MESSAGE("batch " << batch << " step " << s + 1 << ": loss cpu " << want.loss << " cuda " << got.loss << " (rel "
                       << rel(got.loss, want.loss) << "), grad norm cpu " << want.grad_norm << " cuda " << got.grad_norm
                       << " (rel " << rel(got.grad_norm, want.grad_norm) << ")");
      CHECK(std::isfinite(got.loss));
      CHECK(rel(got.loss, want.loss) <= (s == 0 ? 5e-3 : 1e-2));
      CHECK(rel(got.grad_norm, want.grad_norm) <= 3e-2);
      CHECK(got.tokens == want.tokens);
      CHECK(got.chunked.kv_pages_high_water == want.chunked.kv_pages_high_water);
    }
    const double err = weight_err(gpu, cpu);
    MESSAGE("batch " << batch << ": weights after 3 steps: rel " << err);
    CHECK(err <= 2e-2);
  }
}

TEST_CASE("oomb-train --device cuda: checkpoint round trip CPU -> GPU -> CPU continues within tolerance") {
  temp_dir tmp("cuda-round-trip");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const std::string init = write_init(tmp.path, config);
  oomb_trainer::training_run whole(options(config, tmp.path / "whole", "cpu", init));
  std::vector<double> losses;
  while (!whole.done()) losses.push_back(whole.step().loss);

  auto o1 = options(config, tmp.path / "cpu1", "cpu", init);
  o1.stop_after = 1;
  oomb_trainer::training_run(o1).run();  // step 1 on the CPU, saved

  auto o2 = options(config, tmp.path / "gpu2", "cuda");
  o2.resume = (tmp.path / "cpu1" / "checkpoint").string();
  o2.stop_after = 1;
  {
    oomb_trainer::training_run gpu(o2, {}, oomb_trainer::cuda_trainer_factory());
    REQUIRE(gpu.steps_taken() == 1);
    const auto loaded = gpu.weights();
    oomb_trainer::model_params<float> saved(loaded.config());
    std::vector<float> m(saved.size()), v(saved.size());
    oomb_trainer::load_checkpoint(o2.resume, saved.config(), saved.named(),
                                  oomb_trainer::moment_tensors(saved.layout(), m.data(), v.data()));
    CHECK(std::memcmp(loaded.data(), saved.data(), saved.size() * sizeof(float)) == 0);  // the upload is exact
    const auto r = gpu.step();  // step 2 on the GPU, then saved
    MESSAGE("step 2 on the GPU after the CPU's step 1: loss " << r.loss << ", uninterrupted CPU " << losses[1]);
    CHECK(rel(r.loss, losses[1]) <= 5e-3);
    gpu.save();
  }
  auto o3 = options(config, tmp.path / "cpu3", "cpu");
  o3.resume = (tmp.path / "gpu2" / "checkpoint").string();
  oomb_trainer::training_run cpu(o3);
  REQUIRE(cpu.steps_taken() == 2);
  const auto r = cpu.step();  // step 3 back on the CPU
  MESSAGE("step 3 on the CPU after the GPU's step 2: loss " << r.loss << ", uninterrupted CPU " << losses[2]);
  CHECK(rel(r.loss, losses[2]) <= 1e-2);
  const double err = weight_err(cpu, whole);
  MESSAGE("weights after CPU -> GPU -> CPU against the CPU alone: rel " << err);
  CHECK(err <= 2e-2);
}

TEST_CASE("oomb-train --device cuda: resume on the GPU continues within tolerance of the uninterrupted GPU run") {
  temp_dir tmp("cuda-resume");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const std::string init = write_init(tmp.path, config);
  oomb_trainer::training_run whole(options(config, tmp.path / "whole", "cuda", init), {}, oomb_trainer::cuda_trainer_factory());
  std::vector<double> losses;
  while (!whole.done()) losses.push_back(whole.step().loss);

  auto oa = options(config, tmp.path / "part", "cuda", init);
  oa.stop_after = 1;
  oomb_trainer::model_params<float> at_save(oomb_trainer::load_model_config(config));
  {
    oomb_trainer::training_run first(oa, {}, oomb_trainer::cuda_trainer_factory());
    const double loss = first.step().loss;
    CHECK(loss == losses[0]);  // the forward is deterministic: same weights, same loss bits
    first.save();
    at_save = first.weights();
  }
  auto ob = options(config, tmp.path / "part", "cuda");
  ob.resume = (tmp.path / "part" / "checkpoint").string();
  oomb_trainer::training_run rest(ob, {}, oomb_trainer::cuda_trainer_factory());
  const auto loaded = rest.weights();
  CHECK(std::memcmp(loaded.data(), at_save.data(), at_save.size() * sizeof(float)) == 0);  // save + load: exact
  for (std::size_t s = 1; !rest.done(); ++s) {
    const double loss = rest.step().loss;
    MESSAGE("resumed GPU step " << s + 1 << ": loss " << loss << ", uninterrupted " << losses[s] << " (rel "
                                << rel(loss, losses[s]) << ")");
    CHECK(rel(loss, losses[s]) <= 1e-3);
  }
  const double err = weight_err(rest, whole);
  MESSAGE("resumed GPU weights against the uninterrupted GPU run: rel " << err << " (dQ's atomics only)");
  CHECK(err <= 1e-3);
}

TEST_CASE("oomb-train --device cuda --deterministic: two runs, and a stopped-and-resumed one, are the same bits") {
  temp_dir tmp("cuda-deterministic");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const std::string init = write_init(tmp.path, config);
  // Pages of 128 (the Hopper kernels): 4,096 tokens in chunks of 512, so a chunk's backward adds
  // each dQ step from up to 32 key blocks; in place and with offload (8 near slots, 4 per window).
  // (At 1,024 tokens two default runs gave the same bits: too few blocks to reorder.) Page-sparse:
  // 4 selected past pages + sink + local per tile of 64 queries (GQA 2: 128 rows), of up to 28.
  struct mode {
    bool sparse, offload;
  };
  const auto run_options = [&](const fs::path& out, mode m, bool deterministic) {
    std::vector<std::string> a{"--config", config, "--synthetic", "kv-recall", "--seq-len", "4096", "--chunk", "512",
                               "--page", "128", "--steps", "4", "--lr", "1e-3", "--out", out.string(), "--quiet",
                               "--device", "cuda"};
    if (m.offload) a.insert(a.end(), {"--offload", "--near-pages", "8"});
    if (m.sparse) a.insert(a.end(), {"--sparse-budget", "4", "--sink", "1", "--local", "1", "--tile", "64"});
    if (deterministic) a.push_back("--deterministic");
    auto o = oomb_trainer::parse_train_options(a);
    o.init = init;
    return o;
  };
  struct result {
    std::vector<double> losses;
    std::vector<std::string> files;  // the last checkpoint's weights and AdamW state
  };
  const auto finish = [](oomb_trainer::training_run& r, const fs::path& out, result& res) {
    while (!r.done()) res.losses.push_back(r.step().loss);
    r.save();
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      res.files.push_back(training_test::file_bytes((out / "checkpoint-4" / file).string()));
  };
  const auto straight = [&](const fs::path& out, mode m, bool deterministic) {
    result res;
    oomb_trainer::training_run r(run_options(out, m, deterministic), {}, oomb_trainer::cuda_trainer_factory());
    finish(r, out, res);
    return res;
  };
  for (const mode m : {mode{false, false}, mode{false, true}, mode{true, false}, mode{true, true}}) {
    const std::string name = std::string(m.sparse ? "sparse-" : "dense-") + (m.offload ? "offload" : "in-place");
    CAPTURE(name);
    const result a = straight(tmp.path / (name + "-a"), m, true), b = straight(tmp.path / (name + "-b"), m, true);
    CHECK(a.losses == b.losses);
    CHECK(a.files == b.files);
    // stopped after 2 steps and resumed: the same losses and the same bytes at step 4
    const fs::path part = tmp.path / (name + "-part");
    result resumed;
    {
      auto o = run_options(part, m, true);
      o.stop_after = 2;
      oomb_trainer::training_run first(o, {}, oomb_trainer::cuda_trainer_factory());
      for (int s = 0; s < 2; ++s) resumed.losses.push_back(first.step().loss);
      first.save();
    }
    auto o = run_options(part, m, true);
    o.init.clear();
    o.resume = (part / "checkpoint").string();
    oomb_trainer::training_run rest(o, {}, oomb_trainer::cuda_trainer_factory());
    finish(rest, part, resumed);
    CHECK(resumed.losses == a.losses);
    CHECK(resumed.files == a.files);
    // Without the flag, for the docs: how far two straight runs drift apart.
    const result x = straight(tmp.path / (name + "-x"), m, false), y = straight(tmp.path / (name + "-y"), m, false);
    double worst = 0;
    for (std::size_t s = 0; s < x.losses.size(); ++s) worst = std::max(worst, rel(y.losses[s], x.losses[s]));
    const std::string same = x.files == y.files ? "the same bytes" : "different bytes";
    MESSAGE(name << ": two runs without --deterministic: losses apart by up to " << worst << " (relative), checkpoints "
                 << same << "; with it: the same bytes");
  }
}

TEST_CASE("oomb-train --device cuda: a forced optimizer split trains as the all-GPU run; its checkpoints load bit for bit") {
  temp_dir tmp("cuda-split");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const std::string init = write_init(tmp.path, config);
  // 2 MiB of state on the GPU: the embedding's (0.9 MB) and layer 0's first few tensors; the
  // rest in pinned host memory, streamed every step (the pieces themselves: test_optim.cu).
  constexpr std::int64_t cap = std::int64_t(2) << 20;
  const auto split_options = [&](const fs::path& out, const std::string& from) {
    auto o = options(config, out, "cuda", from);
    o.optimizer_gpu_memory = cap;
    return o;
  };
  oomb_trainer::training_run all(options(config, tmp.path / "all", "cuda", init), {}, oomb_trainer::cuda_trainer_factory());
  oomb_trainer::training_run split(split_options(tmp.path / "split", init), {}, oomb_trainer::cuda_trainer_factory());
  const auto& plan = *split.memory();
  MESSAGE(split.banner());
  REQUIRE(plan.optimizer_groups_on_gpu > 0);
  REQUIRE(plan.optimizer_groups_on_gpu < plan.optimizer_groups);
  CHECK(plan.on_gpu(oomb_trainer::plan_part::optimizer) <= std::uint64_t(cap));
  CHECK(all.memory()->optimizer_groups_on_gpu == all.memory()->optimizer_groups);
  CHECK(split.banner().find("optimizer state: the first " + std::to_string(plan.optimizer_groups_on_gpu) + " of ") !=
        std::string::npos);
  CHECK(split.banner().find("in pinned host memory, streamed through") != std::string::npos);  // the trainer's own line
  CHECK(weight_err(split, all) == 0.0);
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) {
    const double want = all.step().loss, got = split.step().loss;
    losses.push_back(got);
    MESSAGE("step " << s + 1 << ": loss all-GPU " << want << ", split " << got << " (rel " << rel(got, want) << ")");
    if (s == 0) CHECK(got == want);  // the same weights: the same forward, bit for bit
    CHECK(rel(got, want) <= 1e-3);  // later: the same update, gradients apart by dQ's atomics only
  }
  const double err = weight_err(split, all);
  MESSAGE("split against all-GPU weights after 3 steps: rel " << err);
  CHECK(err <= 1e-3);

  // A split run's checkpoint: loaded by a split run and by an all-GPU one, masters exact, and
  // saved again to the same bytes; the next step within the resume tolerance.
  auto first = split_options(tmp.path / "part", init);
  first.stop_after = 1;
  oomb_trainer::model_params<float> at_save(oomb_trainer::load_model_config(config));
  {
    oomb_trainer::training_run run(first, {}, oomb_trainer::cuda_trainer_factory());
    run.step();
    run.save();
    at_save = run.weights();
  }
  const fs::path saved = tmp.path / "part" / "checkpoint-1";
  for (const std::int64_t resumed_cap : {cap, std::int64_t(-1)}) {
    CAPTURE(resumed_cap);
    const fs::path out = tmp.path / ("resumed" + std::to_string(resumed_cap));
    auto o = options(config, out, "cuda");
    o.optimizer_gpu_memory = resumed_cap;
    o.resume = (tmp.path / "part" / "checkpoint").string();
    oomb_trainer::training_run rest(o, {}, oomb_trainer::cuda_trainer_factory());
    CHECK((rest.memory()->optimizer_groups_on_gpu < rest.memory()->optimizer_groups) == (resumed_cap > 0));
    const auto loaded = rest.weights();
    CHECK(std::memcmp(loaded.data(), at_save.data(), at_save.size() * sizeof(float)) == 0);
    rest.save();
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      CHECK(training_test::file_bytes((out / "checkpoint-1" / file).string()) == training_test::file_bytes((saved / file).string()));
    const double loss = rest.step().loss;
    MESSAGE("resumed step 2 (cap " << resumed_cap << "): loss " << loss << ", uninterrupted split " << losses[1]);
    CHECK(rel(loss, losses[1]) <= 1e-3);
  }
}

TEST_CASE("oomb-train --device cuda: a NaN weight stops the run at its step, before the update, the checkpoint intact") {
  temp_dir tmp("cuda-nan");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  training_test::check_non_finite_stop(options(config, tmp.path / "unused", "cuda"), oomb_trainer::cuda_trainer_factory(), tmp);
}

TEST_CASE("oomb-train --device cuda: a checkpoint of another shape is refused before anything is allocated") {
  temp_dir tmp("cuda-shape");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  training_test::check_mismatched_checkpoint(options(config, tmp.path / "unused", "cuda"),
                                             oomb_trainer::cuda_trainer_factory(), tmp);
}

TEST_CASE("oomb-train --device cuda: a head_dim the kernels do not take is refused before anything is written") {
  temp_dir tmp("cuda-head-dim");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 32);
  const fs::path out = tmp.path / "out";
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(options(config, out, "cuda"), {}, oomb_trainer::cuda_trainer_factory()),
                       doctest::Contains("head_dim 32 is not supported (the attention kernels take 64 and 128)"),
                       oomb::invalid_argument);
  CHECK_FALSE(fs::exists(out));
}
