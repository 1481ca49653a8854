// The memory plan against what the CPU trainer measures (K/V and gradient page high waters, the
// pools' reserved bytes, the near slots, the activations, the backend's scratch), its limits and refusals, the host limit
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
#include "support/compiled_trainer.hpp"
#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/trainers/memory_plan.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::memory_plan;
using oomb_trainer::plan_part;
using oomb_trainer::plan_target;
// oomb-train --device cpu's trainer (trainers/cpu_trainer.cpp).
using cpu_trainer_chunked = trainer_test::compiled_trainer<oomb_trainer::cpu_ops<float>, oomb::belady_eviction>;

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

    oomb_trainer::model_params<float> p(cfg), g(cfg);
    oomb_trainer::init_perturbed(p, 7);
    cpu_trainer_chunked trainer(cfg, o, rc.tokens);
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
    // The backend's scratch: reserved up front at the size the plan counts, and no op grew it.
    const auto scratch = trainer.backend().scratch_held();
    CHECK(plan.on_host(plan_part::backend_scratch) == scratch.attention);
    CHECK(plan.on_host(plan_part::head_workspace) == scratch.head);
  }
}

TEST_CASE("memory plan: bf16 gradient homes are 2 bytes an element, as the CPU trainer reserves; the near slots stay") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 4, 2, 13);
  chunk_options o;
  o.chunk = 16;
  o.page = 16;
  o.offload = true;
  o.near_pages = 3;
  const memory_plan fp32 = oomb_trainer::plan_memory(cfg, o, 200, cpu_target());
  o.grad_homes = oomb_trainer::page_home_format::bf16;
  const memory_plan bf16 = oomb_trainer::plan_memory(cfg, o, 200, cpu_target());
  CHECK(2 * bf16.on_host(plan_part::grad_pages) == fp32.on_host(plan_part::grad_pages));  // fp32 -> bf16
  CHECK(bf16.on_host(plan_part::grad_near) == fp32.on_host(plan_part::grad_near));
  CHECK(bf16.on_host(plan_part::kv_pages) == fp32.on_host(plan_part::kv_pages));
  CHECK(bf16.describe().find("; bf16)") != std::string::npos);

  oomb_trainer::model_params<float> p(cfg), g(cfg);
  oomb_trainer::init_perturbed(p, 7);
  cpu_trainer_chunked trainer(cfg, o, 200);
  trainer.loss_and_grad(p, g, trainer_test::random_sequence(200, cfg.vocab_size, 3));
  const auto m = trainer.memory();
  CHECK(bf16.grad_pages == trainer.last_stats().grad_pages_high_water);
  CHECK(bf16.on_host(plan_part::grad_pages) == m.far_grad_reserved);
  CHECK(bf16.on_host(plan_part::kv_near) + bf16.on_host(plan_part::grad_near) == m.near_bytes);

  // On the GPU the conversion stages a bf16 pair per slot in device memory, each direction.
  chunk_options same = o;
  same.grad_homes = oomb_trainer::page_home_format::same;
  const plan_target gpu = cuda_target(80 * GiB, 512 * GiB);
  const std::uint64_t bf16_pair = 2 * 16 * 2 * 4 * sizeof(oomb::bf16);  // 2 x page x kv heads x head dim
  CHECK(oomb_trainer::plan_memory(cfg, o, 200, gpu).on_gpu(plan_part::grad_near) ==
        oomb_trainer::plan_memory(cfg, same, 200, gpu).on_gpu(plan_part::grad_near) + 2 * 3 * bf16_pair);

  o.offload = false;  // in place the kernels add into the homes: no bf16 there
  CHECK_THROWS_WITH_AS(oomb_trainer::plan_memory(cfg, o, 200, cpu_target()), doctest::Contains("--grad-homes bf16 needs --offload"),
                       oomb::invalid_argument);
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
      oomb_trainer::model_params<float> p(cfg), g(cfg);
      oomb_trainer::init_perturbed(p, 7);
      cpu_trainer_chunked trainer(cfg, o, tokens);
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
  oomb_trainer::model_params<float> p(cfg), g(cfg);
  oomb_trainer::init_perturbed(p, 5);
  cpu_trainer_chunked trainer(cfg, o, tokens);
  trainer.loss_and_grad(p, g, trainer_test::random_sequence(tokens, cfg.vocab_size, 9));
  CHECK(trainer.last_stats().grad_pages_high_water > 0);
  CHECK(trainer.last_stats().grad_pages_high_water < plan.grad_pages);
  CHECK(trainer.memory().far_grad_reserved <= plan.on_host(plan_part::grad_pages));
  CHECK(plan.kv_pages == trainer.last_stats().kv_pages_high_water);
}

TEST_CASE("memory plan: with offload and pageable homes nothing on the GPU grows with the context; pinned homes grow "
          "the driver's mapping; in place the pages grow") {
  const auto cfg = real_config("qwen2.5-0.5b.json");
  const plan_target t = cuda_target(139 * GiB, 128 * GiB);
  auto off = offload_options(4096, 16);
  off.homes = oomb_trainer::home_memory::pageable;
  const memory_plan a = oomb_trainer::plan_memory(cfg, off, 131072, t), b = oomb_trainer::plan_memory(cfg, off, 4 * 131072, t);
  CHECK(a.gpu_total() == b.gpu_total());
  CHECK(a.gpu_growth_per_10k == 0.0);
  CHECK(b.host_total() > a.host_total());
  CHECK(a.on_host(plan_part::home_staging) == 4 * oomb_trainer::detail::pageable_staging_bytes);  // K/V and gradients, both ways
  // Pinned homes: the same host bytes but the staging (the copy kernel's descriptor slots instead
  // of the staged rings), and the GPU grows by 8 B per pinned 4 KiB.
  off.homes = oomb_trainer::home_memory::pinned;
  const memory_plan pa = oomb_trainer::plan_memory(cfg, off, 131072, t), pb = oomb_trainer::plan_memory(cfg, off, 4 * 131072, t);
  CHECK(pa.on_gpu(plan_part::copy_staging) == 4 * oomb_trainer::detail::page_copy_staging_bytes);
  CHECK(pa.on_host(plan_part::copy_staging) == 4 * oomb_trainer::detail::page_copy_staging_bytes);
  CHECK(a.on_gpu(plan_part::copy_staging) == 0);
  CHECK(pa.host_total() == a.host_total() - a.on_host(plan_part::home_staging) + pa.on_host(plan_part::copy_staging));
  CHECK(pa.on_host(plan_part::home_staging) == 0);
  const std::uint64_t pinned_a = pa.on_host(plan_part::kv_pages) + pa.on_host(plan_part::grad_pages) +
                                 pa.on_host(plan_part::optimizer) + pa.on_host(plan_part::upload_ring) +
                                 pa.on_host(plan_part::copy_staging);
  CHECK(pa.on_gpu(plan_part::pinned_mapping) == pinned_a / 512);
  CHECK(pb.gpu_total() - pa.gpu_total() == pb.on_gpu(plan_part::pinned_mapping) - pa.on_gpu(plan_part::pinned_mapping));
  CHECK(pb.gpu_total() > pa.gpu_total());
  CHECK(pa.gpu_growth_per_10k > 0.0);
  CHECK(a.optimizer_groups == std::int32_t(oomb_trainer::param_layout(cfg).entries().size()));
  CHECK(a.optimizer_groups_on_gpu == a.optimizer_groups);
  CHECK(a.on_gpu(plan_part::optimizer) == 3 * a.on_gpu(plan_part::gradients));
  // cuda_trainer.cuh's save streams one tensor at a time through a buffer of the largest.
  std::size_t largest = 0;
  const oomb_trainer::param_layout layout(cfg);
  for (const auto& e : layout.entries()) largest = std::max(largest, e.numel);
  CHECK(a.on_host(plan_part::checkpoint_staging) == 4 * largest);
  CHECK(a.on_host(plan_part::checkpoint_staging) < a.on_gpu(plan_part::optimizer) / 3);  // < one fp32 copy of the weights
  plan_target no_checkpoints = t;
  no_checkpoints.checkpoint_staging = false;
  CHECK(oomb_trainer::plan_memory(cfg, off, 131072, no_checkpoints).host_total() ==
        pa.host_total() - pa.on_host(plan_part::checkpoint_staging));
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

TEST_CASE("memory plan: the optimizer state fills the GPU in tensor order, the rest in pinned host memory") {
  using oomb_trainer::optimizer_placement;
  const auto seven = real_config("qwen2.5-7b.json");
  const oomb_trainer::param_layout layout(seven);
  const auto& entries = layout.entries();
  const auto off = offload_options(4096, 16);
  plan_target t = cuda_target(139 * GiB, 512 * GiB);
  t.checkpoint_staging = false;
  const memory_plan s = oomb_trainer::plan_memory(seven, off, 131072, t);  // split is the default
  const auto k = static_cast<std::size_t>(s.optimizer_groups_on_gpu);
  CAPTURE(k);
  CHECK(s.gpu_fits());
  CHECK(s.optimizer_groups == std::int32_t(entries.size()));
  REQUIRE(k > 0);
  REQUIRE(k < entries.size());
  // The split point: the first k tensors' state (padding included) on the GPU, the rest pinned,
  // the ring on the GPU; together the whole state, 12 bytes an element.
  CHECK(s.on_gpu(plan_part::optimizer) == 12 * entries[k].offset);
  CHECK(s.on_host(plan_part::optimizer) == 12 * (layout.total() - entries[k].offset));
  CHECK(s.on_gpu(plan_part::optimizer) + s.on_host(plan_part::optimizer) == 3 * s.on_gpu(plan_part::gradients));
  CHECK(s.on_gpu(plan_part::optimizer_staging) == oomb_trainer::optimizer_ring_slots * oomb_trainer::optimizer_piece_elements * 12);
  CHECK(s.on_host(plan_part::optimizer_staging) == 0);
  CHECK(s.optimizer_first_on_host == entries[k].name);
  // One tensor more would not fit; the split decided on the whole plan, not on the state alone.
  CHECK_FALSE(oomb_trainer::detail::plan_at(seven, off, 131072, t, oomb_trainer::split_after(layout, k + 1)).gpu_fits());
  CHECK(s.optimizer_why.find("do not fit beside the rest's") != std::string::npos);
  CHECK(s.describe().find(fmt::format("optimizer state: the first {} of {} tensors on the GPU", k, entries.size())) !=
        std::string::npos);
  CHECK(s.describe().find("from " + entries[k].name + " on") != std::string::npos);
  CHECK(s.describe().find("which the page homes cannot use") != std::string::npos);

  // All on the GPU does not fit; all on the host does, with the ring; the host pays for the state.
  plan_target forced = t;
  forced.optimizer = optimizer_placement::gpu;
  const memory_plan all_gpu = oomb_trainer::plan_memory(seven, off, 131072, forced);
  CHECK(all_gpu.optimizer_groups_on_gpu == all_gpu.optimizer_groups);
  CHECK_FALSE(all_gpu.gpu_fits());
  // (less the driver's mapping of the pinned host part: 8 B per 4 KiB)
  CHECK(all_gpu.gpu_total() - all_gpu.on_gpu(plan_part::pinned_mapping) ==
        s.gpu_total() - s.on_gpu(plan_part::pinned_mapping) - s.on_gpu(plan_part::optimizer_staging) + s.on_host(plan_part::optimizer));
  CHECK(s.on_gpu(plan_part::pinned_mapping) - all_gpu.on_gpu(plan_part::pinned_mapping) <= s.on_host(plan_part::optimizer) / 512 + 1);
  CHECK(s.host_total() == all_gpu.host_total() + s.on_host(plan_part::optimizer));
  forced.optimizer = optimizer_placement::host;
  const memory_plan all_host = oomb_trainer::plan_memory(seven, off, 131072, forced);
  CHECK(all_host.optimizer_groups_on_gpu == 0);
  CHECK(all_host.on_gpu(plan_part::optimizer) == 0);
  CHECK(all_host.on_gpu(plan_part::optimizer_staging) == s.on_gpu(plan_part::optimizer_staging));
  CHECK(all_host.describe().find("optimizer state: all ") != std::string::npos);

  // The cap (--optimizer-gpu-memory): no more state on the GPU than it allows, one tensor more
  // would exceed it; 0 puts all of it on the host; the reason names the flag.
  plan_target capped = t;
  capped.optimizer_gpu_cap = 10 * GiB;
  const memory_plan c = oomb_trainer::plan_memory(seven, off, 131072, capped);
  const auto kc = static_cast<std::size_t>(c.optimizer_groups_on_gpu);
  CHECK(kc > 0);
  CHECK(kc < k);
  CHECK(c.on_gpu(plan_part::optimizer) <= 10 * GiB);
  CHECK(oomb_trainer::split_after(layout, kc + 1).gpu_bytes() > 10 * GiB);
  CHECK(c.optimizer_why.find("--optimizer-gpu-memory caps it at 10.00 GiB") != std::string::npos);
  capped.optimizer_gpu_cap = 0;
  CHECK(oomb_trainer::plan_memory(seven, off, 131072, capped).optimizer_groups_on_gpu == 0);

  // The host keeps less than with all of the state there, so a longer context fits in 128 GiB
  // (the benchmarks' settings: no checkpoints).
  plan_target host128 = cuda_target(139 * GiB, 128 * GiB);
  host128.checkpoint_staging = false;
  plan_target split128 = host128;
  host128.optimizer = optimizer_placement::host;
  CHECK(oomb_trainer::largest_fitting_tokens(seven, off, split128) > 2 * oomb_trainer::largest_fitting_tokens(seven, off, host128));

  // Where everything fits, all of it is on the GPU, no ring; a cap still splits it.
  const auto half = real_config("qwen2.5-0.5b.json");
  const memory_plan small = oomb_trainer::plan_memory(half, off, 131072, t);
  CHECK(small.optimizer_groups_on_gpu == small.optimizer_groups);
  CHECK(small.on_gpu(plan_part::optimizer_staging) == 0);
  CHECK(small.on_host(plan_part::optimizer) == 0);
  CHECK(small.optimizer_first_on_host.empty());
  capped.optimizer_gpu_cap = 2 * GiB;  // the embedding's 1.52 GiB and a few layers
  const memory_plan small_capped = oomb_trainer::plan_memory(half, off, 131072, capped);
  CHECK(small_capped.optimizer_groups_on_gpu > 0);
  CHECK(small_capped.optimizer_groups_on_gpu < small_capped.optimizer_groups);
  CHECK(small_capped.on_gpu(plan_part::optimizer) <= 2 * GiB);
  // Checkpoint staging is one tensor's, the largest (the embedding), wherever the split falls.
  capped.checkpoint_staging = true;
  const memory_plan saving = oomb_trainer::plan_memory(half, off, 131072, capped);
  CHECK(saving.on_host(plan_part::checkpoint_staging) == 4 * std::uint64_t(half.vocab_size) * std::uint64_t(half.hidden_size));
  capped.optimizer_gpu_cap = 0;
  CHECK(oomb_trainer::plan_memory(half, off, 131072, capped).on_host(plan_part::checkpoint_staging) ==
        saving.on_host(plan_part::checkpoint_staging));
}

TEST_CASE("memory plan: --optimizer-gpu-memory caps the GPU's share, for --device cuda only, checked when parsed") {
  const std::string seven = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/qwen2.5-7b.json";
  const auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a{"--config", seven, "--synthetic", "kv-recall", "--seq-len", "131072", "--chunk", "4096",
                               "--page", "128", "--offload", "--steps", "1", "--out", "never", "--device", "cuda",
                               "--gpu-memory", "139G", "--host-memory", "512G"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  using oomb_trainer::parse_train_options;
  CHECK(parse_train_options(args({})).optimizer_gpu_memory == -1);
  CHECK(parse_train_options(args({"--optimizer-gpu-memory", "10G"})).optimizer_gpu_memory == std::int64_t(10 * GiB));
  CHECK(parse_train_options(args({"--optimizer-gpu-memory", "0"})).optimizer_gpu_memory == 0);
  CHECK_THROWS_WITH_AS(parse_train_options(args({"--optimizer-gpu-memory", "10 G"})), doctest::Contains("--optimizer-gpu-memory: '10 G'"),
                       oomb::invalid_argument);
  auto cpu = args({"--optimizer-gpu-memory", "10G"});
  *std::find(cpu.begin(), cpu.end(), "cuda") = "cpu";
  CHECK_THROWS_WITH_AS(parse_train_options(cpu), doctest::Contains("--optimizer-gpu-memory places the optimizer state on a GPU"),
                       oomb::invalid_argument);
  const oomb_trainer::trainer_factory no_device;  // --gpu-memory given: the device is not asked
  CHECK(oomb_trainer::plan_target_of(parse_train_options(args({})), no_device).optimizer == oomb_trainer::optimizer_placement::split);
  const auto t = oomb_trainer::plan_target_of(parse_train_options(args({"--optimizer-gpu-memory", "10G"})), no_device);
  CHECK(t.optimizer_gpu_cap == 10 * GiB);
  const memory_plan p = oomb_trainer::plan_memory(real_config("qwen2.5-7b.json"), offload_options(4096, 128), 131072, t);
  CHECK(p.on_gpu(plan_part::optimizer) <= 10 * GiB);
  CHECK(p.optimizer_summary().find("--optimizer-gpu-memory caps it at 10.00 GiB") != std::string::npos);
  CHECK(oomb_trainer::options_json(parse_train_options(args({"--optimizer-gpu-memory", "10G"})))["optimizer_gpu_memory"] ==
        std::int64_t(10 * GiB));
}

TEST_CASE("optimizer split: the longest prefix of tensors within the room (ring included) and the cap") {
  const auto cfg = trainer_test::tiny_config(4, 2, false, 16, 3, 40);
  const oomb_trainer::param_layout layout(cfg);
  const std::size_t n = layout.entries().size();
  const auto all = oomb_trainer::split_after(layout, n);
  CHECK(all.all_on_gpu());
  CHECK(all.ring_bytes() == 0);
  CHECK(all.gpu_bytes() == 12 * layout.total());
  const auto none = oomb_trainer::split_after(layout, 0);
  CHECK(none.host_offset == 0);
  CHECK(none.piece_elements() == layout.total());  // a tiny model's host part is less than a piece
  CHECK_THROWS_AS(oomb_trainer::split_after(layout, n + 1), oomb::invalid_argument);
  constexpr std::uint64_t unlimited = ~std::uint64_t(0);
  CHECK(oomb_trainer::split_fitting(layout, all.gpu_bytes(), unlimited).all_on_gpu());
  CHECK(oomb_trainer::split_fitting(layout, unlimited, all.gpu_bytes()).all_on_gpu());
  for (std::size_t k = 0; k < n; ++k) {
    CAPTURE(k);
    const auto s = oomb_trainer::split_after(layout, k);
    CHECK(s.host_offset == layout.entries()[k].offset);
    // Exactly the cap of k tensors' state: k of them (the room does not bind).
    CHECK(oomb_trainer::split_fitting(layout, unlimited, s.gpu_bytes()).gpu_tensors == k);
    // Exactly the room of k tensors and their ring: at least k, and whatever it picks fits.
    const auto r = oomb_trainer::split_fitting(layout, s.gpu_bytes() + s.ring_bytes(), unlimited);
    CHECK(r.gpu_tensors >= k);
    CHECK(r.gpu_bytes() + r.ring_bytes() <= s.gpu_bytes() + s.ring_bytes());
  }
  // With large models the ring is the fixed 3 x 48 MiB: the split is the longest prefix.
  const auto seven = oomb_trainer::param_layout(real_config("qwen2.5-7b.json"));
  const std::uint64_t room = 50 * GiB;
  const auto big = oomb_trainer::split_fitting(seven, room, unlimited);
  CHECK(big.gpu_bytes() + big.ring_bytes() <= room);
  CHECK(oomb_trainer::split_after(seven, big.gpu_tensors + 1).gpu_bytes() + big.ring_bytes() > room);
  CHECK(big.ring_bytes() == 3 * (std::uint64_t(1) << 22) * 12);
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
    // Host memory binds: the message names what bf16 gradient homes would fit.
    chunk_options bf16 = off;
    bf16.grad_homes = oomb_trainer::page_home_format::bf16;
    const std::int64_t with_bf16 = oomb_trainer::largest_fitting_tokens(cfg, bf16, t);
    REQUIRE(with_bf16 > largest);
    CHECK(m.find("with --grad-homes bf16 (half the gradient homes' bytes) " + std::to_string(with_bf16) + " tokens fit") !=
          std::string::npos);
    CHECK(m.find("dense bound") == std::string::npos);  // dense: no word about sparse
  }
  {
    // Page-sparse: the refusal says the gradient homes were planned at the dense bound; a length
    // that fits only with bf16 homes says so.
    chunk_options sparse = off;
    sparse.sparse = true;
    sparse.budget = 64;
    chunk_options sparse_bf16 = sparse;
    sparse_bf16.grad_homes = oomb_trainer::page_home_format::bf16;
    const std::int64_t fp32_fits = oomb_trainer::largest_fitting_tokens(cfg, sparse, t);
    const std::int64_t bf16_fits = oomb_trainer::largest_fitting_tokens(cfg, sparse_bf16, t);
    REQUIRE(bf16_fits > fp32_fits + 16);
    CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, sparse, bf16_fits, t),
                         doctest::Contains("with --grad-homes bf16 (half the gradient homes' bytes) this one fits"),
                         oomb::invalid_argument);
    CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, sparse, bf16_fits, t),
                         doctest::Contains("planned at the dense bound"), oomb::invalid_argument);
  }
  // A GPU too small for the weights: no length fits, and the message says why, with all of the
  // optimizer state in pinned host memory.
  const plan_target tiny_gpu = cuda_target(8 * GiB, 128 * GiB);
  CHECK(oomb_trainer::largest_fitting_tokens(cfg, off, tiny_gpu) == 0);
  CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, off, 131072, tiny_gpu),
                       doctest::Contains("no sequence fits"), oomb::invalid_argument);
  const memory_plan none_fits = oomb_trainer::plan_memory(cfg, off, 131072, tiny_gpu);
  CHECK(none_fits.optimizer_groups_on_gpu == 0);
  CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, off, 131072, tiny_gpu),
                       doctest::Contains(fmt::format("of GPU memory, 8.00 GiB available; {} of host memory",
                                                     oomb_trainer::detail::plan_bytes(double(none_fits.host_total())))
                                             .c_str()),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, off, 131072, tiny_gpu),
                       doctest::Contains("not enough GPU memory (optimizer state: all "), oomb::invalid_argument);
  // The split fits the GPU but its host part and the homes do not fit the host: both named.
  const plan_target small_host = cuda_target(139 * GiB, 16 * GiB);
  const memory_plan split_host = oomb_trainer::plan_memory(cfg, off, 131072, small_host);
  REQUIRE(split_host.gpu_fits());
  REQUIRE_FALSE(split_host.host_fits());
  REQUIRE(split_host.on_host(plan_part::optimizer) > 0);
  CHECK_THROWS_WITH_AS(oomb_trainer::checked_memory_plan(cfg, off, 131072, small_host),
                       doctest::Contains(fmt::format("not enough host memory (optimizer state: the first {} of {} tensors on the GPU",
                                                     split_host.optimizer_groups_on_gpu, split_host.optimizer_groups)
                                             .c_str()),
                       oomb::invalid_argument);
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
  auto off = offload_options(4096, 16);
  off.homes = oomb_trainer::home_memory::pageable;
  const memory_plan p = oomb_trainer::plan_memory(cfg, off, 1048576, cuda_target(139 * GiB, 128 * GiB));
  const std::string d = p.describe();
  CAPTURE(d);
  std::size_t lines = 0;
  for (char ch : d) lines += ch == '\n';
  CHECK(lines == 1 + (p.gpu.size() + 2) + (p.host.size() + 2) + 1);  // header, 2 blocks (title, items, total), optimizer
  for (const auto* items : {&p.gpu, &p.host})
    for (const auto& i : *items) CHECK(d.find(i.what) != std::string::npos);
  CHECK(d.find("allowed (the test)") != std::string::npos);
  CHECK(d.find("grows 0.0 MiB per 10K tokens") != std::string::npos);  // the GPU, with offload to pageable homes
  CHECK(d.find("pageable homes") != std::string::npos);
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
TEST_CASE("memory plan: the table for Qwen2.5 0.5B and 7B, Llama-3.1-8B and Qwen3-8B at 128K, 1M and 4M tokens with offload") {
  using oomb_trainer::optimizer_placement;
  std::string table =
      "| model | chunk | optimizer placement | tokens | GPU | GPU growth per 10K tokens (pinned homes) | GPU growth, pageable "
      "homes | host | + checkpoint staging | optimizer on the GPU | fits (no checkpoints) |\n"
      "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n";
  // bench/trainer's settings: page 128, chunk 16,384 (0.5B) or 4,096 (7B), max(4 chunks' pages, 256) near slots.
  struct row {
    const char* model;
    std::int32_t chunk;
    optimizer_placement placement;
    const char* name;
  };
  for (const row r : {row{"qwen2.5-0.5b", 16384, optimizer_placement::split, "split"},
                      row{"qwen2.5-7b", 4096, optimizer_placement::host, "host"},
                      row{"qwen2.5-7b", 4096, optimizer_placement::split, "split"},
                      row{"llama-3.1-8b", 4096, optimizer_placement::split, "split"},
                      row{"qwen3-8b", 4096, optimizer_placement::split, "split"}}) {
    const auto cfg = real_config((std::string(r.model) + ".json").c_str());
    plan_target t = cuda_target(139 * GiB, 128 * GiB);
    t.optimizer = r.placement;
    t.checkpoint_staging = false;  // the benchmarks' fwd_bwd steps write no checkpoint
    auto opt = offload_options(r.chunk, 128);
    opt.near_pages = std::max(4 * r.chunk / 128, 256);
    for (const std::int64_t tokens : {131072, 1048576, 4194304}) {
      const memory_plan p = oomb_trainer::plan_memory(cfg, opt, tokens, t);
      // Pinned homes: the GPU grows by the driver's mapping of them alone (8 B per pinned 4 KiB);
      // pageable homes: nothing on the GPU grows.
      CHECK(p.gpu_growth_per_10k > 0.0);
      CHECK(p.gpu_growth_per_10k <= p.host_growth_per_10k / 512 + 1);
      auto pageable_opt = opt;
      pageable_opt.homes = oomb_trainer::home_memory::pageable;
      const memory_plan pageable = oomb_trainer::plan_memory(cfg, pageable_opt, tokens, t);
      CHECK(pageable.gpu_growth_per_10k == 0.0);
      CHECK(pageable.host_growth_per_10k == p.host_growth_per_10k);
      using oomb_trainer::detail::plan_bytes;
      plan_target saving = t;
      saving.checkpoint_staging = true;
      const std::uint64_t staging = oomb_trainer::plan_memory(cfg, opt, tokens, saving).on_host(plan_part::checkpoint_staging);
      table += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} of {} tensors | {} |\n", r.model, r.chunk, r.name,
                           tokens, plan_bytes(double(p.gpu_total())), plan_bytes(p.gpu_growth_per_10k),
                           plan_bytes(pageable.gpu_growth_per_10k), plan_bytes(double(p.host_total())),
                           plan_bytes(double(staging)),
                           p.optimizer_groups_on_gpu, p.optimizer_groups,
                           p.fits() ? "yes" : p.gpu_fits() ? "no: host" : "no: GPU");
    }
    table += fmt::format("| {} | {} | {} | largest that fits: {} | | | | | | | |\n", r.model, r.chunk, r.name,
                         oomb_trainer::largest_fitting_tokens(cfg, opt, t));
  }
  if (std::getenv("OOMB_PRINT_PLAN_TABLE")) std::fputs(table.c_str(), stdout);
}
