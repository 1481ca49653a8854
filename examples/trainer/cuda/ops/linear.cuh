// oomb trainer — a linear layer's three GEMMs (forward, dX, dW) on row-major tensors, as
// cpu/linear.hpp: y = x W^T + b with W in the HF layout [out][in]; and the bias gradient.
// SPDX-License-Identifier: Apache-2.0
//
// Row-major [r][c] is column-major c x r, so (cuBLAS terms, m x n outputs):
//   forward  y^T  [out x n]  = W^T'  x^T      A = W (stored in x out, transposed), B = x
//   dX       dx^T [in x n]  += W     dy^T     A = W, B = dy
//   dW       dW^T [in x out] += x^T  dy       A = x, B = dy (stored out x n, transposed)
#pragma once

#include <cstdint>

#include "trainer/cuda/ops/common.cuh"
#include "trainer/cuda/ops/gemm.cuh"

namespace oomb_trainer::gpu::ops {

namespace detail {

inline void check_linear(const char* what, std::int64_t n, std::int32_t in, std::int32_t out) {
  OOMB_EXPECTS(n > 0 && in > 0 && out > 0, what, ": n, in, out must be positive, got ", n, ", ", in, ", ", out);
}

template <class E>
constexpr bool is_f32() {
  static_assert(is_element_v<E>, "linear: outputs are bf16 or float");
  return std::is_same_v<E, float>;
}

}  // namespace detail

/// y [n][out] = x [n][in] W^T + b (b [out] may be null; a bias needs a bf16 y). Y: bf16 or float.
template <class Y>
void linear_forward(gemm_context& ctx, std::int64_t n, std::int32_t in, std::int32_t out, const bf16* x,
                    const bf16* W, const bf16* b, Y* y, stream_view stream) {
  detail::check_linear("linear_forward", n, in, out);
  matmul_args a;
  a.trans_a = true;
  a.m = out, a.n = n, a.k = in;
  a.a = W, a.lda = in;
  a.b = x, a.ldb = in;
  a.d = y, a.d_f32 = detail::is_f32<Y>(), a.ldd = out;
  a.bias = b;
  ctx.matmul(a, stream);
}

/// dx [n][in] = dy [n][out] W, or += when `accumulate`. DX: bf16 or float.
template <class DX>
void linear_backward_input(gemm_context& ctx, std::int64_t n, std::int32_t in, std::int32_t out, const bf16* dy,
                           const bf16* W, DX* dx, bool accumulate, stream_view stream) {
  detail::check_linear("linear_backward_input", n, in, out);
  matmul_args a;
  a.m = in, a.n = n, a.k = out;
  a.a = W, a.lda = in;
  a.b = dy, a.ldb = out;
  a.d = dx, a.d_f32 = detail::is_f32<DX>(), a.ldd = in;
  a.beta = accumulate ? 1.0f : 0.0f;
  ctx.matmul(a, stream);
}

/// dW [out][in] += dy^T x, in fp32.
inline void linear_backward_weight(gemm_context& ctx, std::int64_t n, std::int32_t in, std::int32_t out,
                                   const bf16* x, const bf16* dy, float* dW, stream_view stream) {
  detail::check_linear("linear_backward_weight", n, in, out);
  matmul_args a;
  a.trans_b = true;
  a.m = in, a.n = out, a.k = n;
  a.a = x, a.lda = in;
  a.b = dy, a.ldb = out;
  a.d = dW, a.d_f32 = true, a.ldd = in;
  a.beta = 1.0f;
  ctx.matmul(a, stream);
}

/// db [out] += sum_t dy [t][out] (fp32 sums, deterministic). G: bf16 or float.
template <class G>
void bias_backward(std::int64_t n, std::int32_t out, const G* dy, float* db, stream_view stream) {
  static_assert(is_element_v<G>, "bias_backward: dy is bf16 or float");
  detail::check_linear("bias_backward", n, 1, out);
  OOMB_EXPECTS(dy != nullptr && db != nullptr, "bias_backward: null pointer");
  detail::column_sum_add(n, out, dy, db, stream, "bias_backward");
}

}  // namespace oomb_trainer::gpu::ops
