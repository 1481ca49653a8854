// oomb trainer — attention forward over one window of key pages (FlashAttention-2 style, mma.sync).
// SPDX-License-Identifier: Apache-2.0
//
// One block owns BM consecutive *packed* rows of one KV head: row r is (query r / group, query head
// kvh * group + r % group), so the query heads of a GQA group share the block and every K/V tile is
// read once per group. K/V tiles of BN keys come straight from the pages (each row's address through
// the page table; cp.async, double-buffered, ids fetched a tile ahead); each warp owns BM / WARPS
// rows, keeps its O accumulator in registers and runs the online softmax in the mma accumulator
// layout. Masking (causal, the window's end) is applied only to tiles that need it. Kernels never
// fail: the launcher (attention.cuh) checks every argument.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <oomb/core/bf16.hpp>

#include "ptx.cuh"
#include "window.cuh"

namespace oomb_trainer::gpu::detail {

template <int D_, int BM_, int BN_, int WARPS_, int MIN_BLOCKS_>
struct forward_tile {
  static constexpr int D = D_, BM = BM_, BN = BN_, WARPS = WARPS_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int WM = BM / WARPS;  // rows per warp
  static constexpr int MT = WM / 16;     // m16 tiles per warp
  static constexpr int smem_bytes = (BM * D + 2 * 2 * BN * D) * 2;
  static_assert(WM % 16 == 0 && BN % 16 == 0 && D % 16 == 0, "tile shape");
};

template <class Cfg, class O>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_forward_kernel(const kernel_params p, O* __restrict__ out, float* __restrict__ lse_out) {
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, THREADS = Cfg::THREADS, MT = Cfg::MT;
  constexpr int NT_S = BN / 8, NT_O = D / 8;
  constexpr int CPR = D / 8;            // 16-byte chunks per row
  constexpr int RPP = THREADS / CPR;    // rows one pass of the block loads
  constexpr int KV_PASSES = BN / RPP;
  static_assert(BN % RPP == 0 && BM % RPP == 0, "load passes");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = smem_addr(smem);
  const std::uint32_t sK = sQ + BM * D * 2;       // stage s at sK + s * BN * D * 2
  const std::uint32_t sV = sK + 2 * BN * D * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int kvh = blockIdx.y;
  // Heaviest (latest, most causal work) blocks first.
  const int r0 = (gridDim.x - 1 - blockIdx.x) * BM;
  const int rows = p.sq * p.group;
  const int q_lo = r0 / p.group;
  const int q_hi = ((r0 + BM < rows ? r0 + BM : rows) - 1) / p.group;
  const std::int64_t qpos_lo = p.q_start + q_lo, qpos_hi = p.q_start + q_hi;

  const virtual_keys keys(p, p.tile_indptr ? q_lo / p.tile : 0);
  const std::int32_t vlen = keys.vlen;
  const std::int32_t page_mask = (1 << p.log_page) - 1;
  const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);

  // Q tile (rows past the chunk read as zeros).
  const int lrow = tid / CPR, lchunk = tid % CPR;
#pragma unroll
  for (int i = 0; i < BM / RPP; ++i) {
    const int r = lrow + i * RPP, R = r0 + r;
    const bool ok = R < rows;
    const std::uint16_t* src =
        ok ? p.q + (std::int64_t(R / p.group) * p.hq + kvh * p.group + R % p.group) * D + lchunk * 8 : p.q;
    cp_async_16(sQ + swizzled<D>::offset(r, lchunk), src, ok);
  }

  // Tiles of keys visible to at least one row: positions are monotonic in the virtual slot.
  int n_blocks;
  {
    int lo = 0, hi = (vlen + BN - 1) / BN;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (keys.pos(mid * BN) > qpos_hi)
        hi = mid;
      else
        lo = mid + 1;
    }
    n_blocks = lo;
  }

  std::int32_t ids[KV_PASSES];
  auto fetch_ids = [&](int blk) {
#pragma unroll
    for (int i = 0; i < KV_PASSES; ++i) {
      const std::int32_t v = blk * BN + lrow + i * RPP;
      ids[i] = v < vlen ? keys.id(v) : -1;
    }
  };
  auto load_kv = [&](int blk, int stage) {
#pragma unroll
    for (int i = 0; i < KV_PASSES; ++i) {
      const int r = lrow + i * RPP;
      const std::int32_t v = blk * BN + r;
      const bool ok = ids[i] >= 0;
      const std::int64_t off = ok ? p.pool.offset(ids[i], v & page_mask, kvh) + lchunk * 8 : 0;
      const std::uint32_t dst = swizzled<D>::offset(r, lchunk) + stage * (BN * D * 2);
      cp_async_16(sK + dst, base + off, ok);
      cp_async_16(sV + dst, base + off + p.pool.v_offset, ok);
    }
  };

  if (n_blocks > 0) {
    fetch_ids(0);
    load_kv(0, 0);
  }
  cp_async_commit();
  if (n_blocks > 1) fetch_ids(1);

  // Per-thread rows: (mt, h) -> local row warp * WM + mt * 16 + g + 8h.
  std::int64_t qpos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = r0 + warp * Cfg::WM + mt * 16 + g + 8 * h;
      qpos[mt][h] = p.q_start + (R < rows ? R / p.group : q_hi);
    }

  float acc_o[MT][NT_O][4];
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT_O; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  for (int blk = 0; blk < n_blocks; ++blk) {
    const int stage = blk & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (blk + 1 < n_blocks) {
      load_kv(blk + 1, stage ^ 1);
      if (blk + 2 < n_blocks) fetch_ids(blk + 2);
    }
    cp_async_commit();
    const std::uint32_t sKs = sK + stage * (BN * D * 2), sVs = sV + stage * (BN * D * 2);

    // S = Q K^T for this warp's rows.
    float s[MT][NT_S][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_a<D>(sQ, warp * Cfg::WM + mt * 16, kk * 16, lane, a[mt]);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        std::uint32_t b[4];
        load_b_nk<D>(sKs, np * 16, kk * 16, lane, b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Mask only tiles that cross the window's end or the causal diagonal.
    const std::int32_t v0 = blk * BN;
    if (v0 + BN > vlen || keys.pos(v0 + BN - 1) > qpos_lo) {
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const std::int32_t v = v0 + nt * 8 + 2 * t4 + c;
          const std::int64_t kpos = v < vlen ? keys.pos(v) : INT64_MAX;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (kpos > qpos[mt][h]) s[mt][nt][2 * h + c] = -INFINITY;
        }
    }

    // Online softmax in base 2 (scores scaled by scale * log2 e).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]) * p.scale_log2);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ref = mx == -INFINITY ? 0.0f : mx;
        const float corr = fast_exp2(row_max[mt][h] - ref);
        row_max[mt][h] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float pe = fast_exp2(fmaf(s[mt][nt][2 * h + c], p.scale_log2, -ref));
            s[mt][nt][2 * h + c] = pe;
            sum += pe;
          }
        row_sum[mt][h] = row_sum[mt][h] * corr + sum;
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt) {
          acc_o[mt][nt][2 * h] *= corr;
          acc_o[mt][nt][2 * h + 1] *= corr;
        }
      }

    // O += P V, P straight from the accumulators (their layout is mma's A layout).
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
      std::uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack_bf16(s[mt][2 * ks][0], s[mt][2 * ks][1]);
        a[mt][1] = pack_bf16(s[mt][2 * ks][2], s[mt][2 * ks][3]);
        a[mt][2] = pack_bf16(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
        a[mt][3] = pack_bf16(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        std::uint32_t b[4];
        load_b_kn<D>(sVs, dp * 16, ks * 16, lane, b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(acc_o[mt][2 * dp], a[mt], b[0], b[1]);
          mma_16816(acc_o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: normalise, write O (in the caller's element type) and the natural-log lse.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int R = r0 + warp * Cfg::WM + mt * 16 + g + 8 * h;
      if (R >= rows) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int qi = R / p.group, hh = kvh * p.group + R % p.group;
      O* dst = out + (std::int64_t(qi) * p.hq + hh) * D + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt) {
        const float x0 = acc_o[mt][nt][2 * h] * inv, x1 = acc_o[mt][nt][2 * h + 1] * inv;
        if constexpr (std::is_same_v<O, float>) {
          *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(x0, x1);
        } else {
          *reinterpret_cast<std::uint32_t*>(dst + nt * 8) = pack_bf16(x0, x1);
        }
      }
      if (t4 == 0)
        lse_out[std::int64_t(hh) * p.sq + qi] =
            sum > 0.0f ? (row_max[mt][h] + log2f(sum)) * 0.693147180559945309f : -INFINITY;
    }
}

}  // namespace oomb_trainer::gpu::detail
