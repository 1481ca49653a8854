// oomb — attention forward over one window of key pages (FlashAttention-2 style, mma.sync).
// SPDX-License-Identifier: Apache-2.0
//
// One block owns BM consecutive *packed* rows of one KV head: row r is (query r / group, query head
// kvh * group + r % group), so the query heads of a GQA group share the block and every K/V tile is
// read once per group. K/V tiles of BN keys come straight from the pages (each row's address through
// the page table; cp.async, double-buffered, ids fetched a tile ahead); each warp owns BM / WARPS
// rows, keeps its O accumulator in registers and runs the online softmax in the mma accumulator
// layout. Masking (causal, the window's end, per-document bounds) is applied only to tiles that
// need it; with bounds, tiles below a block's first document bound are not visited. Kernels never
// fail: the launcher (attention.cuh) checks every argument.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/core/bf16.hpp"

#include "oomb/attention/ptx.cuh"
#include "oomb/attention/window.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_KERNEL_NAMESPACE_BEGIN

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
OOMB_KERNEL void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_forward_kernel(const kernel_params p, O* __restrict__ out, float* __restrict__ lse_out, int split) {
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, THREADS = Cfg::THREADS, MT = Cfg::MT;
  constexpr int NT_S = BN / 8, NT_O = D / 8;
  constexpr int CPR = D / 8;            // 16-byte chunks per row
  constexpr int RPP = THREADS / CPR;    // rows one pass of the block loads
  constexpr int KV_PASSES = BN / RPP;
  constexpr int KV_STAGE = BN * D * 2;  // bytes of one K (or V) stage
  static_assert(BN % RPP == 0 && BM % RPP == 0 && RPP % 8 == 0, "load passes");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sQ = smem_addr(smem);
  const std::uint32_t sK = sQ + BM * D * 2;  // stage s at sK + s * KV_STAGE
  const std::uint32_t sV = sK + 2 * KV_STAGE;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int kvh = blockIdx.y;
  // `split` CTAs (one thread-block cluster) share a row block, each taking a contiguous part of its
  // key tiles; rank 0 merges the partial results through distributed shared memory.
  const int rank = static_cast<int>(blockIdx.x) % split;
  // Heaviest (latest, most causal work) blocks first.
  const int r0 = (static_cast<int>(gridDim.x) / split - 1 - static_cast<int>(blockIdx.x) / split) * BM;
  const int rows = p.sq * p.group;
  const int q_lo = static_cast<int>(p.group_div.div(r0));
  const int q_hi = static_cast<int>(p.group_div.div((r0 + BM < rows ? r0 + BM : rows) - 1));
  const std::int64_t qpos_lo = p.q_start + q_lo, qpos_hi = p.q_start + q_hi;

  const virtual_keys keys(p, p.tile_indptr ? q_lo / p.tile : 0);
  const std::int32_t vlen = keys.vlen;
  const std::int32_t page_mask = (1 << p.log_page) - 1;
  const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);
  // Pages at least one tile long hold each tile whole: one page-table lookup per tile.
  const bool uniform = (1 << p.log_page) >= BN;

  // Q tile (rows past the chunk read as zeros). Rows a thread loads are RPP apart, so their
  // swizzle (row & 7) is the same and the destination advances by a constant.
  const int lrow = tid / CPR, lchunk = tid % CPR;
  const std::uint32_t dst0 = swizzled<D>::offset(lrow, lchunk);
#pragma unroll
  for (int i = 0; i < BM / RPP; ++i) {
    const int R = r0 + lrow + i * RPP;
    const bool ok = R < rows;
    const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(R)));
    const std::uint16_t* src =
        ok ? p.q + (std::int64_t(qi) * p.hq + kvh * p.group + (R - qi * p.group)) * D + lchunk * 8 : p.q;
    cp_async_16(sQ + dst0 + i * RPP * (D * 2), src, ok);
  }

  int b_begin, b_end;  // this CTA's share of the tiles some row sees
  keys.cluster_share(p, BN, q_lo, qpos_hi, rank, split, b_begin, b_end);
  const std::int64_t lower_hi = key_lower_rel(p, q_hi);  // the block's largest document bound

  // Page ids of a tile, fetched one tile before its load is issued.
  std::int32_t ids[KV_PASSES];
  auto fetch_ids = [&](int blk) {
    if (uniform) {
      ids[0] = keys.id(blk * BN);
    } else {
#pragma unroll
      for (int i = 0; i < KV_PASSES; ++i) {
        const std::int32_t v = blk * BN + lrow + i * RPP;
        ids[i] = v < vlen ? keys.id(v) : -1;
      }
    }
  };
  const std::int64_t row_step = std::int64_t(RPP) * p.pool.stride_token;
  auto load_kv = [&](int blk, int stage) {
    const std::int32_t v0 = blk * BN;
    const std::uint32_t dk = sK + stage * KV_STAGE + dst0, dv = sV + stage * KV_STAGE + dst0;
    if (uniform) {
      const std::uint16_t* src = base + p.pool.offset(ids[0], (v0 & page_mask) + lrow, kvh) + lchunk * 8;
      if (v0 + BN <= vlen) {  // a full tile: no row checks
#pragma unroll
        for (int i = 0; i < KV_PASSES; ++i) {
          cp_async_16(dk + i * RPP * (D * 2), src + i * row_step, true);
          cp_async_16(dv + i * RPP * (D * 2), src + i * row_step + p.pool.v_offset, true);
        }
      } else {
        const std::int32_t valid = vlen - v0 - lrow;  // rows lrow + i * RPP < vlen - v0
#pragma unroll
        for (int i = 0; i < KV_PASSES; ++i) {
          const bool ok = i * RPP < valid;
          const std::uint16_t* sk = ok ? src + i * row_step : base;
          cp_async_16(dk + i * RPP * (D * 2), sk, ok);
          cp_async_16(dv + i * RPP * (D * 2), sk + (ok ? p.pool.v_offset : 0), ok);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < KV_PASSES; ++i) {
        const std::int32_t v = v0 + lrow + i * RPP;
        const bool ok = ids[i] >= 0;
        const std::int64_t off = ok ? p.pool.offset(ids[i], v & page_mask, kvh) + lchunk * 8 : 0;
        cp_async_16(dk + i * RPP * (D * 2), base + off, ok);
        cp_async_16(dv + i * RPP * (D * 2), base + off + (ok ? p.pool.v_offset : 0), ok);
      }
    }
  };

  if (b_end > b_begin) {
    fetch_ids(b_begin);
    load_kv(b_begin, 0);
  }
  cp_async_commit();
  if (b_end > b_begin + 1) fetch_ids(b_begin + 1);

  // Per-thread rows: (mt, h) -> local row warp * WM + mt * 16 + g + 8h; qrow = its query index,
  // qlow its first visible key (key_lower_rel).
  int qrow[MT][2];
  std::int64_t qlow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int R = r0 + warp * Cfg::WM + mt * 16 + g + 8 * h;
      qrow[mt][h] = R < rows ? static_cast<int>(p.group_div.div(R)) : q_hi;
      qlow[mt][h] = key_lower_rel(p, qrow[mt][h]);
    }

  const frag_addr<D> fQ(sQ, lane, true), fK0(sK, lane, false), fV0(sV, lane, true);

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

  for (int blk = b_begin; blk < b_end; ++blk) {
    const int stage = (blk - b_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (blk + 1 < b_end) {
      load_kv(blk + 1, stage ^ 1);
      if (blk + 2 < b_end) fetch_ids(blk + 2);
    }
    cp_async_commit();
    frag_addr<D> fK = fK0, fV = fV0;
    fK.base += stage * KV_STAGE;
    fV.base += stage * KV_STAGE;

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
      for (int mt = 0; mt < MT; ++mt) load_a(fQ, warp * Cfg::WM + mt * 16, kk * 16, a[mt]);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        std::uint32_t b[4];
        load_b_nk(fK, np * 16, kk * 16, b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Mask only tiles that cross the window's end, the causal diagonal or a row's document start.
    const std::int32_t v0 = blk * BN;
    if (v0 + BN > vlen || keys.pos(v0 + BN - 1) > qpos_lo ||
        (p.key_lower != nullptr && keys.pos(v0) - p.q_start < lower_hi)) {
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const std::int32_t v = v0 + nt * 8 + 2 * t4 + c;
          // key position relative to q_start, as query indices count (past keys are negative)
          const std::int64_t krel = v < vlen ? keys.pos(v) - p.q_start : INT64_MAX;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (krel > qrow[mt][h] || krel < qlow[mt][h]) s[mt][nt][2 * h + c] = -INFINITY;
        }
    }

    // Online softmax in base 2 (scores scaled by scale * log2 e). The O rescale is skipped when no
    // row of the warp raised its maximum (the common case once a few tiles are in).
    float corr[MT][2];
    bool grew = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float raw = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt) raw = fmaxf(raw, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        float mx = fmaxf(row_max[mt][h], raw * p.scale_log2);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ref = mx == -INFINITY ? 0.0f : mx;
        corr[mt][h] = mx == row_max[mt][h] ? 1.0f : fast_exp2(row_max[mt][h] - ref);
        grew |= mx != row_max[mt][h];
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
        row_sum[mt][h] = row_sum[mt][h] * corr[mt][h] + sum;
      }
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt) {
          acc_o[mt][nt][0] *= corr[mt][0];
          acc_o[mt][nt][1] *= corr[mt][0];
          acc_o[mt][nt][2] *= corr[mt][1];
          acc_o[mt][nt][3] *= corr[mt][1];
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
        load_b_kn(fV, dp * 16, ks * 16, b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(acc_o[mt][2 * dp], a[mt], b[0], b[1]);
          mma_16816(acc_o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  if (split > 1) {
    // Ranks > 0 park (O, max, partial sum) in their own shared memory, thread-major so each
    // thread's float4s are contiguous across the block; rank 0 folds them in by log-sum-exp.
    static_assert(MT * NT_O * 16 * THREADS <= 4 * BN * D * 2 && MT * 16 * THREADS <= BM * D * 2,
                  "partials fit in the K/V and Q tiles");
    __syncthreads();
    if (rank != 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float4* ml = reinterpret_cast<float4*>(smem) + mt * THREADS + tid;
        *ml = make_float4(row_max[mt][0], row_max[mt][1], row_sum[mt][0], row_sum[mt][1]);
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt)
          reinterpret_cast<float4*>(smem + BM * D * 2)[(mt * NT_O + nt) * THREADS + tid] =
              make_float4(acc_o[mt][nt][0], acc_o[mt][nt][1], acc_o[mt][nt][2], acc_o[mt][nt][3]);
      }
    }
    cluster_sync();
    if (rank == 0) {
      for (int q = 1; q < split; ++q) {
        const std::uint32_t rq = cluster_map(sQ, static_cast<std::uint32_t>(q));
        const std::uint32_t rk = cluster_map(sK, static_cast<std::uint32_t>(q));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const float4 ml = ld_cluster_v4(rq + static_cast<std::uint32_t>((mt * THREADS + tid) * 16));
          float ca[2], cb[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float mo = h ? ml.y : ml.x, so = h ? ml.w : ml.z;
            const float mx = fmaxf(row_max[mt][h], mo);
            const float ref = mx == -INFINITY ? 0.0f : mx;
            ca[h] = fast_exp2(row_max[mt][h] - ref);
            cb[h] = fast_exp2(mo - ref);
            row_sum[mt][h] = row_sum[mt][h] * ca[h] + so * cb[h];
            row_max[mt][h] = mx;
          }
#pragma unroll
          for (int nt = 0; nt < NT_O; ++nt) {
            const float4 v = ld_cluster_v4(rk + static_cast<std::uint32_t>(((mt * NT_O + nt) * THREADS + tid) * 16));
            acc_o[mt][nt][0] = acc_o[mt][nt][0] * ca[0] + v.x * cb[0];
            acc_o[mt][nt][1] = acc_o[mt][nt][1] * ca[0] + v.y * cb[0];
            acc_o[mt][nt][2] = acc_o[mt][nt][2] * ca[1] + v.z * cb[1];
            acc_o[mt][nt][3] = acc_o[mt][nt][3] * ca[1] + v.w * cb[1];
          }
        }
      }
    }
    cluster_sync();  // the other ranks' shared memory stays alive until rank 0 has read it
    if (rank != 0) return;
  }

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
      const int qi = qrow[mt][h], hh = kvh * p.group + (R - qi * p.group);
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

OOMB_KERNEL_NAMESPACE_END
}  // namespace attention::detail
OOMB_NAMESPACE_END
