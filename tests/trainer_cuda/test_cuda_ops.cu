// The CUDA ops backend (examples/trainer/cuda/cuda_ops.cuh) against the CPU backend:
// chunk_recurrent<cuda_ops> and chunk_recurrent<cpu_ops<double>> on the same weights (the
// bf16 values, exactly) and tokens give the same loss and parameter gradients within what bf16
// explains — with the pages in place in device memory (cuda_ops) and streamed from pinned
// homes through device slots (cuda_offload_ops), also over bf16 gradient homes — and the backend
// refuses what it does not support (offload with device homes, pinned homes in place, a sparse tile
// the kernels cannot take).
// Page-sparse attention (page_selector.cuh): the GPU selector selects what the CPU's does where
// their scoring agrees and what a host model of its tile-level scoring does everywhere; a budget
// covering every page runs the dense windows; a partial selection's loss and gradients equal the
// CPU's full sequence in double masked by the GPU run's own selections, within the bf16 bounds.
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
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device_util.cuh"
#include "hf_fixture.hpp"
#include "model_util.hpp"
#include "support/compiled_trainer.hpp"
#include "test_util.hpp"
#include "trainer/algo/chunk_recurrent.hpp"
#include "trainer/cpu/cpu_ops.hpp"
#include "trainer/cpu/full_sequence.hpp"
#include "trainer/cuda/cuda_ops.cuh"

namespace {

using oomb_trainer::chunk_options;
using oomb_trainer::chunk_recurrent;
using oomb_trainer::cpu_ops;
using oomb_trainer::cuda_ops;
using oomb_trainer::cuda_offload_ops;
using oomb_trainer::cuda_pageable_offload_ops;
using oomb_trainer::model_config;
using oomb_trainer::model_params;
// The CPU reference, compiled once in oomb_trainer_test_support (tests/trainer/support/).
using cpu_reference = trainer_test::compiled_trainer<cpu_ops<double>>;

constexpr double loss_tolerance = 5e-3;
constexpr double grad_tolerance = 3e-2;

model_config config(std::int32_t hq, std::int32_t hkv, bool tied, std::int32_t d = 64) {
  model_config c = trainer_test::tiny_config(hq, hkv, tied, d, /*layers=*/2, /*vocab=*/300);
  c.intermediate_size = 384;
  return c;
}

/// Random weights whose every parameter matters, rounded to bf16 (the values the CPU and GPU runs share).
model_params<double> bf16_weights(const model_config& c, std::uint64_t seed) {
  model_params<double> p(c);
  oomb_trainer::init_perturbed(p, seed, /*std_dev=*/0.05);
  for (std::size_t i = 0; i < p.size(); ++i) p.data()[i] = static_cast<float>(oomb::bf16(static_cast<float>(p.data()[i])));
  return p;
}

/// One step of chunk_recurrent<Backend> on the GPU: its loss, gradients (on the host) and, sparse,
/// the selections it made, as full_sequence.hpp's mask.
struct gpu_step {
  double loss = 0;
  model_params<double> grads;
  oomb_trainer::selection_mask mask;
  oomb_trainer::op_seconds op_time{};
  oomb::residency_stats grad_tier{};  ///< the gradient pages' residency (offload)
};

template <class Backend>
gpu_step run_gpu(const model_params<double>& host, const chunk_options& opt, const oomb_trainer::sequence& seq) {
  const model_config& cfg = host.config();
  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  chunk_recurrent<Backend> gpu(cfg, opt, seq.size());
  gpu_step r{gpu.loss_and_grad(weights, grads, seq), model_params<double>(cfg), {}, {}};
  if (opt.offload) {  // pages really moved, both ways
    CHECK(gpu.last_stats().bytes_to_near > 0);
    CHECK(gpu.last_stats().bytes_to_far > 0);
  }
  oomb_trainer::gpu::copy_to_host(grads, r.grads);
  r.mask = {opt.chunk, opt.page, opt.tile, cfg.num_hidden_layers, gpu.selections()};
  r.op_time = gpu.last_stats().op_time;
  r.grad_tier = gpu.grad_residency();
  return r;
}

/// The loss within `loss_tol` and every gradient tensor within `grad_tol` (norm-wise relative) of
/// the reference; returns the largest gradient error.
double expect_step_close(const gpu_step& got, double want_loss, const model_params<double>& want_grads,
                         double loss_tol = loss_tolerance, double grad_tol = grad_tolerance) {
  ops_test::expect_close("loss", std::abs(got.loss - want_loss) / std::abs(want_loss), loss_tol);
  const auto want = want_grads.named();
  const auto have = got.grads.named();
  REQUIRE(want.size() == have.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = trainer_test::rel_err(have[i].data, want[i].data, static_cast<std::size_t>(want[i].numel()));
    worst = std::max(worst, err);
    ops_test::expect_close(want[i].name.c_str(), err, grad_tol);
  }
  MESSAGE("largest gradient error " << worst);
  return worst;
}

template <class Backend = cuda_ops>
void compare(const model_config& cfg, const chunk_options& opt, std::int64_t tokens, bool masked, std::uint64_t seed,
             double grad_tol = grad_tolerance) {
  const model_params<double> host = bf16_weights(cfg, seed);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1, masked);

  model_params<double> cpu_grads(cfg);
  cpu_reference cpu(cfg, opt, tokens);
  const double cpu_loss = cpu.loss_and_grad(host, cpu_grads, seq);

  expect_step_close(run_gpu<Backend>(host, opt, seq), cpu_loss, cpu_grads, loss_tolerance, grad_tol);
}

/// A model of another family on the kernels' head_dim 64: llama with attention and MLP biases and
/// llama3 RoPE scaling, or qwen3 with q/k norms, an o bias, head_dim != hidden / heads and yarn.
model_config family_config(oomb_trainer::model_family f) {
  model_config c = config(4, 2, /*tied=*/f == oomb_trainer::model_family::qwen3);
  c.family = f;
  c.rope.theta = 10000.0;
  c.rope.original_max_position_embeddings = 64;
  c.rope.factor = 4.0;
  if (f == oomb_trainer::model_family::llama) {
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.rope.kind = oomb_trainer::rope_kind::llama3;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
  } else {
    c.qkv_bias = c.o_bias = true;
    c.qk_norm = true;
    c.hidden_size = 192;  // 4 heads of 64: q is wider than the residual stream
    c.rope.kind = oomb_trainer::rope_kind::yarn;
  }
  return c;
}

template <class Backend>
void build(const model_config& cfg, const chunk_options& opt) {
  chunk_recurrent<Backend> trainer(cfg, opt, 64);
}

}  // namespace

TEST_CASE("cuda backend: llama (attention and MLP biases, llama3 RoPE) and qwen3 (q/k norms, o bias, head_dim != hidden / "
          "heads, yarn) against the CPU, in place and offload") {
  for (const auto f : {oomb_trainer::model_family::llama, oomb_trainer::model_family::qwen3}) {
    CAPTURE(oomb_trainer::model_family_name(f));
    chunk_options opt;
    opt.chunk = 32;
    opt.page = 16;
    opt.window_pages = 2;
    compare(family_config(f), opt, 150, /*masked=*/false, 71);
    opt.offload = true;
    opt.near_pages = 4;
    compare<cuda_offload_ops>(family_config(f), opt, 150, /*masked=*/true, 72);
  }
}

TEST_CASE("cuda backend: evaluate's per-token losses equal the CPU's, and add up to the GPU step's loss") {
  const model_config cfg = family_config(oomb_trainer::model_family::qwen3);
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 2;
  const model_params<double> host = bf16_weights(cfg, 91);
  const auto seq = trainer_test::random_sequence(150, cfg.vocab_size, 92, /*masked=*/true);
  cpu_reference cpu(cfg, opt, seq.size());
  const auto want = cpu.evaluate(host, seq);
  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  chunk_recurrent<cuda_ops> gpu(cfg, opt, seq.size());
  const auto got = gpu.evaluate(weights, seq);
  REQUIRE(got.size() == want.size());
  double sum = 0, worst = 0;
  std::int64_t counted = 0;
  for (std::size_t t = 0; t < got.size(); ++t) {
    CHECK(std::isnan(got[t]) == std::isnan(want[t]));
    if (std::isnan(want[t])) continue;
    worst = std::max(worst, std::abs(got[t] - want[t]));  // nats: bf16 weights and activations
    sum += got[t];
    ++counted;
  }
  MESSAGE("evaluate: worst per-token loss error against the CPU " << worst << " nats");
  CHECK(worst <= 5e-2);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  const double step_loss = gpu.loss_and_grad(weights, grads, seq);
  CHECK(std::abs(sum / double(counted) - step_loss) <= 1e-4 * std::abs(step_loss));
}

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

// Pages of 128 tokens: the attention runs on the Hopper kernels (TMA + wgmma) on an H200, the
// ones the benchmarks and long runs take; the cases above (pages of 16) run the portable ones.
TEST_CASE("cuda backend, Hopper attention (pages of 128): head_dim 128, GQA group 7, untied, two-page windows, a partial "
          "last chunk") {
  chunk_options opt;
  opt.chunk = 128;
  opt.page = 128;
  opt.window_pages = 2;
  // 5e-2, not 3e-2: measured on the H200, every tensor upstream of the last layer's attention is
  // 2.7-3.6% off (3.0% median) with the Hopper kernels and 2.7-3.8% with the portable ones forced,
  // so it is not the kernel: dS = P (dP - delta) cancels where attention is near-uniform over
  // hundreds of keys (random weights, 430 tokens), which magnifies the bf16 rounding of O and dO
  // that dP and delta are made of; layer 1's own v/o/MLP gradients stay at 0.6-0.9%.
  compare(config(7, 1, /*tied=*/false, /*d=*/128), opt, /*tokens=*/430, /*masked=*/false, 41, /*grad_tol=*/5e-2);
}

TEST_CASE("cuda backend, Hopper attention (pages of 128), offload: head_dim 64, GQA group 2, tied, a loss mask") {
  chunk_options opt;
  opt.chunk = 256;
  opt.page = 128;
  opt.offload = true;
  opt.near_pages = 3;
  compare<cuda_offload_ops>(config(4, 2, /*tied=*/true), opt, /*tokens=*/700, /*masked=*/true, 43);
}

namespace {

/// Packed documents (sequence::doc_starts): positions restart and each query attends its own
/// document only, through the attention's per-document bounds; the CPU reference takes the same.
template <class Backend = cuda_ops>
void compare_documents(const model_config& cfg, const chunk_options& opt, std::int64_t tokens,
                       std::vector<std::int32_t> starts, std::uint64_t seed, double grad_tol = grad_tolerance) {
  const model_params<double> host = bf16_weights(cfg, seed);
  oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1, /*masked=*/true);
  for (std::int32_t d : starts) seq.mask[static_cast<std::size_t>(d)] = 0;  // as token_sequences packs them
  seq.doc_starts = std::move(starts);
  model_params<double> cpu_grads(cfg);
  cpu_reference cpu(cfg, opt, tokens);
  const double cpu_loss = cpu.loss_and_grad(host, cpu_grads, seq);
  expect_step_close(run_gpu<Backend>(host, opt, seq), cpu_loss, cpu_grads, loss_tolerance, grad_tol);
  // The documents matter: the same tokens as one stream train to another loss.
  oomb_trainer::sequence stream = seq;
  stream.doc_starts.clear();
  model_params<double> stream_grads(cfg);
  cpu_reference cpu_stream(cfg, opt, tokens);
  CHECK(std::abs(cpu_stream.loss_and_grad(host, stream_grads, stream) - cpu_loss) > 1e-3 * std::abs(cpu_loss));
}

}  // namespace

TEST_CASE("cuda backend: packed documents (mid-page, mid-chunk, on a chunk boundary), pages of 16, two-page windows") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 2;
  compare_documents(config(4, 2, /*tied=*/true), opt, /*tokens=*/170, {0, 13, 64, 140, 150}, 51);
}

TEST_CASE("cuda backend, Hopper attention (pages of 128): packed documents, head_dim 128, GQA group 7, in place and "
          "offload") {
  chunk_options opt;
  opt.chunk = 128;
  opt.page = 128;
  opt.window_pages = 2;
  const std::vector<std::int32_t> starts{0, 77, 300, 384, 401};  // mid-page, mid-chunk, on a chunk boundary
  compare_documents(config(7, 1, /*tied=*/false, /*d=*/128), opt, /*tokens=*/430, starts, 53, /*grad_tol=*/5e-2);
  opt.offload = true;
  opt.near_pages = 3;
  opt.window_pages = 0;  // near_pages / 2: one-page windows, pages streamed
  compare_documents<cuda_offload_ops>(config(7, 1, /*tied=*/false, /*d=*/128), opt, /*tokens=*/430, starts, 53,
                                      /*grad_tol=*/5e-2);
}

TEST_CASE("cuda backend, offload: pinned homes streamed through 4 device slots, GQA group 2, tied, a partial last chunk") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 4;  // two-page windows: one computing while the next streams in
  compare<cuda_offload_ops>(config(4, 2, /*tied=*/true), opt, /*tokens=*/80, /*masked=*/false, 11);
}

TEST_CASE("cuda backend, offload: GQA group 7, untied, more slots than a window, token-major pages, a loss mask") {
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.layout = oomb::kv_layout::token_major;
  opt.offload = true;
  opt.near_pages = 7;
  opt.window_pages = 3;
  compare<cuda_offload_ops>(config(7, 1, /*tied=*/false), opt, /*tokens=*/150, /*masked=*/true, 23);
}

TEST_CASE("cuda backend: stage 1's attention outputs kept for stage 2, in place and streamed, against the CPU and "
          "against recomputing") {
  const model_config cfg = config(4, 2, /*tied=*/false);
  model_config three = cfg;
  three.num_hidden_layers = 3;
  const model_params<double> host = bf16_weights(three, 41);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(100, three.vocab_size, 42, /*masked=*/false);
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.window_pages = 2;
  model_params<double> cpu_grads(three);
  cpu_reference cpu(three, opt, seq.size());
  const double cpu_loss = cpu.loss_and_grad(host, cpu_grads, seq);
  const gpu_step recomputed = run_gpu<cuda_ops>(host, opt, seq);
  chunk_options keep = opt;
  keep.keep_attention_outputs = true;
  expect_step_close(run_gpu<cuda_ops>(host, keep, seq), cpu_loss, cpu_grads);
  // The forward is deterministic and reads the same inputs in both stages, so keeping differs from
  // recomputing only by the backward's dQ atomics (a different order of fp32 additions).
  expect_step_close(run_gpu<cuda_ops>(host, keep, seq), recomputed.loss, recomputed.grads, 1e-6, 2e-3);
  keep.offload = true;
  keep.near_pages = 4;
  expect_step_close(run_gpu<cuda_offload_ops>(host, keep, seq), recomputed.loss, recomputed.grads, 1e-6, 2e-3);
}

// --grad-homes bf16 on the GPU (cuda_converting_backend), set up as tests/trainer/test_grad_homes.cpp:
// 10 chunks of one page, windows of 2 pages, 4 gradient slots, so a page goes home and comes back
// up to 9 times. Against fp32 homes: within that test's bound of one bf16 rounding per write-back
// (9 x 2^-8 per tensor, norm-wise); against the CPU trainer's bf16 homes (double compute): within
// what the GPU's bf16 compute explains (grad_tolerance), as every GPU-CPU comparison here.
TEST_CASE("cuda backend, offload: bf16 gradient homes against fp32 homes and against the CPU's bf16 homes") {
  const model_config cfg = config(4, 2, /*tied=*/true);
  const model_params<double> host = bf16_weights(cfg, 61);
  const std::int64_t N = 160;
  const oomb_trainer::sequence seq = trainer_test::random_sequence(N, cfg.vocab_size, 62, /*masked=*/false);
  chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.window_pages = 2;
  opt.offload = true;
  opt.near_pages = 4;
  const gpu_step fp32 = run_gpu<cuda_offload_ops>(host, opt, seq), fp32_again = run_gpu<cuda_offload_ops>(host, opt, seq);
  opt.grad_homes = oomb_trainer::page_home_format::bf16;
  const gpu_step bf16 = run_gpu<cuda_offload_ops>(host, opt, seq);
  model_params<double> cpu_grads(cfg);
  cpu_reference cpu(cfg, opt, N);
  const double cpu_loss = cpu.loss_and_grad(host, cpu_grads, seq);
  opt.grad_homes = oomb_trainer::page_home_format::bf16_stochastic;
  const gpu_step sr = run_gpu<cuda_offload_ops>(host, opt, seq);

  // The same schedule moves half the gradient bytes (fp32 homes -> bf16).
  CHECK(bf16.grad_tier.write_backs == fp32.grad_tier.write_backs);
  CHECK(bf16.grad_tier.write_backs > std::uint64_t(cfg.num_hidden_layers) * (N / 16));  // pages went home repeatedly
  CHECK(2 * bf16.grad_tier.bytes_to_far == fp32.grad_tier.bytes_to_far);
  CHECK(2 * bf16.grad_tier.bytes_to_near == fp32.grad_tier.bytes_to_near);
  CHECK(std::abs(bf16.loss - fp32.loss) <= 1e-6 * std::abs(fp32.loss));  // the forward reads no gradient page

  const auto flat = [](const gpu_step& s) { return std::vector<double>(s.grads.data(), s.grads.data() + s.grads.size()); };
  std::string which;
  const double noise = trainer_test::worst_tensor_error(host, flat(fp32_again), flat(fp32), nullptr);
  const double between = trainer_test::worst_tensor_error(host, flat(bf16), flat(fp32), &which);
  const double sr_between = trainer_test::worst_tensor_error(host, flat(sr), flat(fp32), nullptr);
  const double bound = double((N - 1) / opt.chunk) * std::ldexp(1.0, -8);
  CAPTURE(which);
  CHECK(between > std::max(1e-6, 2 * noise));  // rounding happened, beyond the GPU's run-to-run noise
  CHECK(between <= bound);
  CHECK(sr_between <= 2 * bound);  // each stochastic rounding is within one bf16 ulp
  MESSAGE("GPU bf16 gradient homes vs fp32 homes: worst tensor ", between, " (", which, "), stochastic ", sr_between,
          "; run-to-run ", noise, "; bound ", bound, "; ", bf16.grad_tier.write_backs, " write-backs");
  expect_step_close(bf16, cpu_loss, cpu_grads);
}

// --home-memory pageable (cuda_pageable_offload_ops): the pinned run's pages, moved through
// pinned staging by host copies (oomb/cuda/staged_page_transfer.cuh). The arithmetic is the same,
// so the pinned run is the reference: the same schedule moves the same bytes, the loss is equal
// and the gradients are within the backward's run-to-run noise (its dQ atomics), with every tier
// streamed (K/V, gradients, kept attention outputs) and with bf16 gradient homes (the converting
// tier staged too); and against the CPU, as every offload run.
TEST_CASE("cuda backend, offload: pageable homes against pinned homes (K/V, gradients, kept outputs, bf16 gradient "
          "homes) and against the CPU") {
  const model_config cfg = config(4, 2, /*tied=*/true);
  const model_params<double> host = bf16_weights(cfg, 71);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(160, cfg.vocab_size, 72, /*masked=*/true);
  chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.window_pages = 2;
  opt.offload = true;
  opt.near_pages = 4;
  opt.keep_attention_outputs = true;
  for (const auto format : {oomb_trainer::page_home_format::same, oomb_trainer::page_home_format::bf16}) {
    const bool bf16_grad_homes = oomb_trainer::bf16_homes(format);
    CAPTURE(bf16_grad_homes);
    opt.grad_homes = format;
    opt.homes = oomb_trainer::home_memory::pinned;
    const gpu_step pinned = run_gpu<cuda_offload_ops>(host, opt, seq);
    opt.homes = oomb_trainer::home_memory::pageable;
    const gpu_step pageable = run_gpu<cuda_pageable_offload_ops>(host, opt, seq);
    CHECK(pageable.grad_tier.bytes_to_near == pinned.grad_tier.bytes_to_near);
    CHECK(pageable.grad_tier.bytes_to_far == pinned.grad_tier.bytes_to_far);
    CHECK(pageable.grad_tier.write_backs == pinned.grad_tier.write_backs);
    CHECK(pageable.grad_tier.bytes_to_far > 0);
    expect_step_close(pageable, pinned.loss, pinned.grads, 1e-6, 2e-3);
  }
  opt.grad_homes = oomb_trainer::page_home_format::same;
  compare<cuda_pageable_offload_ops>(cfg, opt, /*tokens=*/150, /*masked=*/false, 73);
}

TEST_CASE("cuda backend: offload with device homes, pinned homes in place and sparse attention are refused") {
  const model_config cfg = config(4, 2, true);
  chunk_options opt;
  opt.chunk = 32;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 4;
  using in_place = oomb_trainer::basic_cuda_ops<oomb::device_resource>;
  using pinned = oomb_trainer::basic_cuda_ops<oomb::pinned_resource>;
  CHECK_THROWS_WITH_AS(build<in_place>(cfg, opt), doctest::Contains("use cuda_offload_ops"), oomb::invalid_argument);
  opt.offload = false;
  CHECK_THROWS_WITH_AS(build<pinned>(cfg, opt), doctest::Contains("needs offload"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(build<cuda_pageable_offload_ops>(cfg, opt), doctest::Contains("needs offload"),
                       oomb::invalid_argument);
  opt.sparse = true;
  opt.budget = 2;
  opt.tile = 32;  // GQA group 2: 64 query rows, the kernels' blocks are 128
  CHECK_THROWS_WITH_AS(build<in_place>(cfg, opt), doctest::Contains("multiple of 128"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(build<in_place>(cfg, opt), doctest::Contains("--tile 64"), oomb::invalid_argument);
}

// ---- page-sparse attention ----

namespace {

/// The options of a sparse run: chunks of `chunk`, 16-token pages, `tile`-query selection tiles.
chunk_options sparse_options(std::int32_t chunk, std::int32_t tile, std::int32_t budget, oomb::score_kind score) {
  chunk_options opt;
  opt.chunk = chunk;
  opt.page = 16;
  opt.sparse = true;
  opt.budget = budget;
  opt.sink = 1;
  opt.local = 1;
  opt.tile = tile;
  opt.score = score;
  return opt;
}

/// Past pages the step's tiles selected, and past pages they had, over every chunk and layer.
std::pair<std::int64_t, std::int64_t> selected_of_past(const oomb_trainer::selection_mask& m) {
  std::int64_t selected = 0, past = 0;
  for (std::size_t i = 0; i < m.tables.size(); ++i) {
    const std::int64_t c = static_cast<std::int64_t>(i) / m.layers;
    selected += m.tables[i].num_entries();
    past += c * m.chunk / m.page * m.tables[i].num_tiles();
  }
  return {selected, past};
}

/// The GPU run's loss and gradients against the CPU's full sequence in double masked by the GPU
/// run's own selections, and that masked reference far from dense (so a GPU backward that ignored
/// the selection would fail).
void expect_masked_reference(const model_params<double>& host, const oomb_trainer::sequence& seq, const gpu_step& gpu) {
  const model_config& cfg = host.config();
  model_params<double> masked(cfg), dense(cfg);
  const double masked_loss = oomb_trainer::full_sequence_loss_and_grad(host, masked, seq, &gpu.mask);
  expect_step_close(gpu, masked_loss, masked);
  oomb_trainer::full_sequence_loss_and_grad(host, dense, seq);
  const std::vector<double> a(masked.data(), masked.data() + masked.size()), b(dense.data(), dense.data() + dense.size());
  const double from_dense = trainer_test::worst_tensor_error(host, a, b, nullptr);
  MESSAGE("masked reference vs dense: worst tensor " << from_dense);
  CHECK(from_dense > 3 * grad_tolerance);
}

/// expect_masked_reference for a sequence of random tokens, the selections partial.
template <class Backend>
void compare_partial(const model_config& cfg, const chunk_options& opt, std::int64_t tokens, std::uint64_t seed) {
  const model_params<double> host = bf16_weights(cfg, seed);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1);
  const gpu_step gpu = run_gpu<Backend>(host, opt, seq);
  const std::pair<std::int64_t, std::int64_t> sel = selected_of_past(gpu.mask);
  MESSAGE("selected " << sel.first << " of " << sel.second << " past pages over the step");
  CHECK(sel.first > 0);
  CHECK(2 * sel.first < sel.second);
  expect_masked_reference(host, seq, gpu);
}

/// expect_masked_reference for packed documents (`starts`): every tile selects among the pages of
/// its first query's document only (from the page holding its start to the chunk's), all of them
/// when they are at most budget + sink + local, else that many with the document's first page as
/// the sink; some tiles select partially, some have fewer candidates than that, some none.
template <class Backend>
void compare_sparse_documents(const model_config& cfg, const chunk_options& opt, std::int64_t tokens,
                              std::vector<std::int32_t> starts, std::uint64_t seed) {
  const model_params<double> host = bf16_weights(cfg, seed);
  oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1, /*masked=*/true);
  for (std::int32_t d : starts) seq.mask[static_cast<std::size_t>(d)] = 0;  // as token_sequences packs them
  seq.doc_starts = std::move(starts);
  const gpu_step gpu = run_gpu<Backend>(host, opt, seq);
  const std::vector<std::int32_t>& docs = seq.doc_starts;
  const std::int32_t most = opt.budget + opt.sink + opt.local;
  std::int64_t partial = 0, fewer = 0, none = 0;
  for (std::size_t i = 0; i < gpu.mask.tables.size(); ++i) {
    const std::int64_t c = static_cast<std::int64_t>(i) / cfg.num_hidden_layers;
    const oomb::sparse_page_table& table = gpu.mask.tables[i];
    const auto past = static_cast<std::int32_t>(c * opt.chunk / opt.page);
    for (std::int32_t t = 0; t < table.num_tiles(); ++t) {
      CAPTURE(c);
      CAPTURE(t);
      const std::int64_t q = c * opt.chunk + std::int64_t(t) * opt.tile;
      const std::int32_t first = *(std::upper_bound(docs.begin(), docs.end(), q) - 1) / opt.page;
      const std::int32_t candidates = std::max(0, past - first);
      const auto [b, e] = table.tile(t);
      CHECK(std::all_of(b, e, [&](std::int32_t pg) { return pg >= first && pg < past; }));
      CHECK(e - b == std::min(most, candidates));
      if (candidates > most) {
        ++partial;
        CHECK(*b == first);
      }
      if (candidates > 0 && candidates < most) ++fewer;
      if (past > 0 && candidates == 0) ++none;
    }
  }
  MESSAGE("tiles (all layers) selecting partially " << partial << ", among fewer than " << most << " pages " << fewer
                                                    << ", with no candidate " << none);
  CHECK(partial > 0);
  CHECK(fewer > 0);
  CHECK(none > 0);
  expect_masked_reference(host, seq, gpu);
}

}  // namespace

TEST_CASE("cuda backend, sparse: a budget covering every page runs the dense windows (tight tolerance)") {
  // Same windows, same pages, the same arithmetic: the loss agrees to fp32 rounding; dQ is summed
  // with atomics (in no fixed order) and rounded to bf16, so gradients agree within 2e-3, an order
  // inside the 3e-2 bf16 bound, not bit for bit.
  const model_config cfg = config(4, 2, /*tied=*/false);
  const model_params<double> host = bf16_weights(cfg, 71);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(300, cfg.vocab_size, 72);
  chunk_options dense;
  dense.chunk = 128;
  dense.page = 16;
  dense.window_pages = 3;
  chunk_options sparse = sparse_options(128, 64, /*budget=*/32, oomb::score_kind::quest);
  sparse.window_pages = 3;
  const gpu_step want = run_gpu<cuda_ops>(host, dense, seq);
  const gpu_step got = run_gpu<cuda_ops>(host, sparse, seq);
  const std::pair<std::int64_t, std::int64_t> sel = selected_of_past(got.mask);
  CHECK(sel.first == sel.second);
  CHECK(sel.second > 0);
  expect_step_close(got, want.loss, want.grads, /*loss_tol=*/1e-6, /*grad_tol=*/2e-3);
}

TEST_CASE("cuda backend, sparse: partial selections (2 of up to 16 pages + sink + local) equal the masked CPU reference") {
  // GQA group 2, tiles of 64 queries (128 rows), Quest; three chunks of 128: pasts of 0, 8, 16 pages.
  chunk_options opt = sparse_options(128, 64, /*budget=*/2, oomb::score_kind::quest);
  opt.window_pages = 2;  // several windows per layer: selections crossing window edges
  compare_partial<cuda_ops>(config(4, 2, /*tied=*/true), opt, 384, 81);
  // GQA group 4, tiles of 32 queries, mean-key; five chunks of 64, a partial last page.
  compare_partial<cuda_ops>(config(4, 1, /*tied=*/false), sparse_options(64, 32, 2, oomb::score_kind::mean), 310, 83);
}

TEST_CASE("cuda backend, offload, sparse: partial selections equal the masked CPU reference, pages streamed") {
  chunk_options opt = sparse_options(128, 64, /*budget=*/2, oomb::score_kind::quest);
  opt.offload = true;
  opt.near_pages = 8;
  compare_partial<cuda_offload_ops>(config(4, 2, /*tied=*/true), opt, 384, 81);
  chunk_options mean = sparse_options(64, 32, 2, oomb::score_kind::mean);
  mean.offload = true;
  mean.near_pages = 6;
  compare_partial<cuda_offload_ops>(config(4, 1, /*tied=*/false), mean, 310, 83);
}

TEST_CASE("cuda backend, sparse: packed documents select per document (from the page of the tile's document start) "
          "and equal the masked CPU reference, in place and offload") {
  // Quest, GQA 2, tiles of 64, chunks of 128 (8 pages): documents from 40 (mid-page 2), 256 (a
  // chunk boundary), 350 and 420; tiles with 6 candidates (partial), 3 (fewer than 4), none (their
  // document starts in the chunk, or past it: page 26 of a past of 24).
  chunk_options opt = sparse_options(128, 64, /*budget=*/2, oomb::score_kind::quest);
  opt.window_pages = 2;
  const std::vector<std::int32_t> starts{0, 40, 256, 350, 420};
  compare_sparse_documents<cuda_ops>(config(4, 2, /*tied=*/true), opt, /*tokens=*/640, starts, 91);
  opt.offload = true;
  opt.near_pages = 8;
  opt.window_pages = 0;
  compare_sparse_documents<cuda_offload_ops>(config(4, 2, /*tied=*/true), opt, /*tokens=*/640, starts, 91);
  // Mean-key, GQA 4, tiles of 32, chunks of 64 (4 pages): the second chunk's past of 4 pages is
  // within budget + sink + local, so its tiles take [first, 4) without the GPU.
  compare_sparse_documents<cuda_ops>(config(4, 1, /*tied=*/false), sparse_options(64, 32, 2, oomb::score_kind::mean),
                                     /*tokens=*/400, {0, 21, 100, 130, 300}, 93);
}

namespace {

/// A step timed by the op clock against the same step untimed: the same loss bit for bit, every
/// kind of op timed (selection only when sparse, else none), their sum within the step.
void check_op_clock(const model_config& cfg, chunk_options opt, std::int64_t tokens, std::uint64_t seed) {
  const model_params<double> host = bf16_weights(cfg, seed);
  const oomb_trainer::sequence seq = trainer_test::random_sequence(tokens, cfg.vocab_size, seed + 1, false);
  const gpu_step plain = run_gpu<cuda_ops>(host, opt, seq);

  opt.time_ops = true;
  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  chunk_recurrent<cuda_ops> timed(cfg, opt, seq.size());
  const double loss = timed.loss_and_grad(weights, grads, seq);
  CHECK(loss == plain.loss);  // the forward (and the selection) is deterministic: timing it changes no bit
  const auto& st = timed.last_stats();
  double sum = 0;
  for (int k = 0; k < oomb_trainer::op_kinds; ++k) {
    const auto kind = static_cast<oomb_trainer::op_kind>(k);
    const double t = st.op_time[static_cast<std::size_t>(k)];
    CAPTURE(oomb_trainer::op_kind_name(kind));
    if (kind == oomb_trainer::op_kind::selection && !opt.sparse)
      CHECK(t == 0.0);  // no selector
    else
      CHECK(t > 0.0);  // every kind of op ran
    sum += t;
  }
  MESSAGE("op time " << sum << " s of a " << st.stage1_seconds + st.stage2_seconds << " s step, selection "
                     << st.op_time[static_cast<std::size_t>(oomb_trainer::op_kind::selection)] << " s");
  CHECK(sum <= 1.05 * (st.stage1_seconds + st.stage2_seconds));
  // Off (the default), nothing is timed.
  CHECK(std::all_of(plain.op_time.begin(), plain.op_time.end(), [](double t) { return t == 0.0; }));
}

}  // namespace

TEST_CASE("cuda backend: the op clock splits a step's GPU time by kind of op and changes no result") {
  chunk_options dense;
  dense.chunk = 128;
  dense.page = 128;
  check_op_clock(config(4, 2, /*tied=*/false), dense, 300, 51);
  // Sparse, selections partial (pasts of 8 and 16 pages, 4 taken): the selector's work is timed too.
  check_op_clock(config(4, 2, /*tied=*/false), sparse_options(128, 64, /*budget=*/2, oomb::score_kind::quest), 384, 53);
}

namespace {

/// A host model of the GPU's tile-level scoring (tile_selection.cuh): per tile, the box (Quest) or
/// mean (mean-key) of its queries over each KV head's group, scored by the functions the kernels
/// use, then oomb's page_selector.
oomb::sparse_page_table tile_level_selection(const oomb::tile_selection_config& cfg, const oomb::page_summaries& sums,
                                             const std::vector<float>& q, std::int64_t n, std::int32_t hq,
                                             std::int32_t hkv, std::int32_t d, const std::vector<std::int32_t>& ids,
                                             std::int32_t past) {
  const std::int32_t group = hq / hkv;
  const oomb::page_summary_view s = sums.view();
  oomb::page_selector selector(cfg.pages);
  oomb::sparse_page_table out;
  std::vector<std::int32_t> row;
  for (std::int64_t t0 = 0; t0 < n; t0 += cfg.tile_queries) {
    const std::int64_t t1 = std::min<std::int64_t>(n, t0 + cfg.tile_queries);
    std::vector<float> lo(std::size_t(hkv) * d, INFINITY), hi(lo.size(), -INFINITY), mean(lo.size());
    for (std::int32_t h = 0; h < hkv; ++h)
      for (std::int32_t c = 0; c < d; ++c) {
        double sum = 0;
        const std::size_t at = std::size_t(h) * d + c;
        for (std::int32_t g = 0; g < group; ++g)
          for (std::int64_t i = t0; i < t1; ++i) {
            const float x = q[static_cast<std::size_t>((i * hq + h * group + g) * d + c)];
            lo[at] = std::min(lo[at], x);
            hi[at] = std::max(hi[at], x);
            sum += x;
          }
        mean[at] = static_cast<float>(sum / (double(group) * double(t1 - t0)));
      }
    std::vector<float> scores(static_cast<std::size_t>(past), -INFINITY);
    for (std::int32_t i = cfg.pages.sink; i < past - cfg.pages.local; ++i) {
      const std::int32_t id = ids[static_cast<std::size_t>(i)];
      if (s.token_count(id) == 0) continue;
      for (std::int32_t h = 0; h < hkv; ++h) {
        const std::size_t at = std::size_t(h) * d;
        const float x = cfg.kind == oomb::score_kind::quest
                            ? oomb::quest_box_bound(lo.data() + at, hi.data() + at, s.min_of(id, h), s.max_of(id, h), d)
                            : oomb::mean_key_score(mean.data() + at, s.mean_of(id, h), d);
        scores[static_cast<std::size_t>(i)] = std::max(scores[static_cast<std::size_t>(i)], x);
      }
    }
    selector.select(scores.data(), past, row);
    out.add_tile(row);
  }
  return out;
}

struct selector_case {
  oomb::score_kind kind;
  std::int32_t hq, hkv, d, tile, queries;  // queries per select call
};

/// Keys of `pages` pages (the last one partial) written in chunks of 4 pages to shuffled far ids
/// and summarised by both selectors; then select calls of `queries` queries over growing pasts,
/// GPU against `expected` (the CPU selector or the host model); then a few ids forgotten, and the
/// same again.
void run_selector_case(const selector_case& k, bool against_cpu, std::uint64_t seed) {
  CAPTURE(oomb::to_string(k.kind));
  CAPTURE(k.hq);
  CAPTURE(k.hkv);
  CAPTURE(k.tile);
  CAPTURE(k.queries);
  const std::int32_t page = 16, pages = 37, capacity = 64;
  const std::int64_t rows = std::int64_t(pages) * page - 5;
  const oomb::tile_selection_config cfg{k.tile, k.kind, {/*budget=*/5, /*sink=*/1, /*local=*/2}};
  cuda_ops be;
  oomb_trainer::cuda_page_selector<cuda_ops> gpu(be, page, k.hq, k.hkv, k.d, capacity, cfg);
  oomb_trainer::cpu_page_selector<float> cpu(be, page, k.hq, k.hkv, k.d, capacity, cfg);
  oomb::page_summaries sums(k.hkv, k.d, capacity);  // the host model's

  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(capacity));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<std::size_t>(pages));
  const std::int64_t kvd = std::int64_t(k.hkv) * k.d;
  // Keys with a per-page offset, so pages score apart.
  std::vector<oomb::bf16> keys(static_cast<std::size_t>(rows * kvd));
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t x = 0; x < kvd; ++x)
      keys[static_cast<std::size_t>(r * kvd + x)] = oomb::bf16(unit(rng) + 0.3f * float((r / page * 7 + x) % 5));
  const std::vector<float> keys_f = ops_test::to_float(keys);
  ops_test::device_array<oomb::bf16> dkeys(keys);
  for (std::int32_t first = 0; first < pages; first += 4) {
    const std::int32_t count = std::min(4, pages - first);
    const std::int64_t r0 = std::int64_t(first) * page, n = std::min<std::int64_t>(rows - r0, std::int64_t(count) * page);
    const oomb::id_span span(ids.data() + first, static_cast<std::size_t>(count));
    gpu.summarize(span, n, dkeys.get() + r0 * kvd);
    cpu.summarize(span, n, keys_f.data() + r0 * kvd);
    for (std::int32_t i = 0; i < count; ++i) {
      const std::int64_t cnt = std::min<std::int64_t>(page, n - std::int64_t(i) * page);
      sums.update(ids[static_cast<std::size_t>(first + i)], 0,
                  oomb::tensor_view<const float, 3>(keys_f.data() + (r0 + std::int64_t(i) * page) * kvd, {cnt, k.hkv, k.d},
                                                    {kvd, k.d, 1}));
    }
  }

  int compared = 0;
  auto select_all = [&](std::uint64_t qseed) {
    const std::int64_t qd = std::int64_t(k.hq) * k.d;
    for (std::int32_t past : {3, 8, 9, 20, 36}) {
      CAPTURE(past);
      const std::vector<oomb::bf16> q = ops_test::random_bf16(static_cast<std::size_t>(k.queries * qd), qseed + past, -2, 2);
      const std::vector<float> q_f = ops_test::to_float(q);
      ops_test::device_array<oomb::bf16> dq(q);
      const oomb::id_span span(ids.data(), ids.size());
      oomb::sparse_page_table got, want;
      gpu.select(dq.get(), k.queries, span, past, nullptr, got);
      if (against_cpu)
        cpu.select(q_f.data(), k.queries, span, past, nullptr, want);
      else
        want = tile_level_selection(cfg, sums, q_f, k.queries, k.hq, k.hkv, k.d, ids, past);
      REQUIRE(got.indptr() == want.indptr());
      REQUIRE(got.indices() == want.indices());
      ++compared;
    }
  };
  select_all(seed + 100);
  // Forgotten ids hold no keys: scored lowest by both, never chosen while others compete.
  for (std::int32_t i : {2, 5, 11, 17}) {
    gpu.forget(ids[static_cast<std::size_t>(i)]);
    cpu.forget(ids[static_cast<std::size_t>(i)]);
    sums.clear(ids[static_cast<std::size_t>(i)]);
  }
  select_all(seed + 200);
  CHECK(compared == 10);
}

}  // namespace

TEST_CASE("cuda selector: equals the CPU selector where their scoring agrees (one-query calls, no GQA)") {
  // One query without GQA: the tile's box is the query itself, its mean the query itself, so the
  // GPU's tile-level score is the CPU's per-query score bit for bit.
  for (const auto kind : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    run_selector_case({kind, 2, 2, 64, 128, 1}, /*against_cpu=*/true, 5);
    run_selector_case({kind, 4, 4, 128, 128, 1}, /*against_cpu=*/true, 6);
  }
}

TEST_CASE("cuda selector: equals a host model of its tile-level scoring (GQA, several tiles, a partial last tile)") {
  // The CPU selector scores each query and takes the tile's maximum: for several queries per tile
  // (or GQA) the GPU's box bound is larger (Quest) and its mean query's score differs (mean-key),
  // so the pages may differ; the host model repeats the GPU's scoring exactly.
  for (const auto kind : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    run_selector_case({kind, 4, 2, 64, 64, 150}, /*against_cpu=*/false, 7);
    run_selector_case({kind, 8, 1, 128, 16, 40}, /*against_cpu=*/false, 8);
  }
}

// ---- transformers: the HF fixture with head_dim 64, in place and with pinned offload ----
// The GPU path against transformers: the HF fixture with head_dim 64 (tests/trainer/fixtures/hf_d64,
// made by tools/fixtures/make_hf_fixture.py: a random Qwen2ForCausalLM, GQA 2, untied, loss and
// float64 gradients on 43 tokens) through chunk_recurrent on cuda_ops and cuda_offload_ops
// (the pageable-homes backend differs from the second only in how pages cross the bus).
//
// The fixture's reference is float64 from the F32 weights; the GPU rounds the weights to bf16 on
// upload and computes in bf16 (fp32 accumulation), so the errors are those of
// test_cuda_ops.cu (3e-2 per gradient tensor there, 5e-3 for the loss: about ten bf16
// roundings per layer each way, independent, adding in quadrature), where both sides use the same
// bf16 weights, plus the rounding of the weights themselves (2^-9 relative per weight), which this
// reference does not share. On the H200 the two add up to 3.2e-2 on the worst tensor (2 of 27 above
// 3e-2): gradient tolerance 5e-2, loss 5e-3.
//
// The fixtures folder is OOMB_TRAINER_FIXTURES in the environment when set (the GPU machine's
// checkout lands elsewhere than the build's), else the source tree's.

namespace {

constexpr double hf_grad_tolerance = 5e-2;  // see the comment above these HF cases

std::string fixtures_dir() {
  const char* env = std::getenv("OOMB_TRAINER_FIXTURES");
  return env != nullptr && *env != '\0' ? env : OOMB_TRAINER_FIXTURES;
}

template <class Backend>
void check_against_hf_fixture(const std::string& name, const oomb_trainer::chunk_options& opt) {
  const std::string dir = fixtures_dir() + "/" + name;
  CAPTURE(dir);
  const auto fx = trainer_test::hf_fixture::load(dir);
  const auto& cfg = fx.config;
  REQUIRE(cfg.head_dim == 64);
  const auto& host = fx.weights;
  const auto& seq = fx.seq;
  const double ref_loss = fx.loss;
  const auto& grads_file = fx.gradients;

  oomb_trainer::gpu::device_params<oomb::bf16> weights(cfg);
  oomb_trainer::gpu::copy_to_device(host, weights);
  oomb_trainer::gpu::device_params<float> grads(cfg);
  oomb_trainer::chunk_recurrent<Backend> trainer(cfg, opt, seq.size());
  const double loss = trainer.loss_and_grad(weights, grads, seq);
  oomb_trainer::model_params<double> got(cfg);
  oomb_trainer::gpu::copy_to_host(grads, got);

  ops_test::expect_close("loss", std::abs(loss - ref_loss) / std::abs(ref_loss), loss_tolerance);
  double worst = 0;
  for (const auto& t : got.named()) {
    const auto want = grads_file.read<double>(t.name, t.shape);
    const double err = trainer_test::rel_err(t.data, want.data(), want.size());
    ops_test::expect_close(t.name.c_str(), err, hf_grad_tolerance);
    worst = std::max(worst, err);
  }
  MESSAGE(name, ": loss ", loss, " (HF float64 ", ref_loss, "), worst gradient error ", worst, " (tolerance ",
          hf_grad_tolerance, ")");
}

}  // namespace

TEST_CASE("HF fixture hf_d64 (head_dim 64, GQA 2, untied) through the GPU path: pages in place, 16-token chunks") {
  oomb_trainer::chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.window_pages = 1;  // the last chunk attends over three windows
  check_against_hf_fixture<oomb_trainer::cuda_ops>("hf_d64", opt);
}

TEST_CASE("HF fixture hf_d64 through the GPU path: pinned homes streamed through two device slots") {
  oomb_trainer::chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.offload = true;
  opt.near_pages = 2;
  check_against_hf_fixture<oomb_trainer::cuda_offload_ops>("hf_d64", opt);
}
