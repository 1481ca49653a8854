// The GPU path against transformers: the HF fixture with head_dim 64 (tests/trainer/fixtures/hf_d64,
// made by tools/make_hf_fixture.py: a random Qwen2ForCausalLM, GQA 2, untied, loss and float64
// gradients on 43 tokens) through chunk_recurrent on both CUDA backends.
// SPDX-License-Identifier: Apache-2.0
//
// The fixture's reference is float64 from the F32 weights; the GPU rounds the weights to bf16 on
// upload and computes in bf16 (fp32 accumulation), so the errors are those of
// test_cuda_backend.cu (3e-2 per gradient tensor there, 5e-3 for the loss: about ten bf16
// roundings per layer each way, independent, adding in quadrature), where both sides use the same
// bf16 weights, plus the rounding of the weights themselves (2^-9 relative per weight), which this
// reference does not share. On the H200 the two add up to 3.2e-2 on the worst tensor (2 of 27 above
// 3e-2): gradient tolerance 5e-2, loss 5e-3.
//
// The fixtures folder is OOMB_TRAINER_FIXTURES in the environment when set (the GPU machine's
// checkout lands elsewhere than the build's), else the source tree's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "device_util.cuh"
#include "test_util.hpp"
#include "trainer/backend/cuda_backend.cuh"
#include "trainer/io/checkpoint.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/train/chunk_recurrent.hpp"

namespace {

constexpr double loss_tolerance = 5e-3;
constexpr double grad_tolerance = 5e-2;

std::string fixtures_dir() {
  const char* env = std::getenv("OOMB_TRAINER_FIXTURES");
  return env != nullptr && *env != '\0' ? env : OOMB_TRAINER_FIXTURES;
}

template <class Backend>
void check_against_fixture(const std::string& name, const oomb_trainer::chunk_options& opt) {
  const std::string dir = fixtures_dir() + "/" + name;
  CAPTURE(dir);
  const auto cfg = oomb_trainer::load_model_config(dir + "/config.json");
  REQUIRE(cfg.head_dim == 64);
  oomb_trainer::qwen2_params<double> host(cfg);
  oomb_trainer::load_weights(dir, host.named());
  const auto reader = oomb_trainer::token_reader::open(dir + "/tokens.bin", static_cast<std::uint32_t>(cfg.vocab_size));
  oomb_trainer::sequence seq;
  seq.tokens = reader.read(0, reader.size());
  std::ifstream in(dir + "/reference.json");
  const double ref_loss = nlohmann::json::parse(in).at("loss").get<double>();
  const auto grads_file = oomb_trainer::safetensors_file::open(dir + "/gradients.safetensors");

  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  oomb_trainer::chunk_recurrent<Backend> trainer(cfg, opt, seq.size());
  const double loss = trainer.loss_and_grad(weights, grads, seq);
  oomb_trainer::qwen2_params<double> got(cfg);
  oomb_trainer::gpu::copy_to_host(grads, got);

  ops_test::expect_close("loss", std::abs(loss - ref_loss) / std::abs(ref_loss), loss_tolerance);
  double worst = 0;
  for (const auto& t : got.named()) {
    const auto want = grads_file.read<double>(t.name, t.shape);
    const double err = trainer_test::rel_err(t.data, want.data(), want.size());
    ops_test::expect_close(t.name.c_str(), err, grad_tolerance);
    worst = std::max(worst, err);
  }
  MESSAGE(name, ": loss ", loss, " (HF float64 ", ref_loss, "), worst gradient error ", worst, " (tolerance ",
          grad_tolerance, ")");
}

}  // namespace

TEST_CASE("HF fixture hf_d64 (head_dim 64, GQA 2, untied) through the GPU path: pages in place, 16-token chunks") {
  oomb_trainer::chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.window_pages = 1;  // the last chunk attends over three windows
  check_against_fixture<oomb_trainer::cuda_backend>("hf_d64", opt);
}

TEST_CASE("HF fixture hf_d64 through the GPU path: pinned homes streamed through two device slots") {
  oomb_trainer::chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 2;
  check_against_fixture<oomb_trainer::cuda_offload_backend>("hf_d64", opt);
}
