// oomb — attention backward over one window of key pages (FlashAttention-2 style, mma.sync).
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

#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/core/bf16.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/ptx.cuh"
#include "oomb/attention/window.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_KERNEL_NAMESPACE_BEGIN

/// Tile shape of the backward: BN keys per block, BM packed query rows per step, and three warp
/// layouts: S/dP as WM_S (rows) x WARPS/WM_S (keys), dK/dV as WK (keys) x WARPS/WK (d), dQ as
/// WM_Q (rows) x WARPS/WM_Q (d).
template <int D_, int BN_, int BM_, int WARPS_, int MIN_BLOCKS_, int WM_S_, int WK_, int WM_Q_>
struct backward_tile {
  static constexpr int D = D_, BN = BN_, BM = BM_, WARPS = WARPS_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int WM_S = WM_S_, WN_S = WARPS / WM_S_, WK = WK_, WD = WARPS / WK_, WM_Q = WM_Q_,
                       WN_Q = WARPS / WM_Q_;
  static constexpr int S_M = BM / WM_S, S_N = BN / WN_S;  // one warp's S/dP tile
  static constexpr int KV_M = BN / WK, KV_N = D / WD;     // one warp's dK/dV tile
  static constexpr int Q_M = BM / WM_Q, Q_N = D / WN_Q;   // one warp's dQ tile
  static constexpr int max_tiles = 4096;                  // sparse query tiles one call may have
  static constexpr int tiles_bytes = 2 * BN * D * 2 + 2 * 2 * BM * D * 2 + 2 * BM * BN * 2;
  static constexpr int smem_bytes = tiles_bytes + 2 * 5 * BM * 4 + max_tiles;
  static_assert(S_M % 16 == 0 && S_N % 16 == 0 && KV_M % 16 == 0 && KV_N % 16 == 0 && Q_M % 16 == 0 &&
                    Q_N % 16 == 0 && BM % 16 == 0 && BN % 16 == 0,
                "warp tiles must be multiples of 16");
  static_assert((S_N / 8) <= 8 && ((S_N / 8) & (S_N / 8 - 1)) == 0, "S tile columns: 16, 32 or 64");
};

struct backward_outputs {
  float* dq;      // [sq][hq][d], added to
  float* dk_own;  // [sq][hkv][d], added to (row = position - q_start)
  float* dv_own;
  window_grad_view<float> dpast;
  /// Hopper backward: every dK/dV row starts 16-byte aligned (rows16_aligned), so whole blocks of rows
  /// are added by TMA reductions (backward_rows_maps); else red.add per pair.
  bool tensor_rows = false;
  bool grad_token_dim1 = false;  // the gradient pool's tensor maps: dim 1 is the token (else the head)
};

/// Whether out's dK/dV rows all start 16-byte aligned (backward_outputs::tensor_rows).
inline bool rows16_aligned(const backward_outputs& out) {
  auto a16 = [](const void* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15u) == 0; };
  const auto& g = out.dpast.pool;
  return a16(out.dk_own) && a16(out.dv_own) &&
         (g.base == nullptr ||
          (a16(g.base) && g.pair_stride % 4 == 0 && g.v_offset % 4 == 0 && g.stride_token % 4 == 0 && g.stride_head % 4 == 0));
}

template <class Cfg>
OOMB_KERNEL void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    attention_backward_kernel(const kernel_params p, const float* __restrict__ lse,
                              const float* __restrict__ delta, const std::uint16_t* __restrict__ d_o,
                              const backward_outputs outp, int qsplit) {
  constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, THREADS = Cfg::THREADS;
  constexpr int CPR = D / 8, RPP = THREADS / CPR;
  constexpr int MT_S = Cfg::S_M / 16, NT_S = Cfg::S_N / 8;
  constexpr int MT_KV = Cfg::KV_M / 16, NT_KV = Cfg::KV_N / 8;
  constexpr int MT_Q = Cfg::Q_M / 16, NT_Q = Cfg::Q_N / 8;
  constexpr int QSTAGE = BM * D * 2;
  static_assert(BN % RPP == 0 && BM % RPP == 0 && RPP % 8 == 0, "load passes");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sK = smem_addr(smem);
  const std::uint32_t sV = sK + BN * D * 2;
  const std::uint32_t sQ = sV + BN * D * 2;      // 2 stages
  const std::uint32_t sdO = sQ + 2 * QSTAGE;     // 2 stages
  const std::uint32_t sP = sdO + 2 * QSTAGE;     // [BM][BN]
  const std::uint32_t sdS = sP + BM * BN * 2;    // [BM][BN]
  float* sL = reinterpret_cast<float*>(smem + Cfg::tiles_bytes);  // [2][BM] lse
  float* sDelta = sL + 2 * BM;                                    // [2][BM]
  int* sRowQ = reinterpret_cast<int*>(sDelta + 2 * BM);           // [2][BM] query index (-1: no row)
  int* sRowOff = sRowQ + 2 * BM;                                  // [2][BM] element offset of the row in q / dq
  int* sRowLo = sRowOff + 2 * BM;  // [2][BM] the row's first visible key column, by its document (0..BN)
  std::uint8_t* sBits = reinterpret_cast<std::uint8_t*>(sRowLo + 2 * BM);

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
  // The queries that see a key of this block: from the causal start first_q to the last whose
  // document starts at or before kmax (queries_reaching); the walk takes no step past them.
  const int q_end = queries_reaching(p, kmax);
  const int walk_rows = q_end * p.group;
  const int nqb = (walk_rows + BM - 1) / BM;
  const std::int64_t first_q = kmin - p.q_start;  // earliest query that sees a key of this block
  if (first_q >= q_end) return;
  const int page_mask = (1 << p.log_page) - 1;
  const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);

  // Sparse: bit b of sBits[tile] says whether that query tile attends page j0 + b of the block.
  const bool sparse = p.tile_indptr != nullptr;
  const std::int32_t j0 = s0 >> p.log_page;
  const int npg = ((s_end - 1) >> p.log_page) - j0 + 1;
  const unsigned full_bits = (1u << npg) - 1u;
  const int tile_rows = p.tile * p.group;  // packed rows per query tile (a multiple of BM)
  // read_bits: the block's pages some tile attends. The others (past pages no tile selected) are
  // never read: their ids may be -1 and their memory anything, even NaN (a masked P = 0 would not
  // stop a NaN K or V from reaching dS and dQ), so they load as zeros and get no gradient.
  __shared__ unsigned read_bits;
  if (sparse) {
    if (tid == 0) read_bits = 0;
    __syncthreads();
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
      if (bits != 0) atomicOr(&read_bits, bits);
    }
    __syncthreads();
  }
  // Pages wholly below the first query's document bound are read by no row (their ids may be -1).
  unsigned below = 0;
  if (p.key_lower != nullptr) {
    const std::int64_t lower0 = __ldg(p.key_lower);
    for (int b = 0; b < npg; ++b) below |= unsigned(pos0 + (std::int64_t(j0 + b + 1) << p.log_page) <= lower0) << b;
  }
  const unsigned reads = (sparse ? read_bits : full_bits) & ~below;
  auto read_page = [&](std::int32_t s) { return ((reads >> ((s >> p.log_page) - j0)) & 1u) != 0; };

  // K and V of the block, once.
  const int lrow = tid / CPR, lchunk = tid % CPR;
  const std::uint32_t dst0 = swizzled<D>::offset(lrow, lchunk);
#pragma unroll
  for (int i = 0; i < BN / RPP; ++i) {
    const std::int32_t s = s0 + lrow + i * RPP;
    const bool ok = s < win.len && read_page(s);
    const std::int64_t off = ok ? p.pool.offset(win.ids[s >> p.log_page], s & page_mask, kvh) + lchunk * 8 : 0;
    cp_async_16(sK + dst0 + i * RPP * (D * 2), base + off, ok);
    cp_async_16(sV + dst0 + i * RPP * (D * 2), base + off + (ok ? p.pool.v_offset : 0), ok);
  }

  // `qsplit` blocks (blockIdx.z) share this key block's query tiles round-robin (more blocks when
  // keys are few); their dK/dV then meet through atomic adds. Next tile at or after b that is
  // this block's and has work for it:
  const int qz = static_cast<int>(blockIdx.z);
  auto mine = [&](int b) { return b + (qz - b % qsplit + qsplit) % qsplit; };
  auto next_block = [&](int b) {
    b = mine(b);
    if (sparse)
      while (b < nqb) {
        const std::uint32_t t = p.tile_rows_div.div(static_cast<std::uint32_t>(b * BM));
        if (sBits[t] != 0) break;
        b = mine(static_cast<int>((t + 1) * static_cast<std::uint32_t>(tile_rows) / BM));
      }
    return b;
  };

  const int head0 = kvh * p.group;
  // Issues the loads of query block b into `stage` and records its rows' query index and offset.
  auto load_q = [&](int b, int stage) {
#pragma unroll
    for (int i = 0; i < BM / RPP; ++i) {
      const int R = b * BM + lrow + i * RPP;
      const bool ok = R < rows;
      const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(R)));
      const std::int64_t off = ok ? (std::int64_t(qi) * p.hq + head0 + (R - qi * p.group)) * D + lchunk * 8 : 0;
      const std::uint32_t dst = dst0 + i * RPP * (D * 2) + stage * QSTAGE;
      cp_async_16(sQ + dst, p.q + off, ok);
      cp_async_16(sdO + dst, d_o + off, ok);
    }
    for (int r = tid; r < BM; r += THREADS) {
      const int R = b * BM + r;
      const bool ok = R < rows;
      const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(R)));
      const int hh = head0 + (R - qi * p.group);
      const std::int64_t off = ok ? std::int64_t(hh) * p.sq + qi : 0;
      cp_async_4(smem_addr(sL + stage * BM + r), lse + off, ok);
      cp_async_4(smem_addr(sDelta + stage * BM + r), delta + off, ok);
      sRowQ[stage * BM + r] = ok ? qi : -1;
      sRowOff[stage * BM + r] = ok ? (qi * p.hq + hh) * D : 0;
      const std::int64_t lo = ok ? key_lower_rel(p, qi) - (kmin - p.q_start) : 0;
      sRowLo[stage * BM + r] = lo > 0 ? (lo < BN ? static_cast<int>(lo) : BN) : 0;
    }
  };

  const std::int64_t q0 = first_q > 0 ? first_q : 0;
  const int b_first = next_block(static_cast<int>((q0 * p.group) / BM));
  if (b_first >= nqb) {  // uniform across the block: no tile of its share sees these keys
    cp_async_wait<0>();
    return;
  }
  // Staggered order: resident blocks would otherwise walk the query tiles in lockstep and all add
  // into the same rows of dq at once (an L2 atomic hot spot); each starts at its own tile and wraps.
  int b = b_first;
  if (p.stagger) {
    const int span = nqb - b_first;
    const int s = next_block(b_first + static_cast<int>((std::uint32_t(blockIdx.x) * 40503u) % std::uint32_t(span)));
    if (s < nqb) b = s;
  }
  const int b_start = b;
  load_q(b, 0);
  cp_async_commit();

  const int wm = warp / Cfg::WN_S, wn = warp % Cfg::WN_S;   // S / dP
  const int wk = warp / Cfg::WD, wd = warp % Cfg::WD;       // dK / dV
  const int wq = warp / Cfg::WN_Q, wqn = warp % Cfg::WN_Q;  // dQ

  // Per-lane fragment addresses (see frag_addr); Q/dO get the stage offset per step.
  const frag_addr<D> fQ0(sQ, lane, true), fdO0(sdO, lane, true);
  const frag_addr<D> fK_b(sK, lane, false), fV_b(sV, lane, false), fK_a(sK, lane, true);
  const frag_addr<BN> fP_b(sP, lane, false), fdS_b(sdS, lane, false), fdS_a(sdS, lane, true);
  // Where this thread stores its P / dS pairs: row wm*S_M + mt*16 + g + 8h, chunk (c0 + nt) ^ g
  // with c0 = wn*S_N/8 a multiple of NT_S, so the chunk is ((c0 ^ g) ^ nt).
  const std::uint32_t pd_row = static_cast<std::uint32_t>((wm * Cfg::S_M + g) * (BN * 2) + 4 * t4);
  const std::uint32_t pd_chunk = static_cast<std::uint32_t>(((wn * Cfg::S_N / 8) ^ g) << 4);

  float acc_dk[MT_KV][NT_KV][4], acc_dv[MT_KV][NT_KV][4];
#pragma unroll
  for (int mt = 0; mt < MT_KV; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT_KV; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mt][nt][e] = acc_dv[mt][nt][e] = 0.0f;

  constexpr float log2e = 1.4426950408889634f;
  const std::int64_t kbase = pos0 + s0 - p.q_start;  // key column c sits at query index kbase + c
  for (int it = 0; b >= 0; ++it) {
    const int stage = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    int nb = next_block(b + 1);
    if (nb >= nqb) nb = b_first;   // wrap (staggered order)
    if (nb == b_start) nb = -1;    // every tile of this block's share done
    if (nb >= 0) load_q(nb, stage ^ 1);
    cp_async_commit();
    frag_addr<D> fQ = fQ0, fdO = fdO0;
    fQ.base += stage * QSTAGE;
    fdO.base += stage * QSTAGE;
    const float* sLs = sL + stage * BM;
    const float* sDs = sDelta + stage * BM;
    const int* rowq = sRowQ + stage * BM;
    const int* rowoff = sRowOff + stage * BM;
    const int* rowlo = sRowLo + stage * BM;

    // S = Q K^T and dP = dO V^T on this warp's S_M x S_N tile.
    float s[MT_S][NT_S][4], dp[MT_S][NT_S][4];
#pragma unroll
    for (int mt = 0; mt < MT_S; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = dp[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[MT_S][4], ad[MT_S][4];
#pragma unroll
      for (int mt = 0; mt < MT_S; ++mt) {
        load_a(fQ, wm * Cfg::S_M + mt * 16, kk * 16, a[mt]);
        load_a(fdO, wm * Cfg::S_M + mt * 16, kk * 16, ad[mt]);
      }
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        std::uint32_t bk[4], bv[4];
        load_b_nk(fK_b, wn * Cfg::S_N + np * 16, kk * 16, bk);
        load_b_nk(fV_b, wn * Cfg::S_N + np * 16, kk * 16, bv);
#pragma unroll
        for (int mt = 0; mt < MT_S; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_16816(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          mma_16816(dp[mt][2 * np], ad[mt], bv[0], bv[1]);
          mma_16816(dp[mt][2 * np + 1], ad[mt], bv[2], bv[3]);
        }
      }
    }

    // P = exp(scale S - lse), dS = P (dP - delta); masked entries are 0. Both go to shared memory.
    // Two copies of the loop so that tiles needing no mask carry no per-element test.
    const unsigned bits = sparse ? sBits[p.tile_rows_div.div(static_cast<std::uint32_t>(b * BM))] : full_bits;
    auto softmax_grad = [&](auto masked) {
#pragma unroll
      for (int mt = 0; mt < MT_S; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm * Cfg::S_M + mt * 16 + g + 8 * h;
          const float l2 = sLs[r] * log2e;
          const float lref = l2 == -INFINITY ? INFINITY : l2;
          const float dl = sDs[r];
          const std::uint32_t roff = pd_row + static_cast<std::uint32_t>((mt * 16 + 8 * h) * (BN * 2));
          // visible: rowlo[r] <= col <= qlim (its document's bound, causal)
          [[maybe_unused]] const std::int64_t qlim = std::int64_t(rowq[r]) - kbase;
#pragma unroll
          for (int nt = 0; nt < NT_S; ++nt) {
            float pv[2], dv[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float pe = fast_exp2(fmaf(s[mt][nt][2 * h + c], p.scale_log2, -lref));
              float ds = pe * (dp[mt][nt][2 * h + c] - dl);
              if constexpr (decltype(masked)::value) {
                const int col = wn * Cfg::S_N + nt * 8 + 2 * t4 + c;
                const std::int32_t sk = s0 + col;
                const bool ok = sk < s_end && ((bits >> ((sk >> p.log_page) - j0)) & 1u) && col <= qlim && col >= rowlo[r];
                if (!ok) pe = ds = 0.0f;  // exactly 0, whatever dP holds
              }
              pv[c] = pe;
              dv[c] = ds;
            }
            const std::uint32_t off = roff + (pd_chunk ^ static_cast<std::uint32_t>(nt << 4));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + off), "r"(pack_bf16(pv[0], pv[1])));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + off), "r"(pack_bf16(dv[0], dv[1])));
          }
        }
    };
    const int last_row = (b + 1) * BM < rows ? (b + 1) * BM - 1 : rows - 1;
    if (s_end - s0 < BN || bits != full_bits ||
        kmax > p.q_start + std::int64_t(p.group_div.div(static_cast<std::uint32_t>(b * BM))) ||
        (p.key_lower != nullptr &&
         kmin - p.q_start < key_lower_rel(p, static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(last_row))))))
      softmax_grad(std::true_type{});
    else
      softmax_grad(std::false_type{});
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q on this warp's KV_M keys x KV_N columns.
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      std::uint32_t ap[MT_KV][4], as[MT_KV][4];
#pragma unroll
      for (int mt = 0; mt < MT_KV; ++mt) {
        load_a_t(fP_b, wk * Cfg::KV_M + mt * 16, kk * 16, ap[mt]);
        load_a_t(fdS_b, wk * Cfg::KV_M + mt * 16, kk * 16, as[mt]);
      }
#pragma unroll
      for (int np = 0; np < NT_KV / 2; ++np) {
        std::uint32_t bo[4], bq[4];
        load_b_kn(fdO, wd * Cfg::KV_N + np * 16, kk * 16, bo);
        load_b_kn(fQ, wd * Cfg::KV_N + np * 16, kk * 16, bq);
#pragma unroll
        for (int mt = 0; mt < MT_KV; ++mt) {
          mma_16816(acc_dv[mt][2 * np], ap[mt], bo[0], bo[1]);
          mma_16816(acc_dv[mt][2 * np + 1], ap[mt], bo[2], bo[3]);
          mma_16816(acc_dk[mt][2 * np], as[mt], bq[0], bq[1]);
          mma_16816(acc_dk[mt][2 * np + 1], as[mt], bq[2], bq[3]);
        }
      }
    }

    // dQ += scale * dS K on this warp's Q_M rows x Q_N columns, added to global memory.
    {
      float dq[MT_Q][NT_Q][4];
#pragma unroll
      for (int mt = 0; mt < MT_Q; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT_Q; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[mt][nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        std::uint32_t a[MT_Q][4];
#pragma unroll
        for (int mt = 0; mt < MT_Q; ++mt) load_a(fdS_a, wq * Cfg::Q_M + mt * 16, kk * 16, a[mt]);
#pragma unroll
        for (int np = 0; np < NT_Q / 2; ++np) {
          std::uint32_t bk[4];
          load_b_kn(fK_a, wqn * Cfg::Q_N + np * 16, kk * 16, bk);
#pragma unroll
          for (int mt = 0; mt < MT_Q; ++mt) {
            mma_16816(dq[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816(dq[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT_Q; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wq * Cfg::Q_M + mt * 16 + g + 8 * h;
          if (rowq[r] < 0) continue;
          float* dst = outp.dq + rowoff[r] + wqn * Cfg::Q_N + 2 * t4;
#pragma unroll
          for (int nt = 0; nt < NT_Q; ++nt)
            red_add_v2(dst + nt * 8, dq[mt][nt][2 * h] * p.scale, dq[mt][nt][2 * h + 1] * p.scale);
        }
    }
    b = nb;
  }
  cp_async_wait<0>();

  // Epilogue: without a query split each key row has exactly one owner (this block), so a plain
  // read-add-write suffices (and dK/dV are deterministic).
#pragma unroll
  for (int mt = 0; mt < MT_KV; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int32_t sk = s0 + wk * Cfg::KV_M + mt * 16 + g + 8 * h;
      if (sk >= s_end) continue;
      const std::int64_t pos = pos0 + sk;
      float *dk, *dv;
      if (pos >= p.q_start) {
        const std::int64_t row = pos - p.q_start;
        if (row >= p.sq) continue;  // a key after the chunk: no query sees it
        dk = outp.dk_own + (row * p.hkv + kvh) * D;
        dv = outp.dv_own + (row * p.hkv + kvh) * D;
      } else {
        if (!read_page(sk)) continue;  // unselected: id and grad id may be -1
        const std::int32_t gid = outp.dpast.grad_page[sk >> p.log_page];
        const std::int64_t off = outp.dpast.pool.offset(gid, sk & page_mask, kvh);
        dk = outp.dpast.pool.base + off;
        dv = dk + outp.dpast.pool.v_offset;
      }
#pragma unroll
      for (int nt = 0; nt < NT_KV; ++nt) {
        const int col = wd * Cfg::KV_N + nt * 8 + 2 * t4;
        if (qsplit > 1) {  // several blocks own this key row: add atomically
          red_add_v2(dk + col, acc_dk[mt][nt][2 * h] * p.scale, acc_dk[mt][nt][2 * h + 1] * p.scale);
          red_add_v2(dv + col, acc_dv[mt][nt][2 * h], acc_dv[mt][nt][2 * h + 1]);
          continue;
        }
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
OOMB_KERNEL void attention_delta_kernel(std::int32_t sq, std::int32_t hq, std::int32_t d, const O* __restrict__ o,
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
template <int = 0>  // a template: every translation unit may include this header
OOMB_KERNEL void attention_merge_kernel(std::int32_t sq, std::int32_t hq, std::int32_t d, float* __restrict__ o_acc,
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

OOMB_KERNEL_NAMESPACE_END
}  // namespace attention::detail
OOMB_NAMESPACE_END
