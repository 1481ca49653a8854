// oomb trainer — what the CUDA ops backend (cuda/cuda_ops.cuh) allocates, stated once in host C++:
// basic_cuda_ops takes its sizes from here, and the memory plan (trainers/memory_plan.hpp, which
// g++ compiles without CUDA) adds up the same numbers, so a change to an allocation is a change to
// the plan.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

struct cuda_ops_memory {
  /// Workspace the fused LM head may take for its logits tiles; reserved whole (the shared op
  /// workspace: the head's is the largest of the ops').
  static constexpr std::size_t head_budget = std::size_t(256) << 20;
  /// cuBLASLt's workspace: what its Hopper kernels ask for at most in practice (NVIDIA's guidance for sm_90).
  static constexpr std::size_t gemm_workspace = std::size_t(32) << 20;
  /// The smallest upload ring (the ring doubles while a chunk's tables would not fit twice over).
  static constexpr std::size_t upload_ring_start = std::size_t(1) << 20;
  /// Where a window's page ids start in its uploaded table (offset, pages, last page's length, pad).
  static constexpr std::size_t window_header_ints = 4;

  /// Scratch for a chunk, in elements: fp32 copies of activation gradients and accumulators
  /// (f32[0]: the RMSNorm dx, o and dq; f32[1]: the head's dx, dk; f32[2]: dv), the window's
  /// partial output o_w [rows][qd] and lse_w [rows][hq], the attention delta [rows][hq], the head's
  /// rstd [rows] and per-row loss and lse [2 rows] in fp32; its normed rows xf [rows][H] in bf16.
  struct scratch {
    std::int64_t f32[3] = {0, 0, 0};
    std::int64_t o_w = 0, lse_w = 0, delta = 0, rstd = 0, rows = 0;
    std::int64_t xf = 0;
    std::uint64_t bytes() const noexcept {
      return 4 * std::uint64_t(f32[0] + f32[1] + f32[2] + o_w + lse_w + delta + rstd + rows) + 2 * std::uint64_t(xf);
    }
  };

  static scratch scratch_for(const chunk_shape& s) noexcept {
    const std::int64_t n = s.rows, H = s.dims.H, qd = s.dims.qdim(), kvd = s.dims.kvdim(), hq = s.dims.hq;
    scratch r;
    r.f32[0] = n * std::max(H, qd);
    r.f32[1] = n * std::max(H, kvd);
    r.f32[2] = n * kvd;
    r.o_w = n * qd;
    r.lse_w = n * hq;
    r.delta = n * hq;
    r.rstd = n;
    r.rows = 2 * n;
    r.xf = n * H;
    return r;
  }

  /// The upload ring (pinned, and as much device memory again): what one chunk holds in it at once
  /// (the chunk's RoPE cos/sin, fp32 [rows][d], held while every layer runs; its tokens and targets;
  /// a backward window's table: its page ids, each one's gradient page and, packed documents, each
  /// query's int64 bound), doubled from upload_ring_start until twice that fits: the host may run a
  /// chunk ahead.
  static std::size_t upload_ring_bytes(const chunk_shape& s) noexcept {
    const std::uint64_t rope = std::uint64_t(s.rows) * std::uint64_t(s.dims.d) * 4;
    const std::uint64_t tokens = 2 * std::uint64_t(s.rows) * 4;
    const std::uint64_t window = 4 * (window_header_ints + 2 * std::uint64_t(s.window_pages) + 1) + 8 * std::uint64_t(s.rows);
    const std::uint64_t held = rope + tokens + window;
    std::size_t ring = upload_ring_start;
    while (ring < 2 * held) ring *= 2;
    return ring;
  }
};

}  // namespace oomb_trainer
