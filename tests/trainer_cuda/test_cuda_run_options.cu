// oomb-train --device cuda with --offload, --sparse-budget and --keep-attention-outputs through
// training_run: offload gives the in-place run's losses, the log carries the transfer and GPU
// memory fields, sparse selects fewer pages than dense reads, a tile the kernels cannot take and a
// plan that does not fit the GPU are refused before anything is written.
// SPDX-License-Identifier: Apache-2.0
//
// Tolerances: both runs start from the same GPU initialisation (Philox, seed 1234) and differ only
// in where the pages live; the attention backward adds dQ with atomics, so gradients differ by
// summation order: losses within 1e-3 relative (as test_cuda_trainer.cu's GPU-against-GPU bound).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <oomb/cuda/page_summary_kernels.cuh>

#include "model_util.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/trainers/cuda_factory.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::log_lines;
using training_test::temp_dir;

oomb_trainer::train_options gpu_options(const std::string& config, const fs::path& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--config", config, "--synthetic", "kv-recall", "--seq-len", "256", "--chunk", "64",
                             "--page", "16", "--steps", "3", "--lr", "1e-3", "--out", out.string(), "--quiet",
                             "--device", "cuda"};
  a.insert(a.end(), extra.begin(), extra.end());
  return oomb_trainer::parse_train_options(a);
}

std::vector<double> losses_of(oomb_trainer::training_run& run) {
  std::vector<double> l;
  while (!run.done()) l.push_back(run.step().loss);
  return l;
}

}  // namespace

TEST_CASE("oomb-train --device cuda --offload: the in-place run's losses, transfers and GPU memory in the log") {
  temp_dir tmp("cuda-offload-run");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  oomb_trainer::training_run in_place(gpu_options(config, tmp.path / "in-place"), {}, oomb_trainer::cuda_trainer_factory());
  oomb_trainer::training_run offload(gpu_options(config, tmp.path / "offload", {"--offload", "--near-pages", "8"}), {},
                                     oomb_trainer::cuda_trainer_factory());
  CHECK(offload.banner().find("offload (near tier 8 + 8 slots)") != std::string::npos);
  const auto a = losses_of(in_place), b = losses_of(offload);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    MESSAGE("step " << i + 1 << ": in place " << a[i] << ", offload " << b[i]);
    CHECK(std::isfinite(b[i]));
    CHECK(std::abs(b[i] - a[i]) <= 1e-3 * std::abs(a[i]));
  }
  const auto log = log_lines(tmp.path / "offload" / "log.jsonl");
  REQUIRE(log.size() == 3);
  const auto& last = log.back();
  MESSAGE("offload log: " << last.dump());
  CHECK(last["bytes_to_near"].get<double>() > 0);
  CHECK(last["bytes_to_far"].get<double>() > 0);
  CHECK(last["h2d_gb_per_second"].get<double>() > 0);
  CHECK(last["exposed_transfer_seconds"].get<double>() >= 0);
  CHECK(last["pinned_host_bytes"].get<double>() > 0);
  CHECK(last["gpu_bytes_in_use_peak"].get<double>() >= last["gpu_bytes_in_use"].get<double>());  // the step's end is a sample
  CHECK(last["gpu_bytes_in_use"].get<double>() > 0);
  CHECK(last["gpu_bytes_total"].get<double>() > last["gpu_bytes_in_use"].get<double>());
}

TEST_CASE("oomb-train --device cuda --keep-attention-outputs: the same losses as attending again, in place and offload") {
  temp_dir tmp("cuda-kept-run");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  for (const bool streamed : {false, true}) {
    CAPTURE(streamed);
    std::vector<std::string> mode = streamed ? std::vector<std::string>{"--offload", "--near-pages", "8"} : std::vector<std::string>{};
    auto kept_mode = mode;
    kept_mode.push_back("--keep-attention-outputs");
    const std::string tag = streamed ? "offload" : "in-place";
    oomb_trainer::training_run again(gpu_options(config, tmp.path / ("again-" + tag), mode), {}, oomb_trainer::cuda_trainer_factory());
    oomb_trainer::training_run kept(gpu_options(config, tmp.path / ("kept-" + tag), kept_mode), {},
                                    oomb_trainer::cuda_trainer_factory());
    const auto a = losses_of(again), b = losses_of(kept);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(b[i] - a[i]) <= 1e-3 * std::abs(a[i]));
    }
    // The plan counts the blocks: 1 layer x 4 chunks.
    REQUIRE(kept.memory());
    const auto& plan = *kept.memory();
    const auto part = oomb_trainer::plan_part::attention_outputs;
    CHECK((streamed ? plan.on_host(part) : plan.on_gpu(part)) > 0);
  }
}

TEST_CASE("oomb-train --device cuda --sparse-budget: trains, selects fewer pages than there are; a bad tile is refused") {
  temp_dir tmp("cuda-sparse-run");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  for (const bool streamed : {false, true}) {
    CAPTURE(streamed);
    std::vector<std::string> extra{"--sparse-budget", "2", "--sink", "1", "--local", "1", "--tile", "64"};
    if (streamed) extra.insert(extra.end(), {"--offload", "--near-pages", "8"});
    const fs::path out = tmp.path / (streamed ? "offload" : "in-place");
    oomb_trainer::training_run run(gpu_options(config, out, extra), {}, oomb_trainer::cuda_trainer_factory());
    for (const double loss : losses_of(run)) CHECK(std::isfinite(loss));
    const auto last = log_lines(out / "log.jsonl").back();
    MESSAGE("sparse: " << last["sparse_pages_selected"] << " of " << last["sparse_pages_candidate"] << " past pages");
    CHECK(last["sparse_pages_selected"].get<double>() < last["sparse_pages_candidate"].get<double>());
    // The plan's summaries are the selector's: Quest's min and max for every page id (2 layers x
    // 16), at home in pinned memory.
    REQUIRE(run.memory());
    CHECK(run.memory()->on_gpu(oomb_trainer::plan_part::sparse_summaries) == 0);
    CHECK(run.memory()->on_host(oomb_trainer::plan_part::sparse_summaries) ==
          oomb::device_page_summaries::bytes(2 * 16, 2, 64, oomb::summary_stats_for(oomb::score_kind::quest)));
  }
  // GQA 2: a tile of 32 queries is 64 rows, not a whole 128-row block.
  const fs::path never = tmp.path / "never";
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(gpu_options(config, never, {"--sparse-budget", "2", "--tile", "32"}), {},
                                                  oomb_trainer::cuda_trainer_factory()),
                       doctest::Contains("use --tile 64"), oomb::invalid_argument);
  CHECK_FALSE(fs::exists(never));
}

TEST_CASE("oomb-train --device cuda: the plan's GPU limit is cudaMemGetInfo's free less the margin; too little is refused") {
  temp_dir tmp("cuda-plan");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  const fs::path never = tmp.path / "never";
  const auto before = oomb_trainer::cuda_memory_use();
  const auto plan = oomb_trainer::training_run::plan(gpu_options(config, never), oomb_trainer::cuda_trainer_factory());
  MESSAGE(plan.describe());
  CHECK(plan.gpu_limit + oomb_trainer::gpu_memory_margin <= before.total);
  CHECK(plan.gpu_limit + oomb_trainer::gpu_memory_margin >= before.free / 2);  // another test's memory may come and go
  CHECK(plan.fits());
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(gpu_options(config, never, {"--gpu-memory", "64M"}), {},
                                                  oomb_trainer::cuda_trainer_factory()),
                       doctest::Contains("of GPU memory, 64.0 MiB available"), oomb::invalid_argument);
  CHECK_FALSE(fs::exists(never));
}

TEST_CASE("oomb-train --device cuda --packing documents: a version 2 file trains per document, in place as offload") {
  temp_dir tmp("cuda-documents-run");
  const std::string config = trainer_test::write_gpu_config(tmp.path, 64);
  // 120 documents of 5 to 90 tokens, each a third prompt (mask 0) and the rest answer.
  std::mt19937 rng(17);
  std::vector<std::uint32_t> toks;
  std::vector<std::uint64_t> starts;
  std::vector<std::uint8_t> mask;
  for (int d = 0; d < 120; ++d) {
    starts.push_back(toks.size());
    const std::uint32_t n = 5 + rng() % 86;
    for (std::uint32_t i = 0; i < n; ++i) {
      toks.push_back(rng() % 300);
      mask.push_back(i >= n / 3);
    }
  }
  const std::string data = (tmp.path / "docs.tokens").string();
  oomb_trainer::write_token_file(data, toks.data(), toks.size(), 300, starts, mask.data());
  auto run = [&](const char* name, const char* packing, std::vector<std::string> extra) {
    std::vector<std::string> a{"--config", config, "--data", data, "--packing", packing, "--seq-len", "256", "--chunk",
                               "64", "--page", "16", "--steps", "3", "--lr", "1e-3", "--out", (tmp.path / name).string(),
                               "--quiet", "--device", "cuda"};
    a.insert(a.end(), extra.begin(), extra.end());
    oomb_trainer::training_run r(oomb_trainer::parse_train_options(a), {}, oomb_trainer::cuda_trainer_factory());
    return losses_of(r);
  };
  const auto in_place = run("in-place", "documents", {});
  const auto offload = run("offload", "documents", {"--offload", "--near-pages", "8"});
  const auto stream = run("stream", "none", {});
  for (std::size_t i = 0; i < in_place.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isfinite(in_place[i]));
    CHECK(std::abs(offload[i] - in_place[i]) <= 1e-3 * std::abs(in_place[i]));
  }
  // Per-document attention and positions: another loss than the same file read as one stream.
  CHECK(std::abs(stream[0] - in_place[0]) > 1e-4 * std::abs(in_place[0]));
  const auto log = log_lines(tmp.path / "in-place" / "log.jsonl");
  REQUIRE(log.size() == 3);
  CHECK(log[0].contains("padding_tokens"));
}
