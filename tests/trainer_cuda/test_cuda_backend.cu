// The CUDA trainer backend (examples/trainer/backend/cuda_backend.cuh) against the CPU backend:
// chunk_recurrent<cuda_backend> and chunk_recurrent<cpu_backend<double>> on the same weights (the
// bf16 values, exactly) and tokens give the same loss and parameter gradients within what bf16
// explains — with the pages in place in device memory (cuda_backend) and streamed from pinned
// homes through device slots (cuda_offload_backend) — and the backend refuses what it does not
// support (offload with device homes, pinned homes in place, sparse).
// SPDX-License-Identifier: Apache-2.0
//
// Tolerances (norm-wise relative, ||gpu - cpu|| / ||cpu|| per tensor): the GPU rounds every
// activation, activation gradient and K/V page to bf16 (2^-9 = 2e-3 relative at most per
// rounding, ~1e-3 norm-wise) and the CPU reference rounds nothing (double). A gradient passes
// through about ten roundings per layer each way, of errors that are independent and add in
// quadrature, ~1e-2 after two layers: tolerance 3e-2 per gradient tensor. The loss is a mean over
// all targets of log-softmax values, where the rounding errors average out: 5e-3.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "device_util.cuh"
#include "model_util.hpp"
#include "test_util.hpp"
#include "trainer/backend/cpu_backend.hpp"
#include "trainer/backend/cuda_backend.cuh"
#include "trainer/train/chunk_recurrent.hpp"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::chunk_recurrent;
using oomb_trainer::cpu_backend;
using oomb_trainer::cuda_backend;
using oomb_trainer::cuda_offload_backend;
using oomb_trainer::model_config;
using oomb_trainer::qwen2_params;

constexpr double loss_tolerance = 5e-3;
constexpr double grad_tolerance = 3e-2;

model_config config(std::int32_t hq, std::int32_t hkv, bool tied) {
  model_config c = trainer_test::tiny_config(hq, hkv, tied, /*d=*/64, /*layers=*/2, /*vocab=*/300);
  c.intermediate_size = 384;
  return c;
}

/// Random weights whose every parameter matters, rounded to bf16 (the values both backends use).
qwen2_params<double> bf16_weights(const model_config& c, std::uint64_t seed) {
  qwen2_params<double> p(c);
  oomb_trainer::init_perturbed(p, seed, /*std_dev=*/0.05);
  for (std::size_t i = 0; i < p.size(); ++i) p.data()[i] = static_cast<float>(oomb::bf16(static_cast<float>(p.data()[i])));
  return p;
}

template <class Backend = cuda_backend>
void compare(const model_config& cfg, const chunk_options& opt, std::int64_t tokens, bool masked, std::uint64_t seed) {
  const qwen2_params<double> host = bf16_weights(cfg, seed);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1, masked);

  qwen2_params<double> cpu_grads(cfg);
  chunk_recurrent<cpu_backend<double>> cpu(cfg, opt, tokens);
  const double cpu_loss = cpu.loss_and_grad(host, cpu_grads, seq);

  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  chunk_recurrent<Backend> gpu(cfg, opt, tokens);
  const double gpu_loss = gpu.loss_and_grad(weights, grads, seq);
  if (opt.offload) {  // pages really moved, both ways
    CHECK(gpu.last_stats().bytes_to_near > 0);
    CHECK(gpu.last_stats().bytes_to_far > 0);
  }
  qwen2_params<double> gpu_grads(cfg);
  oomb_trainer::gpu::copy_to_host(grads, gpu_grads);

  ops_test::expect_close("loss", std::abs(gpu_loss - cpu_loss) / std::abs(cpu_loss), loss_tolerance);
  const auto want = cpu_grads.named();
  const auto got = gpu_grads.named();
  REQUIRE(want.size() == got.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = trainer_test::rel_err(got[i].data, want[i].data, static_cast<std::size_t>(want[i].numel()));
    worst = std::max(worst, err);
    ops_test::expect_close(want[i].name.c_str(), err, grad_tolerance);
  }
  MESSAGE("largest gradient error " << worst);
}

template <class Backend>
void build(const model_config& cfg, const chunk_options& opt) {
  chunk_recurrent<Backend> trainer(cfg, opt, 64);
}

}  // namespace

TEST_CASE("cuda backend: GQA group 2, tied embeddings, one-page windows, a partial last chunk") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 1;  // chunk 2 attends over 5 windows per layer
  compare(config(4, 2, /*tied=*/true), opt, /*tokens=*/80, /*masked=*/false, 11);
}

TEST_CASE("cuda backend: GQA group 7, untied, three-page windows, a partial last page, a loss mask") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 3;
  compare(config(7, 1, /*tied=*/false), opt, /*tokens=*/75, /*masked=*/true, 23);
}

TEST_CASE("cuda backend: one window per layer (window_pages 0), token-major pages") {
  chunk_options opt;
  opt.chunk = 64;
  opt.page = 16;
  opt.layout = oomb::kv_layout::token_major;
  compare(config(4, 2, /*tied=*/false), opt, /*tokens=*/150, /*masked=*/false, 37);
}

TEST_CASE("cuda backend, offload: pinned homes streamed through 4 device slots, GQA group 2, tied, a partial last chunk") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 4;  // two-page windows: one computing while the next streams in
  compare<cuda_offload_backend>(config(4, 2, /*tied=*/true), opt, /*tokens=*/80, /*masked=*/false, 11);
}

TEST_CASE("cuda backend, offload: GQA group 7, untied, more slots than a window, token-major pages, a loss mask") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.layout = oomb::kv_layout::token_major;
  opt.offload = true;
  opt.near_pages = 7;
  opt.window_pages = 3;
  compare<cuda_offload_backend>(config(7, 1, /*tied=*/false), opt, /*tokens=*/150, /*masked=*/true, 23);
}

TEST_CASE("cuda backend: offload with device homes, pinned homes in place and sparse attention are refused") {
  const model_config cfg = config(4, 2, true);
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 4;
  using in_place = oomb_trainer::basic_cuda_backend<oomb::device_resource>;
  using pinned = oomb_trainer::basic_cuda_backend<oomb::pinned_resource>;
  CHECK_THROWS_WITH_AS(build<in_place>(cfg, opt), doctest::Contains("use cuda_offload_backend"), oomb::invalid_argument);
  opt.offload = false;
  CHECK_THROWS_WITH_AS(build<pinned>(cfg, opt), doctest::Contains("needs offload"), oomb::invalid_argument);
  opt.sparse = true;
  opt.budget = 2;
  CHECK_THROWS_WITH_AS(build<in_place>(cfg, opt), doctest::Contains("page-sparse attention is not supported"),
                       oomb::invalid_argument);
}
