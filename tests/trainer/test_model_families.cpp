// The model families and RoPE types: each fixture's config.json (as transformers 5.17 wrote it)
// parses into the family's tensors, RoPE frequencies equal the fixture generator's float64 ones,
// families refuse what they do not implement with the reason, and a config written back keeps its
// source file but for the fields that changed. (The gradients of every family and RoPE type
// against transformers: test_hf_fixture.cpp.)
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io_test_util.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/model/params.hpp"
#include "trainer/model/rope_frequencies.hpp"

using namespace oomb_trainer;
using io_test::expect_error;
using nlohmann::json;

namespace {

std::string fixture(const std::string& name) { return std::string(OOMB_TRAINER_FIXTURES) + "/" + name; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

}  // namespace

TEST_CASE("families: each fixture's config gives exactly the tensors transformers saved") {
  struct expect {
    const char* name;
    model_family family;
    bool qkv_bias, o_bias, mlp_bias, qk_norm;
    std::int32_t head_dim;
  };
  const expect cases[] = {
      {"hf_tiny", model_family::qwen2, true, false, false, false, 8},
      {"hf_llama", model_family::llama, true, true, true, false, 8},
      {"hf_mistral", model_family::mistral, false, false, false, false, 16},
      {"hf_qwen3", model_family::qwen3, false, false, false, true, 16},
      {"hf_rope_yarn", model_family::qwen3, false, false, false, true, 16},
      {"hf_rope_llama3", model_family::llama, false, false, false, false, 16},
  };
  for (const auto& e : cases) {
    CAPTURE(e.name);
    const auto c = load_model_config(fixture(e.name) + "/config.json");
    CHECK(c.family == e.family);
    CHECK(c.qkv_bias == e.qkv_bias);
    CHECK(c.o_bias == e.o_bias);
    CHECK(c.mlp_bias == e.mlp_bias);
    CHECK(c.qk_norm == e.qk_norm);
    CHECK(c.head_dim == e.head_dim);
    // The layout's names and shapes are the file's, one for one.
    const auto file = safetensors_file::open(fixture(e.name) + "/model.safetensors");
    const param_layout layout(c);
    CHECK(file.tensors().size() == layout.entries().size());
    for (const auto& t : layout.entries()) {
      CAPTURE(t.name);
      CHECK(file.info(t.name).shape == t.shape);
    }
    CHECK(layout.has(layer_tensor::q_norm) == e.qk_norm);
    CHECK(layout.has(layer_tensor::o_b) == e.o_bias);
    CHECK(layout.has(layer_tensor::gate_b) == e.mlp_bias);
  }
}

TEST_CASE("families: what transformers would read differently is refused with the reason") {
  const json mistral = read_json(fixture("hf_mistral") + "/config.json");
  auto windowed = mistral;
  windowed["sliding_window"] = 4096;
  expect_error([&] { (void)parse_model_config(windowed, "m.json"); },
               {"m.json", "'sliding_window' = 4096 is unsupported", "set it to null"});
  auto absent = mistral;
  absent.erase("sliding_window");
  expect_error([&] { (void)parse_model_config(absent, "m.json"); }, {"'sliding_window' is missing", "4096"});

  // qwen3 without head_dim: transformers' default is 128, not hidden / heads.
  auto qwen3 = read_json(fixture("hf_qwen3") + "/config.json");
  qwen3.erase("head_dim");
  CHECK(parse_model_config(qwen3, "q").head_dim == 128);
  auto sliding = read_json(fixture("hf_qwen3") + "/config.json");
  sliding["use_sliding_window"] = true;
  expect_error([&] { (void)parse_model_config(sliding, "q.json"); }, {"'use_sliding_window' = true"});

  // llama: head_dim is free, absent it is hidden / heads.
  auto llama = read_json(fixture("hf_llama") + "/config.json");
  llama["head_dim"] = 16;
  CHECK(parse_model_config(llama, "l").head_dim == 16);
  llama.erase("head_dim");
  CHECK(parse_model_config(llama, "l").head_dim == 8);
  llama["attention_bias"] = "yes";
  expect_error([&] { (void)parse_model_config(llama, "l.json"); }, {"'attention_bias' must be true or false"});

  // qwen2's attention derives head_dim from hidden / heads: another value is refused.
  auto qwen2 = read_json(fixture("hf_tiny") + "/config.json");
  qwen2["head_dim"] = 16;
  expect_error([&] { (void)parse_model_config(qwen2, "q2.json"); }, {"'head_dim' = 16 is unsupported for qwen2"});
}

TEST_CASE("rope: the frequencies and attention factor of every type equal the fixture generator's float64 ones") {
  for (const char* name : {"hf_llama", "hf_rope_linear", "hf_rope_yarn", "hf_rope_llama3", "hf_rope_longrope"}) {
    CAPTURE(name);
    const auto c = load_model_config(fixture(name) + "/config.json");
    const json ref = read_json(fixture(name) + "/reference.json");
    const auto f = rope_frequencies_for(c.rope, c.head_dim, ref.at("num_tokens").get<std::int64_t>());
    const auto want = ref.at("rope_inv_freq").get<std::vector<double>>();
    REQUIRE(f.inv_freq.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(f.inv_freq[i] - want[i]) <= 1e-15 * want[i]);
    }
    CHECK(std::abs(f.attention_factor - ref.at("rope_attention_factor").get<double>()) <= 1e-15);
  }
}

TEST_CASE("rope: longrope takes its short factors up to the pre-training length, its long ones past it") {
  const auto c = load_model_config(fixture("hf_rope_longrope") + "/config.json");
  REQUIRE(c.rope.kind == rope_kind::longrope);
  CHECK(c.rope.original_max_position_embeddings == 32);
  CHECK(c.rope.factor == 4.0);  // derived: max_position_embeddings / original
  const double theta = c.rope.theta;
  for (const std::int64_t len : {std::int64_t(16), std::int64_t(32), std::int64_t(33), std::int64_t(1000)}) {
    CAPTURE(len);
    const auto f = rope_frequencies_for(c.rope, c.head_dim, len);
    const auto& ext = len > 32 ? c.rope.long_factor : c.rope.short_factor;
    for (std::size_t i = 0; i < ext.size(); ++i)
      CHECK(f.inv_freq[i] == doctest::Approx(1.0 / (ext[i] * std::pow(theta, 2.0 * double(i) / c.head_dim))).epsilon(1e-15));
    CHECK(f.attention_factor == doctest::Approx(std::sqrt(1 + std::log(4.0) / std::log(32.0))).epsilon(1e-15));
  }
  // Plain RoPE does not depend on the length.
  const auto p = load_model_config(fixture("hf_tiny") + "/config.json");
  CHECK(rope_frequencies_for(p.rope, p.head_dim, 10).inv_freq == rope_frequencies_for(p.rope, p.head_dim, 1 << 20).inv_freq);
}

TEST_CASE("rope: the transformers 4 layout, both layouts at once, and yarn's DeepSeek attention factor") {
  // Llama 3.1's published layout: top-level rope_theta, rope_scaling with the type.
  const auto v4 = load_model_config(std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/llama-3.1-8b.json");
  auto v5json = read_json(fixture("hf_rope_llama3") + "/config.json");
  const auto v5 = parse_model_config(v5json, "v5");
  CHECK(v4.rope.kind == v5.rope.kind);
  // Both places stating the same RoPE are fine; different ones are refused.
  v5json["rope_scaling"] = v5json["rope_parameters"];
  v5json["rope_scaling"].erase("rope_theta");
  CHECK(parse_model_config(v5json, "both").rope == v5.rope);
  v5json["rope_scaling"]["factor"] = 2.0;
  expect_error([&] { (void)parse_model_config(v5json, "both.json"); },
               {"'rope_parameters' and 'rope_scaling' describe different RoPE"});

  auto yarn = read_json(fixture("hf_rope_yarn") + "/config.json");
  yarn["rope_parameters"]["mscale"] = 0.707;
  yarn["rope_parameters"]["mscale_all_dim"] = 0.707;
  const auto y = parse_model_config(yarn, "y");
  CHECK(rope_frequencies_for(y.rope, y.head_dim, 43).attention_factor == doctest::Approx(1.0));
  yarn["rope_parameters"]["attention_factor"] = 1.5;
  const auto y2 = parse_model_config(yarn, "y");
  CHECK(rope_frequencies_for(y2.rope, y2.head_dim, 43).attention_factor == 1.5);
}

TEST_CASE("config: written back, a config keeps its source file but for the fields that changed") {
  for (const char* name : {"hf_llama", "hf_qwen3", "hf_rope_longrope", "hf_tiny"}) {
    CAPTURE(name);
    const json source = read_json(fixture(name) + "/config.json");
    auto c = parse_model_config(source, name);
    CHECK(to_json(c) == source);  // nothing changed: the very same object

    c.max_position_embeddings = 4096;
    c.rope.kind = rope_kind::yarn;
    c.rope.factor = 8.0;
    c.rope.original_max_position_embeddings = 128;
    c.rope.short_factor.clear();
    c.rope.long_factor.clear();
    c.rope.attention_factor.reset();
    const json out = to_json(c);
    for (const auto& item : source.items()) {
      CAPTURE(item.key());
      if (item.key() != "max_position_embeddings" && item.key() != "rope_parameters" && item.key() != "rope_scaling" &&
          item.key() != "rope_theta")
        CHECK(out.at(item.key()) == item.value());
    }
    CHECK(out.at("max_position_embeddings") == 4096);
    const auto back = parse_model_config(out, "back");
    CHECK(back == c);
    // The resolved factor is written, so max_position_embeddings cannot change its meaning.
    CHECK(out.at("rope_parameters").at("factor") == 8.0);
  }
  // Built in code: what transformers 5 would write, read back to the same model.
  model_config fresh = load_model_config(fixture("hf_qwen3") + "/config.json");
  fresh.source = nullptr;
  CHECK(parse_model_config(to_json(fresh), "fresh") == fresh);
  fresh.family = model_family::mistral;
  fresh.qk_norm = false;
  CHECK(parse_model_config(to_json(fresh), "fresh") == fresh);
}
