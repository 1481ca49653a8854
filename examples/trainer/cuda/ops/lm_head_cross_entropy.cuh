// oomb trainer — the LM head and next-token cross-entropy fused on the GPU, without the tokens x
// vocabulary logits (Qwen2.5's vocabulary is ~152K: one 4,096-token chunk's fp32 logits are 2.5 GB).
// SPDX-License-Identifier: Apache-2.0
//
// The tokens are taken in tiles of plan.tokens_tile rows and the vocabulary in tiles of
// plan.vocab_tile columns; only one tile of logits (fp32) and of their gradient (bf16, the GEMMs'
// input type) exists at a time, in the caller's workspace. Per token tile:
//   pass 1, per vocab tile: logits = x W_tile^T (cuBLASLt, fp32 out), then each row's running
//           max and sum of exponentials are merged (online log-sum-exp) and the target's logit kept;
//           lse = max + log(sum), loss = lse - logit[target];
//   pass 2 (backward), per vocab tile: the logits again (kept from pass 1 when the vocabulary is
//           one tile), dlogits = scale * (softmax - onehot) in bf16, dx (+)= dlogits W_tile and
//           dW_tile += dlogits^T x (fp32).
// So the vocabulary in one tile costs 3 GEMMs of n x V x H, in several tiles 4; plan_lm_head_ce
// picks the tiles for a workspace budget, preferring whole-vocabulary rows.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "trainer/cuda/ops/common.cuh"
#include "trainer/cuda/ops/gemm.cuh"
#include "trainer/cuda/ops/linear.cuh"

namespace oomb_trainer::gpu::ops {

struct lm_head_ce_plan {
  std::int64_t tokens_tile = 0;
  std::int32_t vocab_tile = 0;
};

/// One call's tensors (device pointers). Targets outside [-1, V) give a NaN loss, no gradient, and
/// their position in *bad_position (set to -1 by the caller; read back at its next synchronisation).
struct lm_head_ce_args {
  std::int64_t n = 0;                   ///< tokens
  std::int32_t H = 0, V = 0;            ///< hidden size, vocabulary
  const bf16* x = nullptr;              ///< [n][H], the final norm's output
  const bf16* W = nullptr;              ///< [V][H], the head (HF layout)
  const std::int32_t* targets = nullptr;  ///< [n]; -1: no target (loss 0, no gradient)
  float* loss = nullptr;                ///< [n] out: -log softmax(logits)[target]
  float* lse = nullptr;                 ///< [n] out: log-sum-exp of the row's logits
  std::int32_t* bad_position = nullptr;
  // Backward (both may be null: forward only).
  float scale = 1.0f;                   ///< the gradients are those of scale * sum(loss)
  float* dx = nullptr;                  ///< [n][H] out, written
  float* dW = nullptr;                  ///< [V][H], added to
};

namespace detail {

constexpr int ce_threads = 256;

/// Running (max, sum of exp(x - max)) pairs merge exactly: the online softmax statistic.
struct max_sum {
  float m, s;
};
__device__ __forceinline__ max_sum merge(max_sum a, max_sum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

/// Block per row of a tile: merges the tile's (max, sum) into the row's running pair (the first
/// tile starts it) and records the target's logit when the target is in the tile.
template <int = 0>  // a template: every translation unit may include this header
__global__ void __launch_bounds__(ce_threads) ce_tile_stats_kernel(std::int32_t vn, std::int32_t v0, bool first,
                                                                   const float* __restrict__ logits,
                                                                   const std::int32_t* __restrict__ targets,
                                                                   float* __restrict__ run_m, float* __restrict__ run_s,
                                                                   float* __restrict__ target_logit) {
  __shared__ max_sum part[ce_threads / 32];
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * vn;
  max_sum acc{-INFINITY, 0.0f};
  for (std::int32_t c = threadIdx.x; c < vn; c += blockDim.x) {
    const float l = row[c];
    if (l > acc.m) {
      acc.s = (acc.m == -INFINITY ? 0.0f : acc.s * expf(acc.m - l)) + 1.0f;
      acc.m = l;
    } else {
      acc.s += expf(l - acc.m);
    }
  }
  for (int o = 16; o > 0; o /= 2)
    acc = merge(acc, {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)});
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < ce_threads / 32; ++w) acc = merge(acc, part[w]);
    if (!first) acc = merge({run_m[r], run_s[r]}, acc);
    run_m[r] = acc.m;
    run_s[r] = acc.s;
    const std::int32_t t = targets[r] - v0;
    if (t >= 0 && t < vn) target_logit[r] = row[t];
  }
}

/// lse and loss of each row of a token tile; a target outside [-1, V) is reported and gets NaN.
template <int = 0>  // a template: every translation unit may include this header
__global__ void ce_finish_kernel(std::int64_t tn, std::int64_t t0, std::int32_t V, const std::int32_t* __restrict__ targets,
                                 const float* __restrict__ run_m, const float* __restrict__ run_s,
                                 const float* __restrict__ target_logit, float* __restrict__ lse, float* __restrict__ loss,
                                 std::int32_t* bad_position) {
  const std::int64_t r = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (r >= tn) return;
  const float l = run_m[r] + logf(run_s[r]);
  const std::int32_t t = targets[r];
  lse[r] = l;
  if (t < -1 || t >= V) {
    loss[r] = __int_as_float(0x7fc00000);
    atomicCAS(bad_position, -1, static_cast<std::int32_t>(t0 + r));
  } else {
    loss[r] = t >= 0 ? l - target_logit[r] : 0.0f;
  }
}

/// dlogits [tn][vn] = scale * (exp(logit - lse) - onehot(target)) as bf16; rows without a valid
/// target get zeros. Rows along grid y, columns along x (no division per element).
template <int = 0>  // a template: every translation unit may include this header
__global__ void ce_tile_grad_kernel(std::int64_t tn, std::int32_t vn, std::int32_t v0, std::int32_t V, float scale,
                                    const float* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                    const float* __restrict__ lse, bf16* __restrict__ dlogits) {
  for (std::int64_t r = blockIdx.y; r < tn; r += gridDim.y) {
    const std::int32_t t = targets[r];
    const bool counted = t >= 0 && t < V;
    const float l = lse[r];
    const float* row = logits + r * vn;
    bf16* out = dlogits + r * vn;
    for (std::int32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < vn; c += gridDim.x * blockDim.x)
      out[c] = bf16(counted ? scale * (expf(row[c] - l) - (v0 + c == t ? 1.0f : 0.0f)) : 0.0f);
  }
}

struct ce_workspace {
  float* logits;   // [tokens_tile][vocab_tile]
  bf16* dlogits;   // [tokens_tile][vocab_tile]
  float *run_m, *run_s, *target_logit;  // [tokens_tile]
  std::size_t bytes;
};

inline ce_workspace carve_ce(void* base, const lm_head_ce_plan& p) {
  workspace_carver c(base);
  const std::size_t tile = std::size_t(p.tokens_tile) * std::size_t(p.vocab_tile), rows = std::size_t(p.tokens_tile);
  ce_workspace w{};
  w.logits = c.take<float>(tile);
  w.dlogits = c.take<bf16>(tile);
  w.run_m = c.take<float>(rows);
  w.run_s = c.take<float>(rows);
  w.target_logit = c.take<float>(rows);
  w.bytes = c.bytes();
  return w;
}

}  // namespace detail

/// Bytes of workspace one call with this plan needs.
inline std::size_t lm_head_ce_workspace_bytes(const lm_head_ce_plan& plan) {
  OOMB_EXPECTS(plan.tokens_tile > 0 && plan.vocab_tile > 0, "lm_head_ce: tile sizes must be positive, got ",
               plan.tokens_tile, " x ", plan.vocab_tile);
  return detail::carve_ce(nullptr, plan).bytes;
}

/// Tiles for n tokens and a vocabulary of V within `budget` bytes of workspace: whole-vocabulary
/// rows (3 GEMMs) when at least min(n, 512) tokens fit, else vocabulary tiles (a multiple of 256
/// columns, 4 GEMMs) for up to 4,096 tokens at a time. Throws when not even 128 x 256 fits.
inline lm_head_ce_plan plan_lm_head_ce(std::int64_t n, std::int32_t V, std::size_t budget) {
  OOMB_EXPECTS(n > 0 && V > 0, "plan_lm_head_ce: n and V must be positive, got ", n, ", ", V);
  const auto fits = [&](std::int64_t tt, std::int32_t vt) { return lm_head_ce_workspace_bytes({tt, vt}) <= budget; };
  const std::int64_t whole_rows = n < 512 ? n : 512;
  if (fits(whole_rows, V)) {
    if (fits(n, V)) return {n, V};
    std::int64_t tt = n / 128 * 128;  // the most whole 128-row groups that fit (512 does)
    while (!fits(tt, V)) tt -= 128;
    return {tt, V};
  }
  for (std::int64_t tt = n < 4096 ? n : 4096; tt >= 1; tt = tt > 128 ? tt / 2 : 0) {
    std::int32_t vt = 256;
    if (!fits(tt, vt)) continue;
    while (vt + 256 < V && fits(tt, vt + 256)) vt += 256;
    return {tt, vt};
  }
  OOMB_FAIL(oomb::invalid_argument, "plan_lm_head_ce: a workspace of ", budget, " bytes is too small (",
            lm_head_ce_workspace_bytes({128, 256}), " needed for a 128 x 256 tile)");
}

/// The head's loss and lse per token and, when a.dx or a.dW is set, their gradients (see the top
/// of this file). Enqueues GEMMs on `ctx` and kernels on `stream`; no allocation, no host wait.
inline void lm_head_cross_entropy(gemm_context& ctx, const lm_head_ce_plan& plan, const lm_head_ce_args& a,
                                  void* workspace, std::size_t workspace_bytes, stream_view stream) {
  OOMB_EXPECTS(a.n > 0 && a.H > 0 && a.V > 0, "lm_head_ce: n, H, V must be positive, got ", a.n, ", ", a.H, ", ", a.V);
  OOMB_EXPECTS(a.x != nullptr && a.W != nullptr && a.targets != nullptr && a.loss != nullptr && a.lse != nullptr &&
                   a.bad_position != nullptr,
               "lm_head_ce: x, W, targets, loss, lse and bad_position must be set");
  OOMB_EXPECTS(std::isfinite(a.scale), "lm_head_ce: scale must be finite, got ", a.scale);
  OOMB_EXPECTS(plan.tokens_tile > 0 && plan.vocab_tile > 0 && plan.tokens_tile < (std::int64_t(1) << 31),
               "lm_head_ce: bad plan ", plan.tokens_tile, " x ", plan.vocab_tile);
  detail::check_workspace("lm_head_ce", workspace, workspace_bytes, lm_head_ce_workspace_bytes(plan));
  const detail::ce_workspace w = detail::carve_ce(workspace, plan);
  const bool backward = a.dx != nullptr || a.dW != nullptr;
  const std::int32_t vt = plan.vocab_tile < a.V ? plan.vocab_tile : a.V;
  const bool one_vocab_tile = vt == a.V;
  const auto logits_tile = [&](std::int64_t t0, std::int64_t tn, std::int32_t v0, std::int32_t vn) {
    linear_forward(ctx, tn, a.H, vn, a.x + t0 * a.H, a.W + std::int64_t(v0) * a.H, static_cast<const bf16*>(nullptr),
                   w.logits, stream);
  };
  for (std::int64_t t0 = 0; t0 < a.n; t0 += plan.tokens_tile) {
    const std::int64_t tn = a.n - t0 < plan.tokens_tile ? a.n - t0 : plan.tokens_tile;
    const std::int32_t* tg = a.targets + t0;
    for (std::int32_t v0 = 0; v0 < a.V; v0 += vt) {
      const std::int32_t vn = a.V - v0 < vt ? a.V - v0 : vt;
      logits_tile(t0, tn, v0, vn);
      detail::ce_tile_stats_kernel<><<<unsigned(tn), detail::ce_threads, 0, stream.get()>>>(
          vn, v0, v0 == 0, w.logits, tg, w.run_m, w.run_s, w.target_logit);
      OOMB_OPS_CHECK_LAUNCH("lm_head_ce (row statistics)");
    }
    detail::ce_finish_kernel<><<<unsigned((tn + 255) / 256), 256, 0, stream.get()>>>(
        tn, t0, a.V, tg, w.run_m, w.run_s, w.target_logit, a.lse + t0, a.loss + t0, a.bad_position);
    OOMB_OPS_CHECK_LAUNCH("lm_head_ce (loss)");
    if (!backward) continue;
    for (std::int32_t v0 = 0; v0 < a.V; v0 += vt) {
      const std::int32_t vn = a.V - v0 < vt ? a.V - v0 : vt;
      if (!one_vocab_tile) logits_tile(t0, tn, v0, vn);
      const dim3 grid(detail::grid_for(vn, 256, 64), unsigned(tn < 65535 ? tn : 65535));
      detail::ce_tile_grad_kernel<><<<grid, 256, 0, stream.get()>>>(
          tn, vn, v0, a.V, a.scale, w.logits, tg, a.lse + t0, w.dlogits);
      OOMB_OPS_CHECK_LAUNCH("lm_head_ce (dlogits)");
      if (a.dx != nullptr)
        linear_backward_input(ctx, tn, a.H, vn, w.dlogits, a.W + std::int64_t(v0) * a.H, a.dx + t0 * a.H, v0 > 0, stream);
      if (a.dW != nullptr)
        linear_backward_weight(ctx, tn, a.H, vn, a.x + t0 * a.H, w.dlogits, a.dW + std::int64_t(v0) * a.H, stream);
    }
  }
}

}  // namespace oomb_trainer::gpu::ops
