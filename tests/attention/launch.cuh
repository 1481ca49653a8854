// oomb tests — the attention layer's plan + launch in one call, and launches of a chosen kernel
// configuration, split and order, for the tests and the benchmark (the trainer plans explicitly).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <oomb/attention/attention.cuh>

namespace attn_test {

namespace gpu = oomb::attention;

inline const gpu::device_facts& facts() { return gpu::current_device_facts(); }

/// The public entries through a plan made for this call.
template <class O>
void forward(const gpu::attention_args& a, O* o, float* lse, cudaStream_t stream,
             gpu::kernel_choice kernels = gpu::kernel_choice::automatic) {
  gpu::forward(gpu::plan_forward(gpu::call_shape::of(a), facts(), {kernels}), a, o, lse, stream);
}
inline void backward(const gpu::attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                     float* dq, float* dk, float* dv, oomb::window_grad_view<float> dpast, cudaStream_t stream,
                     gpu::backward_workspace ws = {}, gpu::kernel_choice kernels = gpu::kernel_choice::automatic) {
  gpu::backward(gpu::plan_backward(gpu::call_shape::of(a, dq), facts(), {kernels}), a, lse, delta, d_o, dq, dk, dv,
                dpast, ws, stream);
}
/// The workspace the public backward wants for a (a 16-byte aligned dq).
inline std::int64_t workspace_ints(const gpu::attention_args& a) {
  return gpu::plan_backward(gpu::call_shape::of(a), facts()).workspace_ints;
}

/// The public backward planned deterministic (plan_options::deterministic; order 2: the KV heads
/// in turn), with a workspace of the plan's size allocated around the call (synchronous: for tests).
inline void deterministic_backward(const gpu::attention_args& a, const float* lse, const float* delta,
                                   const oomb::bf16* d_o, float* dq, float* dk, float* dv,
                                   oomb::window_grad_view<float> dpast, cudaStream_t stream, int order = 0) {
  gpu::plan_options o;
  o.deterministic = true;
  o.order = order;
  const auto plan = gpu::plan_backward(gpu::call_shape::of(a, dq), facts(), o);
  std::int32_t* ws = nullptr;
  if (cudaMalloc(&ws, static_cast<std::size_t>(plan.workspace_ints) * sizeof(std::int32_t) + 4) != cudaSuccess)
    OOMB_FAIL(oomb::cuda_error, "deterministic_backward: cudaMalloc");
  try {
    gpu::backward(plan, a, lse, delta, d_o, dq, dk, dv, dpast, {ws, plan.workspace_ints}, stream);
  } catch (...) {
    cudaFree(ws);
    throw;
  }
  if (cudaFree(ws) != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "deterministic_backward: cudaFree");
}

/// Plans configuration Cfg with a forced split (0: the plan's) and order.
template <class Cfg>
gpu::plan_options forced(int split, int order = 0) {
  gpu::plan_options o;
  o.config = gpu::detail::config_of<Cfg>();
  o.split = split;
  o.order = order;
  return o;
}

template <class Cfg, class O>
void launch_forward(const gpu::attention_args& a, O* o, float* lse, cudaStream_t stream, int split = 0) {
  gpu::detail::launch_forward<Cfg>(gpu::plan_forward(gpu::call_shape::of(a), facts(), forced<Cfg>(split)), a, o, lse,
                                   stream);
}
template <class Cfg, class O>
void launch_forward_sm90(const gpu::attention_args& a, O* o, float* lse, cudaStream_t stream, int split = 0) {
  gpu::detail::launch_forward_sm90<Cfg>(gpu::plan_forward(gpu::call_shape::of(a), facts(), forced<Cfg>(split)), a, o,
                                        lse, stream);
}
template <class Cfg>
void launch_backward(const gpu::attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                     float* dq, float* dk, float* dv, oomb::window_grad_view<float> dpast, cudaStream_t stream,
                     int split = 0, int order = 0) {
  gpu::detail::launch_backward<Cfg>(gpu::plan_backward(gpu::call_shape::of(a, dq), facts(), forced<Cfg>(split, order)),
                                    a, lse, delta, d_o, dq, dk, dv, dpast, stream);
}
template <class Cfg, bool Trace = false>
void launch_backward_sm90(const gpu::attention_args& a, const float* lse, const float* delta, const oomb::bf16* d_o,
                          float* dq, float* dk, float* dv, oomb::window_grad_view<float> dpast, cudaStream_t stream,
                          int split = 0, int order = 0, gpu::backward_workspace ws = {},
                          std::uint64_t* trace = nullptr) {
  gpu::detail::launch_backward_sm90<Cfg, Trace>(
      gpu::plan_backward(gpu::call_shape::of(a, dq), facts(), forced<Cfg>(split, order)), a, lse, delta, d_o, dq, dk,
      dv, dpast, stream, ws, trace);
}

}  // namespace attn_test
