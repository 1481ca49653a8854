// oomb benchmarks — the trainer's CUDA layer ops at one Qwen2.5-7B chunk (4,096 tokens): the
// linear layer's GEMMs (TFLOP/s) and the memory-bound kernels (GB/s of the least traffic each
// needs), AdamW and the gradient norm over 2^30 parameters. Median of CUDA-event timings after
// warm-up; one JSON line per op.
// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "trainer/cpu/rope.hpp"
#include "trainer/cuda/ops/adamw.cuh"
#include "trainer/cuda/ops/elementwise.cuh"
#include "trainer/cuda/ops/embedding.cuh"
#include "trainer/cuda/ops/grad_norm.cuh"
#include "trainer/cuda/ops/linear.cuh"
#include "trainer/cuda/ops/rmsnorm.cuh"
#include "trainer/cuda/ops/rope.cuh"
#include "trainer/cuda/ops/swiglu.cuh"

namespace ops = oomb_trainer::gpu::ops;
using oomb::bf16;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_layer_ops: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<void*> allocations;

template <class T>
T* alloc(std::size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  allocations.push_back(p);
  return static_cast<T*>(p);
}

__global__ void fill_kernel(std::size_t n, std::uint64_t seed, bf16* out) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out[i] = bf16(float((z ^ (z >> 31)) >> 40) / float(1 << 24) * 2.0f - 1.0f);
  }
}

template <class T>
T* random(std::size_t n, std::uint64_t seed, cudaStream_t s) {
  T* p = alloc<T>(n);
  if constexpr (std::is_same_v<T, bf16>) {
    fill_kernel<<<1024, 256, 0, s>>>(n, seed, p);
  } else {
    bf16* tmp = alloc<bf16>(n);
    fill_kernel<<<1024, 256, 0, s>>>(n, seed, tmp);
    ops::convert(std::int64_t(n), tmp, p, ops::stream_view(s));
  }
  return p;
}

cudaStream_t s;
const char* device_name = "";

void measure(const char* op, const char* shape, double work, const char* unit, const std::function<void()>& f, int reps = 20) {
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<float> ms;
  for (int r = 0; r < reps + 3; ++r) {
    check(cudaEventRecord(e0, s), "record");
    f();
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float m = 0;
    check(cudaEventElapsedTime(&m, e0, e1), "elapsed");
    if (r >= 3) ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  std::printf("{\"bench\":\"layer_ops\",\"device\":\"%s\",\"op\":\"%s\",\"shape\":\"%s\",\"reps\":%d,\"median_ms\":%.4f,"
              "\"min_ms\":%.4f,\"max_ms\":%.4f,\"%s\":%.1f}\n",
              device_name, op, shape, reps, med, ms.front(), ms.back(), unit, work / (med * 1e-3) / 1e12 * (unit[0] == 'g' ? 1e3 : 1.0));
  std::fflush(stdout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  device_name = prop.name;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const ops::stream_view st(s);
  // Qwen2.5-7B: hidden 3584, intermediate 18944, 28 query / 4 KV heads of 128, vocabulary 151,936.
  const std::int64_t n = 4096;
  const std::int32_t H = 3584, I = 18944, hq = 28, d = 128, V = 151936;
  const std::size_t nH = std::size_t(n) * H, nI = std::size_t(n) * I;
  ops::gemm_context ctx;

  bf16* x = random<bf16>(nH, 1, s);
  bf16* wq = random<bf16>(std::size_t(hq) * d * H, 2, s);
  bf16* bq = random<bf16>(std::size_t(hq) * d, 3, s);
  bf16* wg = random<bf16>(std::size_t(I) * H, 4, s);
  bf16* q = alloc<bf16>(std::size_t(n) * hq * d);
  bf16* g = random<bf16>(nI, 5, s);
  bf16* u = random<bf16>(nI, 6, s);
  bf16* h = alloc<bf16>(nI);
  bf16* dgu = random<bf16>(nI, 7, s);
  float* dx = alloc<float>(nH);
  float* dWg = alloc<float>(std::size_t(I) * H);
  check(cudaMemsetAsync(dWg, 0, std::size_t(I) * H * sizeof(float), s), "memset");
  const double flop_q = 2.0 * n * H * hq * d, flop_g = 2.0 * n * H * I;
  measure("linear_forward q_proj (bias, bf16 out)", "n4096 in3584 out3584", flop_q, "tflops",
          [&] { ops::linear_forward(ctx, n, H, hq * d, x, wq, bq, q, st); });
  measure("linear_forward gate_proj (bf16 out)", "n4096 in3584 out18944", flop_g, "tflops",
          [&] { ops::linear_forward(ctx, n, H, I, x, wg, static_cast<const bf16*>(nullptr), g, st); });
  measure("linear_backward_input gate_proj (fp32 +=)", "n4096 in3584 out18944", flop_g, "tflops",
          [&] { ops::linear_backward_input(ctx, n, H, I, dgu, wg, dx, true, st); });
  measure("linear_backward_weight gate_proj (fp32 +=)", "n4096 in3584 out18944", flop_g, "tflops",
          [&] { ops::linear_backward_weight(ctx, n, H, I, x, dgu, dWg, st); });

  bf16* w = random<bf16>(std::size_t(H), 8, s);
  bf16* y = alloc<bf16>(nH);
  float* rstd = alloc<float>(std::size_t(n));
  float* dy = random<float>(nH, 9, s);
  float* dw = alloc<float>(std::size_t(H));
  const std::size_t rms_ws = ops::rmsnorm_backward_workspace_bytes(n, H);
  char* ws = alloc<char>(rms_ws);
  measure("rmsnorm_forward (bf16 -> bf16)", "n4096 H3584", 4.0 * nH, "gb_per_s",
          [&] { ops::rmsnorm_forward(n, H, x, w, 1e-6f, y, rstd, st); });
  measure("rmsnorm_backward (bf16 x, fp32 dy, dx +=)", "n4096 H3584", 14.0 * nH, "gb_per_s",
          [&] { ops::rmsnorm_backward(n, H, x, w, rstd, dy, dx, dw, ws, rms_ws, st); });

  const oomb_trainer::cpu::rope_table<float> table(1 << 20, n, oomb_trainer::plain_rope_frequencies(d, 1e6));
  float* cos_t = alloc<float>(table.cos.size());
  float* sin_t = alloc<float>(table.sin.size());
  check(cudaMemcpy(cos_t, table.cos.data(), table.cos.size() * 4, cudaMemcpyHostToDevice), "cos");
  check(cudaMemcpy(sin_t, table.sin.data(), table.sin.size() * 4, cudaMemcpyHostToDevice), "sin");
  const ops::rope_table_view view{cos_t, sin_t, n, d / 2};
  measure("rope_forward q (bf16, in place)", "n4096 heads28 d128", 4.0 * n * hq * d + 4.0 * n * d, "gb_per_s",
          [&] { ops::rope_forward(n, hq, d, q, view, st); });

  measure("swiglu_forward (bf16)", "n4096 I18944", 6.0 * nI, "gb_per_s", [&] { ops::swiglu_forward(std::int64_t(nI), g, u, h, st); });
  bf16* dg = alloc<bf16>(nI);
  bf16* du = alloc<bf16>(nI);
  measure("swiglu_backward (bf16)", "n4096 I18944", 10.0 * nI, "gb_per_s",
          [&] { ops::swiglu_backward(std::int64_t(nI), g, u, dgu, dg, du, st); });

  std::vector<std::int32_t> tok(static_cast<std::size_t>(n));
  for (std::size_t t = 0; t < tok.size(); ++t) tok[t] = std::int32_t((t * 2654435761u) % std::uint32_t(V));
  std::int32_t* tokens = alloc<std::int32_t>(tok.size());
  std::int32_t* bad = alloc<std::int32_t>(1);
  check(cudaMemcpy(tokens, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice), "tokens");
  check(cudaMemset(bad, 0xff, 4), "bad");
  bf16* table_e = random<bf16>(std::size_t(V) * H, 10, s);
  float* dtable = alloc<float>(std::size_t(V) * H);
  check(cudaMemsetAsync(dtable, 0, std::size_t(V) * H * 4, s), "memset");
  const std::size_t emb_ws = ops::embedding_backward_workspace_bytes(n, V);
  char* ews = alloc<char>(emb_ws);
  measure("embedding_forward (bf16)", "n4096 H3584 V151936", 4.0 * nH, "gb_per_s",
          [&] { ops::embedding_forward(n, H, V, tokens, table_e, y, bad, st); });
  measure("embedding_backward (bf16 dout, fp32 dtable +=)", "n4096 H3584 V151936", 10.0 * nH, "gb_per_s",
          [&] { ops::embedding_backward(n, H, V, tokens, y, dtable, ews, emb_ws, st); });

  const std::int64_t P = std::int64_t(1) << 30;
  float* p = random<float>(std::size_t(P), 11, s);
  float* m = alloc<float>(std::size_t(P));
  float* v = alloc<float>(std::size_t(P));
  float* grad = random<float>(std::size_t(P), 12, s);
  bf16* compute = alloc<bf16>(std::size_t(P));
  float* partials = alloc<float>(ops::grad_norm_partials);
  float* norm_scale = alloc<float>(2);
  check(cudaMemsetAsync(m, 0, std::size_t(P) * 4, s), "memset");
  check(cudaMemsetAsync(v, 0, std::size_t(P) * 4, s), "memset");
  measure("grad_norm (fp32, one tensor) + finish", "2^30 elements", 4.0 * double(P), "gb_per_s", [&] {
    ops::grad_norm_begin(partials, st);
    ops::grad_norm_accumulate(P, grad, partials, st);
    ops::grad_norm_finish(partials, 1.0f, norm_scale, norm_scale + 1, st);
  });
  const auto c = ops::adamw_step_coefficients(oomb_trainer::adamw_options{}, 1e-4, 1, true);
  measure("adamw_update (fp32 master, bf16 copy)", "2^30 elements", 30.0 * double(P), "gb_per_s",
          [&] { ops::adamw_update(P, p, m, v, grad, compute, c, norm_scale + 1, st); });
  check(cudaStreamSynchronize(s), "sync");
  for (void* a : allocations) check(cudaFree(a), "cudaFree");
  return 0;
}
