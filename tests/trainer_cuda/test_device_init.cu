// gpu::init_hf (cuda/device_init.cuh): init_hf's distribution on the GPU, tensor by
// tensor (norms 1, biases 0, matrices N(0, 0.02^2) drawn at their layout offsets, tied and
// untied), the same bits with or without a compute copy, the compute copy = bf16(master).
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "trainer/cuda/device_init.cuh"

#include "device_util.cuh"
#include "model_util.hpp"

namespace {

using namespace ops_test;
namespace gpu = oomb_trainer::gpu;

template <class X>
std::vector<X> download(const gpu::device_params<X>& p) {
  OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "test sync");
  std::vector<X> h(p.size());
  OOMB_CUDA_CHECK(cudaMemcpy(h.data(), p.data(), h.size() * sizeof(X), cudaMemcpyDeviceToHost), "test download");
  return h;
}

}  // namespace

TEST_CASE("gpu::init_hf: norms 1, biases 0, matrices N(0, 0.02^2) at their layout offsets, padding 0") {
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    oomb_trainer::model_config c = trainer_test::tiny_config(/*hq=*/4, /*hkv=*/2, tied, /*d=*/64, /*layers=*/2, /*vocab=*/1000);
    c.intermediate_size = 384;
    test_stream stream;
    gpu::device_params<float> master(c);
    gpu::device_params<bf16> compute(c);
    const std::uint64_t seed = 1234;
    gpu::init_hf(master, compute, seed, stream.view());
    const std::vector<float> m = download(master);
    const std::vector<bf16> w = download(compute);

    // One matrix drawn alone at its offset: the same bits as inside the whole model.
    const oomb_trainer::param_layout& layout = master.layout();
    const oomb_trainer::param_entry& q = layout.entries()[layout.layer_entry(1, oomb_trainer::layer_tensor::q_w)];  // layer 1 q_proj
    device_array<float> alone(q.numel);
    device_array<bf16> alone_w(q.numel);
    gpu::ops::normal_init(std::int64_t(q.numel), q.offset, seed, 0.02f, alone.get(), alone_w.get(), stream.view());
    const std::vector<float> a = alone.download();
    CHECK(trainer_test::same_bits(a, std::vector<float>(m.begin() + std::ptrdiff_t(q.offset),
                                                        m.begin() + std::ptrdiff_t(q.offset + q.numel))));

    std::vector<bool> covered(m.size(), false);
    double sum = 0, sq = 0, count = 0;
    for (const auto& e : layout.entries()) {
      const bool norm = e.name.find("norm") != std::string::npos;
      const bool bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
      bool ok = true;
      for (std::size_t i = e.offset; i < e.offset + e.numel; ++i) {
        covered[i] = true;
        if (norm) ok = ok && m[i] == 1.0f;
        else if (bias) ok = ok && m[i] == 0.0f;
        else {
          ok = ok && std::isfinite(m[i]) && std::fabs(m[i]) < 6 * 0.02f;
          sum += m[i];
          sq += double(m[i]) * m[i];
          ++count;
        }
      }
      CHECK_MESSAGE(ok, e.name);
    }
    CHECK(layout.tied() == tied);
    bool padding_zero = true, rounded = true;
    for (std::size_t i = 0; i < m.size(); ++i) {
      padding_zero = padding_zero && (covered[i] || m[i] == 0.0f);
      rounded = rounded && w[i] == bf16(m[i]);
    }
    CHECK(padding_zero);
    CHECK(rounded);
    const double mean = sum / count, sd = std::sqrt(sq / count - mean * mean);
    MESSAGE("matrices (" << count << " values): mean " << mean << ", std " << sd);
    CHECK(std::fabs(mean) < 5 * 0.02 / std::sqrt(count));
    CHECK(std::fabs(sd / 0.02 - 1) < 0.01);

    // Master alone (no compute copy: drawn through a scratch) gives the same bits; another seed does not.
    gpu::device_params<float> again(c), other(c);
    gpu::init_hf(again, seed, stream.view());
    gpu::init_hf(other, seed + 1, stream.view());
    CHECK(trainer_test::same_bits(download(again), m));
    const std::vector<float> o = download(other);
    std::size_t equal = 0;
    for (std::size_t i = q.offset; i < q.offset + q.numel; ++i) equal += o[i] == m[i];
    CHECK(equal < 8);
  }
}
