// Both training paths against the HF fixtures (tools/fixtures/make_hf_fixture.py: random
// transformers models of each family and RoPE type, with GQA and perturbed biases/norms, loss and
// float64 gradients): loss and every gradient tensor, norm-wise <= 1e-9 in double. The fixture
// computes RoPE as the trainer does (frequencies and angles in double, cos/sin times the attention
// factor rounded to fp32), as cpu/rope.hpp does.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "hf_fixture.hpp"
#include "support/gradient_runs.hpp"
#include "test_util.hpp"

namespace {

void check_against_fixture(const std::string& name) {
  CAPTURE(name);
  const auto fx = trainer_test::hf_fixture::load(std::string(OOMB_TRAINER_FIXTURES) + "/" + name);
  const auto& p = fx.weights;
  const auto& seq = fx.seq;
  const double ref_loss = fx.loss;
  const auto& grads_file = fx.gradients;
  CHECK(grads_file.tensors().size() == p.layout().entries().size());

  auto compare = [&](const std::string& path, const trainer_test::gradient_run& run) {
    CAPTURE(path);
    CHECK(std::abs(run.loss - ref_loss) <= 1e-9 * std::abs(ref_loss));
    double worst = 0;
    for (const auto& e : p.layout().entries()) {
      CAPTURE(e.name);
      const auto want = grads_file.read<double>(e.name, e.shape);
      const double err = trainer_test::rel_err(run.grads.data() + e.offset, want.data(), want.size());
      CHECK(err <= 1e-9);
      worst = std::max(worst, err);
    }
    MESSAGE(name, " ", path, ": loss ", run.loss, " (HF ", ref_loss, "), worst gradient error ", worst);
  };

  compare("full sequence", trainer_test::run_full_sequence(p, seq));

  oomb_trainer::chunk_options opt;
  opt.chunk = 16;
  opt.page = 16;
  opt.window_pages = 1;
  opt.offload = true;
  opt.near_pages = 2;
  compare("chunk-recurrent, offload", trainer_test::run_chunked(p, seq, opt));
}

}  // namespace

TEST_CASE("HF fixture: loss and every gradient of both paths match transformers in double (untied, GQA 2)") {
  check_against_fixture("hf_tiny");
}

TEST_CASE("HF fixture: loss and every gradient of both paths match transformers in double (tied, GQA 4)") {
  check_against_fixture("hf_tiny_tied");
}

TEST_CASE("HF fixture: loss and every gradient of both paths match transformers in double (head_dim 64, GQA 2)") {
  check_against_fixture("hf_d64");
}

TEST_CASE("HF fixture: llama with attention and MLP biases") { check_against_fixture("hf_llama"); }

TEST_CASE("HF fixture: mistral, head_dim 16 != hidden / heads") { check_against_fixture("hf_mistral"); }

TEST_CASE("HF fixture: qwen3 with q/k norms, head_dim 16, tied") { check_against_fixture("hf_qwen3"); }

TEST_CASE("HF fixture: RoPE scaling linear, yarn, llama3, longrope (long factors)") {
  for (const char* name : {"hf_rope_linear", "hf_rope_yarn", "hf_rope_llama3", "hf_rope_longrope"})
    check_against_fixture(name);
}
