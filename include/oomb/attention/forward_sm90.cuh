// oomb — attention forward for Hopper (sm_90a): TMA page tiles, an mbarrier pipeline,
// wgmma products, producer/consumer warp specialisation.
// SPDX-License-Identifier: Apache-2.0
//
// Same contract and packed GQA rows as forward.cuh (one block = 128 packed rows of one KV head).
// Three warpgroups: warpgroup 0 is the producer (one thread issues the TMA loads; setmaxnreg gives
// its registers away), warpgroups 1 and 2 are consumers owning 64 rows each. K and V tiles of 128
// keys are TMA boxes of a page (page_size >= 128, so a tile never crosses pages): one tensor map
// covers the whole pool with the page id as its outermost coordinate, so scattered pages need no
// per-page descriptor. STAGES stages of K and of V, each with a full and an empty mbarrier.
// Per tile a consumer issues S = Q K^T for tile j and O += P V for tile j - 1 back to back, then
// runs the softmax of tile j while the P V product is still in flight (wgmma.wait_group 1).
// The tile holding the window's end is loaded by the producer warp with ordinary loads and its
// rows past the end zeroed, so stale (even non-finite) data in a partial page never reaches O.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/core/bf16.hpp"

#include "oomb/attention/ptx.cuh"
#include "oomb/attention/ptx_sm90.cuh"
#include "oomb/attention/window.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_KERNEL_NAMESPACE_BEGIN

template <int D_, int STAGES_, bool PINGPONG_ = false>
struct forward_sm90_tile {
  static constexpr int D = D_, BM = 128, BN = 128, STAGES = STAGES_;
  /// Consumers take turns issuing their products (named barriers), so one warpgroup's softmax
  /// runs while the other's products occupy the tensor cores.
  static constexpr bool PINGPONG = PINGPONG_;
  static constexpr int THREADS = 384;            // producer warpgroup + 2 consumer warpgroups
  static constexpr int PANELS = D / 64;          // 128-byte swizzle rows hold 64 bf16
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;    // one K (or V) stage
  static constexpr int BAR_BYTES = 4 * STAGES * 8;  // static shared memory, sm_90a builds only
  static constexpr int smem_bytes = 1024 /* alignment slack */ + Q_BYTES + 2 * STAGES * KV_BYTES;
  static constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;  // 128*56 + 256*224 = 64512
  static_assert(D == 64 || D == 128, "head_dim");
};

template <class Cfg, class O>
OOMB_KERNEL void __launch_bounds__(Cfg::THREADS, 1)
    attention_forward_sm90_kernel(const __grid_constant__ kernel_params p, const __grid_constant__ CUtensorMap tmap_k,
                                  const __grid_constant__ CUtensorMap tmap_v, O* __restrict__ out,
                                  float* __restrict__ lse_out, int token_dim1, int split) {
#if OOMB_ATTENTION_SM90A
  using namespace sm90;
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, S = Cfg::STAGES, PANELS = Cfg::PANELS;
  constexpr int KV_BYTES = Cfg::KV_BYTES;
  constexpr int PANEL_BYTES = BN * 128;  // one 64-column panel of a K/V tile (BM == BN)

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle is a function of the address: tiles start 1024-aligned.
  const std::uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t sQ = sbase;
  const std::uint32_t sK = sQ + Cfg::Q_BYTES;  // stage s at sK + s * KV_BYTES
  const std::uint32_t sV = sK + S * KV_BYTES;
  // The mbarriers live in static shared memory, which only this (sm_90a) branch declares: the
  // launcher reads the kernel's static size to know whether the binary holds the real kernel.
  __shared__ alignas(8) std::uint64_t bar_mem[4 * S];
  const std::uint32_t bars = smem_addr(bar_mem);
  auto full_k = [&](int s) { return bars + 8u * s; };
  auto full_v = [&](int s) { return bars + 8u * (S + s); };
  auto empty_k = [&](int s) { return bars + 8u * (2 * S + s); };
  auto empty_v = [&](int s) { return bars + 8u * (3 * S + s); };

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7;
  const int kvh = blockIdx.y;
  // `split` CTAs (one thread-block cluster) share a row block, each taking a contiguous part of its
  // key tiles; rank 0 merges the partial results through distributed shared memory.
  const int rank = static_cast<int>(blockIdx.x) % split;
  const int r0 = (static_cast<int>(gridDim.x) / split - 1 - static_cast<int>(blockIdx.x) / split) * BM;  // heaviest first
  const int rows = p.sq * p.group;
  const int q_lo = static_cast<int>(p.group_div.div(r0));
  const int q_hi = static_cast<int>(p.group_div.div((r0 + BM < rows ? r0 + BM : rows) - 1));
  const std::int64_t qpos_lo = p.q_start + q_lo, qpos_hi = p.q_start + q_hi;

  const virtual_keys keys(p, p.tile_indptr ? q_lo / p.tile : 0);
  const std::int32_t vlen = keys.vlen;
  const std::int32_t page_mask = (1 << p.log_page) - 1;
  int b_begin, b_end;  // this CTA's share of the tiles some row sees
  keys.cluster_share(p, BN, q_lo, qpos_hi, rank, split, b_begin, b_end);
  // Tiles before this one may start below some row's document bound (that of the block's last
  // query, the largest): they take the per-row mask. An index, not the bound, so that a call without
  // bounds carries nothing extra through the tile loop (0: no tile).
  const int bounded_below = p.key_lower != nullptr ? keys.first_tile_reaching(BN, __ldg(p.key_lower + q_hi)) + 1 : 0;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (tid < 32) {
    if (lane == 0) {
      prefetch_tensor_map(&tmap_k);
      prefetch_tensor_map(&tmap_v);
    }
    const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);
    for (int blk = b_begin; blk < b_end; ++blk) {
      const int s = (blk - b_begin) % S;
      const std::uint32_t ph = static_cast<std::uint32_t>((blk - b_begin) / S) & 1u;
      const std::int32_t v0 = blk * BN;
      const std::int32_t id = keys.id(v0);
      const int tok = v0 & page_mask;
      // The maps' dims 1 and 2 are (token, head) ordered by stride (see make_kv_tensor_map).
      const int c1 = token_dim1 ? tok : kvh, c2 = token_dim1 ? kvh : tok;
      if (lane == 0) {
        mbar_wait(empty_k(s), ph ^ 1u);
        mbar_expect_tx(full_k(s), KV_BYTES);
#pragma unroll
        for (int c = 0; c < PANELS; ++c)
          tma_load_4d(sK + s * KV_BYTES + c * PANEL_BYTES, &tmap_k, full_k(s), c * 64, c1, c2, id);
      }
      if (v0 + BN <= vlen) {
        if (lane == 0) {
          mbar_wait(empty_v(s), ph ^ 1u);
          mbar_expect_tx(full_v(s), KV_BYTES);
#pragma unroll
          for (int c = 0; c < PANELS; ++c)
            tma_load_4d(sV + s * KV_BYTES + c * PANEL_BYTES, &tmap_v, full_v(s), c * 64, c1, c2, id);
        }
      } else {
        // The window's last tile: rows past vlen become zeros (P is 0 there, but 0 * NaN is not).
        if (lane == 0) mbar_wait(empty_v(s), ph ^ 1u);
        __syncwarp();
        const std::int32_t valid = vlen - v0;
        const std::uint32_t dst = sV + s * KV_BYTES;
        for (int i = lane; i < BN * D / 8; i += 32) {
          const int r = i / (D / 8), chunk = i % (D / 8);
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (r < valid)
            v = *reinterpret_cast<const uint4*>(base + p.pool.offset(id, tok + r, kvh) + p.pool.v_offset + chunk * 8);
          const std::uint32_t a =
              dst + (chunk >> 3) * PANEL_BYTES + r * 128 + ((static_cast<std::uint32_t>(chunk & 7) ^ (r & 7)) << 4);
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                       : "memory");
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(full_v(s));
      }
    }
    }
    if (split > 1) {  // every thread of the cluster takes part in the merge's two cluster barriers
      cluster_sync();
      cluster_sync();
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  setmaxnreg_inc<Cfg::CONSUMER_REGS>();
  const int c = wg - 1;                  // consumer index: rows c * 64 .. c * 64 + 63 of the block
  const int ct = tid - 128 * wg;         // thread within the warpgroup
  const int w = ct >> 5, g = lane >> 2, t4 = lane & 3;

  // Q: this warpgroup's 64 rows, packed rows past the chunk read as zeros, written in TMA's
  // 128-byte-swizzle layout ([panel][row][64]) so the same descriptors serve Q, K and V.
  {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int i = 0; i < 64 * CPR / 128; ++i) {
      const int e = ct + i * 128;
      const int lr = e / CPR, chunk = e % CPR;
      const int row = c * 64 + lr;
      const int R = r0 + row;
      const bool ok = R < rows;
      const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(ok ? R : 0)));
      const std::uint16_t* src = ok ? p.q + (std::int64_t(qi) * p.hq + kvh * p.group + (R - qi * p.group)) * D + chunk * 8 : p.q;
      const std::uint32_t dst =
          sQ + (chunk >> 3) * (BM * 128) + row * 128 + ((static_cast<std::uint32_t>(chunk & 7) ^ (row & 7)) << 4);
      cp_async_16(dst, src, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(1 + c, 128);
  }

  int qrow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = r0 + c * 64 + w * 16 + g + 8 * h;
    qrow[h] = R < rows ? static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(R))) : q_hi;
  }

  constexpr int NS = BN / 2, NO = D / 2;  // accumulator floats per thread
  float s_acc[NS], o_acc[NO];
  std::uint32_t pa[BN / 16][4];
#pragma unroll
  for (int i = 0; i < NO; ++i) o_acc[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const std::uint32_t q_rows = sQ + c * 64 * 128;
  // Tile blk's stage and phase count from this CTA's first tile.
  auto issue_qk = [&](int blk) {
    const int s = (blk - b_begin) % S;
    mbar_wait(full_k(s), static_cast<std::uint32_t>((blk - b_begin) / S) & 1u);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const std::uint32_t koff = (k >> 2) * PANEL_BYTES + (k & 3) * 32;
      wgmma_ss_n128(s_acc, sw128_desc(q_rows + (k >> 2) * (BM * 128) + (k & 3) * 32, 16, 1024),
                    sw128_desc(sK + s * KV_BYTES + koff, 16, 1024), k > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int blk) {
    const int s = (blk - b_begin) % S;
    mbar_wait(full_v(s), static_cast<std::uint32_t>((blk - b_begin) / S) & 1u);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) {
      const std::uint64_t db = sw128_desc(sV + s * KV_BYTES + k * 16 * 128, PANEL_BYTES, 1024);
      if constexpr (D == 128)
        wgmma_rs_n128(o_acc, pa[k], db);
      else
        wgmma_rs_n64(o_acc, pa[k], db);
    }
    wgmma_commit();
  };
  // Masks tile blk (only tiles crossing the window's end, the diagonal or a row's document start),
  // then the online softmax in base 2: exponentiates s_acc in place and returns the O correction per row.
  auto softmax = [&](int blk, float (&corr)[2]) {
    const std::int32_t v0 = blk * BN;
    if (v0 + BN > vlen || keys.pos(v0 + BN - 1) > qpos_lo || blk < bounded_below) {
      const std::int64_t k0 = keys.pos(v0) - p.q_start;  // a tile lies inside one page
      const std::int32_t valid = vlen - v0;
      std::int64_t qlow[2];  // each row's first visible key, read here only: masked tiles are few
#pragma unroll
      for (int h = 0; h < 2; ++h) qlow[h] = key_lower_rel(p, qrow[h]);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * t4 + e;
          const std::int64_t krel = col < valid ? k0 + col : INT64_MAX;
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (krel > qrow[h] || krel < qlow[h]) s_acc[4 * j + 2 * h + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float raw = -INFINITY;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) raw = fmaxf(raw, fmaxf(s_acc[4 * j + 2 * h], s_acc[4 * j + 2 * h + 1]));
      float mx = fmaxf(row_max[h], raw * p.scale_log2);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ref = mx == -INFINITY ? 0.0f : mx;
      corr[h] = fast_exp2(row_max[h] - ref);
      row_max[h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(s_acc[4 * j + 2 * h + e], p.scale_log2, -ref));
          s_acc[4 * j + 2 * h + e] = pe;
          sum += pe;
        }
      row_sum[h] = row_sum[h] * corr[h] + sum;
    }
  };
  auto to_p = [&] {
#pragma unroll
    for (int k = 0; k < BN / 16; ++k) {
      pa[k][0] = pack_bf16(s_acc[8 * k + 0], s_acc[8 * k + 1]);
      pa[k][1] = pack_bf16(s_acc[8 * k + 2], s_acc[8 * k + 3]);
      pa[k][2] = pack_bf16(s_acc[8 * k + 4], s_acc[8 * k + 5]);
      pa[k][3] = pack_bf16(s_acc[8 * k + 6], s_acc[8 * k + 7]);
    }
  };
  auto fence_s = [&] {
#pragma unroll
    for (int i = 0; i < NS; ++i) fence_operand(s_acc[i]);
  };
  auto fence_o = [&] {
#pragma unroll
    for (int i = 0; i < NO; ++i) fence_operand(o_acc[i]);
  };

  // Ping-pong turns: named barrier 3 + c is consumer c's turn to issue; consumer 0 goes first.
  auto turn_wait = [&] {
    if constexpr (Cfg::PINGPONG) named_sync(3 + c, 256);
  };
  auto turn_pass = [&] {
    if constexpr (Cfg::PINGPONG) named_arrive(3 + (1 - c), 256);
  };
  if constexpr (Cfg::PINGPONG)
    if (c == 1) named_arrive(3, 256);

  if (b_end > b_begin) {
    float corr[2];
    turn_wait();
    issue_qk(b_begin);
    turn_pass();
    wgmma_wait<0>();
    fence_s();
    mbar_arrive(empty_k(0));
    softmax(b_begin, corr);
    to_p();
    for (int blk = b_begin + 1; blk < b_end; ++blk) {
      turn_wait();
      issue_qk(blk);
      issue_pv(blk - 1);
      turn_pass();
      wgmma_wait<1>();  // S of tile blk is ready; P V of tile blk - 1 may still run
      fence_s();
      mbar_arrive(empty_k((blk - b_begin) % S));
      softmax(blk, corr);
      wgmma_wait<0>();
      fence_o();
      mbar_arrive(empty_v((blk - 1 - b_begin) % S));
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o_acc[4 * j + 0] *= corr[0];
        o_acc[4 * j + 1] *= corr[0];
        o_acc[4 * j + 2] *= corr[1];
        o_acc[4 * j + 3] *= corr[1];
      }
      to_p();
    }
    turn_wait();
    issue_pv(b_end - 1);
    turn_pass();
    wgmma_wait<0>();
    fence_o();
    mbar_arrive(empty_v((b_end - 1 - b_begin) % S));
  }
  if constexpr (Cfg::PINGPONG)
    if (c == 0) named_sync(3, 256);  // consumer 1's last pass

  if (split > 1) {
    // Ranks > 0 park (O, max, partial sum) in their own shared memory, thread-major (float4 f of
    // consumer thread i at [f][i]); rank 0 folds them in by log-sum-exp through DSMEM.
    constexpr int NF = NO / 4;
    static_assert((NF + 1) * 256 * 16 <= Cfg::Q_BYTES + 2 * S * KV_BYTES, "partials fit in the tiles");
    const int ci = tid - 128;
    named_sync(5, 256);  // both consumers are done reading Q, K and V
    if (rank != 0) {
      float4* part = reinterpret_cast<float4*>(smem_raw + (sQ - smem_addr(smem_raw)));
#pragma unroll
      for (int f = 0; f < NF; ++f)
        part[f * 256 + ci] = make_float4(o_acc[4 * f], o_acc[4 * f + 1], o_acc[4 * f + 2], o_acc[4 * f + 3]);
      part[NF * 256 + ci] = make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]);
    }
    cluster_sync();
    if (rank == 0) {
      for (int q = 1; q < split; ++q) {
        const std::uint32_t rq = cluster_map(sQ, static_cast<std::uint32_t>(q));
        const float4 ml = ld_cluster_v4(rq + static_cast<std::uint32_t>((NF * 256 + ci) * 16));
        float ca[2], cb[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mo = h ? ml.y : ml.x, so = h ? ml.w : ml.z;
          const float mx = fmaxf(row_max[h], mo);
          const float ref = mx == -INFINITY ? 0.0f : mx;
          ca[h] = fast_exp2(row_max[h] - ref);
          cb[h] = fast_exp2(mo - ref);
          row_sum[h] = row_sum[h] * ca[h] + so * cb[h];
          row_max[h] = mx;
        }
#pragma unroll
        for (int f = 0; f < NF; ++f) {
          const float4 v = ld_cluster_v4(rq + static_cast<std::uint32_t>((f * 256 + ci) * 16));
          o_acc[4 * f + 0] = o_acc[4 * f + 0] * ca[0] + v.x * cb[0];
          o_acc[4 * f + 1] = o_acc[4 * f + 1] * ca[0] + v.y * cb[0];
          o_acc[4 * f + 2] = o_acc[4 * f + 2] * ca[1] + v.z * cb[1];
          o_acc[4 * f + 3] = o_acc[4 * f + 3] * ca[1] + v.w * cb[1];
        }
      }
    }
    cluster_sync();  // the other ranks' shared memory stays alive until rank 0 has read it
    if (rank != 0) return;
  }

  // Epilogue: normalise, write O (in the caller's element type) and the natural-log lse.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int R = r0 + c * 64 + w * 16 + g + 8 * h;
    if (R >= rows) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int qi = qrow[h], hh = kvh * p.group + (R - qi * p.group);
    O* dst = out + (std::int64_t(qi) * p.hq + hh) * D + 2 * t4;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float x0 = o_acc[4 * j + 2 * h] * inv, x1 = o_acc[4 * j + 2 * h + 1] * inv;
      if constexpr (std::is_same_v<O, float>) {
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(x0, x1);
      } else {
        *reinterpret_cast<std::uint32_t*>(dst + j * 8) = pack_bf16(x0, x1);
      }
    }
    if (t4 == 0)
      lse_out[std::int64_t(hh) * p.sq + qi] =
          sum > 0.0f ? (row_max[h] + log2f(sum)) * 0.693147180559945309f : -INFINITY;
  }
#else
  (void)p;
  (void)tmap_k;
  (void)tmap_v;
  (void)out;
  (void)lse_out;
  (void)token_dim1;
  (void)split;
  __trap();  // built without sm_90a: the launcher never selects this kernel then
#endif
}

OOMB_KERNEL_NAMESPACE_END
}  // namespace attention::detail
OOMB_NAMESPACE_END
