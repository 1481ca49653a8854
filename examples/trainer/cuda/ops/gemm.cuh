// oomb trainer — bf16 GEMMs with fp32 accumulation through cuBLASLt.
// SPDX-License-Identifier: Apache-2.0
//
// gemm_context owns a cuBLASLt handle and a device workspace (both made once, in its constructor)
// and caches, per problem (shape, transposes, output type, epilogue, pointer alignments), the
// descriptors and the algorithm cuBLASLt's heuristic chose, so a training step makes no
// descriptor and asks no heuristic after its first occurrence. A call only enqueues cublasLtMatmul
// on the given stream. One context serves one stream at a time (the workspace is shared by its
// calls) and is not thread-safe: give each stream that runs GEMMs concurrently its own context.
//
// matmul() speaks cuBLAS's column-major language; linear.cuh maps a layer's row-major forward,
// dX and dW onto it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include <cublasLt.h>

#include "trainer/cuda/ops/common.cuh"

namespace oomb_trainer::gpu::ops {

/// One column-major matmul: D [m][n] = alpha * op(A) op(B) + beta * D (+ bias[m] per column when
/// bias is not null). op(A) is m x k (A stored k x m when trans_a), op(B) is k x n (B stored n x k
/// when trans_b). A, B and bias are bf16; D is bf16 or fp32 (d_f32); the accumulation is fp32.
struct matmul_args {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const bf16* a = nullptr;
  std::int64_t lda = 0;
  const bf16* b = nullptr;
  std::int64_t ldb = 0;
  void* d = nullptr;
  bool d_f32 = false;
  std::int64_t ldd = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  ///< 1 accumulates into D (D is also cuBLAS's C)
  const bf16* bias = nullptr;  ///< bf16 bias in the epilogue; needs a bf16 D and beta == 0
};

class gemm_context {
 public:
  /// 32 MiB: what cuBLASLt's Hopper kernels ask for at most in practice (NVIDIA's guidance for sm_90).
  static constexpr std::size_t default_workspace_bytes = std::size_t(32) << 20;

  explicit gemm_context(std::size_t workspace_bytes = default_workspace_bytes) : workspace_bytes_(workspace_bytes) {
    check(cublasLtCreate(&handle_), "cublasLtCreate");
    if (workspace_bytes_ > 0) {
      const cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_);
      if (e != cudaSuccess) {
        cublasLtDestroy(handle_);
        oomb::detail::raise_cuda<oomb::out_of_memory>(__FILE__, __LINE__, e, "cudaMalloc",
                                                      "gemm_context: workspace of ", workspace_bytes_, " bytes");
      }
    }
  }
  gemm_context(const gemm_context&) = delete;
  gemm_context& operator=(const gemm_context&) = delete;
  ~gemm_context() {
    for (auto& kv : plans_) kv.second.destroy();
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
  }

  std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }
  /// Problems planned so far (each made its descriptors and asked the heuristic once).
  std::size_t cached_plans() const noexcept { return plans_.size(); }

  /// Enqueues one matmul on `stream` (see matmul_args). Throws oomb::invalid_argument for a bad
  /// shape or pointer, oomb::cuda_error when cuBLASLt has no algorithm or fails.
  void matmul(const matmul_args& a, stream_view stream) {
    OOMB_EXPECTS(a.m > 0 && a.n > 0 && a.k > 0, "gemm: m, n, k must be positive, got ", a.m, ", ", a.n, ", ", a.k);
    OOMB_EXPECTS(a.a != nullptr && a.b != nullptr && a.d != nullptr, "gemm: a null matrix pointer");
    OOMB_EXPECTS(a.lda >= (a.trans_a ? a.k : a.m) && a.ldb >= (a.trans_b ? a.n : a.k) && a.ldd >= a.m,
                 "gemm: leading dimensions too small: lda ", a.lda, ", ldb ", a.ldb, ", ldd ", a.ldd, " for m ", a.m,
                 ", n ", a.n, ", k ", a.k);
    OOMB_EXPECTS(a.bias == nullptr || (!a.d_f32 && a.beta == 0.0f),
                 "gemm: a bias epilogue needs a bf16 output written with beta = 0");
    const key k{a.trans_a, a.trans_b, a.m, a.n, a.k, a.lda, a.ldb, a.ldd, a.d_f32, a.bias != nullptr,
                alignment(a.a), alignment(a.b), alignment(a.d)};
    auto it = plans_.find(k);
    if (it == plans_.end()) it = plans_.emplace(k, make_plan(k)).first;
    const plan& p = it->second;
    if (a.bias != nullptr) {
      const void* bias = a.bias;
      check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
            "setting the bias pointer");
    }
    check(cublasLtMatmul(handle_, p.desc, &a.alpha, a.a, p.la, a.b, p.lb, &a.beta, a.d, p.ld, a.d, p.ld, &p.algo,
                         workspace_, workspace_bytes_, stream.get()),
          "cublasLtMatmul");
  }

 private:
  using key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, bool, bool, unsigned, unsigned, unsigned>;

  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulAlgo_t algo{};
    void destroy() noexcept {
      if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
      if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
      if (ld != nullptr) cublasLtMatrixLayoutDestroy(ld);
      if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    }
  };

  static void check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
      OOMB_FAIL(oomb::cuda_error, "gemm: ", what, " failed: ", cublasLtGetStatusName(s), " (",
                cublasLtGetStatusString(s), ")");
  }

  /// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
  static unsigned alignment(const void* p) {
    const auto u = reinterpret_cast<std::uintptr_t>(p);
    unsigned al = 256;
    while (al > 1 && (u % al) != 0) al /= 2;
    return al;
  }

  plan make_plan(const key& k) const {
    const auto [ta, tb, m, n, kk, lda, ldb, ldd, d_f32, has_bias, al_a, al_b, al_d] = k;
    plan p;
    struct guard {  // destroys a half-made plan when a step throws
      plan* p;
      ~guard() {
        if (p != nullptr) p->destroy();
      }
    } g{&p};
    check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "setting TRANSA");
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "setting TRANSB");
    if (has_bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const std::int32_t bias_type = CUDA_R_16BF;
      check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "setting the epilogue");
      check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
            "setting the bias type");
    }
    check(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, ta ? kk : m, ta ? m : kk, lda), "layout of A");
    check(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, tb ? n : kk, tb ? kk : n, ldb), "layout of B");
    check(cublasLtMatrixLayoutCreate(&p.ld, d_f32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldd), "layout of D");

    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::size_t ws = workspace_bytes_;
    const std::uint32_t aa = al_a, ab = al_b, ad = al_d;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.la, p.lb, p.ld, p.ld, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      OOMB_FAIL(oomb::cuda_error, "gemm: cuBLASLt has no algorithm for m ", m, ", n ", n, ", k ", kk, " (trans ", ta,
                tb, ", ", d_f32 ? "fp32" : "bf16", " output", has_bias ? ", bias" : "", ", alignments ", al_a, "/",
                al_b, "/", al_d, " bytes)");
    p.algo = result.algo;
    g.p = nullptr;
    return p;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<key, plan> plans_;
};

}  // namespace oomb_trainer::gpu::ops
