// oomb trainer — a model's random initialisation on the GPU: the distribution of the host's
// init_hf (model/params.hpp: matrices and the embedding ~ N(0, 0.02^2), biases 0, norm weights
// 1; tied embeddings have no lm_head tensor), drawn by normal_init (cuda/ops/normal_init.cuh).
// SPDX-License-Identifier: Apache-2.0
//
// Each tensor draws the Philox counters of its own place in the layout (index = its offset in
// param_layout), so a weight depends only on the seed, the config and its index: not on the launch
// shape, not on how the work is split into calls. The host's init_hf draws other numbers
// (mt19937_64 in order; the README's numbers rest on it): a GPU-initialised run and a CPU one start
// from the same distribution, not the same weights (start both from --init for that).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

#include "trainer/cuda/device_buffer.cuh"
#include "trainer/cuda/device_params.cuh"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/normal_init.cuh"

namespace oomb_trainer::gpu {

namespace detail {

/// What init_hf puts in the tensor called `name`.
enum class init_kind { normal, ones, zeros };
inline init_kind init_kind_of(const std::string& name) {
  if (name.find("norm") != std::string::npos) return init_kind::ones;
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return init_kind::zeros;
  return init_kind::normal;
}

/// bf16 elements normal_init writes beside the master per call when the caller keeps no compute
/// copy: a tensor larger than this is drawn in pieces (the same bits, by the counter scheme).
constexpr std::int64_t init_scratch_elements = std::int64_t(1) << 22;

}  // namespace detail

/// master = init_hf's distribution from `seed` (padding between tensors zero). Enqueued on
/// `stream`, asynchronous (a 7.6B model: milliseconds); the bf16 scratch normal_init writes beside
/// the master is 8 MiB, freed when the call returns (cudaFree waits for the device).
inline void init_hf(device_params<float>& master, std::uint64_t seed, oomb::cuda_stream_view stream,
                       double std_dev = 0.02) {
  const param_layout& layout = master.layout();
  device_buffer<oomb::bf16> scratch(static_cast<std::size_t>(detail::init_scratch_elements));
  OOMB_CUDA_CHECK(cudaMemsetAsync(master.data(), 0, master.size() * sizeof(float), stream.get()), "init_hf: zeroing");
  for (const param_entry& e : layout.entries()) {
    const auto n = static_cast<std::int64_t>(e.numel);
    float* p = master.data() + e.offset;
    switch (detail::init_kind_of(e.name)) {
      case detail::init_kind::zeros: break;
      case detail::init_kind::ones:
        ops::fill(n, 1.0f, p, stream);
        break;
      case detail::init_kind::normal:
        for (std::int64_t i = 0; i < n; i += detail::init_scratch_elements) {
          const std::int64_t piece = std::min(detail::init_scratch_elements, n - i);
          ops::normal_init(piece, e.offset + static_cast<std::uint64_t>(i), seed, static_cast<float>(std_dev), p + i,
                           scratch.data(), stream);
        }
        break;
    }
  }
}

/// compute = bf16(master), element by element (rounded to nearest even); enqueued on `stream`.
inline void refresh_compute(const device_params<float>& master, device_params<oomb::bf16>& compute,
                            oomb::cuda_stream_view stream) {
  OOMB_EXPECTS(master.size() == compute.size(), "refresh_compute: master of ", master.size(), " elements, compute of ",
               compute.size());
  ops::convert(static_cast<std::int64_t>(master.size()), master.data(), compute.data(), stream);
}

/// init_hf of the master, then the bf16 compute copy from it.
inline void init_hf(device_params<float>& master, device_params<oomb::bf16>& compute, std::uint64_t seed,
                       oomb::cuda_stream_view stream, double std_dev = 0.02) {
  init_hf(master, seed, stream, std_dev);
  refresh_compute(master, compute, stream);
}

}  // namespace oomb_trainer::gpu
