// Both training paths against the HF fixtures (tools/fixtures/make_hf_fixture.py: a random
// transformers Qwen2ForCausalLM with GQA and perturbed biases/norms, loss and float64 gradients):
// loss and every gradient tensor, norm-wise <= 1e-9 in double. The fixture computes RoPE as the
// trainer does (angles in double, cos/sin rounded to fp32), as rope.hpp does.
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
