// oomb tests — a plain fp32 GPU attention that materialises the score matrix, one query head at a
// time, through small tiled fp32 GEMMs. It is slow but obviously right; tests check it against the
// CPU reference on small shapes and then use it as the oracle for the benchmark's large shapes.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include <oomb/attention/args.hpp>

namespace attn_test {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

namespace ref {

using oomb::attention::attention_args;

__device__ __forceinline__ float bf(const oomb::bf16 x) { return __uint_as_float(std::uint32_t(x.bits) << 16); }

/// The window as the reference sees it: slot j of the window is key position first_page*P + j.
struct window {
  attention_args a;
  std::int32_t len;    // valid slots
  std::int32_t log_p;
  std::int32_t kvh;    // current KV head
  std::int32_t h;      // current query head

  __device__ std::int32_t id(std::int32_t j) const { return a.kv.table.page(0, j >> log_p); }
  __device__ std::int64_t pos(std::int32_t j) const { return (std::int64_t(a.first_page) << log_p) + j; }
  /// The CPU reference's rule: causal, and a past page (ending at or before q_start) only if the
  /// query's tile selected it.
  __device__ bool visible(std::int32_t i, std::int32_t j) const {
    if (j >= len || pos(j) > a.q_start + i) return false;
    if (a.tile_indptr == nullptr) return true;
    const std::int32_t pi = j >> log_p;
    const std::int64_t logical = std::int64_t(a.first_page) + pi;
    const std::int64_t start = logical << log_p;
    if (start + a.kv.table.page_len(0, pi) > a.q_start) return true;
    const std::int32_t t = i / a.tile;
    for (std::int32_t k = a.tile_indptr[t]; k < a.tile_indptr[t + 1]; ++k)
      if (a.tile_pages[k] == logical) return true;
    return false;
  }
  __device__ float k(std::int32_t j, std::int32_t x) const {
    return j < len ? bf(a.kv.pool.k(id(j), j & ((1 << log_p) - 1), kvh)[x]) : 0.0f;
  }
  __device__ float v(std::int32_t j, std::int32_t x) const {
    return j < len ? bf(a.kv.pool.v(id(j), j & ((1 << log_p) - 1), kvh)[x]) : 0.0f;
  }
  __device__ float q(std::int32_t i, std::int32_t x) const { return bf(a.q[(std::int64_t(i) * a.hq + h) * a.d + x]); }
};

/// C(m, n) <- epilogue(m, n, sum_k A(m, k) B(k, n)), 64x64 tiles, fp32.
template <class A, class B, class C>
__global__ void gemm(std::int32_t M, std::int32_t N, std::int32_t K, A a, B b, C c) {
  __shared__ float As[16][65];
  __shared__ float Bs[16][65];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int32_t m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (std::int32_t k0 = 0; k0 < K; k0 += 16) {
    for (int e = threadIdx.x; e < 16 * 64; e += 256) {
      const int kk = e % 16, mm = e / 16;  // k fastest: rows of Q, K, dO, P are contiguous in k
      As[kk][mm] = (m0 + mm < M && k0 + kk < K) ? a(m0 + mm, k0 + kk) : 0.0f;
      const int nn = e % 64, kb = e / 64;  // n fastest: V, Q, dO as B are contiguous in n
      Bs[kb][nn] = (n0 + nn < N && k0 + kb < K) ? b(k0 + kb, n0 + nn) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < 16; ++kk)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += As[kk][ty + 16 * i] * Bs[kk][tx + 16 * j];
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const std::int32_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) c(m, n, acc[i][j]);
    }
}

struct q_op { window w; __device__ float operator()(std::int32_t i, std::int32_t x) const { return w.q(i, x); } };
struct kt_op { window w; __device__ float operator()(std::int32_t x, std::int32_t j) const { return w.k(j, x); } };
struct vt_op { window w; __device__ float operator()(std::int32_t x, std::int32_t j) const { return w.v(j, x); } };
struct k_op { window w; __device__ float operator()(std::int32_t j, std::int32_t x) const { return w.k(j, x); } };
struct v_op { window w; __device__ float operator()(std::int32_t j, std::int32_t x) const { return w.v(j, x); } };
struct rows_op {  // [i][x] of a [rows][hq][d] bf16 tensor for head h
  const oomb::bf16* t; std::int32_t hq, d, h;
  __device__ float operator()(std::int32_t i, std::int32_t x) const { return bf(t[(std::int64_t(i) * hq + h) * d + x]); }
};
struct mat_op { const float* m; std::int64_t ld; __device__ float operator()(std::int32_t r, std::int32_t c) const { return m[r * ld + c]; } };
struct mat_t_op { const float* m; std::int64_t ld; __device__ float operator()(std::int32_t r, std::int32_t c) const { return m[c * ld + r]; } };

struct store_scores {  // S = scale * acc where visible, -inf elsewhere
  window w; float* s; std::int64_t ld;
  __device__ void operator()(std::int32_t i, std::int32_t j, float acc) const {
    s[i * ld + j] = w.visible(i, j) ? w.a.scale * acc : -INFINITY;
  }
};
struct store_o {
  float* o; std::int32_t hq, d, h;
  __device__ void operator()(std::int32_t i, std::int32_t x, float acc) const { o[(std::int64_t(i) * hq + h) * d + x] = acc; }
};
struct add_rows {  // t[(i*hq+h)*d + x] += alpha * acc
  float* t; std::int32_t hq, d, h; float alpha;
  __device__ void operator()(std::int32_t i, std::int32_t x, float acc) const { t[(std::int64_t(i) * hq + h) * d + x] += alpha * acc; }
};
struct add_mat {
  float* m; std::int64_t ld; float alpha;
  __device__ void operator()(std::int32_t r, std::int32_t c, float acc) const { m[r * ld + c] += alpha * acc; }
};
struct store_ds {  // dS = P (dP - delta)
  const float* p; float* ds; std::int64_t ld; const float* delta;  // delta of this head, [sq]
  __device__ void operator()(std::int32_t i, std::int32_t j, float acc) const {
    ds[i * ld + j] = p[i * ld + j] * (acc - delta[i]);
  }
};

/// Row softmax of S in place: lse[i] (natural log, -inf for an empty row), P = exp(S - lse).
/// `fixed_lse` given: P = exp(S - fixed_lse[i]) instead (the backward recomputes P from the global lse).
__global__ void softmax_rows(float* s, std::int64_t ld, std::int32_t n, float* lse, const float* fixed_lse) {
  __shared__ float red[32];
  float* row = s + blockIdx.x * ld;
  float l;
  if (fixed_lse) {
    l = fixed_lse[blockIdx.x];
  } else {
    float m = -INFINITY;
    for (std::int32_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, row[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float sum = 0.0f;
    if (m != -INFINITY)
      for (std::int32_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(row[j] - m);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
    __syncthreads();
    sum = 0.0f;
    for (int w = 0; w < int(blockDim.x / 32); ++w) sum += red[w];
    l = m == -INFINITY ? -INFINITY : m + logf(sum);
    if (threadIdx.x == 0) lse[blockIdx.x] = l;
  }
  for (std::int32_t j = threadIdx.x; j < n; j += blockDim.x) row[j] = l == -INFINITY ? 0.0f : expf(row[j] - l);
}

/// delta[h][i] = sum_x dO * O, fp32.
__global__ void delta_rows(std::int32_t sq, std::int32_t hq, std::int32_t d, const float* o, const oomb::bf16* d_o, float* delta) {
  const std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= std::int64_t(sq) * hq) return;
  float acc = 0.0f;
  for (std::int32_t x = 0; x < d; ++x) acc += o[r * d + x] * bf(d_o[r * d + x]);
  delta[(r % hq) * sq + r / hq] = acc;
}

/// Adds the window's accumulated dK/dV ([len][d] of one KV head) into own rows or gradient pages.
__global__ void scatter_kv(window w, const float* dk, const float* dv, std::int32_t d, float* dk_own, float* dv_own,
                           oomb::window_grad_view<float> dpast) {
  const std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= std::int64_t(w.len) * d) return;
  const std::int32_t j = static_cast<std::int32_t>(e / d), x = static_cast<std::int32_t>(e % d);
  const std::int64_t pos = w.pos(j);
  if (pos >= w.a.q_start) {
    const std::int64_t row = pos - w.a.q_start;
    if (row >= w.a.sq) return;
    dk_own[(row * w.a.hkv + w.kvh) * d + x] += dk[e];
    dv_own[(row * w.a.hkv + w.kvh) * d + x] += dv[e];
  } else {
    const std::int32_t entry = j >> w.log_p, t = j & ((1 << w.log_p) - 1);
    if (dpast.grad_page[entry] < 0) return;  // a page the window does not read: nothing was added
    dpast.dk(entry, t, w.kvh)[x] += dk[e];
    dpast.dv(entry, t, w.kvh)[x] += dv[e];
  }
}

inline dim3 grid_for(std::int32_t M, std::int32_t N) { return dim3((N + 63) / 64, (M + 63) / 64); }

/// Scratch a reference call needs: two [sq][window_len] fp32 matrices and [len][d] x 2 per KV head.
struct workspace {
  float* s = nullptr;
  float* p2 = nullptr;
  float* dkw = nullptr;
  float* dvw = nullptr;
  float* lse_h = nullptr;
  workspace(std::int64_t sq, std::int64_t len, std::int64_t d) {
    cuda_check(cudaMalloc(&s, sizeof(float) * sq * (len + 1)), "ref workspace");
    cuda_check(cudaMalloc(&p2, sizeof(float) * sq * (len + 1)), "ref workspace");
    cuda_check(cudaMalloc(&dkw, sizeof(float) * (len + 1) * d), "ref workspace");
    cuda_check(cudaMalloc(&dvw, sizeof(float) * (len + 1) * d), "ref workspace");
    cuda_check(cudaMalloc(&lse_h, sizeof(float) * sq), "ref workspace");
  }
  ~workspace() {
    cudaFree(s);
    cudaFree(p2);
    cudaFree(dkw);
    cudaFree(dvw);
    cudaFree(lse_h);
  }
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
};

inline window make_window(const attention_args& a, std::int32_t window_len) {
  window w{a, window_len, 0, 0, 0};
  while ((1 << w.log_p) < a.kv.pool.page_size) ++w.log_p;
  return w;
}

/// Forward: o [sq][hq][d] fp32, lse [hq][sq]. window_len: the window's key count (host-known).
inline void forward(const attention_args& a, std::int32_t window_len, float* o, float* lse) {
  workspace ws(a.sq, window_len, a.d);
  window w = make_window(a, window_len);
  const std::int32_t group = a.hq / a.hkv;
  const std::int64_t ld = window_len;
  for (std::int32_t h = 0; h < a.hq; ++h) {
    w.h = h;
    w.kvh = h / group;
    if (window_len > 0) {
      gemm<<<grid_for(a.sq, window_len), 256>>>(a.sq, window_len, a.d, q_op{w}, kt_op{w}, store_scores{w, ws.s, ld});
      softmax_rows<<<a.sq, 256>>>(ws.s, ld, window_len, lse + std::int64_t(h) * a.sq, nullptr);
      gemm<<<grid_for(a.sq, a.d), 256>>>(a.sq, a.d, window_len, mat_op{ws.s, ld}, v_op{w}, store_o{o, a.hq, a.d, h});
    } else {
      cuda_check(cudaMemset(o, 0, sizeof(float) * a.sq * a.hq * a.d), "ref forward");
      softmax_rows<<<a.sq, 32>>>(ws.s, 1, 0, lse + std::int64_t(h) * a.sq, nullptr);
    }
    cuda_check(cudaGetLastError(), "ref forward");
  }
  cuda_check(cudaDeviceSynchronize(), "ref forward");
}

/// Backward of one window with the global o (fp32) and lse; adds into dq, dk_own, dv_own, dpast.
inline void backward(const attention_args& a, std::int32_t window_len, const float* o, const float* lse,
                     const oomb::bf16* d_o, float* dq, float* dk_own, float* dv_own, oomb::window_grad_view<float> dpast) {
  if (window_len == 0) return;
  workspace ws(a.sq, window_len, a.d);
  float* delta = nullptr;
  cuda_check(cudaMalloc(&delta, sizeof(float) * a.sq * a.hq), "ref backward");
  delta_rows<<<(a.sq * a.hq + 255) / 256, 256>>>(a.sq, a.hq, a.d, o, d_o, delta);
  window w = make_window(a, window_len);
  const std::int32_t group = a.hq / a.hkv;
  const std::int64_t ld = window_len;
  for (std::int32_t kvh = 0; kvh < a.hkv; ++kvh) {
    cuda_check(cudaMemset(ws.dkw, 0, sizeof(float) * window_len * a.d), "ref backward");
    cuda_check(cudaMemset(ws.dvw, 0, sizeof(float) * window_len * a.d), "ref backward");
    for (std::int32_t r = 0; r < group; ++r) {
      const std::int32_t h = kvh * group + r;
      w.h = h;
      w.kvh = kvh;
      gemm<<<grid_for(a.sq, window_len), 256>>>(a.sq, window_len, a.d, q_op{w}, kt_op{w}, store_scores{w, ws.s, ld});
      softmax_rows<<<a.sq, 256>>>(ws.s, ld, window_len, nullptr, lse + std::int64_t(h) * a.sq);
      gemm<<<grid_for(a.sq, window_len), 256>>>(a.sq, window_len, a.d, rows_op{d_o, a.hq, a.d, h}, vt_op{w},
                                                store_ds{ws.s, ws.p2, ld, delta + std::int64_t(h) * a.sq});
      gemm<<<grid_for(a.sq, a.d), 256>>>(a.sq, a.d, window_len, mat_op{ws.p2, ld}, k_op{w},
                                         add_rows{dq, a.hq, a.d, h, a.scale});
      gemm<<<grid_for(window_len, a.d), 256>>>(window_len, a.d, a.sq, mat_t_op{ws.p2, ld}, q_op{w},
                                               add_mat{ws.dkw, a.d, a.scale});
      gemm<<<grid_for(window_len, a.d), 256>>>(window_len, a.d, a.sq, mat_t_op{ws.s, ld}, rows_op{d_o, a.hq, a.d, h},
                                               add_mat{ws.dvw, a.d, 1.0f});
      cuda_check(cudaGetLastError(), "ref backward");
    }
    w.kvh = kvh;
    scatter_kv<<<(std::int64_t(window_len) * a.d + 255) / 256, 256>>>(w, ws.dkw, ws.dvw, a.d, dk_own, dv_own, dpast);
    cuda_check(cudaGetLastError(), "ref backward");
  }
  cuda_check(cudaDeviceSynchronize(), "ref backward");
  cudaFree(delta);
}

}  // namespace ref
}  // namespace attn_test
