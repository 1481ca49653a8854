// The training loop: it learns a task that needs information from earlier chunks (and a control
// that cannot see earlier chunks does not), resume reproduces the uninterrupted losses bit for
// bit, --batch averages the sequences' gradients, a NaN stops the run before the update, a
// checkpoint of another shape is refused up front, the command line names what is wrong.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/trainers/cpu_trainer.hpp"
#include "test_util.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;

using training_test::temp_dir;

oomb_trainer::train_options base_options(const std::string& out) {
  oomb_trainer::train_options o;
  o.config = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";
  o.synthetic = "kv-recall";
  o.seq_len = 128;
  o.chunk = 16;
  o.page = 16;
  o.lr = 3e-3;
  o.warmup = 20;
  o.out = out;
  o.quiet = true;
  return o;
}

std::vector<std::string> with_batch(std::vector<std::string> args, const std::string& n) {
  args.push_back("--batch");
  args.push_back(n);
  return args;
}

double mean_tail(const std::vector<double>& v, std::size_t n) {
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

}  // namespace

// kv-recall (data/synthetic.hpp): 8 keys get random values among 6 in the sequence's first chunk;
// later chunks ask for them. A chunk with a question holds neither the record nor an earlier answer
// to the same key, and the other keys' values are independent, so anything that only sees the
// question's own chunk predicts from a distribution independent of the value: its expected answer
// loss is at least ln 6 (the entropy of a uniform value). Getting below half of that needs the
// information to cross chunk boundaries: forward through the paged K/V of earlier chunks, backward
// through the gradient pages that carry dK/dV back to them. The control run attends to no past
// page at all (sparse with budget 0, sink 0, local 0): same model, same data, only the
// cross-chunk path cut, and it stays near ln 6.
TEST_CASE("training: kv-recall is learnt through the chunk-recurrent path within 60 s; cut the cross-chunk path and it is not") {
  const double answers = 6.0;  // possible answers: kv-recall's default values
  const double threshold = 0.5 * std::log(answers);
  auto train = [](const oomb_trainer::train_options& o, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    oomb_trainer::training_run run(o);
    std::vector<double> losses;
    while (!run.done()) losses.push_back(run.step().loss);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return losses;
  };
  temp_dir tmp("learn");
  auto o = base_options(tmp / "learn");
  o.steps = 400;
  o.offload = true;  // the K/V and gradient pages stream through a 4-slot near tier
  o.near_pages = 4;
  double seconds = 0;
  const auto losses = train(o, seconds);
  const double final_loss = mean_tail(losses, 50);
  MESSAGE("kv-recall: mean answer loss over the last 50 of ", losses.size(), " steps ", final_loss, " (ln 6 = ",
          std::log(answers), ", threshold ", threshold, ") in ", seconds, " s");
  CHECK(losses.front() > std::log(answers));  // it starts knowing nothing
  CHECK(final_loss < threshold);
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer every load and store is instrumented: the 60 s bound is the optimised
  // build's; here it is five times that, and the loss bound is unchanged.
  const double time_limit = 300.0;
#else
  const double time_limit = 60.0;
#endif
  CHECK(seconds < time_limit);

  auto control = base_options(tmp / "control");
  control.steps = 400;
  control.sparse = true;
  control.budget = control.sink = control.local = 0;
  double control_seconds = 0;
  const auto cut = train(control, control_seconds);
  const double control_loss = mean_tail(cut, 50);
  MESSAGE("control without cross-chunk attention: mean answer loss over the last 50 steps ", control_loss);
  CHECK(control_loss > 0.8 * std::log(answers));
}

TEST_CASE("training: resume reproduces the uninterrupted losses and weights bit for bit (token file, offload, sparse)") {
  temp_dir tmp("resume");
  // A token file of a repetitive random text (so the loss moves).
  std::mt19937 rng(3);
  std::vector<std::uint32_t> text(4000);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = i % 7 == 0 ? rng() % 64 : (text[i - 1] * 5 + 1) % 64;
  oomb_trainer::write_token_file(tmp / "tokens.bin", text.data(), text.size(), 64);

  auto o = base_options(tmp / "a");
  o.synthetic.clear();
  o.data = tmp / "tokens.bin";
  o.seq_len = 200;
  o.chunk = 32;
  o.steps = 8;
  o.warmup = 2;
  o.weight_decay = 0.1;
  o.clip = 0.5;
  o.offload = true;
  o.near_pages = 4;
  o.sparse = true;
  o.budget = 2;
  o.tile = 16;

  oomb_trainer::training_run a(o);
  std::vector<double> whole;
  while (!a.done()) whole.push_back(a.step().loss);
  CHECK(whole.back() < whole.front());

  auto ob = o;
  ob.out = tmp / "b";
  ob.stop_after = 3;
  oomb_trainer::training_run b(ob);
  b.run();  // 3 steps, then a checkpoint
  REQUIRE(b.steps_taken() == 3);

  auto oc = o;
  oc.out = tmp / "b";
  oc.resume = tmp / "b/checkpoint";
  oomb_trainer::training_run c(oc);
  CHECK(c.steps_taken() == 3);
  std::vector<double> resumed;
  while (!c.done()) resumed.push_back(c.step().loss);
  REQUIRE(resumed.size() == 5);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(resumed[i] == whole[i + 3]);  // exactly, not approximately
  }
  const auto wc = c.weights(), wa = a.weights();
  CHECK(std::memcmp(wc.data(), wa.data(), wa.size() * sizeof(float)) == 0);
  // The log of the interrupted run holds all 8 steps.
  std::ifstream log(tmp / "b/log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) ++lines;
  CHECK(lines == 8);
}

TEST_CASE("training: --dump-grads writes the first step's gradients under the HF names") {
  temp_dir tmp("dump");
  auto o = base_options(tmp / "out");
  o.steps = 1;
  o.warmup = 0;
  o.dump_grads = tmp / "grads.safetensors";
  oomb_trainer::training_run run(o);
  run.step();
  const auto f = oomb_trainer::safetensors_file::open(o.dump_grads);
  CHECK(f.tensors().size() == run.weights().layout().entries().size());
  CHECK(f.contains("model.layers.1.mlp.down_proj.weight"));
  CHECK_FALSE(f.contains("lm_head.weight"));  // tiny.json ties the head
  const auto g = f.read<double>("model.embed_tokens.weight", {64, 64});
  double norm = 0;
  for (double x : g) norm += x * x;
  CHECK(norm > 0);
}

// Gradient accumulation: a step over two sequences has the mean of their losses and the mean of
// their gradients (each sequence's own mean over its counted targets), whatever their masks.
TEST_CASE("training: --batch 2's loss and gradient are the means of the two sequences' alone") {
  temp_dir tmp("batch");
  const auto o = base_options(tmp / "out");
  oomb_trainer::trainer_setup setup;
  setup.config = oomb_trainer::load_model_config(o.config);
  setup.chunk.chunk = o.chunk;
  setup.chunk.page = o.page;
  setup.max_tokens = o.seq_len;
  const oomb_trainer::kv_recall task(setup.config.vocab_size, o.seq_len, o.chunk, o.seed, {});
  const oomb_trainer::sequence a = task.make(0), b = task.make(1);
  REQUIRE(a.counted_targets() > 0);

  auto gradient = [&](const std::vector<oomb_trainer::sequence>& batch, const std::string& file) {
    oomb_trainer::cpu_trainer t(setup);
    t.init(o.seed);
    oomb_trainer::step_settings s;
    s.lr = 1e-3;
    s.clip = 1.0;
    s.dump_grads = tmp / file;
    const auto m = t.step(batch, s, {});
    const auto f = oomb_trainer::safetensors_file::open(s.dump_grads);
    std::vector<double> g;
    const oomb_trainer::param_layout layout(setup.config);
    for (const auto& e : layout.entries()) {
      const auto x = f.read<double>(e.name, e.shape);
      g.insert(g.end(), x.begin(), x.end());
    }
    return std::make_pair(m, g);
  };
  const auto [ma, ga] = gradient({a}, "a.safetensors");
  const auto [mb, gb] = gradient({b}, "b.safetensors");
  const auto [mab, gab] = gradient({a, b}, "ab.safetensors");
  std::vector<double> mean(ga.size());
  for (std::size_t i = 0; i < ga.size(); ++i) mean[i] = 0.5 * (ga[i] + gb[i]);
  const double err = trainer_test::rel_err(gab, mean), apart = trainer_test::rel_err(ga, gb);
  MESSAGE("--batch 2: loss " << mab.loss << " (mean of " << ma.loss << " and " << mb.loss << "), gradient rel err "
                             << err << " from the mean (the two gradients are " << apart << " apart)");
  CHECK(mab.loss == doctest::Approx(0.5 * (ma.loss + mb.loss)).epsilon(1e-12));
  CHECK(err < 1e-5);  // float accumulation of the second sequence's chunks onto the first's
  CHECK(apart > 0.1);  // a gradient of one sequence alone would fail
  double norm = 0;
  for (double x : mean) norm += x * x;
  CHECK(mab.grad_norm == doctest::Approx(std::sqrt(norm)).epsilon(1e-5));

  // Through training_run: --batch 2 takes two sequences per step.
  auto ob = o;
  ob.batch = 2;
  ob.steps = 2;
  ob.warmup = 0;
  oomb_trainer::training_run run(ob);
  const auto r = run.step();
  CHECK(r.tokens == 2 * ob.seq_len);
  CHECK(r.loss == doctest::Approx(mab.loss).epsilon(1e-12));
  CHECK(run.banner().find("2 sequences of 128 tokens per step") != std::string::npos);
}

TEST_CASE("training: a NaN weight stops the run at its step, before the update, the last checkpoint intact") {
  temp_dir tmp("nan");
  auto o = base_options(tmp / "unused");
  o.steps = 3;
  o.warmup = 0;
  training_test::check_non_finite_stop(o, {}, tmp);
}

TEST_CASE("training: a checkpoint of another shape is refused before anything is allocated") {
  temp_dir tmp("shape");
  auto o = base_options(tmp / "unused");
  o.steps = 3;
  o.warmup = 0;
  training_test::check_mismatched_checkpoint(o, {}, tmp);
}

TEST_CASE("training: the command line names what is wrong") {
  using oomb_trainer::parse_train_options;
  const std::vector<std::string> ok{"--config", "c.json", "--synthetic", "kv-recall", "--seq-len", "64", "--chunk", "16",
                                    "--steps", "3", "--out", "o"};
  const auto o = parse_train_options(ok);
  CHECK(o.seq_len == 64);
  CHECK(o.page == 16);
  CHECK(o.batch == 1);
  CHECK(parse_train_options(with_batch(ok, "4")).batch == 4);
  CHECK_THROWS_WITH_AS(parse_train_options(with_batch(ok, "0")), doctest::Contains("--batch must be in [1, "),
                       oomb::invalid_argument);
  CHECK(parse_train_options({"--help"}).help);
  auto with = [&](std::vector<std::string> extra) {
    auto a = ok;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--bogus"})), doctest::Contains("unknown option '--bogus'"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--chunk", "x"})), doctest::Contains("--chunk needs an integer"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--data", "t.bin"})), doctest::Contains("exactly one of --data"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options({"--config", "c.json"}), doctest::Contains("--synthetic"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--steps"})), doctest::Contains("--steps needs a value"),
                       oomb::invalid_argument);
  const auto off = parse_train_options(with({"--offload"}));
  CHECK(off.near_pages == 256);  // two windows of at least 128 pages
  // The benchmark's default is the same function: sparse windows hold the chunk's own pages and
  // 16 (B + S + L) selected ones (Qwen2.5-0.5B's shape: 128 own pages, B 64, S 1, L 1).
  oomb_trainer::chunk_options sparse;
  sparse.chunk = 16384;
  sparse.page = 128;
  CHECK(oomb_trainer::default_near_pages(sparse) == 512);
  sparse.sparse = true;
  sparse.budget = 64;
  CHECK(oomb_trainer::default_near_pages(sparse) == 2 * (128 + 16 * 66));
  CHECK_THROWS_WITH_AS(parse_train_options(with({"--full-backprop", "--offload"})), doctest::Contains("--full-backprop"),
                       oomb::invalid_argument);
}
