// oomb benchmarks — the fused LM head + cross-entropy (forward and backward) against the same
// work with the whole tokens x vocabulary logits materialised (one GEMM into fp32 logits, a
// softmax cross-entropy into bf16 dlogits, the dX and dW GEMMs: the plain cuBLAS way), at
// Qwen2.5-0.5B and 7B shapes. Times are medians of CUDA-event timings after warm-up; memory is
// each variant's workspace and its total device allocation. One JSON line per measurement.
// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "trainer/cuda/ops/lm_head_cross_entropy.cuh"

namespace ops = oomb_trainer::gpu::ops;
using oomb::bf16;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_lm_head: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* alloc(std::size_t n, std::size_t& total) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(T) + 1), "cudaMalloc");
  total += n * sizeof(T);
  return static_cast<T*>(p);
}

__global__ void fill_kernel(std::size_t n, std::uint64_t seed, float scale, bf16* out) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;  // splitmix64: a seeded, reproducible fill
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = bf16(scale * (float(z >> 40) / float(1 << 24) * 2.0f - 1.0f));
  }
}

struct shape {
  const char* model;
  std::int32_t H, V;
  std::int64_t n;
};

struct variant {
  std::string name;
  std::size_t budget;  // 0: the whole logits in one tile
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const shape shapes[] = {{"Qwen2.5-0.5B", 896, 151936, 4096}, {"Qwen2.5-7B", 3584, 151936, 4096}};
  const variant variants[] = {{"materialised_logits", 0},
                              {"fused_2GiB", std::size_t(2) << 30},
                              {"fused_1GiB", std::size_t(1) << 30},
                              {"fused_512MiB", std::size_t(512) << 20},
                              {"fused_256MiB", std::size_t(256) << 20}};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const ops::stream_view stream(s);
  for (const shape& sh : shapes) {
    double loss_reference = 0;
    for (const variant& var : variants) {
      std::size_t total = 0;
      const ops::lm_head_ce_plan plan =
          var.budget == 0 ? ops::lm_head_ce_plan{sh.n, sh.V} : ops::plan_lm_head_ce(sh.n, sh.V, var.budget);
      const std::size_t ws_bytes = ops::lm_head_ce_workspace_bytes(plan);
      bf16* x = alloc<bf16>(std::size_t(sh.n) * sh.H, total);
      bf16* W = alloc<bf16>(std::size_t(sh.V) * sh.H, total);
      float* dx = alloc<float>(std::size_t(sh.n) * sh.H, total);
      float* dW = alloc<float>(std::size_t(sh.V) * sh.H, total);
      float* loss = alloc<float>(std::size_t(sh.n), total);
      float* lse = alloc<float>(std::size_t(sh.n), total);
      std::int32_t* targets = alloc<std::int32_t>(std::size_t(sh.n), total);
      std::int32_t* bad = alloc<std::int32_t>(1, total);
      char* ws = alloc<char>(ws_bytes, total);
      fill_kernel<<<1024, 256, 0, s>>>(std::size_t(sh.n) * sh.H, 1, 1.0f, x);
      fill_kernel<<<1024, 256, 0, s>>>(std::size_t(sh.V) * sh.H, 2, 0.05f, W);
      std::vector<std::int32_t> t(static_cast<std::size_t>(sh.n));
      std::mt19937 rng(3);
      for (auto& v : t) v = std::int32_t(rng() % std::uint32_t(sh.V));
      check(cudaMemcpy(targets, t.data(), t.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "targets");
      check(cudaMemset(dW, 0, std::size_t(sh.V) * sh.H * sizeof(float)), "dW");
      check(cudaMemset(bad, 0xff, sizeof(std::int32_t)), "bad");
      ops::gemm_context ctx;
      ops::lm_head_ce_args a;
      a.n = sh.n, a.H = sh.H, a.V = sh.V;
      a.x = x, a.W = W, a.targets = targets, a.loss = loss, a.lse = lse, a.bad_position = bad;
      a.scale = 1.0f / float(sh.n), a.dx = dx, a.dW = dW;
      cudaEvent_t e0, e1;
      check(cudaEventCreate(&e0), "event");
      check(cudaEventCreate(&e1), "event");
      std::vector<float> ms;
      for (int r = 0; r < reps + 2; ++r) {
        check(cudaEventRecord(e0, s), "record");
        ops::lm_head_cross_entropy(ctx, plan, a, ws, ws_bytes, stream);
        check(cudaEventRecord(e1, s), "record");
        check(cudaEventSynchronize(e1), "sync");
        float m = 0;
        check(cudaEventElapsedTime(&m, e0, e1), "elapsed");
        if (r >= 2) ms.push_back(m);
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      std::vector<float> lh(static_cast<std::size_t>(sh.n));
      check(cudaMemcpy(lh.data(), loss, lh.size() * sizeof(float), cudaMemcpyDeviceToHost), "loss");
      std::int32_t bad_h = 0;
      check(cudaMemcpy(&bad_h, bad, sizeof bad_h, cudaMemcpyDeviceToHost), "bad");
      double loss_sum = 0;
      for (float l : lh) loss_sum += l;
      if (var.budget == 0) loss_reference = loss_sum;
      const double flops = 6.0 * double(sh.n) * sh.V * sh.H;  // forward + dX + dW GEMMs
      std::printf(
          "{\"bench\":\"lm_head_ce\",\"device\":\"%s\",\"model\":\"%s\",\"tokens\":%lld,\"hidden\":%d,\"vocab\":%d,"
          "\"variant\":\"%s\",\"tokens_tile\":%lld,\"vocab_tile\":%d,\"reps\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,"
          "\"max_ms\":%.3f,\"tflops_useful\":%.1f,\"workspace_bytes\":%zu,\"total_device_bytes\":%zu,"
          "\"mean_loss\":%.6f,\"loss_rel_diff_vs_materialised\":%.3e,\"bad_position\":%d}\n",
          prop.name, sh.model, static_cast<long long>(sh.n), sh.H, sh.V, var.name.c_str(),
          static_cast<long long>(plan.tokens_tile), plan.vocab_tile, reps, median, ms.front(), ms.back(),
          flops / (median * 1e-3) / 1e12, ws_bytes, total, loss_sum / double(sh.n),
          std::abs(loss_sum - loss_reference) / std::abs(loss_reference), bad_h);
      std::fflush(stdout);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      for (void* p : {static_cast<void*>(x), static_cast<void*>(W), static_cast<void*>(dx), static_cast<void*>(dW),
                      static_cast<void*>(loss), static_cast<void*>(lse), static_cast<void*>(targets),
                      static_cast<void*>(bad), static_cast<void*>(ws)})
        check(cudaFree(p), "cudaFree");
    }
  }
  cudaStreamDestroy(s);
  return 0;
}
