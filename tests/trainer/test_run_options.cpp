// oomb-train's run options: bad sparse input, --keep-attention-outputs, --plan, --host-memory /
// --gpu-memory and the memory plan's refusal, --out's trust (options.json, no silent mixing),
// checkpoint-<step> with --keep-last, resume checks, no duplicated log lines, the stop flag.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/config.hpp"
#include "trainer/trainers/memory_plan.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::log_lines;
using oomb_trainer::parse_train_options;
using training_test::temp_dir;

const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";

/// A small kv-recall run into `out` (tiny.json: 16-dim heads, 64 tokens, 4 chunks of 16).
std::vector<std::string> run_args(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--config", tiny, "--synthetic", "kv-recall", "--seq-len", "64", "--chunk", "16",
                             "--steps", "3", "--out", out, "--quiet"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

/// A "cuda" device that is the CPU's trainer behind the maker, reporting 8 GiB free: the GPU's
/// plan and log paths, checkable anywhere.
oomb_trainer::trainer_factory host_as_gpu() {
  oomb_trainer::trainer_factory m;
  m.name = "cuda";
  m.require = [](const oomb_trainer::trainer_setup&) {};
  m.make = [](const oomb_trainer::trainer_setup& s) -> std::unique_ptr<oomb_trainer::trainer> {
    return std::make_unique<oomb_trainer::cpu_trainer>(s);
  };
  m.memory_use = [] { return oomb_trainer::device_memory_use{2ull << 30, 8ull << 30, 10ull << 30}; };
  return m;
}

}  // namespace

TEST_CASE("run options: sparse shape flags need --sparse-budget, and a budget covering every past page is dense") {
  for (const char* flag : {"--sink", "--local", "--tile"}) {
    const std::string message = std::string(flag) + " shapes page-sparse attention: it needs --sparse-budget";
    CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {flag, "2"})), doctest::Contains(message.c_str()),
                         oomb::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--scoring", "mean"})),
                       doctest::Contains("--scoring shapes page-sparse attention: it needs --sparse-budget"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--sparse-budget", "0", "--scoring", "max"})),
                       doctest::Contains("--scoring: 'max' is not quest or mean"), oomb::invalid_argument);
  CHECK(parse_train_options(run_args("o", {"--sparse-budget", "0"})).scoring == oomb::score_kind::quest);
  CHECK(parse_train_options(run_args("o", {"--sparse-budget", "0", "--scoring", "mean"})).scoring == oomb::score_kind::mean);
  // 64 tokens in chunks of 16, pages of 16: the last chunk's past is 3 pages.
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--sparse-budget", "1", "--sink", "1", "--local", "1"})),
                       doctest::Contains("= 3 pages covers every past page (at most 3 at 64 tokens"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--sparse-budget", "9"})), doctest::Contains("that is dense attention"),
                       oomb::invalid_argument);
  CHECK(parse_train_options(run_args("o", {"--sparse-budget", "0", "--sink", "1", "--local", "1"})).budget == 0);
}

TEST_CASE("run options: --keep-attention-outputs, --plan, --host-memory, --gpu-memory, --keep-last parse") {
  const auto o = parse_train_options(run_args("o", {"--keep-attention-outputs", "--plan", "--host-memory", "12G",
                                                    "--gpu-memory", "512MiB", "--keep-last", "5"}));
  CHECK(o.keep_attention_outputs);
  CHECK(o.plan);
  CHECK(o.host_memory == (12ull << 30));
  CHECK(o.gpu_memory == (512ull << 20));
  CHECK(o.keep_last == 5);
  const auto d = parse_train_options(run_args("o"));
  CHECK_FALSE(d.keep_attention_outputs);
  CHECK(d.host_memory == 0);  // host_memory_default() at plan time
  CHECK(d.keep_last == 2);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--host-memory", "lots"})),
                       doctest::Contains("--host-memory: 'lots' is not a byte count"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--gpu-memory", "0"})),
                       doctest::Contains("--gpu-memory must be more than 0 bytes"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--keep-last", "0"})), doctest::Contains("--keep-last must be in [1, "),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--keep-attention-outputs", "--full-backprop"})),
                       doctest::Contains("--keep-attention-outputs is chunk-recurrent's"), oomb::invalid_argument);
}

TEST_CASE("run options: --attention-kernels automatic|portable reaches the chunk options and options.json") {
  using oomb::attention::kernel_choice;
  CHECK(parse_train_options(run_args("o")).attention_kernels == kernel_choice::automatic);
  const auto o = parse_train_options(run_args("o", {"--device", "cuda", "--attention-kernels", "portable"}));
  CHECK(o.attention_kernels == kernel_choice::portable);
  CHECK(oomb_trainer::chunk_options_of(o).attention_kernels == kernel_choice::portable);
  CHECK(oomb_trainer::options_json(o)["attention_kernels"] == "portable");
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o")))["attention_kernels"] == "automatic");
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--attention-kernels", "fast"})),
                       doctest::Contains("--attention-kernels: unknown kernels 'fast' (known: automatic, portable)"),
                       oomb::invalid_argument);
}

TEST_CASE("run options: stage 1's prefetch of the last selection is on with sparse and offload; "
          "--no-prefetch-last-selection turns it off and needs both") {
  // dense: nothing to prefetch, and options.json says so
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o")))["prefetch_last_selection"] == false);
  const auto on = parse_train_options(run_args("o", {"--sparse-budget", "0", "--offload"}));
  CHECK(on.prefetch_last_selection);
  CHECK(oomb_trainer::chunk_options_of(on).prefetch_last_selection);
  CHECK(oomb_trainer::options_json(on)["prefetch_last_selection"] == true);
  const auto off = parse_train_options(run_args("o", {"--sparse-budget", "0", "--offload", "--no-prefetch-last-selection"}));
  CHECK_FALSE(off.prefetch_last_selection);
  CHECK_FALSE(oomb_trainer::chunk_options_of(off).prefetch_last_selection);
  CHECK(oomb_trainer::options_json(off)["prefetch_last_selection"] == false);
  for (const std::vector<std::string>& without : {std::vector<std::string>{"--offload"}, {"--sparse-budget", "0"}})
    CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", [&] {
                           auto a = without;
                           a.push_back("--no-prefetch-last-selection");
                           return a;
                         }())),
                         doctest::Contains("--no-prefetch-last-selection turns off stage 1's prefetch"),
                         oomb::invalid_argument);
}

TEST_CASE("run options: --deterministic reaches the chunk options and options.json; on cuda only what it can order") {
  CHECK_FALSE(parse_train_options(run_args("o")).deterministic);
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o")))["deterministic"] == false);
  // the CPU is deterministic whatever the flags: accepted with sparse attention and any page
  const auto cpu = parse_train_options(run_args("o", {"--deterministic", "--sparse-budget", "0"}));
  CHECK(cpu.deterministic);
  CHECK(oomb_trainer::chunk_options_of(cpu).deterministic);
  CHECK(oomb_trainer::options_json(cpu)["deterministic"] == true);
  const auto gpu = parse_train_options(run_args("o", {"--device", "cuda", "--deterministic", "--page", "128", "--chunk", "128", "--seq-len", "1024"}));
  CHECK(gpu.deterministic);
  CHECK(oomb_trainer::chunk_options_of(gpu).deterministic);
  // page-sparse too (the Hopper backward orders its dQ by the tiles' selections)
  CHECK(parse_train_options(run_args("o", {"--device", "cuda", "--deterministic", "--page", "128", "--chunk", "128",
                                           "--seq-len", "1024", "--sparse-budget", "1"}))
            .deterministic);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--device", "cuda", "--deterministic"})),
                       doctest::Contains("--page >= 128 (got 16)"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--device", "cuda", "--deterministic", "--page", "128", "--chunk",
                                                          "128", "--seq-len", "1024", "--attention-kernels", "portable"})),
                       doctest::Contains("needs the Hopper attention kernels"), oomb::invalid_argument);
}

TEST_CASE("run options: --home-memory pinned|pageable needs --offload and --device cuda; options.json and the plan say it") {
  CHECK(parse_train_options(run_args("o")).homes == oomb_trainer::home_memory::pinned);
  const auto o = parse_train_options(run_args("o", {"--device", "cuda", "--offload", "--home-memory", "pageable"}));
  CHECK(o.homes == oomb_trainer::home_memory::pageable);
  CHECK(oomb_trainer::chunk_options_of(o).homes == oomb_trainer::home_memory::pageable);
  CHECK(oomb_trainer::options_json(o)["home_memory"] == "pageable");
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o")))["home_memory"] == "pinned");
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--device", "cuda", "--home-memory", "pageable"})),
                       doctest::Contains("--home-memory pageable needs --offload and --device cuda"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--offload", "--home-memory", "pageable"})),
                       doctest::Contains("on the CPU every home is pageable host memory already"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--offload", "--home-memory", "swap"})),
                       doctest::Contains("--home-memory: unknown memory 'swap' (known: pinned, pageable)"), oomb::invalid_argument);
  // The plan of a pageable run: its staging on the host, nothing growing on the GPU.
  auto co = oomb_trainer::chunk_options_of(o);
  co.near_pages = 8;
  oomb_trainer::plan_target t;
  t.device = "cuda";
  t.gpu_bytes = 8ull << 30;
  t.host = {8ull << 30, "the test"};
  const auto plan = oomb_trainer::plan_memory(oomb_trainer::load_model_config(tiny), co, 4096, t);
  CHECK(plan.on_host(oomb_trainer::plan_part::home_staging) > 0);
  CHECK(plan.gpu_growth_per_10k == 0.0);
  CHECK(plan.describe().find("pageable homes") != std::string::npos);
  co.offload = false;
  CHECK_THROWS_WITH_AS(co.validate(), doctest::Contains("--home-memory pageable needs --offload"), oomb::invalid_argument);
}

TEST_CASE("run options: --plan prints the run's plan (kept outputs, the GPU's parts, the limits) and writes nothing") {
  temp_dir tmp("plan");
  const std::string out = tmp / "never";
  const std::string cpu = oomb_trainer::training_run::plan_text(parse_train_options(run_args(out, {"--host-memory", "1G"})));
  MESSAGE(cpu);
  CHECK(cpu.find("memory plan: 64 tokens on cpu, chunk 16, page 16") != std::string::npos);
  CHECK(cpu.find("1.00 GiB allowed (--host-memory)") != std::string::npos);
  CHECK(cpu.find("attention outputs") == std::string::npos);
  const std::string kept =
      oomb_trainer::training_run::plan_text(parse_train_options(run_args(out, {"--keep-attention-outputs", "--offload"})));
  // tiny.json: 2 layers, so 1 layer x 4 chunks of blocks; homes on the host, 4 slots.
  CHECK(kept.find("attention outputs kept for stage 2 (4 blocks of") != std::string::npos);
  CHECK(kept.find("attention output slots (4)") != std::string::npos);
  const auto gpu_args = run_args(out, {"--seq-len", "128", "--device", "cuda", "--offload", "--sparse-budget", "1", "--gpu-memory", "4G"});
  const auto gpu = oomb_trainer::training_run::plan(parse_train_options(gpu_args), host_as_gpu());
  CHECK(gpu.gpu_limit == (4ull << 30));
  // The summaries grow with the context: at home in pinned memory; the device holds a slice of one
  // layer's past, gathered for scoring, and the workspace.
  CHECK(gpu.on_gpu(oomb_trainer::plan_part::sparse_summaries) == 0);
  CHECK(gpu.on_host(oomb_trainer::plan_part::sparse_summaries) > 0);
  CHECK(gpu.on_gpu(oomb_trainer::plan_part::sparse_gathered) > 0);
  CHECK(gpu.on_gpu(oomb_trainer::plan_part::sparse_gathered) < gpu.on_host(oomb_trainer::plan_part::sparse_summaries));
  CHECK(gpu.on_gpu(oomb_trainer::plan_part::sparse_workspace) > 0);
  // Once the past is longer than a slice (2,048 pages: 32,768 tokens of 16), selection's device
  // bytes stop growing with the context; the summaries' home keeps growing.
  const auto sparse_at = [&](const char* tokens) {
    return oomb_trainer::training_run::plan(
        parse_train_options(run_args(out, {"--seq-len", tokens, "--device", "cuda", "--offload", "--sparse-budget", "64",
                                           "--gpu-memory", "64G"})),
        host_as_gpu());
  };
  const auto at_256k = sparse_at("262144"), at_512k = sparse_at("524288");
  CHECK(at_256k.on_gpu(oomb_trainer::plan_part::sparse_gathered) == at_512k.on_gpu(oomb_trainer::plan_part::sparse_gathered));
  CHECK(at_256k.on_gpu(oomb_trainer::plan_part::sparse_workspace) == at_512k.on_gpu(oomb_trainer::plan_part::sparse_workspace));
  CHECK(2 * at_256k.on_host(oomb_trainer::plan_part::sparse_summaries) <=
        at_512k.on_host(oomb_trainer::plan_part::sparse_summaries) + (1u << 20));
  CHECK(gpu.optimizer_groups_on_gpu == gpu.optimizer_groups);  // cuda_trainer keeps it all there
  // Without --gpu-memory: the device's free bytes less the 1 GiB margin.
  const auto free = oomb_trainer::training_run::plan(parse_train_options(run_args(out, {"--device", "cuda"})), host_as_gpu());
  CHECK(free.gpu_limit == (8ull << 30) - oomb_trainer::gpu_memory_margin);
  // Too long for the host: the plan says so and how long a sequence fits.
  const std::string tight = oomb_trainer::training_run::plan_text(
      parse_train_options(run_args(out, {"--seq-len", "65536", "--host-memory", "64M"})));
  CHECK(tight.find("DOES NOT FIT") != std::string::npos);
  CHECK(tight.find("does not fit: the largest --seq-len that fits is ") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("run options: a run whose plan does not fit is refused with both numbers before anything is written") {
  temp_dir tmp("refused");
  const std::string out = tmp / "never";
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(parse_train_options(run_args(out, {"--seq-len", "65536", "--host-memory", "64M"}))),
                       doctest::Contains("of host memory, 64.0 MiB allowed (--host-memory): not enough host memory; the largest "
                                         "sequence that fits is "),
                       oomb::invalid_argument);
  // On the GPU, the refusal says where the optimizer state went (here: none of it fits there).
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(parse_train_options(run_args(out, {"--device", "cuda", "--gpu-memory", "1M"})),
                                                  {}, host_as_gpu()),
                       doctest::Contains("of GPU memory, 1.0 MiB available"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run(parse_train_options(run_args(out, {"--device", "cuda", "--gpu-memory", "1M"})),
                                                  {}, host_as_gpu()),
                       doctest::Contains("(optimizer state: all "), oomb::invalid_argument);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("run options: options.json, checkpoint-<step> with --keep-last, checkpoint -> the latest, the log's fields") {
  temp_dir tmp("checkpoints");
  const fs::path out = tmp / "run";
  auto o = parse_train_options(run_args(out.string(), {"--device", "cuda", "--steps", "5", "--save-every", "1", "--keep-last", "2", "--seed", "7"}));
  oomb_trainer::training_run(o, {}, host_as_gpu()).run();
  const auto opts = nlohmann::json::parse(std::ifstream(out / "options.json"));
  CHECK(opts["seed"] == 7);
  CHECK(opts["keep_last"] == 2);
  CHECK(opts["seq_len"] == 64);
  CHECK(opts["min_lr"] == doctest::Approx(1e-4));  // the effective value, not the "-1" default
  CHECK_FALSE(fs::exists(out / "checkpoint-3"));
  CHECK(fs::exists(out / "checkpoint-4" / "model.safetensors"));
  CHECK(fs::exists(out / "checkpoint-5" / "model.safetensors"));
  CHECK(fs::read_symlink(out / "checkpoint") == "checkpoint-5");
  const auto log = log_lines(out / "log.jsonl");
  REQUIRE(log.size() == 5);
  for (const char* field : {"grad_norm", "exposed_transfer_seconds", "h2d_gb_per_second", "d2h_gb_per_second",
                            "pinned_host_bytes", "pageable_host_bytes", "gpu_bytes_in_use", "gpu_bytes_in_use_peak", "gpu_bytes_total"}) {
    CAPTURE(field);
    CHECK(log.back().contains(field));
  }
  CHECK(log.back()["gpu_bytes_in_use"] == (2ull << 30));
}

TEST_CASE("run options: an --out holding another run's log is refused; --resume continues it with no duplicated lines") {
  temp_dir tmp("mixing");
  const fs::path out = tmp / "run";
  auto o = parse_train_options(run_args(out.string(), {"--steps", "4", "--save-every", "2", "--keep-last", "3", "--stop-after", "3"}));
  oomb_trainer::training_run(o).run();  // checkpoints at 2 and 3, log of 3 steps
  o.stop_after = 0;
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run{o}, doctest::Contains("holds another run's log.jsonl: continue it with --resume"),
                       oomb::invalid_argument);
  // Another seed is another run: refused by name.
  auto other = o;
  other.resume = (out / "checkpoint-2").string();
  other.seed = 99;
  CHECK_THROWS_WITH_AS(oomb_trainer::training_run{other}, doctest::Contains("the checkpoint's run had seed 1234, the command line says 99"),
                       oomb::invalid_argument);
  // Resuming from step 2 takes step 3 again: it is logged once.
  o.resume = (out / "checkpoint-2").string();
  oomb_trainer::training_run rest(o);
  CHECK(rest.steps_taken() == 2);
  rest.run();
  const auto log = log_lines(out / "log.jsonl");
  REQUIRE(log.size() == 4);
  for (std::size_t i = 0; i < log.size(); ++i) CHECK(log[i]["step"] == i + 1);
}

TEST_CASE("run options: a stop request (SIGINT / SIGTERM's flag) ends the run at the next step boundary with a checkpoint") {
  temp_dir tmp("signal");
  const fs::path out = tmp / "run";
  volatile std::sig_atomic_t stop = 0;
  oomb_trainer::training_run run(parse_train_options(run_args(out.string(), {"--steps", "10"})), [&](const std::string& line) {
    if (line.rfind("step ", 0) == 0) stop = SIGTERM;  // as the handler would, during step 1
  });
  CHECK(run.run(&stop) == SIGTERM);
  CHECK(run.steps_taken() == 1);
  CHECK(fs::read_symlink(out / "checkpoint") == "checkpoint-1");
  CHECK(log_lines(out / "log.jsonl").size() == 1);
}

TEST_CASE("run options: a step's counters add up over the batch, exposed transfer time included") {
  oomb_trainer::chunk_step_stats sum, a, b;
  a.exposed_transfer_seconds = 0.25;
  b.exposed_transfer_seconds = 0.5;
  a.bytes_to_near = 3;
  b.bytes_to_near = 4;
  a.attention_host.residency = 1;
  b.attention_host.residency = 2;
  a.attention_host.selection_wait = 0.5;
  b.attention_host.total = 4;
  oomb_trainer::add_stats(sum, a);
  oomb_trainer::add_stats(sum, b);
  CHECK(sum.exposed_transfer_seconds == 0.75);
  CHECK(sum.bytes_to_near == 7);
  CHECK(sum.attention_host.residency == 3);
  CHECK(sum.attention_host.selection_wait == 0.5);
  CHECK(sum.attention_host.total == 4);
}

TEST_CASE("run options: log.jsonl splits the host's attention time: residency, kernel calls, selection, within the step") {
  temp_dir tmp("host-times");
  const fs::path out = tmp / "run";
  oomb_trainer::training_run(
      parse_train_options(run_args(out.string(), {"--steps", "2", "--seq-len", "128", "--offload", "--near-pages", "4", "--sparse-budget", "1"})))
      .run();
  const auto log = log_lines(out / "log.jsonl");
  REQUIRE(log.size() == 2);
  for (const auto& line : log) {
    const auto& h = line["attention_host_seconds"];
    const double residency = h["residency"], kernels = h["kernels"], selection = h["selection"],
                 wait = h["selection_wait"], total = h["total"];
    // Streamed pages, computed attention and a selection per (chunk, layer) past the first chunk.
    CHECK(residency > 0);
    CHECK(kernels > 0);
    CHECK(selection > 0);
    CHECK(wait == 0);  // the CPU selector never waits
    // The parts are inside paged_attention's calls, which are inside the stages.
    CHECK(residency + kernels + selection <= total);
    CHECK(total <= line["stage1_seconds"].get<double>() + line["stage2_seconds"].get<double>());
  }
}

TEST_CASE("run options: --schedule and AdamW's betas and epsilon parse, are checked, reach the optimizer and options.json") {
  auto o = parse_train_options(run_args("o", {"--schedule", "linear", "--adam-beta1", "0.8", "--adam-beta2", "0.95",
                                              "--adam-epsilon", "1e-6"}));
  CHECK(o.schedule == oomb_trainer::lr_schedule_kind::linear);
  CHECK(o.adam_beta1 == 0.8);
  CHECK(o.adam_beta2 == 0.95);
  CHECK(o.adam_epsilon == 1e-6);
  const auto j = oomb_trainer::options_json(o);
  CHECK(j["schedule"] == "linear");
  CHECK(j["adam_beta2"] == 0.95);
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o")))["schedule"] == "cosine");
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--schedule", "step"})), doctest::Contains("not cosine, linear or constant"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--adam-beta1", "1"})), doctest::Contains("--adam-beta1 must be in [0, 1)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--adam-beta2", "-0.1"})), doctest::Contains("--adam-beta2"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--adam-epsilon", "0"})), doctest::Contains("--adam-epsilon must be positive"),
                       oomb::invalid_argument);

  // They reach the update: a run with other betas ends at other weights; the schedule shows in the log's lr.
  temp_dir tmp("knobs");
  auto weights_after = [&](const std::string& tag, std::vector<std::string> extra) {
    oomb_trainer::training_run run(parse_train_options(run_args(tmp / tag, extra)), {}, {});
    run.run();
    return run.weights();
  };
  const auto plain = weights_after("plain", {}), betas = weights_after("betas", {"--adam-beta1", "0.5"}),
             eps = weights_after("eps", {"--adam-epsilon", "1e-2"});
  auto same = [](const oomb_trainer::model_params<float>& a, const oomb_trainer::model_params<float>& b) {
    return std::equal(a.data(), a.data() + a.size(), b.data());
  };
  CHECK_FALSE(same(plain, betas));
  CHECK_FALSE(same(plain, eps));
  CHECK(same(plain, weights_after("again", {})));  // and the same flags give the same bits
  (void)weights_after("constant", {"--schedule", "constant", "--warmup", "1"});
  const auto log = log_lines(fs::path(tmp / "constant") / "log.jsonl");
  REQUIRE(log.size() == 3);
  CHECK(log[0]["lr"] == doctest::Approx(1e-3));  // warm-up of one step reaches LR at once
  CHECK(log[2]["lr"] == doctest::Approx(1e-3));  // and stays there
}

TEST_CASE("run options: the step line and the log carry the tokens seen and the run's ETA") {
  temp_dir tmp("eta");
  std::vector<std::string> lines;
  oomb_trainer::training_run run(parse_train_options(run_args(tmp / "run")),
                                 [&](const std::string& l) { lines.push_back(l); }, {});
  run.run();
  const auto log = log_lines(fs::path(tmp / "run") / "log.jsonl");
  REQUIRE(log.size() == 3);
  CHECK(log[0]["tokens_seen"] == 64);
  CHECK(log[2]["tokens_seen"] == 192);
  CHECK(log[0]["eta_seconds"].get<double>() >= 0);
  CHECK(log[2]["eta_seconds"] == 0.0);
  const auto step_line = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("step ", 0) == 0; });
  REQUIRE(step_line != lines.end());
  CHECK(step_line->find("64 tokens seen") != std::string::npos);
  CHECK(step_line->find("run ETA ") != std::string::npos);
  CHECK(oomb_trainer::human_count(1.05e6) == "1.05M");
  CHECK(oomb_trainer::human_duration(200) == "3m20s");
  CHECK(oomb_trainer::human_duration(18420) == "5h07m");
  CHECK(oomb_trainer::human_duration(42.4) == "42 s");
}

TEST_CASE("run options: --rope-theta and --rope-scaling override the config, reach the model and every saved config.json") {
  temp_dir tmp("rope");
  // tiny.json: max_position_embeddings 1M, plain RoPE. A 64-token run of each kind.
  std::vector<std::string> lines;
  auto train = [&](const std::string& tag, std::vector<std::string> extra) {
    lines.clear();
    oomb_trainer::training_run run(parse_train_options(run_args(tmp / tag, extra)),
                                   [&](const std::string& line) { lines.push_back(line); });
    run.run();
    return oomb_trainer::load_model_config((fs::path(tmp / tag) / "checkpoint" / "config.json").string());
  };
  const auto plain = train("plain", {});
  CHECK(plain.rope.kind == oomb_trainer::rope_kind::plain);
  CHECK(plain.max_position_embeddings == 1048576);
  const auto yarn = train("yarn", {"--rope-scaling", R"({"rope_type":"yarn","factor":4,"original_max_position_embeddings":16})",
                                   "--rope-theta", "5e5"});
  CHECK(yarn.rope.kind == oomb_trainer::rope_kind::yarn);
  CHECK(yarn.rope.factor == 4.0);
  CHECK(yarn.rope.original_max_position_embeddings == 16);
  CHECK(yarn.rope.theta == 5e5);
  CHECK(std::any_of(lines.begin(), lines.end(),
                    [](const std::string& l) { return l.find("RoPE: yarn (theta 500000.0, factor 4.0, from 16 tokens)") != std::string::npos; }));
  // The rest of the saved config is the source file's.
  const auto source = nlohmann::json::parse(std::ifstream(tiny));
  const auto saved = nlohmann::json::parse(std::ifstream(fs::path(tmp / "yarn") / "checkpoint" / "config.json"));
  for (const auto& item : source.items())
    if (item.key() != "rope_theta" && item.key() != "rope_scaling") CHECK(saved.at(item.key()) == item.value());
  // The override changes what is trained: another loss than the plain run at step 1.
  const auto loss_of = [&](const std::string& tag) { return log_lines(fs::path(tmp / tag) / "log.jsonl").at(0).at("loss").get<double>(); };
  CHECK(loss_of("yarn") != loss_of("plain"));
  CHECK(train("none", {"--rope-scaling", "none"}).rope == plain.rope);

  // Past max_position_embeddings with plain RoPE: a note, and the saved config says the new length.
  const std::string small = tmp / "small.json";
  auto j = source;
  j["max_position_embeddings"] = 32;
  std::ofstream(small) << j.dump(2);
  const auto longer = train("longer", {"--config", small});
  CHECK(longer.max_position_embeddings == 64);
  CHECK(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("note: --seq-len 64 is beyond the config's max_position_embeddings 32 with plain RoPE") != std::string::npos;
  }));

  CHECK_THROWS_WITH_AS(train("dyn", {"--rope-scaling", R"({"rope_type":"dynamic","factor":2})"}),
                       doctest::Contains("\"dynamic\" cannot be trained"), oomb::format_error);
  CHECK_THROWS_WITH_AS(train("arr", {"--rope-scaling", "[1]"}), doctest::Contains("--rope-scaling takes a JSON object"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(train("bad", {"--rope-scaling", "{yarn"}), doctest::Contains("malformed JSON"), oomb::format_error);
  CHECK_THROWS_WITH_AS(parse_train_options(run_args("o", {"--rope-theta", "-1"})), doctest::Contains("--rope-theta must be positive"),
                       oomb::invalid_argument);
  CHECK(oomb_trainer::options_json(parse_train_options(run_args("o", {"--rope-theta", "2e6"})))["rope_theta"] == 2e6);
}
