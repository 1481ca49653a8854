// oomb trainer — AdamW fused on the GPU: one pass reads the fp32 gradient and updates the fp32
// master weights and moments, and writes the bf16 compute weights, as optim/adamw.hpp (PyTorch's
// torch.optim.AdamW). The step's coefficients are computed on the host in double (the step count
// is host state, so no device value is read back); the gradient-clipping factor is read from
// device memory (grad_norm.cuh writes it), so clipping needs no host synchronisation.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>

#include "trainer/cuda/ops/common.cuh"
#include "trainer/optim/adamw.hpp"

namespace oomb_trainer::gpu::ops {

/// The per-step scalars of the update (see optim/adamw.hpp), in fp32.
struct adamw_coefficients {
  float step_size = 0;     ///< lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 0;  ///< 1 / sqrt(1 - beta2^t)
  float b1 = 0, one_minus_b1 = 0, b2 = 0, one_minus_b2 = 0, eps = 0;
  float shrink = 1;        ///< 1 - lr * weight_decay, or 1 for tensors that do not decay
};

/// Coefficients of step t (1-based, the count after this step) at learning rate lr; `decay` says
/// whether the tensors updated with them decay (optim/adamw.hpp: rank >= 2, or decay_vectors).
inline adamw_coefficients adamw_step_coefficients(const adamw_options& o, double lr, std::int64_t t, bool decay) {
  OOMB_EXPECTS(std::isfinite(lr) && lr >= 0, "adamw: learning rate must be finite and >= 0, got ", lr);
  OOMB_EXPECTS(t >= 1, "adamw: the step count starts at 1, got ", t);
  const double bc1 = 1.0 - std::pow(o.beta1, double(t)), bc2 = 1.0 - std::pow(o.beta2, double(t));
  adamw_coefficients c;
  c.step_size = static_cast<float>(lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.b1 = static_cast<float>(o.beta1);
  c.one_minus_b1 = static_cast<float>(1.0 - o.beta1);
  c.b2 = static_cast<float>(o.beta2);
  c.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
  c.eps = static_cast<float>(o.eps);
  c.shrink = decay && o.weight_decay != 0.0 ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
  return c;
}

namespace detail {

// A template so two translation units may include this header (one definition per instantiation).
template <int = 0>
__global__ void adamw_kernel(std::int64_t n, float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ grad, bf16* __restrict__ compute, adamw_coefficients c,
                             const float* __restrict__ grad_scale) {
  const float gs = grad_scale != nullptr ? *grad_scale : 1.0f;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * gs;
    float pi = p[i] * c.shrink;
    const float mi = c.b1 * m[i] + c.one_minus_b1 * g;
    const float vi = c.b2 * v[i] + c.one_minus_b2 * (g * g);
    pi -= c.step_size * mi / (sqrtf(vi) * c.inv_sqrt_bc2 + c.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (compute != nullptr) compute[i] = bf16(pi);
  }
}

}  // namespace detail

/// One AdamW update of n elements (a tensor, or a run of tensors that share `c`'s decay): master
/// weights p, moments m and v (fp32, updated in place), gradient grad (fp32) times *grad_scale
/// (device; null: 1), and the bf16 compute copy (null: none) written from the new p.
inline void adamw_update(std::int64_t n, float* p, float* m, float* v, const float* grad, bf16* compute,
                         const adamw_coefficients& c, const float* grad_scale, stream_view stream) {
  OOMB_EXPECTS(n > 0, "adamw_update: n must be positive, got ", n);
  OOMB_EXPECTS(p != nullptr && m != nullptr && v != nullptr && grad != nullptr, "adamw_update: null pointer");
  detail::adamw_kernel<><<<detail::grid_for(n, 256, 4096), 256, 0, stream.get()>>>(n, p, m, v, grad, compute, c, grad_scale);
  OOMB_OPS_CHECK_LAUNCH("adamw_update");
}

}  // namespace oomb_trainer::gpu::ops
