// One HF fixture of tests/trainer/fixtures (tools/fixtures/make_hf_fixture.py) loaded for a test:
// config, weights (double), the token sequence, the float64 loss and the gradients file.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/data/targets.hpp"
#include "trainer/io/checkpoint.hpp"
#include "trainer/io/config.hpp"
#include "trainer/io/safetensors.hpp"
#include "trainer/io/tokens.hpp"
#include "trainer/model/params.hpp"

namespace trainer_test {

struct hf_fixture {
  oomb_trainer::model_config config;
  oomb_trainer::model_params<double> weights;
  oomb_trainer::sequence seq;
  double loss = 0;  ///< transformers' float64 loss
  oomb_trainer::safetensors_file gradients;

  /// The fixture in folder `dir`.
  static hf_fixture load(const std::string& dir) {
    const auto cfg = oomb_trainer::load_model_config(dir + "/config.json");
    oomb_trainer::model_params<double> p(cfg);
    oomb_trainer::load_weights(dir, p.named());
    const auto reader = oomb_trainer::token_reader::open(dir + "/tokens.bin", static_cast<std::uint32_t>(cfg.vocab_size));
    oomb_trainer::sequence seq;
    seq.tokens = reader.read(0, reader.size());
    std::ifstream in(dir + "/reference.json");
    const double loss = nlohmann::json::parse(in).at("loss").get<double>();
    return {cfg, std::move(p), std::move(seq), loss, oomb_trainer::safetensors_file::open(dir + "/gradients.safetensors")};
  }
};

}  // namespace trainer_test
