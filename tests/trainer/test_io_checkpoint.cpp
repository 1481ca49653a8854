// Checkpoints: bit-exact round trips (float and double), atomic replacement, crashes and failures
// mid-write leaving the previous checkpoint intact, validation on load, load_weights and
// dump_gradients.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <sstream>

#include "io_test_util.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/optim/adamw.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using io_test::fake_model;
using io_test::temp_dir;

namespace {

model_config tiny_config() {
  model_config c;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  c.rope.theta = 1e4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.max_position_embeddings = 64;
  return c;
}


template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<std::string> leftovers(const temp_dir& parent) { return parent.entries(); }

}  // namespace

TEST_CASE_TEMPLATE("checkpoint round trip is bit-exact: weights, AdamW moments, step, data position, RNG", T, float,
                   double) {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<T> m(1);
  adamw_options ao;
  ao.weight_decay = 0.1;
  adamw<T> opt(m.params, ao);
  std::vector<std::vector<T>> grads;
  std::vector<named_tensor<T>> g;
  for (const auto& p : m.params) {
    grads.push_back(io_test::random_vector<T>(static_cast<std::size_t>(p.numel()), 50 + grads.size()));
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) g.push_back({m.params[i].name, m.params[i].shape, grads[i].data()});
  opt.step(1e-2, m.params, g);
  opt.step(1e-2, m.params, g);

  std::mt19937_64 rng(77);
  rng.discard(1000);
  trainer_state st;
  st.step = opt.steps_taken();
  st.data_position = (std::uint64_t{1} << 40) + 12345;  // beyond 32 bits and double's comfort
  std::ostringstream rs;
  rs << rng;
  st.rng_state = rs.str();
  st.extra["seed"] = 77;
  st.extra["lr"] = 1e-2;
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), st);
  CHECK(leftovers(parent) == std::vector<std::string>{"ckpt"});
  CHECK(temp_dir::list(dir) ==
        std::vector<std::string>{"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"});
  CHECK(read_checkpoint_config(dir) == tiny_config());
  const dtype native = std::is_same_v<T, double> ? dtype::f64 : dtype::f32;
  CHECK(safetensors_file::open(dir + "/model.safetensors").info("lm_head.weight").type == native);
  CHECK(safetensors_file::open(dir + "/model.safetensors").metadata().at("format") == "pt");

  fake_model<T> r(999);  // different contents, same layout
  adamw<T> ropt(r.params, ao);
  const trainer_state back = load_checkpoint(dir, tiny_config(), r.params, ropt.state_tensors());
  CHECK(same_bits(r.storage, m.storage));
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    CHECK(same_bits(ropt.exp_avg(i), opt.exp_avg(i)));
    CHECK(same_bits(ropt.exp_avg_sq(i), opt.exp_avg_sq(i)));
  }
  CHECK(back.step == 2);
  CHECK(back.data_position == st.data_position);
  CHECK(back.extra == st.extra);
  std::mt19937_64 rng2;
  std::istringstream(back.rng_state) >> rng2;
  CHECK(rng2() == rng());

  // Resume: one more step from the loaded state equals one more step of the original, bit for bit.
  ropt.set_steps_taken(back.step);
  opt.step(5e-3, m.params, g);
  std::vector<named_tensor<T>> rg;
  for (std::size_t i = 0; i < r.params.size(); ++i) rg.push_back({r.params[i].name, r.params[i].shape, grads[i].data()});
  ropt.step(5e-3, r.params, rg);
  CHECK(same_bits(r.storage, m.storage));

  // Weights alone (no optimizer tensors) load too.
  fake_model<T> w(5);
  CHECK(load_checkpoint(dir, tiny_config(), w.params, std::vector<named_tensor<T>>{}).step == 2);
}

TEST_CASE_TEMPLATE("streamed tensors: the same files as in-place ones, each copied out and in exactly once", T, float,
                   double) {
  temp_dir parent;
  fake_model<T> m(3);
  std::vector<named_tensor<T>> moments;
  std::vector<std::vector<T>> moment_storage;
  for (const auto& p : m.params) {
    moment_storage.push_back(io_test::random_vector<T>(static_cast<std::size_t>(p.numel()), 200 + moment_storage.size()));
    moments.push_back({p.name + ".exp_avg", p.shape, moment_storage.back().data()});
  }
  // Storage the checkpoint code cannot address: reached only through copy_out / copy_in, which count.
  std::vector<int> outs(m.params.size() + moments.size()), ins(outs.size());
  auto stream = [&](const std::vector<named_tensor<T>>& list, std::size_t first) {
    std::vector<streamed_tensor<T>> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const named_tensor<T> t = list[i];
      const std::size_t k = first + i;
      out.push_back({t.name, t.shape, [t, k, &outs](T* host) { ++outs[k]; std::memcpy(host, t.data, t.numel() * sizeof(T)); },
                     [t, k, &ins](const T* host) { ++ins[k]; std::memcpy(t.data, host, t.numel() * sizeof(T)); }});
    }
    return out;
  };
  trainer_state st;
  st.step = 7;
  save_checkpoint(parent / "in-place", tiny_config(), m.params, moments, st);
  save_checkpoint(parent / "streamed", tiny_config(), stream(m.params, 0), stream(moments, m.params.size()), st);
  CHECK(outs == std::vector<int>(outs.size(), 1));
  CHECK(ins == std::vector<int>(ins.size(), 0));
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    CAPTURE(file);
    CHECK(io_test::read_bytes(parent / "in-place" + file) == io_test::read_bytes(parent / "streamed" + file));
  }

  const std::vector<T> saved_params = m.storage;
  const std::vector<std::vector<T>> saved_moments = moment_storage;
  m.storage.assign(m.storage.size(), T(-1));
  for (auto& v : moment_storage) v.assign(v.size(), T(-1));
  CHECK(load_checkpoint(parent / "streamed", tiny_config(), stream(m.params, 0), stream(moments, m.params.size())).step == 7);
  CHECK(ins == std::vector<int>(ins.size(), 1));
  CHECK(same_bits(m.storage, saved_params));
  for (std::size_t i = 0; i < moment_storage.size(); ++i) CHECK(same_bits(moment_storage[i], saved_moments[i]));

  std::vector<streamed_tensor<T>> no_copy_out = stream(m.params, 0);
  no_copy_out[1].copy_out = nullptr;
  expect_error<oomb::invalid_argument>([&] { save_checkpoint(parent / "bad", tiny_config(), no_copy_out, {}, st); },
                                       {"model.layers.0.self_attn.q_proj.weight", "has no data"});
}

TEST_CASE("checkpoint in BF16 on request; overwriting replaces the whole folder") {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<float> m(3);
  checkpoint_options o;
  o.tensor_dtype = dtype::bf16;
  trainer_state st;
  st.step = 1;
  save_checkpoint(dir, tiny_config(), m.params, {}, st, o);
  CHECK(safetensors_file::open(dir + "/model.safetensors").info("model.norm.weight").type == dtype::bf16);
  CHECK(temp_dir::list(dir) == std::vector<std::string>{"config.json", "model.safetensors", "trainer_state.json"});
  fake_model<float> r(4);
  load_checkpoint(dir, tiny_config(), r.params, std::vector<named_tensor<float>>{});
  for (std::size_t i = 0; i < r.storage.size(); ++i) CHECK(r.storage[i] == static_cast<float>(oomb::bf16(m.storage[i])));

  // A second save with an optimizer replaces the folder: the new file appears, step changes.
  adamw<float> opt(m.params);
  st.step = 2;
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), st);
  CHECK(temp_dir::list(dir) ==
        std::vector<std::string>{"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"});
  CHECK(load_checkpoint(dir, tiny_config(), r.params, opt.state_tensors()).step == 2);
  CHECK(same_bits(r.storage, m.storage));
  CHECK(leftovers(parent) == std::vector<std::string>{"ckpt"});
}

TEST_CASE("an interrupted checkpoint write leaves the previous checkpoint intact") {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<double> old_model(10), new_model(11);
  adamw<double> opt(old_model.params);
  trainer_state st;
  st.step = 7;
  save_checkpoint(dir, tiny_config(), old_model.params, opt.state_tensors(), st);

  auto check_previous_intact = [&] {
    fake_model<double> r(12);
    adamw<double> ro(r.params);
    CHECK(load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()).step == 7);
    CHECK(same_bits(r.storage, old_model.storage));
  };

  SUBCASE("an exception after each file: nothing changes, no temporary left") {
    for (const char* stop_after : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
      CAPTURE(stop_after);
      checkpoint_options o;
      o.after_file = [&](const std::string& f) {
        if (f == stop_after) throw std::runtime_error("simulated failure after " + f);
      };
      trainer_state s2;
      s2.step = 8;
      CHECK_THROWS_WITH_AS(save_checkpoint(dir, tiny_config(), new_model.params, opt.state_tensors(), s2, o),
                           doctest::Contains("simulated failure"), std::runtime_error);
      check_previous_intact();
      CHECK(leftovers(parent) == std::vector<std::string>{"ckpt"});
    }
  }

  SUBCASE("a process killed mid-checkpoint: the previous one still loads; only a .tmp- folder remains") {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // child: dies without unwinding half way through, as a crash would
      checkpoint_options o;
      o.after_file = [](const std::string& f) {
        if (f == "optimizer.safetensors") ::_exit(42);
      };
      trainer_state s2;
      s2.step = 8;
      try {
        save_checkpoint(dir, tiny_config(), new_model.params, opt.state_tensors(), s2, o);
      } catch (...) {
      }
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 42);
    check_previous_intact();
    const auto left = leftovers(parent);
    REQUIRE(left.size() == 2);
    CHECK(left[0] == "ckpt");
    CHECK(left[1].rfind("ckpt.tmp-", 0) == 0);
    // The next save succeeds beside the crash's leftover.
    trainer_state s3;
    s3.step = 9;
    save_checkpoint(dir, tiny_config(), new_model.params, opt.state_tensors(), s3);
    fake_model<double> r(13);
    CHECK(load_checkpoint(dir, tiny_config(), r.params, std::vector<named_tensor<double>>{}).step == 9);
    CHECK(same_bits(r.storage, new_model.storage));
  }

  SUBCASE("the rename cannot happen (the target is a file): error, nothing replaced, no temporary") {
    const std::string file_target = parent / "not_a_folder";
    io_test::write_bytes(file_target, "keep me");
    expect_error<oomb::error>([&] { save_checkpoint(file_target, tiny_config(), new_model.params, opt.state_tensors(), st); },
                              {"not_a_folder", "not a folder"});
    CHECK(io_test::read_bytes(file_target) == "keep me");
    CHECK(leftovers(parent) == std::vector<std::string>{"ckpt", "not_a_folder"});
    check_previous_intact();
  }

  SUBCASE("the parent folder does not exist: error, nothing created") {
    expect_error<oomb::error>([&] { save_checkpoint(parent / "a/b/ckpt", tiny_config(), new_model.params, opt.state_tensors(), st); },
                              {"a/b/ckpt"});
    CHECK(leftovers(parent) == std::vector<std::string>{"ckpt"});
  }

  SUBCASE("a read-only parent folder (when not root, who may write anyway)") {
    if (::geteuid() != 0) {
      std::filesystem::permissions(parent.path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
      expect_error<oomb::error>([&] { save_checkpoint(dir, tiny_config(), new_model.params, opt.state_tensors(), st); },
                                {"ckpt"});
      std::filesystem::permissions(parent.path(), std::filesystem::perms::owner_all);
    }
    check_previous_intact();
  }
}

TEST_CASE("load_checkpoint validates before reading: config, tensors, shapes, state, files") {
  temp_dir parent;
  const std::string dir = parent / "ckpt";
  fake_model<double> m(20);
  adamw<double> opt(m.params);
  trainer_state st;
  st.step = 3;
  save_checkpoint(dir, tiny_config(), m.params, opt.state_tensors(), st);
  fake_model<double> r(21);
  const auto untouched = r.storage;
  adamw<double> ro(r.params);

  auto other = tiny_config();
  other.rope.theta = 1e6;
  expect_error([&] { (void)load_checkpoint(dir, other, r.params, ro.state_tensors()); },
               {"config.json", "'rope_theta' differs"});

  auto extra = r.params;
  std::vector<double> more(8, 1.0);
  extra.push_back({"model.layers.0.input_layernorm.weight", {8}, more.data()});
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), extra, std::vector<named_tensor<double>>{}); },
               {"model.safetensors", "tensor 'model.layers.0.input_layernorm.weight' is missing"});

  auto fewer = r.params;
  fewer.pop_back();
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), fewer, std::vector<named_tensor<double>>{}); },
               {"model.safetensors", "tensor 'lm_head.weight' is not a tensor of this model"});

  auto reshaped = r.params;
  reshaped[1].shape = {4, 16};
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), reshaped, std::vector<named_tensor<double>>{}); },
               {"model.safetensors", "tensor 'model.layers.0.self_attn.q_proj.weight'", "[8, 8], expected [4, 16]"});
  CHECK(same_bits(r.storage, untouched));  // nothing read before validation passed

  io_test::write_bytes(dir + "/trainer_state.json", R"({"format":"oomb-trainer-state","version":1,"step":-1,"data_position":0,"rng_state":""})");
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
               {"trainer_state.json", "'step'"});
  io_test::write_bytes(dir + "/trainer_state.json", R"({"format":"oomb-trainer-state","version":1,"step":1,"rng_state":""})");
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
               {"trainer_state.json", "'data_position' is missing"});
  io_test::write_bytes(dir + "/trainer_state.json", R"({"format":"other","version":1})");
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
               {"trainer_state.json", "'format'"});
  std::filesystem::remove(dir + "/trainer_state.json");
  expect_error([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
               {"trainer_state.json", "missing"});
  save_checkpoint(dir, tiny_config(), m.params, {}, st);  // no optimizer file
  expect_error<oomb::error>([&] { (void)load_checkpoint(dir, tiny_config(), r.params, ro.state_tensors()); },
                            {"optimizer.safetensors"});
  expect_error([&] { (void)load_checkpoint(parent / "nothing", tiny_config(), r.params, ro.state_tensors()); },
               {"nothing", "not a checkpoint folder"});
  CHECK(same_bits(r.storage, untouched));
}

TEST_CASE("load_weights reads an HF folder (sharded) into the model; dump_gradients writes F32") {
  temp_dir dir;
  fake_model<float> m(30);
  safetensors_writer a, b;
  for (std::size_t i = 0; i < m.params.size(); ++i) (i % 2 ? a : b).add(m.params[i], dtype::bf16);
  a.write(dir / "model-00001-of-00002.safetensors");
  b.write(dir / "model-00002-of-00002.safetensors");
  nlohmann::json index;
  for (std::size_t i = 0; i < m.params.size(); ++i)
    index["weight_map"][m.params[i].name] = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  io_test::write_bytes(dir / "model.safetensors.index.json", index.dump());
  fake_model<double> r(31);
  load_weights(dir.path(), r.params);
  for (std::size_t i = 0; i < r.storage.size(); ++i)
    CHECK(r.storage[i] == static_cast<double>(static_cast<float>(oomb::bf16(m.storage[i]))));

  auto fewer = r.params;
  fewer.pop_back();  // a tied model has no lm_head.weight
  expect_error([&] { load_weights(dir.path(), fewer); }, {"tensor 'lm_head.weight' is not a parameter"});
  load_weights(dir.path(), fewer, /*allow_unused=*/true);

  std::vector<double> g(80);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1.0 / (1.0 + static_cast<double>(i));
  dump_gradients(dir / "grads.safetensors", std::vector<named_tensor<double>>{{"model.embed_tokens.weight", {10, 8}, g.data()}},
                 {{"step", "1"}});
  const auto f = safetensors_file::open(dir / "grads.safetensors");
  CHECK(f.info("model.embed_tokens.weight").type == dtype::f32);
  CHECK(f.metadata().at("step") == "1");
  const auto back = f.read<float>("model.embed_tokens.weight", {10, 8});
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(back[i] == static_cast<float>(g[i]));
}

TEST_CASE("folder replacement without RENAME_EXCHANGE (two renames) swaps in the new folder, leaves nothing") {
  temp_dir parent;
  std::filesystem::create_directory(parent / "ckpt");
  io_test::write_bytes(parent / "ckpt/a", "old");
  std::filesystem::create_directory(parent / "new");
  io_test::write_bytes(parent / "new/a", "new");
  io_test::write_bytes(parent / "new/b", "more");
  detail::replace_dir_by_two_renames(parent / "new", parent / "ckpt");
  CHECK(parent.entries() == std::vector<std::string>{"ckpt"});
  CHECK(temp_dir::list(parent / "ckpt") == std::vector<std::string>{"a", "b"});
  CHECK(io_test::read_bytes(parent / "ckpt/a") == "new");
  // A temporary that cannot be renamed (it does not exist): the previous folder is put back.
  expect_error<oomb::error>([&] { detail::replace_dir_by_two_renames(parent / "gone", parent / "ckpt"); },
                            {"cannot rename the temporary folder"});
  CHECK(parent.entries() == std::vector<std::string>{"ckpt"});
  CHECK(io_test::read_bytes(parent / "ckpt/a") == "new");
}
