// The committed HF fixtures (tools/fixtures/make_hf_fixture.py) are consistent with their configs:
// every HF Qwen2 parameter is there with the shape the config implies, F32 weights, F64 gradients
// under the same names, the token file matches reference.json. (The model comparison against them is
// the trainer's own test.)
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <set>

#include "io_test_util.hpp"
#include "trainer/io/checkpoint_reader.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/json_util.hpp"
#include "trainer/io/tokens.hpp"

using namespace oomb_trainer;

namespace {

using shape_map = std::map<std::string, std::vector<std::int64_t>>;

// HF Qwen2ForCausalLM parameter names and shapes for a config ([out, in] for linear weights).
shape_map hf_qwen2_parameters(const model_config& c) {
  const std::int64_t h = c.hidden_size, i = c.intermediate_size, v = c.vocab_size;
  const std::int64_t q = std::int64_t{c.num_attention_heads} * c.head_dim;
  const std::int64_t kv = std::int64_t{c.num_key_value_heads} * c.head_dim;
  shape_map m;
  m["model.embed_tokens.weight"] = {v, h};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = {h};
    m[p + "self_attn.q_proj.weight"] = {q, h};
    m[p + "self_attn.q_proj.bias"] = {q};
    m[p + "self_attn.k_proj.weight"] = {kv, h};
    m[p + "self_attn.k_proj.bias"] = {kv};
    m[p + "self_attn.v_proj.weight"] = {kv, h};
    m[p + "self_attn.v_proj.bias"] = {kv};
    m[p + "self_attn.o_proj.weight"] = {h, q};
    m[p + "post_attention_layernorm.weight"] = {h};
    m[p + "mlp.gate_proj.weight"] = {i, h};
    m[p + "mlp.up_proj.weight"] = {i, h};
    m[p + "mlp.down_proj.weight"] = {h, i};
  }
  m["model.norm.weight"] = {h};
  if (!c.tie_word_embeddings) m["lm_head.weight"] = {v, h};
  return m;
}

nlohmann::json read_json(const std::string& path) {
  const std::string text = io_test::read_bytes(path);
  return detail::parse_json_bounded(text.data(), text.data() + text.size(), 16, path, "json");
}

void check_fixture(const std::string& name, bool tied, int kv_heads) {
  CAPTURE(name);
  const std::string dir = std::string(OOMB_TRAINER_FIXTURES) + "/" + name;
  const model_config c = load_model_config(dir + "/config.json");
  CHECK(c.tie_word_embeddings == tied);
  CHECK(c.num_key_value_heads == kv_heads);
  CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  CHECK(c.num_attention_heads / c.num_key_value_heads > 1);  // GQA, so grouping mistakes show
  const shape_map expected = hf_qwen2_parameters(c);

  const checkpoint_reader weights(dir);
  REQUIRE(weights.shard_count() == 1);
  const std::vector<std::string> names = weights.names();
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == expected.size());
  for (const auto& [pname, shape] : expected) {
    CAPTURE(pname);
    REQUIRE(weights.contains(pname));
    CHECK(weights.info(pname).shape == shape);
    CHECK(weights.info(pname).type == dtype::f32);
    // Every parameter was perturbed away from its default (zeros for biases, ones for norms).
    const auto w = weights.read<double>(pname, shape);
    double mean = 0, var = 0;
    for (double x : w) mean += x;
    mean /= static_cast<double>(w.size());
    for (double x : w) var += (x - mean) * (x - mean);
    CHECK(var / static_cast<double>(w.size()) > 1e-3);
  }

  const auto grads = safetensors_file::open(dir + "/gradients.safetensors");
  CHECK(grads.tensors().size() == expected.size());
  double total = 0;
  for (const auto& [pname, shape] : expected) {
    CAPTURE(pname);
    CHECK(grads.info(pname).type == dtype::f64);
    const auto g = grads.read<double>(pname, shape);
    double sq = 0;
    for (double x : g) sq += x * x;
    CHECK(sq > 0);  // every parameter influences the loss
    CHECK(std::isfinite(sq));
    total += sq;
  }
  CHECK(total > 0);

  const auto ref = read_json(dir + "/reference.json");
  const double loss = ref.at("loss").get<double>();
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
  CHECK(std::strtod(grads.metadata().at("loss").c_str(), nullptr) == loss);  // the same double
  // fp32 transformers agrees to fp32 rounding: a sanity check that the float64 reference is HF's model.
  CHECK(std::fabs(ref.at("loss_stock_transformers_fp32").get<double>() - loss) < 1e-5 * loss);
  CHECK(ref.at("tie_word_embeddings").get<bool>() == tied);

  const auto tokens = token_reader::open(dir + "/tokens.bin", static_cast<std::uint32_t>(c.vocab_size));
  const auto ref_tokens = ref.at("tokens").get<std::vector<std::int32_t>>();
  CHECK(tokens.size() == ref_tokens.size());
  CHECK(tokens.vocab_size() == static_cast<std::uint32_t>(c.vocab_size));
  CHECK(tokens.read(0, ref_tokens.size()) == ref_tokens);
  CHECK(ref.at("num_targets").get<std::size_t>() == ref_tokens.size() - 1);
  CHECK(ref_tokens.size() % 16 != 0);  // not a multiple of a page or chunk
}

}  // namespace

TEST_CASE("HF fixture hf_tiny (untied, GQA 2) is consistent with its config") { check_fixture("hf_tiny", false, 2); }

TEST_CASE("HF fixture hf_tiny_tied (tied, GQA 4) is consistent with its config") { check_fixture("hf_tiny_tied", true, 1); }

TEST_CASE("HF fixture hf_d64 (untied, GQA 2, head_dim 64: the GPU kernels' shape) is consistent with its config") {
  check_fixture("hf_d64", false, 1);
}
