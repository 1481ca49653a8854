// The memory plan against what the CPU trainer measures (K/V and gradient page high waters, the
// pools' reserved bytes, the near slots, the activations), its limits and refusals, the host limit
// default, and the table of docs/trainer.md ("Memory plan") for the real configs.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/core.h>

#include "model_util.hpp"
#include "trainer/backend/cpu_backend.hpp"
#include "trainer/train/chunk_recurrent.hpp"
#include "trainer/train/memory_plan.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::memory_plan;
using oomb_trainer::plan_part;
using oomb_trainer::plan_target;

constexpr std::uint64_t GiB = std::uint64_t(1) << 30;

plan_target cpu_target(std::uint64_t host_bytes = 64 * GiB) {
  plan_target t;
  t.host = {host_bytes, "the test"};
  return t;
}

plan_target cuda_target(std::uint64_t gpu_bytes, std::uint64_t host_bytes) {
  plan_target t;
  t.device = "cuda";
  t.gpu_bytes = gpu_bytes;
  t.host = {host_bytes, "the test"};
  return t;
}

oomb_trainer::model_config real_config(const char* name) {
  return oomb_trainer::load_model_config(std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/" + name);
}

chunk_options offload_options(std::int32_t chunk, std::int32_t page) {
  chunk_options o;
  o.chunk = chunk;
  o.page = page;
  o.offload = true;
  o.near_pages = 2 * chunk / page;  // oomb-train's default
  return o;
}

}  // namespace

TEST_CASE("memory plan: pages, pools, near slots and activations are what the CPU trainer measures") {
  struct run_case {
    std::int64_t tokens;
    std::int32_t chunk, page, near;  // near 0: in place
    std::int32_t layers, hq, hkv;
  };
  const run_case cases[] = {
      {37, 16, 16, 0, 2, 4, 2},     // partial page and chunk
      {37, 16, 16, 2, 2, 4, 2},
      {16, 16, 16, 0, 2, 2, 2},     // one chunk: no gradient page at all
      {16, 16, 16, 2, 2, 2, 2},
      {200, 16, 16, 3, 2, 4, 2},    // 13 chunks, slabs of 8 pages: the last slab cut at the capacity
      {200, 16, 16, 0, 3, 4, 1},
      {300, 64, 16, 8, 2, 4, 2},    // 4 pages a chunk, 5 chunks: slab 32 pages
      {300, 64, 32, 0, 2, 4, 2},
      {1000, 32, 16, 5, 3, 7, 1},   // several slabs
  };
  for (const run_case& rc : cases) {
    CAPTURE(rc.tokens);
    CAPTURE(rc.chunk);
    CAPTURE(rc.page);
    CAPTURE(rc.near);
    CAPTURE(rc.layers);
    const auto cfg = trainer_test::tiny_config(rc.hq, rc.hkv, false, 4, rc.layers, 13);
    chunk_options o;
    o.chunk = rc.chunk;
    o.page = rc.page;
    o.offload = rc.near > 0;
    o.near_pages = std::max(rc.near, rc.chunk / rc.page);
    const memory_plan plan = oomb_trainer::plan_memory(cfg, o, rc.tokens, cpu_target());
    REQUIRE(plan.gpu.empty());  // the CPU trainer holds everything in host memory

    oomb_trainer::qwen2_params<float> p(cfg), g(cfg);
    oomb_trainer::init_perturbed(p, 7);
    oomb_trainer::chunk_recurrent<oomb_trainer::cpu_backend<float>, oomb::belady_eviction> trainer(cfg, o, rc.tokens);
    trainer.loss_and_grad(p, g, trainer_test::random_sequence(rc.tokens, cfg.vocab_size, 3));
    const auto& s = trainer.last_stats();
    const auto m = trainer.memory();
    CHECK(plan.kv_pages == s.kv_pages_high_water);
    CHECK(plan.grad_pages == s.grad_pages_high_water);
    CHECK(plan.on_host(plan_part::kv_pages) == m.far_kv_reserved);
    CHECK(plan.on_host(plan_part::grad_pages) == m.far_grad_reserved);
    CHECK(plan.on_host(plan_part::kv_near) + plan.on_host(plan_part::grad_near) == m.near_bytes);
    CHECK(plan.on_host(plan_part::activations) == m.activation_bytes);
    CHECK(plan.on_host(plan_part::weights) == p.size() * sizeof(float));
  }
}

TEST_CASE("memory plan: kept attention outputs are the blocks the CPU trainer reserves, homes and slots") {
  for (const bool offload : {false, true}) {
    for (const std::int64_t tokens : {37, 200}) {
      CAPTURE(offload);
      CAPTURE(tokens);
      const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 3, 13);
      chunk_options o;
      o.chunk = 16;
      o.page = 16;
      o.offload = offload;
      o.near_pages = 2;
      o.keep_attention_outputs = true;
      const memory_plan plan = oomb_trainer::plan_memory(cfg, o, tokens, cpu_target());
      oomb_trainer::qwen2_params<float> p(cfg), g(cfg);
      oomb_trainer::init_perturbed(p, 7);
      oomb_trainer::chunk_recurrent<oomb_trainer::cpu_backend<float>, oomb::belady_eviction> trainer(cfg, o, tokens);
      trainer.loss_and_grad(p, g, trainer_test::random_sequence(tokens, cfg.vocab_size, 3));
      const auto m = trainer.memory();
      CHECK(plan.on_host(plan_part::attention_outputs) > 0);
      CHECK(plan.on_host(plan_part::attention_outputs) == m.far_outputs_reserved);
      CHECK(plan.on_host(plan_part::kv_near) + plan.on_host(plan_part::grad_near) +
                plan.on_host(plan_part::attention_outputs_near) == m.near_bytes);
      CHECK((plan.on_host(plan_part::attention_outputs_near) > 0) == offload);
    }
  }
}

TEST_CASE("memory plan: page-sparse attention touches at most the dense plan's gradient pages") {
  const auto cfg = trainer_test::tiny_config(4, 2, true, 4, 2, 13);
  chunk_options o = offload_options(32, 16);
  o.sparse = true;
  o.budget = 2;
  const std::int64_t tokens = 400;
  const memory_plan plan = oomb_trainer::plan_memory(cfg, o, tokens, cpu_target());
  oomb_trainer::qwen2_params<float> p(cfg), g(cfg);
  oomb_trainer::init_perturbed(p, 5);
  oomb_trainer::chunk_recurrent<oomb_trainer::cpu_backend<float>, oomb::belady_eviction> trainer(cfg, o, tokens);
  trainer.loss_and_grad(p, g, trainer_test::random_sequence(tokens, cfg.vocab_size, 9));
  CHECK(trainer.last_stats().grad_pages_high_water > 0);
  CHECK(trainer.last_stats().grad_pages_high_water < plan.grad_pages);
  CHECK(trainer.memory().far_grad_reserved <= plan.on_host(plan_part::grad_pages));
  CHECK(plan.kv_pages == trainer.last_stats().kv_pages_high_water);
}

TEST_CASE("memory plan: with offload nothing on the GPU grows with the context; in place the pages do") {
  const auto cfg = real_config("qwen2.5-0.5b.json");
  const plan_target t = cuda_target(139 * GiB, 128 * GiB);
  const auto off = offload_options(4096, 16);
  const memory_plan a = oomb_trainer::plan_memory(cfg, off, 131072, t), b = oomb_trainer::plan_memory(cfg, off, 4 * 131072, t);
  CHECK(a.gpu_total() == b.gpu_total());
  CHECK(a.gpu_growth_per_10k == 0.0);
  CHECK(b.host_total() > a.host_total());
  CHECK(a.optimizer_groups == cfg.num_hidden_layers + 2);
  CHECK(a.optimizer_groups_on_gpu == a.optimizer_groups);
  CHECK(a.on_gpu(plan_part::optimizer) == 3 * a.on_gpu(plan_part::gradients));
  CHECK(a.on_host(plan_part::checkpoint_staging) == a.on_gpu(plan_part::optimizer));  // cuda_training.cuh's save
  plan_target no_checkpoints = t;
  no_checkpoints.checkpoint_staging = false;
  CHECK(oomb_trainer::plan_memory(cfg, off, 131072, no_checkpoints).host_total() ==
        a.host_total() - a.on_host(plan_part::checkpoint_staging));
  // bf16 K/V homes of every page, fp32 gradient homes of every page but the last chunk's.
  const std::uint64_t kv_pair = 2 * 16 * std::uint64_t(cfg.num_key_value_heads * cfg.head_dim) * 2;
  CHECK(a.on_host(plan_part::kv_pages) == std::uint64_t(a.kv_pages) * kv_pair);
  CHECK(a.kv_pages == std::int64_t(cfg.num_hidden_layers) * 131072 / 16);
  CHECK(a.grad_pages == std::int64_t(cfg.num_hidden_layers) * (131072 - 4096) / 16);
  CHECK(a.on_host(plan_part::grad_pages) >= std::uint64_t(a.grad_pages) * 2 * kv_pair);

  chunk_options in_place = off;
  in_place.offload = false;
  in_place.near_pages = 0;
  const memory_plan c = oomb_trainer::plan_memory(cfg, in_place, 131072, t);
  CHECK(c.host.size() < a.host.size());  // no homes
  CHECK(c.on_gpu(plan_part::kv_pages) == a.on_host(plan_part::kv_pages));
  CHECK(c.gpu_growth_per_10k > 0.0);
  CHECK(c.gpu_total() > a.gpu_total());
}

TEST_CASE("memory plan: the optimizer goes to pinned host memory only when it does not fit on the GPU") {
  const auto seven = real_config("qwen2.5-7b.json");
  const auto off = offload_options(4096, 16);
  const memory_plan big = oomb_trainer::plan_memory(seven, off, 131072, cuda_target(139 * GiB, 512 * GiB));
  CHECK(big.optimizer_groups_on_gpu == 0);
  CHECK(big.on_gpu(plan_part::optimizer) == 0);
  CHECK(big.on_host(plan_part::optimizer) == 3 * big.on_gpu(plan_part::gradients));
  CHECK(big.on_host(plan_part::optimizer_staging) > 0);
  CHECK(big.optimizer_why.find("do not fit") != std::string::npos);
  CHECK(big.gpu_fits());

  plan_target forced = cuda_target(139 * GiB, 512 * GiB);
  forced.optimizer = oomb_trainer::optimizer_placement::gpu;
  const memory_plan on_gpu = oomb_trainer::plan_memory(seven, off, 131072, forced);
  CHECK(on_gpu.optimizer_groups_on_gpu == on_gpu.optimizer_groups);
  CHECK_FALSE(on_gpu.gpu_fits());
  CHECK(on_gpu.gpu_total() == big.gpu_total() + big.on_host(plan_part::optimizer));

  // Split: the groups that fit stay on the GPU (first fit in layout order), the rest go to the host.
  plan_target split = cuda_target(139 * GiB, 512 * GiB);
  split.optimizer = oomb_trainer::optimizer_placement::split;
  const memory_plan s = oomb_trainer::plan_memory(seven, off, 131072, split);
  CHECK(s.gpu_fits());
  CHECK(s.optimizer_groups_on_gpu > 0);
  CHECK(s.optimizer_groups_on_gpu < s.optimizer_groups);
  CHECK(s.on_gpu(plan_part::optimizer) + s.on_host(plan_part::optimizer) == on_gpu.on_gpu(plan_part::optimizer));
  // No group left on the host would have fitted in what is left on the GPU.
  const auto groups = oomb_trainer::detail::optimizer_groups(oomb_trainer::param_layout(seven));
  std::uint64_t smallest = ~std::uint64_t(0);
  for (const auto gr : groups) smallest = std::min<std::uint64_t>(smallest, 3 * gr * sizeof(float));
  CHECK(s.gpu_limit - s.gpu_total() < smallest);
  // The host keeps less, so a longer context fits in the same host memory (without checkpoints:
  // staging the GPU's state for one costs the host about what the split saved).
  plan_target host128 = cuda_target(139 * GiB, 128 * GiB);
  host128.checkpoint_staging = false;
  plan_target split128 = host128;
  split128.optimizer = oomb_trainer::optimizer_placement::split;
  CHECK(oomb_trainer::largest_fitting_tokens(seven, off, split128) > 2 * oomb_trainer::largest_fitting_tokens(seven, off, host128));
  // Where everything fits, split is all on the GPU, as automatic.
  const memory_plan small = oomb_trainer::plan_memory(real_config("qwen2.5-0.5b.json"), off, 131072, split);
  CHECK(small.optimizer_groups_on_gpu == small.optimizer_groups);
  CHECK(small.on_host(plan_part::optimizer_staging) == 0);
}

TEST_CASE("memory plan: a context that does not fit is refused with both numbers and the largest that fits") {
  const auto cfg = real_config("qwen2.5-7b.json");
  const auto off = offload_options(4096, 16);
  const plan_target t = cuda_target(139 * GiB, 128 * GiB);
  const std::int64_t largest = oomb_trainer::largest_fitting_tokens(cfg, off, t);
  REQUIRE(largest > 0);
  CHECK(largest % 16 == 0);
  CHECK(oomb_trainer::plan_memory(cfg, off, largest, t).fits());
  CHECK_FALSE(oomb_trainer::plan_memory(cfg, off, largest + 16, t).fits());
  CHECK_NOTHROW(oomb_trainer::checked_memory_plan(cfg, off, largest, t));
  const memory_plan too_long = oomb_trainer::plan_memory(cfg, off, 4 * 1048576, t);
  REQUIRE_FALSE(too_long.host_fits());
  try {
    oomb_trainer::checked_memory_plan(cfg, off, 4 * 1048576, t);
    FAIL("4M tokens of 7B fit in 128 GiB of host memory?");
  } catch (const oomb::invalid_argument& e) {
    const std::string m = e.what();
    CAPTURE(m);
    using oomb_trainer::detail::plan_bytes;
    CHECK(m.find(plan_bytes(double(too_long.host_total())) + " of host memory, 128.00 GiB allowed (the test)") !=
          std::string::npos);
    CHECK(m.find(plan_bytes(double(too_long.gpu_total())) + " of GPU memory, 139.00 GiB available") != std::string::npos);
    CHECK(m.find("not enough host memory") != std::string::npos);
    CHECK(m.find("the largest sequence that fits is " + std::to_string(largest) + " tokens") != std::string::npos);
  }
  // A GPU too small for the weights: no length fits, and the message says why.
  const plan_target tiny_gpu = cuda_target(8 * GiB, 128 * GiB);
  CHECK(oomb_trainer::largest_fitting_tokens(cfg, off, tiny_gpu) == 0);
  CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, off, 131072, tiny_gpu),
                       doctest::Contains("no sequence fits"), oomb::invalid_argument);
  // Inputs no run could have.
  CHECK_THROWS_AS(oomb_trainer::plan_memory(cfg, off, 1, t), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb_trainer::plan_memory(cfg, off, 131072, cuda_target(0, GiB)), oomb::invalid_argument);
  plan_target tpu = t;
  tpu.device = "tpu";
  CHECK_THROWS_WITH_AS(oomb_trainer::plan_memory(cfg, off, 131072, tpu), doctest::Contains("tpu"), oomb::invalid_argument);
  chunk_options bad = off;
  bad.near_pages = 3;
  CHECK_THROWS_AS(oomb_trainer::plan_memory(cfg, bad, 131072, t), oomb::invalid_argument);
}

TEST_CASE("memory plan: describe() lists every item, the totals and where the host limit came from") {
  const auto cfg = real_config("qwen2.5-0.5b.json");
  const memory_plan p = oomb_trainer::plan_memory(cfg, offload_options(4096, 16), 1048576, cuda_target(139 * GiB, 128 * GiB));
  const std::string d = p.describe();
  CAPTURE(d);
  std::size_t lines = 0;
  for (char ch : d) lines += ch == '\n';
  CHECK(lines == 1 + (p.gpu.size() + 2) + (p.host.size() + 2) + 1);  // header, 2 blocks (title, items, total), optimizer
  for (const auto* items : {&p.gpu, &p.host})
    for (const auto& i : *items) CHECK(d.find(i.what) != std::string::npos);
  CHECK(d.find("allowed (the test)") != std::string::npos);
  CHECK(d.find("grows 0.0 MiB per 10K tokens") != std::string::npos);  // the GPU, with offload
  CHECK(d.find("optimizer state: on the GPU (it fits beside the rest)") != std::string::npos);
}

TEST_CASE("memory plan: the host limit comes from MemAvailable, never MemTotal; byte counts parse") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("oomb_memory_plan_{}", ::getpid());
  fs::create_directories(dir);
  const auto write = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto with = oomb_trainer::host_memory_default(
      write("with", "MemTotal:       24684092 kB\nMemFree:        19252788 kB\nMemAvailable:   22473016 kB\n"
                    "Buffers:          249032 kB\nCached:          3121372 kB\n"));
  CHECK(with.bytes == std::uint64_t(22473016) * 1024);
  CHECK(with.source.find("MemAvailable") != std::string::npos);
  CHECK(with.source.find("MemTotal 23.5 GiB is not used") != std::string::npos);
  const auto old = oomb_trainer::host_memory_default(
      write("old", "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n"));
  CHECK(old.bytes == std::uint64_t(420) * 1024);
  CHECK(old.source.find("MemFree + Buffers + Cached") != std::string::npos);
  const auto none = oomb_trainer::host_memory_default((dir / "missing").string());
  CHECK(none.source.find("unreadable") != std::string::npos);
  CHECK(none.source.find("--host-memory") != std::string::npos);
  fs::remove_all(dir);
  // This machine's: readable, positive, never above MemTotal's report of what exists.
  const auto here = oomb_trainer::host_memory_default();
  CHECK(here.bytes > 0);

  CHECK(oomb_trainer::parse_bytes("1073741824") == GiB);
  CHECK(oomb_trainer::parse_bytes("128G") == 128 * GiB);
  CHECK(oomb_trainer::parse_bytes("128GiB") == 128 * GiB);
  CHECK(oomb_trainer::parse_bytes("512m") == std::uint64_t(512) << 20);
  CHECK(oomb_trainer::parse_bytes("2T") == 2048 * GiB);
  for (const char* bad : {"", "-1G", " 5G", "12 G", "G", "1.5G", "4Q", "99999999999T"})
    CHECK_THROWS_AS(oomb_trainer::parse_bytes(bad), oomb::invalid_argument);
}

// The table of docs/trainer.md ("Memory plan"): OOMB_PRINT_PLAN_TABLE=1 test_trainer -tc='*table*'
TEST_CASE("memory plan: the table for Qwen2.5 0.5B and 7B at 128K, 1M and 4M tokens with offload") {
  using oomb_trainer::optimizer_placement;
  std::string table =
      "| model | chunk | optimizer placement | tokens | GPU | GPU growth per 10K tokens | host (pinned) | + checkpoint staging "
      "| optimizer on the GPU | fits (no checkpoints) |\n"
      "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n";
  // bench/trainer's settings: page 128, chunk 16,384 (0.5B) or 4,096 (7B), max(4 chunks' pages, 256) near slots.
  struct row {
    const char* model;
    std::int32_t chunk;
    optimizer_placement placement;
    const char* name;
  };
  for (const row r : {row{"qwen2.5-0.5b", 16384, optimizer_placement::automatic, "automatic"},
                      row{"qwen2.5-7b", 4096, optimizer_placement::automatic, "automatic"},
                      row{"qwen2.5-7b", 4096, optimizer_placement::split, "split"}}) {
    const auto cfg = real_config((std::string(r.model) + ".json").c_str());
    plan_target t = cuda_target(139 * GiB, 128 * GiB);
    t.optimizer = r.placement;
    t.checkpoint_staging = false;  // the benchmarks' fwd_bwd steps write no checkpoint
    auto opt = offload_options(r.chunk, 128);
    opt.near_pages = std::max(4 * r.chunk / 128, 256);
    for (const std::int64_t tokens : {131072, 1048576, 4194304}) {
      const memory_plan p = oomb_trainer::plan_memory(cfg, opt, tokens, t);
      CHECK(p.gpu_growth_per_10k == 0.0);
      using oomb_trainer::detail::plan_bytes;
      plan_target saving = t;
      saving.checkpoint_staging = true;
      const std::uint64_t staging = oomb_trainer::plan_memory(cfg, opt, tokens, saving).on_host(plan_part::checkpoint_staging);
      table += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} of {} groups | {} |\n", r.model, r.chunk, r.name, tokens,
                           plan_bytes(double(p.gpu_total())), plan_bytes(p.gpu_growth_per_10k), plan_bytes(double(p.host_total())),
                           plan_bytes(double(staging)),
                           p.optimizer_groups_on_gpu, p.optimizer_groups,
                           p.fits() ? "yes" : p.gpu_fits() ? "no: host" : "no: GPU");
    }
    table += fmt::format("| {} | {} | {} | largest that fits: {} | | | | | | |\n", r.model, r.chunk, r.name,
                         oomb_trainer::largest_fitting_tokens(cfg, opt, t));
  }
  if (std::getenv("OOMB_PRINT_PLAN_TABLE")) std::fputs(table.c_str(), stdout);
}
