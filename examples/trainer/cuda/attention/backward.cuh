// oomb trainer — attention backward over one window of key pages (FlashAttention-2 style, mma.sync).
// SPDX-License-Identifier: Apache-2.0
//
// One block owns BN consecutive keys of the window for one KV head and walks the packed query rows
// (query, head of the group) in tiles of BM: it recomputes P from the *global* lse, forms
// dS = P * (dP - delta) with delta = rowsum(dO * O) precomputed (attention_backward_delta), keeps
// dK and dV in registers for the whole walk, and adds dQ into an fp32 buffer with vector atomics
// (red.global.add.v2.f32). At the end each key row's dK/dV is added, by its one owner, either into
// the chunk's own rows (position >= q_start) or into the fp32 gradient page that mirrors its KV
// page. Sparse: a query tile contributes only to the past pages it selected (a per-tile bit mask
// built once per block); unselected pages get no gradient.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <oomb/core/bf16.hpp>
#include <oomb/paging/views.hpp>

#include "ptx.cuh"
#include "window.cuh"

namespace oomb_trainer::gpu::detail {

template <int D_, int BN_, int BM_, int WARPS_, int MIN_BLOCKS_>
struct backward_tile {
  static constexpr int D = D_, BN = BN_, BM = BM_, WARPS = WARPS_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int max_tiles = 4096;  // sparse query tiles one call may have
  static constexpr int smem_bytes =
      (2 * BN * D + 2 * 2 * BM * D + 2 * BM * BN) * 2 + 2 * 2 * BM * 4 + max_tiles;
  static_assert(BN == 128 && BM == 64 && WARPS == 8, "the warp layouts below assume 128 keys x 64 rows, 8 warps");
};

struct backward_outputs {
  float* dq;      // [sq][hq][d], added to
  float* dk_own;  // [sq][hkv][d], added to (row = position - q_start)
  float* dv_own;
  oomb::grad_mirror_view<float> dpast;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_kernel(const kernel_params p, const float* __restrict__ lse,
                              const float* __restrict__ delta, const std::uint16_t* __restrict__ d_o,
                              const backward_outputs outp) {
  constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, THREADS = Cfg::THREADS;
  constexpr int CPR = D / 8, RPP = THREADS / CPR;
  constexpr int NT_KV = D / 16;  // n8 tiles of a warp's dK/dV slice (D/2 columns)
  constexpr int NT_Q = D / 32;   // n8 tiles of a warp's dQ slice (D/4 columns)

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sK = smem_addr(smem);
  const std::uint32_t sV = sK + BN * D * 2;
  const std::uint32_t sQ = sV + BN * D * 2;          // 2 stages
  const std::uint32_t sdO = sQ + 2 * BM * D * 2;     // 2 stages
  const std::uint32_t sP = sdO + 2 * BM * D * 2;     // [BM][BN]
  const std::uint32_t sdS = sP + BM * BN * 2;        // [BM][BN]
  float* sL = reinterpret_cast<float*>(smem + (2 * BN * D + 4 * BM * D + 2 * BM * BN) * 2);  // [2][BM] lse * log2 e
  float* sDelta = sL + 2 * BM;                                                             // [2][BM]
  std::uint8_t* sBits = reinterpret_cast<std::uint8_t*>(sDelta + 2 * BM);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int kvh = blockIdx.y;
  const std::int32_t s0 = blockIdx.x * BN;
  const window_extent win(p);
  if (s0 >= win.len) return;
  const std::int32_t s_end = s0 + BN < win.len ? s0 + BN : win.len;
  const std::int64_t pos0 = std::int64_t(p.first_page) << p.log_page;
  const std::int64_t kmin = pos0 + s0, kmax = pos0 + s_end - 1;
  const int rows = p.sq * p.group;
  const int nqb = (rows + BM - 1) / BM;
  const std::int64_t first_q = kmin - p.q_start;  // earliest query that sees a key of this block
  if (first_q >= p.sq) return;
  const int page_mask = (1 << p.log_page) - 1;
  const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);

  // K and V of the block, once.
  const int lrow = tid / CPR, lchunk = tid % CPR;
#pragma unroll
  for (int i = 0; i < BN / RPP; ++i) {
    const int r = lrow + i * RPP;
    const std::int32_t s = s0 + r;
    const bool ok = s < win.len;
    const std::int64_t off = ok ? p.pool.offset(win.ids[s >> p.log_page], s & page_mask, kvh) + lchunk * 8 : 0;
    cp_async_16(sK + swizzled<D>::offset(r, lchunk), base + off, ok);
    cp_async_16(sV + swizzled<D>::offset(r, lchunk), base + off + p.pool.v_offset, ok);
  }

  // Sparse: bit b of sBits[tile] says whether that query tile attends page j0 + b of the block.
  const bool sparse = p.tile_indptr != nullptr;
  const std::int32_t j0 = s0 >> p.log_page;
  const int npg = ((s_end - 1) >> p.log_page) - j0 + 1;
  const unsigned full_bits = (1u << npg) - 1u;
  const int tile_rows = p.tile * p.group;  // packed rows per query tile (a multiple of BM)
  if (sparse) {
    const std::int64_t p_own = first_own_page(p, win);
    const int ntiles = (p.sq + p.tile - 1) / p.tile;
    for (int t = tid; t < ntiles; t += THREADS) {
      const std::int32_t* list = p.tile_pages + p.tile_indptr[t];
      const std::int32_t cnt = p.tile_indptr[t + 1] - p.tile_indptr[t];
      unsigned bits = 0;
      for (int b = 0; b < npg; ++b) {
        const std::int64_t page = std::int64_t(p.first_page) + j0 + b;
        bool on = page >= p_own;
        if (!on) {
          const std::int32_t k = lower_bound(list, cnt, page);
          on = k < cnt && list[k] == page;
        }
        bits |= unsigned(on) << b;
      }
      sBits[t] = static_cast<std::uint8_t>(bits);
    }
    __syncthreads();
  }
  // Next query tile at or after b that has work for this block.
  auto next_block = [&](int b) {
    if (sparse)
      while (b < nqb && sBits[(b * BM) / tile_rows] == 0) b = ((b * BM) / tile_rows + 1) * tile_rows / BM;
    return b;
  };

  auto load_q = [&](int b, int stage) {
#pragma unroll
    for (int i = 0; i < BM / RPP; ++i) {
      const int r = lrow + i * RPP, R = b * BM + r;
      const bool ok = R < rows;
      const std::int64_t off = ok ? (std::int64_t(R / p.group) * p.hq + kvh * p.group + R % p.group) * D + lchunk * 8 : 0;
      const std::uint32_t dst = swizzled<D>::offset(r, lchunk) + stage * (BM * D * 2);
      cp_async_16(sQ + dst, p.q + off, ok);
      cp_async_16(sdO + dst, d_o + off, ok);
    }
    if (tid < BM) {
      const int R = b * BM + tid;
      const bool ok = R < rows;
      const std::int64_t off = ok ? std::int64_t(kvh * p.group + R % p.group) * p.sq + R / p.group : 0;
      cp_async_4(smem_addr(sL + stage * BM + tid), lse + off, ok);
      cp_async_4(smem_addr(sDelta + stage * BM + tid), delta + off, ok);
    }
  };

  const std::int64_t q0 = first_q > 0 ? first_q : 0;
  int b = next_block(static_cast<int>((q0 * p.group) / BM));
  if (b < nqb) load_q(b, 0);
  cp_async_commit();

  // Warp layouts: S/dP and dQ tiles as 2 (rows) x 4 (keys / d); dK/dV as 4 (keys) x 2 (d).
  const int wm = warp >> 2, wn = warp & 3;
  const int wk = warp >> 1, wd = warp & 1;

  float acc_dk[2][NT_KV][4], acc_dv[2][NT_KV][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT_KV; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][nt][e] = acc_dv[mt][nt][e] = 0.0f;

  constexpr float log2e = 1.4426950408889634f;
  for (int it = 0; b < nqb; ++it) {
    const int stage = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    const int nb = next_block(b + 1);
    if (nb < nqb) load_q(nb, stage ^ 1);
    cp_async_commit();
    const std::uint32_t sQs = sQ + stage * (BM * D * 2), sdOs = sdO + stage * (BM * D * 2);
    const float* sLs = sL + stage * BM;
    const float* sDs = sDelta + stage * BM;

    // S = Q K^T and dP = dO V^T, rows wm*32.., keys wn*32..
    float s[2][4][4], dp[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = dp[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[2][4], ad[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        load_a<D>(sQs, wm * 32 + mt * 16, kk * 16, lane, a[mt]);
        load_a<D>(sdOs, wm * 32 + mt * 16, kk * 16, lane, ad[mt]);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        std::uint32_t bk[4], bv[4];
        load_b_nk<D>(sK, wn * 32 + np * 16, kk * 16, lane, bk);
        load_b_nk<D>(sV, wn * 32 + np * 16, kk * 16, lane, bv);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_16816(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          mma_16816(dp[mt][2 * np], ad[mt], bv[0], bv[1]);
          mma_16816(dp[mt][2 * np + 1], ad[mt], bv[2], bv[3]);
        }
      }
    }

    // P = exp(scale S - lse), dS = P (dP - delta); masked entries are 0. Both go to shared memory.
    const unsigned bits = sparse ? sBits[(b * BM) / tile_rows] : full_bits;
    const bool need_mask = s_end - s0 < BN || bits != full_bits || kmax > p.q_start + (b * BM) / p.group;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * 32 + mt * 16 + g + 8 * h;
        const int R = b * BM + r;
        const float l2 = sLs[r] * log2e;
        const float lref = l2 == -INFINITY ? INFINITY : l2;
        const float dl = sDs[r];
        const std::int64_t qpos = p.q_start + (R < rows ? R / p.group : 0);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          float pv[2], dv[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int col = wn * 32 + nt * 8 + 2 * t4 + c;
            float pe = fast_exp2(fmaf(s[mt][nt][2 * h + c], p.scale_log2, -lref));
            if (need_mask) {
              const std::int32_t sk = s0 + col;
              const bool ok = sk < s_end && ((bits >> ((sk >> p.log_page) - j0)) & 1u) && pos0 + sk <= qpos;
              if (!ok) pe = 0.0f;
            }
            pv[c] = pe;
            dv[c] = pe * (dp[mt][nt][2 * h + c] - dl);
          }
          const std::uint32_t off = swizzled<BN>::offset(r, (wn * 32 + nt * 8) >> 3) + 4 * t4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + off), "r"(pack_bf16(pv[0], pv[1])));
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + off), "r"(pack_bf16(dv[0], dv[1])));
        }
      }
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q: keys wk*32.., d columns wd*D/2..
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      std::uint32_t ap[2][4], as[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        load_a_t<BN>(sP, wk * 32 + mt * 16, kk * 16, lane, ap[mt]);
        load_a_t<BN>(sdS, wk * 32 + mt * 16, kk * 16, lane, as[mt]);
      }
#pragma unroll
      for (int np = 0; np < NT_KV / 2; ++np) {
        std::uint32_t bo[4], bq[4];
        load_b_kn<D>(sdOs, wd * (D / 2) + np * 16, kk * 16, lane, bo);
        load_b_kn<D>(sQs, wd * (D / 2) + np * 16, kk * 16, lane, bq);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_16816(acc_dv[mt][2 * np], ap[mt], bo[0], bo[1]);
          mma_16816(acc_dv[mt][2 * np + 1], ap[mt], bo[2], bo[3]);
          mma_16816(acc_dk[mt][2 * np], as[mt], bq[0], bq[1]);
          mma_16816(acc_dk[mt][2 * np + 1], as[mt], bq[2], bq[3]);
        }
      }
    }

    // dQ += scale * dS K: rows wm*32.., d columns wn*D/4..; added to global memory.
    {
      float dq[2][NT_Q][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT_Q; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[mt][nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        std::uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) load_a<BN>(sdS, wm * 32 + mt * 16, kk * 16, lane, a[mt]);
#pragma unroll
        for (int np = 0; np < NT_Q / 2; ++np) {
          std::uint32_t bk[4];
          load_b_kn<D>(sK, wn * (D / 4) + np * 16, kk * 16, lane, bk);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_16816(dq[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816(dq[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int R = b * BM + wm * 32 + mt * 16 + g + 8 * h;
          if (R >= rows) continue;
          float* dst = outp.dq + (std::int64_t(R / p.group) * p.hq + kvh * p.group + R % p.group) * D +
                       wn * (D / 4) + 2 * t4;
#pragma unroll
          for (int nt = 0; nt < NT_Q; ++nt)
            red_add_v2(dst + nt * 8, dq[mt][nt][2 * h] * p.scale, dq[mt][nt][2 * h + 1] * p.scale);
        }
    }
    b = nb;
  }
  cp_async_wait<0>();

  // Epilogue: each key row has exactly one owner (this block), so a plain read-add-write suffices.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int32_t sk = s0 + wk * 32 + mt * 16 + g + 8 * h;
      if (sk >= s_end) continue;
      const std::int64_t pos = pos0 + sk;
      float *dk, *dv;
      if (pos >= p.q_start) {
        const std::int64_t row = pos - p.q_start;
        if (row >= p.sq) continue;  // a key after the chunk: no query sees it
        dk = outp.dk_own + (row * p.hkv + kvh) * D;
        dv = outp.dv_own + (row * p.hkv + kvh) * D;
      } else {
        const std::int32_t gid = outp.dpast.grad_id[win.ids[sk >> p.log_page]];
        const std::int64_t off = outp.dpast.pool.offset(gid, sk & page_mask, kvh);
        dk = outp.dpast.pool.base + off;
        dv = dk + outp.dpast.pool.v_offset;
      }
#pragma unroll
      for (int nt = 0; nt < NT_KV; ++nt) {
        const int col = wd * (D / 2) + nt * 8 + 2 * t4;
        float2 k2 = *reinterpret_cast<float2*>(dk + col), v2 = *reinterpret_cast<float2*>(dv + col);
        k2.x += acc_dk[mt][nt][2 * h] * p.scale;
        k2.y += acc_dk[mt][nt][2 * h + 1] * p.scale;
        v2.x += acc_dv[mt][nt][2 * h];
        v2.y += acc_dv[mt][nt][2 * h + 1];
        *reinterpret_cast<float2*>(dk + col) = k2;
        *reinterpret_cast<float2*>(dv + col) = v2;
      }
    }
}

/// delta[h][i] = sum_d dO[i][h][d] * O[i][h][d] (fp32), one warp per (i, h).
template <class O>
__global__ void attention_delta_kernel(std::int32_t sq, std::int32_t hq, std::int32_t d, const O* __restrict__ o,
                                       const std::uint16_t* __restrict__ d_o, float* __restrict__ delta) {
  const std::int64_t row = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= std::int64_t(sq) * hq) return;
  const O* orow = o + row * d;
  const std::uint16_t* grow = d_o + row * d;
  float acc = 0.0f;
  for (int k = lane; k < d; k += 32) {
    float ov;
    if constexpr (std::is_same_v<O, float>)
      ov = orow[k];
    else
      ov = __uint_as_float(std::uint32_t(orow[k].bits) << 16);
    acc += ov * __uint_as_float(std::uint32_t(grow[k]) << 16);
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) {
    const std::int64_t i = row / hq, h = row % hq;
    delta[h * sq + i] = acc;
  }
}

/// Folds one window's (o, lse) into the accumulator (o_acc, lse_acc) by log-sum-exp; one warp a row.
__global__ void attention_merge_kernel(std::int32_t sq, std::int32_t hq, std::int32_t d, float* __restrict__ o_acc,
                                       float* __restrict__ lse_acc, const float* __restrict__ o,
                                       const float* __restrict__ lse) {
  const std::int64_t row = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= std::int64_t(sq) * hq) return;
  const std::int64_t i = row / hq, h = row % hq;
  const float la = lse_acc[h * sq + i], lb = lse[h * sq + i];
  const float m = fmaxf(la, lb);
  if (m == -INFINITY) return;  // neither side saw a key: the accumulator stays (0, -inf)
  const float wa = expf(la - m), wb = expf(lb - m);
  const float inv = 1.0f / (wa + wb);
  for (int k = lane; k < d; k += 32) o_acc[row * d + k] = (o_acc[row * d + k] * wa + o[row * d + k] * wb) * inv;
  __syncwarp();
  if (lane == 0) lse_acc[h * sq + i] = m + logf(wa + wb);
}

}  // namespace oomb_trainer::gpu::detail
