// HF model folders (io/hf_export.hpp, checkpoint_layout::hf): shards cut where the limit says as
// huggingface_hub cuts them, the index, BF16 rounded to nearest even, config.json's dtype, the
// tokenizer files copied, ordinary permissions; through oomb-train's run: --save-format hf resumes
// bit for bit from float32 weights and refuses bfloat16 ones, --export at the end of the run.
// (tests/trainer/test_hf_export.py loads these folders with transformers.)
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "io_test_util.hpp"
#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/io/hf_export.hpp"
#include "trainer/optim/adamw.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using io_test::fake_model;
using io_test::temp_dir;

namespace {

namespace fs = std::filesystem;

model_config tiny_config() {
  return parse_model_config(nlohmann::json::parse(R"({"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 8,
      "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "vocab_size": 10, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": false})"),
                            "tiny config");
}


nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(io_test::read_bytes(path)); }

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

/// Sets the umask for a scope (files are created on this thread only).
struct umask_scope {
  mode_t old;
  explicit umask_scope(mode_t m) : old(::umask(m)) {}
  ~umask_scope() { ::umask(old); }
};

std::uint16_t bf16_bits_of(float v) {
  temp_dir dir;
  std::vector<float> x{v};
  std::vector<named_tensor<float>> w{{"x", {1}, x.data()}};
  write_hf_weights(dir.path(), w, dtype::bf16, hf_default_max_shard_bytes);
  const auto f = safetensors_file::open(dir / "model.safetensors");
  REQUIRE(f.info("x").type == dtype::bf16);
  std::uint16_t bits = 0;
  f.read_raw("x", &bits);
  return bits;
}

std::uint16_t bf16_bits_of(double v) {
  temp_dir dir;
  std::vector<double> x{v};
  std::vector<named_tensor<double>> w{{"x", {1}, x.data()}};
  write_hf_weights(dir.path(), w, dtype::bf16, hf_default_max_shard_bytes);
  std::uint16_t bits = 0;
  safetensors_file::open(dir / "model.safetensors").read_raw("x", &bits);
  return bits;
}

const std::string fixture = std::string(OOMB_TRAINER_FIXTURES) + "/hf_tiny";

/// Two steps' worth of a run on the hf_tiny fixture (its config, weights and tokens), into `out`.
train_options fixture_run(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--config", fixture + "/config.json", "--init", fixture, "--data", fixture + "/tokens.bin",
                             "--seq-len", "20", "--chunk", "16", "--steps", "4", "--lr", "1e-2", "--out", out, "--quiet"};
  a.insert(a.end(), extra.begin(), extra.end());
  return parse_train_options(a);
}

std::vector<double> logged_losses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

}  // namespace

TEST_CASE("hf shards: plan_hf_shards cuts where the limit says, as huggingface_hub's split does") {
  // Fill until the next tensor would pass the limit; a shard may reach the limit exactly.
  auto p = plan_hf_shards({4, 4, 4, 4, 4}, 8);
  REQUIRE(p.shards.size() == 3);
  CHECK(p.shards[0].tensors == std::vector<std::size_t>{0, 1});
  CHECK(p.shards[1].tensors == std::vector<std::size_t>{2, 3});
  CHECK(p.shards[2].tensors == std::vector<std::size_t>{4});
  CHECK(p.shards[0].bytes == 8);
  CHECK(p.total_size == 20);
  CHECK(p.sharded());
  CHECK(p.shards[0].file == "model-00001-of-00003.safetensors");
  CHECK(p.shards[2].file == "model-00003-of-00003.safetensors");
  // A tensor larger than the limit gets a shard of its own, numbered before the shard being filled.
  // (These plans are huggingface_hub 1.33's split_state_dict_into_shards_factory's, run on the same sizes.)
  p = plan_hf_shards({3, 20, 4, 2}, 8);
  REQUIRE(p.shards.size() == 3);
  CHECK(p.shards[0].tensors == std::vector<std::size_t>{1});
  CHECK(p.shards[1].tensors == std::vector<std::size_t>{0, 2});
  CHECK(p.shards[2].tensors == std::vector<std::size_t>{3});
  CHECK(p.total_size == 29);
  p = plan_hf_shards({3, 20, 4, 2}, 9);
  REQUIRE(p.shards.size() == 2);
  CHECK(p.shards[1].tensors == std::vector<std::size_t>{0, 2, 3});
  // Everything in one shard: model.safetensors, no index.
  p = plan_hf_shards({4, 4}, 8);
  REQUIRE(p.shards.size() == 1);
  CHECK(p.shards[0].file == "model.safetensors");
  CHECK_FALSE(p.sharded());
  CHECK(plan_hf_shards({1}, hf_default_max_shard_bytes).shards.size() == 1);
  CHECK(hf_default_max_shard_bytes == 50'000'000'000ull);  // save_pretrained's "50GB" in transformers 5.17
}

TEST_CASE("hf shards: --save-shard-size takes HF's decimal units and the binary ones") {
  CHECK(parse_shard_size("5GB") == 5'000'000'000ull);
  CHECK(parse_shard_size("50GB") == hf_default_max_shard_bytes);
  CHECK(parse_shard_size("500MB") == 500'000'000ull);
  CHECK(parse_shard_size("2kb") == 2000);
  CHECK(parse_shard_size("4GiB") == (4ull << 30));
  CHECK(parse_shard_size("4G") == (4ull << 30));
  CHECK(parse_shard_size("1000") == 1000);
  for (const char* bad : {"", "GB", "5 GB", "5XB", "-1", "0", "1.5GB"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_shard_size(bad), oomb::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(parse_shard_size("99999999999TB"), doctest::Contains("too large"), oomb::invalid_argument);
}

TEST_CASE("hf checkpoint: a tiny shard limit gives several shards; the index names every tensor once, total_size adds up") {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<float> m(1);
  adamw<float> opt(m.params);
  trainer_state st;
  st.step = 5;
  checkpoint_options o;
  o.layout = checkpoint_layout::hf;
  o.max_shard_bytes = 160;  // BF16: the 80-element tensors are 160 bytes, 64 -> 128, 8 -> 16
  std::vector<std::string> written;
  o.after_file = [&](const std::string& f) { written.push_back(f); };
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), st, o);

  const std::vector<std::string> shards = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                           "model-00003-of-00003.safetensors"};
  std::vector<std::string> expected = {"config.json"};
  expected.insert(expected.end(), shards.begin(), shards.end());
  for (const char* f : {"model.safetensors.index.json", "optimizer.safetensors", "trainer_state.json"}) expected.push_back(f);
  CHECK(written == expected);
  std::sort(expected.begin(), expected.end());
  CHECK(temp_dir::list(dir) == expected);

  const nlohmann::json index = read_json(dir + "/model.safetensors.index.json");
  CHECK(index["metadata"]["total_size"] == (80 + 64 + 8 + 8 + 80) * 2);
  CHECK(index["metadata"]["total_parameters"] == 80 + 64 + 8 + 8 + 80);
  const auto& map = index["weight_map"];
  CHECK(map.size() == m.params.size());
  // Each shard holds exactly the tensors the index gives it, BF16, within the limit, format pt.
  std::set<std::string> seen;
  std::uint64_t bytes = 0;
  for (const auto& s : shards) {
    const auto f = safetensors_file::open(dir + "/" + s);
    CHECK(f.metadata().at("format") == "pt");
    std::uint64_t shard_bytes = 0;
    for (const auto& t : f.tensors()) {
      CAPTURE(t.name);
      CHECK(seen.insert(t.name).second);  // in one shard only
      CHECK(map.at(t.name) == s);
      CHECK(t.type == dtype::bf16);
      shard_bytes += t.end - t.begin;
    }
    CHECK(shard_bytes <= o.max_shard_bytes);
    bytes += shard_bytes;
  }
  CHECK(seen.size() == m.params.size());
  CHECK(bytes == index["metadata"]["total_size"].get<std::uint64_t>());
  // embed (160, the limit exactly) | q_proj.weight (128) + bias (16) + norm (16) = 160 | lm_head (160).
  CHECK(map["model.embed_tokens.weight"] == shards[0]);
  CHECK(map["model.layers.0.self_attn.q_proj.weight"] == shards[1]);
  CHECK(map["model.norm.weight"] == shards[1]);
  CHECK(map["lm_head.weight"] == shards[2]);

  // config.json says what the weights are; the optimizer state stays F32.
  const nlohmann::json cfg = read_json(dir + "/config.json");
  CHECK(cfg["dtype"] == "bfloat16");
  if (cfg.contains("torch_dtype")) CHECK(cfg["torch_dtype"] == "bfloat16");
  CHECK(parse_model_config(cfg, "config.json").hidden_size == 8);
  CHECK(safetensors_file::open(dir + "/optimizer.safetensors").info("lm_head.weight.exp_avg").type == dtype::f32);

  // load_checkpoint reads the shards (the weights rounded once), the moments and the state exactly.
  fake_model<float> r(2);
  adamw<float> ro(r.params);
  CHECK(load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()).step == 5);
  for (std::size_t i = 0; i < r.storage.size(); ++i) CHECK(r.storage[i] == static_cast<float>(oomb::bf16(m.storage[i])));
  // ...and refuses shards that lack a tensor or hold one too many.
  auto extra = r.params;
  std::vector<float> more(8, 1.0f);
  extra.push_back({"model.layers.0.input_layernorm.weight", {8}, more.data()});
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), extra, ro.state_tensors()); },
               {"model.safetensors.index.json", "'model.layers.0.input_layernorm.weight' is missing"});
  auto fewer = r.params;
  fewer.pop_back();
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), fewer, std::vector<named_tensor<float>>{}); },
               {shards[2], "'lm_head.weight' is not a tensor of this model"});
}

TEST_CASE("hf checkpoint: a model that fits one shard is one model.safetensors; F32 weights load bit for bit") {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<float> m(3);
  adamw<float> opt(m.params);
  trainer_state st;
  st.step = 2;
  checkpoint_options o;
  o.layout = checkpoint_layout::hf;
  o.tensor_dtype = dtype::f32;
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), st, o);
  CHECK(temp_dir::list(dir) ==
        std::vector<std::string>{"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"});
  CHECK(read_json(dir + "/config.json")["dtype"] == "float32");
  CHECK(safetensors_file::open(dir + "/model.safetensors").metadata().at("format") == "pt");
  fake_model<float> r(4);
  adamw<float> ro(r.params);
  load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors());
  CHECK(std::memcmp(r.storage.data(), m.storage.data(), m.storage.size() * sizeof(float)) == 0);
  check_exact_weights<float>(dir, "--resume x");  // F32 masters: exact
}

TEST_CASE("hf checkpoint: streamed tensors (a GPU's) write the same shards, each copied out once") {
  temp_dir parent;
  fake_model<float> m(8);
  std::vector<streamed_tensor<float>> streamed;
  std::vector<int> copies(m.params.size(), 0);
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    streamed.push_back({p.name, p.shape,
                        [&, i](float* host) {
                          ++copies[i];
                          std::memcpy(host, m.params[i].data, m.params[i].numel() * sizeof(float));
                        },
                        [](const float*) {}});
  }
  checkpoint_options o;
  o.layout = checkpoint_layout::hf;
  o.max_shard_bytes = 160;
  o.model_only = true;
  save_checkpoint(parent / "streamed", tiny_config(), streamed, std::vector<streamed_tensor<float>>{}, trainer_state{}, o);
  save_checkpoint(parent / "in_place", tiny_config(), m.params, std::vector<named_tensor<float>>{}, trainer_state{}, o);
  CHECK(copies == std::vector<int>(m.params.size(), 1));
  const auto files = temp_dir::list(parent / "in_place");
  REQUIRE(temp_dir::list(parent / "streamed") == files);
  for (const auto& f : files) CHECK(io_test::read_bytes(parent / ("streamed/" + f)) == io_test::read_bytes(parent / ("in_place/" + f)));
}

TEST_CASE("hf checkpoint: BF16 is rounded to nearest, ties to even, once (also from double)") {
  const float one = 1.0f;
  CHECK(bf16_bits_of(one) == 0x3f80);
  CHECK(bf16_bits_of(1.0f + 0x1p-8f) == 0x3f80);               // tie between 1 and 1 + 2^-7: even (down)
  CHECK(bf16_bits_of(1.0f + 3 * 0x1p-8f) == 0x3f82);           // tie between 1 + 2^-7 and 1 + 2^-6: even (up)
  CHECK(bf16_bits_of(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);    // past the tie: up
  CHECK(bf16_bits_of(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);    // short of it: down
  CHECK(bf16_bits_of(-(1.0f + 3 * 0x1p-8f)) == 0xbf82);        // sign kept, same rule
  CHECK(bf16_bits_of(std::numeric_limits<float>::max()) == 0x7f80);  // past bf16's largest: infinity
  CHECK(bf16_bits_of(0x1p-134f) == 0x0000);                    // half bf16's smallest subnormal: tie, even (zero)
  CHECK(bf16_bits_of(0x1.8p-133f) == 0x0002);                  // 1.5 x the smallest: tie, even (2 units)
  const std::uint16_t nan = bf16_bits_of(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);
  // From double: one rounding. 1 + 2^-8 + 2^-40 rounds up; through float it would be a tie, and down.
  CHECK(bf16_bits_of(1.0 + 0x1p-8 + 0x1p-40) == 0x3f81);
  CHECK(bf16_bits_of(1.0 + 0x1p-8) == 0x3f80);
}

TEST_CASE("hf checkpoint: tokenizer and generation files copied from the source; ordinary permissions") {
  temp_dir parent;
  const std::string src = parent / "init";
  fs::create_directory(src);
  const std::vector<std::string> companions = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                               "generation_config.json", "chat_template.jinja", "merges.txt", "vocab.json"};
  for (const auto& name : companions) {
    io_test::write_bytes(src + "/" + name, "{\"name\": \"" + name + "\"}");
    fs::permissions(src + "/" + name, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);  // 0444
  }
  io_test::write_bytes(parent / "blob", "model bytes");  // an HF cache links its snapshot's files to blobs
  fs::create_symlink(parent / "blob", src + "/tokenizer.model");
  io_test::write_bytes(src + "/README.md", "not copied");
  io_test::write_bytes(src + "/optimizer.pt", "not copied");

  umask_scope mask(027);
  fake_model<float> m(5);
  adamw<float> opt(m.params);
  checkpoint_options o;
  o.layout = checkpoint_layout::hf;
  o.companion_source = src;
  o.max_shard_bytes = 200;
  const std::string dir = parent / "ckpt";
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), trainer_state{}, o);
  for (const auto& name : companions) {
    CAPTURE(name);
    CHECK(io_test::read_bytes(dir + "/" + name) == io_test::read_bytes(src + "/" + name));
  }
  CHECK(io_test::read_bytes(dir + "/tokenizer.model") == "model bytes");
  CHECK_FALSE(fs::is_symlink(dir + "/tokenizer.model"));
  CHECK_FALSE(fs::exists(dir + "/README.md"));
  CHECK_FALSE(fs::exists(dir + "/optimizer.pt"));
  // Files as creat() makes them, the folder as mkdir does: 0666 / 0777 less the umask (027).
  CHECK(mode_of(dir) == 0750);
  for (const auto& name : temp_dir::list(dir)) {
    CAPTURE(name);
    CHECK(mode_of(dir + "/" + name) == 0640);
  }
  // The oomb layout copies them too (so a run resumed from it carries them on) with the same modes.
  checkpoint_options oo;
  oo.companion_source = src;
  save_checkpoint(parent / "oomb", tiny_config(), m.params, opt.state_tensors(), trainer_state{}, oo);
  CHECK(fs::exists(parent / "oomb/tokenizer.json"));
  CHECK(read_json(parent / "oomb/config.json")["dtype"] == "float32");
  for (const auto& name : temp_dir::list(parent / "oomb")) CHECK(mode_of(parent / "oomb/" + name) == 0640);
  CHECK(hf_companion_source(src + "/model.safetensors") == src);
  CHECK(hf_companion_source(src) == src);
}

TEST_CASE("hf export: model only; load_checkpoint sends it to --init; an export replaces only an export") {
  temp_dir parent;
  const std::string dir = parent / "export";
  fake_model<float> m(6);
  adamw<float> opt(m.params);
  checkpoint_options o;
  o.layout = checkpoint_layout::hf;
  o.model_only = true;
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), trainer_state{}, o);
  CHECK(temp_dir::list(dir) == std::vector<std::string>{"config.json", "model.safetensors"});
  fake_model<float> r(7);
  adamw<float> ro(r.params);
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
               {"trainer_state.json", "missing", "--init takes its weights"});
  load_weights(dir, r.params);  // what --init does
  for (std::size_t i = 0; i < r.storage.size(); ++i) CHECK(r.storage[i] == static_cast<float>(oomb::bf16(m.storage[i])));
  expect_error<oomb::invalid_argument>([&] { check_exact_weights<float>(dir, "--resume " + dir); },
                                       {"--resume", "its weights are BF16", "--save-dtype float32", "--init"});

  check_hf_export_target(dir);              // an earlier export: may be replaced
  check_hf_export_target(parent / "none");  // new
  io_test::write_bytes(dir + "/notes.txt", "mine");
  expect_error<oomb::invalid_argument>([&] { check_hf_export_target(dir); }, {"--export", "notes.txt", "not a file of an HF model folder"});
  io_test::write_bytes(parent / "file", "x");
  expect_error<oomb::invalid_argument>([&] { check_hf_export_target(parent / "file"); }, {"exists and is not a folder"});
  CHECK(is_hf_model_file("model-00003-of-00012.safetensors"));
  CHECK_FALSE(is_hf_model_file("model-0003-of-00012.safetensors"));
  CHECK_FALSE(is_hf_model_file("model-0000a-of-00012.safetensors"));
  CHECK_FALSE(is_hf_model_file("optimizer.safetensors"));
  CHECK_FALSE(is_hf_model_file("trainer_state.json"));
}

TEST_CASE("hf flags: --save-format, --save-dtype, --save-shard-size, --export parse and are checked") {
  auto o = fixture_run("o", {"--save-format", "hf"});
  CHECK(o.save_format == checkpoint_layout::hf);
  CHECK(o.hf_dtype() == dtype::bf16);
  CHECK(o.hf_shard_bytes() == hf_default_max_shard_bytes);
  o = fixture_run("o", {"--save-format", "hf", "--save-dtype", "float32", "--save-shard-size", "2GB"});
  CHECK(o.hf_dtype() == dtype::f32);
  CHECK(o.hf_shard_bytes() == 2'000'000'000ull);
  CHECK(fixture_run("o", {"--export", "e", "--save-dtype", "float32"}).export_dir == "e");
  CHECK(fixture_run("o").save_format == checkpoint_layout::oomb);
  CHECK_THROWS_WITH_AS(fixture_run("o", {"--save-format", "safetensors"}), doctest::Contains("unknown format 'safetensors' (known: oomb, hf)"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(fixture_run("o", {"--save-format", "hf", "--save-dtype", "float16"}),
                       doctest::Contains("unknown dtype 'float16' (known: bfloat16, float32)"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(fixture_run("o", {"--save-dtype", "bfloat16"}), doctest::Contains("--save-dtype sets the weights' dtype of HF folders"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(fixture_run("o", {"--save-shard-size", "1GB"}), doctest::Contains("--save-shard-size shards HF folders"),
                       oomb::invalid_argument);
  CHECK(std::string(help_text()).find("--save-format F") != std::string::npos);
  CHECK(std::string(help_text()).find("--export DIR") != std::string::npos);
}

TEST_CASE("hf run: --save-format hf --save-dtype float32 resumes from a sharded checkpoint bit for bit") {
  temp_dir tmp;
  // The uninterrupted run.
  training_run a(fixture_run(tmp / "a", {"--save-format", "hf", "--save-dtype", "float32"}));
  a.run();
  // The same run stopped after 2 steps, its checkpoints in shards of at most 8 KB; then resumed.
  const std::vector<std::string> hf = {"--save-format", "hf", "--save-dtype", "float32", "--save-shard-size", "8KB"};
  auto ob = fixture_run(tmp / "b", hf);
  ob.stop_after = 2;
  training_run(ob).run();
  const std::string ckpt = tmp / "b/checkpoint-2";
  REQUIRE(fs::exists(ckpt + "/model.safetensors.index.json"));
  CHECK(checkpoint_reader(ckpt).shard_count() > 2);
  CHECK(read_json(ckpt + "/config.json")["dtype"] == "float32");
  auto oc = fixture_run(tmp / "b", hf);
  oc.resume = tmp / "b/checkpoint";
  training_run c(oc);
  CHECK(c.steps_taken() == 2);
  c.run();
  const auto wa = a.weights(), wc = c.weights();
  REQUIRE(wa.size() == wc.size());
  CHECK(std::memcmp(wa.data(), wc.data(), wa.size() * sizeof(float)) == 0);
  const auto la = logged_losses(tmp / "a/log.jsonl"), lc = logged_losses(tmp / "b/log.jsonl");
  REQUIRE(la.size() == 4);
  CHECK(la == lc);  // exactly
  // The final checkpoint is the same weights whatever the sharding.
  const checkpoint_reader ra(tmp / "a/checkpoint-4"), rc(tmp / "b/checkpoint-4");
  CHECK(ra.names() == rc.names());
  for (const auto& name : ra.names()) {
    CAPTURE(name);
    const auto& shape = ra.info(name).shape;
    CHECK(ra.read<float>(name, shape) == rc.read<float>(name, shape));
  }
}

TEST_CASE("hf run: a bfloat16 checkpoint is not resumed (the masters were rounded); --export waits for the last step") {
  temp_dir tmp;
  auto o = fixture_run(tmp / "run", {"--save-format", "hf", "--export", tmp / "export"});
  o.stop_after = 2;
  std::vector<std::string> lines;
  training_run(o, [&](const std::string& l) { lines.push_back(l); }).run();
  CHECK(lines.front().find("checkpoints: HF model folders, bfloat16 weights (not resumable") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "export"));  // stopped before --steps: no export yet
  CHECK(read_json(tmp / "run/checkpoint-2/config.json")["dtype"] == "bfloat16");

  auto r = fixture_run(tmp / "run", {"--save-format", "hf", "--export", tmp / "export"});
  r.resume = tmp / "run/checkpoint-2";
  expect_error<oomb::invalid_argument>([&] { training_run{r}; },
                                       {"--resume", "checkpoint-2", "its weights are BF16", "the master weights rounded",
                                        "--save-dtype float32", "--init"});
  CHECK(logged_losses(tmp / "run/log.jsonl").size() == 2);  // refused before anything was written

  // An oomb run to the end exports a bfloat16 HF folder: weights, config, the fixture's files only.
  auto e = fixture_run(tmp / "run2", {"--export", tmp / "export"});
  lines.clear();
  training_run(e, [&](const std::string& l) { lines.push_back(l); }).run();
  CHECK(lines.back().find("export: " + (tmp / "export") + " (HF model folder, bfloat16 weights, step 4)") == 0);
  CHECK(fs::exists(tmp / "export/model.safetensors"));  // 15K parameters: one shard
  CHECK_FALSE(fs::exists(tmp / "export/optimizer.safetensors"));
  CHECK_FALSE(fs::exists(tmp / "export/trainer_state.json"));
  for (const auto& name : temp_dir::list(tmp / "export")) CHECK(is_hf_model_file(name));
  CHECK(read_json(tmp / "export/config.json")["dtype"] == "bfloat16");
  CHECK(fs::exists(tmp / "run2/checkpoint-4/optimizer.safetensors"));  // the checkpoints stay oomb, F32
  CHECK(read_json(tmp / "run2/checkpoint-4/config.json")["dtype"] == "float32");
  // The export is the final checkpoint's F32 weights rounded to BF16 once.
  const checkpoint_reader x(tmp / "export"), ck(tmp / "run2/checkpoint-4");
  for (const auto& name : ck.names()) {
    CAPTURE(name);
    const auto& shape = ck.info(name).shape;
    CHECK(x.info(name).type == dtype::bf16);
    const auto f = ck.read<float>(name, shape), b = x.read<float>(name, shape);
    for (std::size_t i = 0; i < f.size(); ++i) CHECK(b[i] == static_cast<float>(oomb::bf16(f[i])));
  }
  // An --export folder holding something else is refused before the run writes anything.
  io_test::write_bytes(tmp / "export/mine.txt", "x");
  expect_error<oomb::invalid_argument>([&] { training_run{fixture_run(tmp / "run3", {"--export", tmp / "export"})}; },
                                       {"--export", "mine.txt"});
  CHECK_FALSE(fs::exists(tmp / "run3"));
}
