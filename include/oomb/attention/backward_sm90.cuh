// oomb — attention backward for Hopper (sm_90a): wgmma products, producer/consumer warp
// specialisation, an mbarrier pipeline over the query steps.
// SPDX-License-Identifier: Apache-2.0
//
// Same contract, arguments and packed GQA rows as backward.cuh. One CTA owns BN = 128 keys of one
// KV head (one page tile, page_size >= 128) and walks the packed query rows in steps of BM = 64
// (128 for the d64 configurations; 80 for d128's, which computes dQ^T = K^T dS^T so that head_dim is
// wgmma's M). The walk (query_walk) cuts the rows into steps from the start of each run of query tiles
// that attend the block's keys, so no step straddles a sparse tile that does not (hs1): every
// configuration takes dense and page-sparse calls.
// Three warpgroups: warpgroup 0 is the producer (it loads the K/V tile once through the pool-wide
// TMA maps, then streams Q, dO, lse and delta of each step into STAGES shared-memory stages: calls
// whose GQA group fits a step (TMA_Q, hb6) get Q/dO as TMA boxes of whole queries, steps of
// floor(BM / group) * group rows; the others load packed rows with cp.async); warpgroups 1
// and 2 are consumers, consumer c owning keys 64c .. 64c + 63. Per step a consumer computes, in the
// transposed ("swap AB") form so that its keys are the wgmma M dimension,
//   S^T = K_c Q^T, dP^T = V_c dO^T            (wgmma, both operands from shared memory)
//   P^T = exp2(S^T scale log2e - lse log2e), dS^T = scale P^T (dP^T - delta)   (registers; the
//                                              scale rides in dS, so dQ and dK need none)
//   dV_c += P^T dO, dK_c += dS^T Q            (wgmma, A from registers: the accumulator layout is
//                                              the A-fragment layout)
// and stores dS (stmatrix .trans) into shared memory; dQ = dS K is then computed with wgmma. The
// configurations (variants.cuh) hand dQ to a writer warp through shared tiles (backward_dq::
// writer_warp: bulk reductions into dq, off the consumers' chain; FlashAttention-3's step order,
// measured +16-27% at d64, docs/history/attention.md hb3); the alternative adds it from every
// consumer thread with red.global.add.v2 (hb2); writer_tensor lays the shared tile out as dq's TMA
// boxes and adds it with tensor reductions. d128: consumer c takes columns 64c..64c+63 over all 128
// keys, after a named barrier between the two consumers (dS double-buffered, so one barrier per step
// suffices); d64: consumer c takes query half c of a 128-row step over all keys, after the barrier
// (hb7, +13-14% with the tensor reductions), or with DQ_OWN all columns over its own keys, so the
// consumers never wait for each other (hb2: +6-12% at 64-row steps), at twice the dq additions. dK/dV
// stay in registers for the walk and are added once at the end: whole 128-row blocks by TMA tensor
// reductions from a staging tile, others by red.add (hs2; the pieces of a block and the CTAs of a
// query split add into the same rows; deterministic plans: the pieces in piece order). Page-sparse
// calls: the launch order (sparse_backward_plan) cuts long walks into pieces and, with a workspace,
// launches the selected blocks most-selected first. Only the configurations variants.cuh names are
// compiled; the ones that lost (per-row bulk dQ reductions, software-pipelined steps, ...) are gone,
// their numbers in docs/history/attention.md.
// Keys past the window's end read as zeros (the partial tile is loaded with zero-filling cp.async),
// and masked entries are selected to 0, so stale page tails never reach dQ.
#pragma once

#include <cmath>
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "oomb/cuda/kernel_linkage.cuh"
#include "oomb/core/bf16.hpp"
#include "oomb/paging/views.hpp"

#include "oomb/attention/backward.cuh"
#include "oomb/attention/ptx.cuh"
#include "oomb/attention/ptx_sm90.cuh"
#include "oomb/attention/query_walk.hpp"
#include "oomb/attention/window.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_KERNEL_NAMESPACE_BEGIN

/// How a consumer's finished dQ tile reaches the fp32 dq in global memory.
enum class backward_dq {
  atomics,      ///< red.global.add.v2 from every consumer thread
  writer_warp,  ///< via shared memory; a producer warp adds whole query segments with bulk reductions
  /// via a shared tile laid out as dq's TMA boxes (128-byte swizzle); the producer warp adds it with
  /// one TMA tensor reduction per 32 columns (needs TMA_Q's steps of whole queries)
  writer_tensor,
};

/// One CTA's timeline in kernel_params::trace (bench --trace; globaltimer nanoseconds, as seen by the
/// first consumer thread): when the CTA began (before the launch order's loads), when it knew its
/// query tiles, when the K/V tile had landed, when the first step's Q/dO had (writer-warp
/// configurations; else = walk), when the walk's last products were done, when both consumers were
/// (epilogue), when dK/dV were staged for the tensor reductions (red.add epilogue: = synced), when
/// the epilogue's reductions were issued; and what it took. Deterministic plans: how long the dQ
/// writer waited for its steps' turns in all (dq_wait) and the epilogue for its piece turn
/// (piece_wait), in nanoseconds. A CTA that found no step writes `begin` and `info` only (end = 0).
struct backward_trace_record {
  enum slot { BEGIN, SELECTED, WALK, FIRST, LAST, SYNCED, STAGED, END, INFO, DQ_WAIT, PIECE_WAIT, WORDS };
  /// info: SM (bits 0-7), KV head (8-15), piece + 1 (16-23), steps (24-39), key block (40-63)
  static __host__ __device__ std::uint64_t info(int sm, int kvh, int piece, int steps, int kb) {
    return std::uint64_t(sm & 255) | std::uint64_t(kvh & 255) << 8 | std::uint64_t((piece + 1) & 255) << 16 |
           std::uint64_t(steps & 0xffff) << 24 | std::uint64_t(kb) << 40;
  }
  struct info_fields {
    int sm, kvh, piece, steps, kb;
  };
  /// info's fields back (the bench's CSV).
  static info_fields fields(std::uint64_t v) {
    return {static_cast<int>(v & 255), static_cast<int>(v >> 8 & 255), static_cast<int>(v >> 16 & 255) - 1,
            static_cast<int>(v >> 24 & 0xffff), static_cast<int>(v >> 40)};
  }
};

/// Bits [ta, tb) of selection word wd.
__device__ __forceinline__ std::uint32_t range_bits(int wd, int ta, int tb) {
  const int lo = ta - 32 * wd, hi = tb - 32 * wd;  // the range relative to the word's first bit
  if (hi <= 0 || lo >= 32) return 0u;
  const std::uint32_t from = lo <= 0 ? ~0u : ~0u << lo, below = hi >= 32 ? ~0u : (1u << hi) - 1u;
  return from & below;
}

/// How many entries of the sorted list a[0, n) lie below x, searched by a whole warp (every lane
/// calls it, with its lane index): each round probes 32 evenly spaced entries, so a list of n entries
/// costs log_32(n) dependent loads. Every lane returns the count.
__device__ __forceinline__ int warp_lower_bound(const std::int32_t* a, int n, std::int64_t x, int lane) {
  int lo = 0, hi = n;  // the count lies in [lo, hi]
  while (lo < hi) {    // warp-uniform
    const int step = (hi - lo + 31) / 32;
    const int pos = lo + lane * step;
    const unsigned below = __ballot_sync(~0u, pos < hi && a[pos] < x);  // a prefix of the lanes
    const int c = __popc(below);
    if (c == 0) break;  // a[lo] >= x
    const int top = lo + c * step;  // a[lo + (c - 1) * step] < x <= a[top] (or top >= hi)
    lo += (c - 1) * step + 1;
    hi = top < hi ? top : hi;
  }
  return lo;
}

/// Finds the query tiles t in [ta, tb) whose sorted page list holds a page, as bits of a shared
/// selection word array. The CTA's warps take the tiles in groups of L lanes (a power of two from 2 to
/// 32: the most that cover the range in one pass), and a group searches its tile's list L-ary: each
/// round probes L entries at once, so a list of n entries costs log_L(n) dependent loads (one L2
/// round trip each) where a binary search costs log_2(n), and every past block's CTA pays this before
/// its walk (a launch ordered by a workspace reads the bits instead: sparse_backward_plan::tiles_of).
/// The constructor issues the first pass's list bounds, so that their loads overlap the window's
/// (the kernel builds it before it knows whether the page is past, hs2).
template <int THREADS>
struct tile_search {
  static constexpr int WARPS = THREADS / 32;
  int ta, tb, L, lane, warp, lo = 0, hi = 0;  // lo, hi: the first pass's tile's list

  __device__ tile_search(const kernel_params& p, int ta_, int tb_)
      : ta(ta_), tb(tb_), L(32), lane(static_cast<int>(threadIdx.x) & 31), warp(static_cast<int>(threadIdx.x) >> 5) {
    const int per_warp = (tb - ta + WARPS - 1) / WARPS;
    while (L > 2 && 32 / L < per_warp) L >>= 1;
    const int t = ta + warp * (32 / L) + lane / L;
    if (t < tb) {
      lo = p.tile_indptr[t];
      hi = p.tile_indptr[t + 1];
    }
  }

  /// Sets the bits of the tiles that select `page` in sel (zeroed).
  __device__ void run(const kernel_params& p, std::int64_t page, std::uint32_t* sel) const {
    const int j = lane & (L - 1), gbase = lane & ~(L - 1), groups = 32 / L;
    const std::uint32_t gmask = L == 32 ? ~0u : ((1u << L) - 1u) << gbase;
    for (int t0 = ta + warp * groups; t0 < tb; t0 += WARPS * groups) {  // warp-uniform
      const int t = t0 + lane / L;
      int l = lo, h = hi;  // the entries of tile t's list that may still hold page
      if (t0 != ta + warp * groups) {
        l = h = 0;
        if (t < tb) {
          l = p.tile_indptr[t];
          h = p.tile_indptr[t + 1];
        }
      }
      bool active = h > l, found = false;
      while (__any_sync(~0u, active)) {
        const int n = h - l, step = n <= L ? 1 : (n + L - 1) / L;
        const int pos = l + j * step;
        const bool probe = active && pos < h;
        const std::int32_t v = probe ? p.tile_pages[pos] : 0;
        const std::uint32_t le = __ballot_sync(~0u, probe && v <= page) & gmask;
        const std::uint32_t eq = __ballot_sync(~0u, probe && v == page) & gmask;
        if (active) {
          if (eq != 0) {
            found = true;
            active = false;
          } else if (n <= L || le == 0) {  // every entry probed, or page below them all
            active = false;
          } else {  // page can only lie between the last probe <= page and the next probe
            l += (31 - __clz(static_cast<int>(le)) - gbase) * step;
            h = l + step < h ? l + step : h;
          }
        }
      }
      if (found && j == 0) atomicOr(sel + (t >> 5), 1u << (t & 31));
    }
  }
};

/// The sparse backward's launch order from a workspace (sparse_backward_plan::order, hs2): counts for
/// every past key block of the window the query tiles whose list selects its page, then lists the
/// blocks that any tile selects, most selected first (a counting sort by count), so that the long
/// walks start first and an unselected block launches no walk; and per past page the bits of the
/// tiles that select it, which the backward's CTAs read instead of searching (tile_search). One CTA of
/// ORDER_THREADS; ws holds count [past_blocks], order [past_blocks], selected [1], then the bits
/// [past_pages][ceil(ntiles / 32)]. (A template, as a header's kernels must be: one definition for
/// every translation unit that includes it.)
inline constexpr int ORDER_THREADS = 1024;
template <int THREADS = ORDER_THREADS>
OOMB_KERNEL void __launch_bounds__(THREADS)
    sparse_backward_order_kernel(const __grid_constant__ kernel_params p, int past_blocks, int blocks_per_page,
                                 std::int32_t* ws) {
  std::int32_t* const count = ws;
  std::int32_t* const order = ws + past_blocks;
  constexpr int PER_THREAD = 4096 / THREADS;  // counts 1..ntiles (<= 4096), four per thread
  using scan = cub::BlockScan<int, THREADS>;
  __shared__ typename scan::TempStorage scan_tmp;
  __shared__ int start[4096 + 2];  // per count 1..ntiles: where its blocks go in `order`
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int ntiles = (p.sq + p.tile - 1) / p.tile, words = (ntiles + 31) >> 5;
  const int past_pages = past_blocks / blocks_per_page;
  std::uint32_t* const tiles_of = reinterpret_cast<std::uint32_t*>(ws + 2 * past_blocks + 1);
  for (int b = tid; b < past_blocks; b += THREADS) count[b] = 0;
  for (int w = tid; w < past_pages * words; w += THREADS) tiles_of[w] = 0u;
  for (int c = tid; c <= ntiles + 1; c += THREADS) start[c] = 0;
  __syncthreads();
  // A tile lists a page at most once (strictly increasing), so a count is at most ntiles. A warp per tile.
  for (int t = warp; t < ntiles; t += THREADS / 32)
    for (int e = p.tile_indptr[t] + lane; e < p.tile_indptr[t + 1]; e += 32) {
      const std::int64_t j = std::int64_t(p.tile_pages[e]) - p.first_page;
      if (j < 0 || j >= past_pages) continue;  // outside the window's past
      atomicOr(tiles_of + j * words + (t >> 5), 1u << (t & 31));
      for (int b = 0; b < blocks_per_page; ++b) atomicAdd(count + j * blocks_per_page + b, 1);
    }
  __syncthreads();
  for (int b = tid; b < past_blocks; b += THREADS)
    if (count[b] > 0) atomicAdd(start + count[b], 1);
  __syncthreads();
  // Exclusive prefix sums from the highest count down: item i of the scan is count ntiles - i.
  int n[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int c = ntiles - (tid * PER_THREAD + k);
    n[k] = c >= 1 ? start[c] : 0;
  }
  int selected = 0;
  scan(scan_tmp).ExclusiveSum(n, n, selected);
  __syncthreads();  // every start[] read before any is written
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int c = ntiles - (tid * PER_THREAD + k);
    if (c >= 1) start[c] = n[k];
  }
  if (tid == 0) ws[2 * past_blocks] = selected;
  __syncthreads();
  for (int b = tid; b < past_blocks; b += THREADS)
    if (count[b] > 0) order[atomicAdd(start + count[b], 1)] = b;
}

template <int D_, int STAGES_, backward_dq DQ_ = backward_dq::atomics, bool DQ_OWN_ = false, int BM_ = 64,
          bool TMA_Q_ = false>
struct backward_sm90_tile {
  /// BM: packed query rows per step, 64, or 128 at d64 with the writer warp (FlashAttention-3's d64
  /// tile: S^T products of n = 128, half the fixed per-step cost per FLOP; single dS buffer), or 80
  /// at d128 with the writer warp (FlashAttention-3's d128 tile: a quarter more work per step than 64).
  /// With 80 rows, dK += dS^T Q (A from registers) is waited for at the end of each step: keeping it
  /// in flight into the next step needs registers the consumers lack (ptxas serialises the
  /// products, C7512). Reading dS^T from shared memory instead frees them but measured 6-9% slower
  /// on the H200 (docs/history/attention.md hb5).
  static constexpr int D = D_, BN = 128, BM = BM_, STAGES = STAGES_;
  /// dQ^T = K^T dS^T, head_dim as wgmma's M: a step that is not a multiple of 64 rows cannot be M.
  static constexpr bool DQ_SWAP = BM % 64 != 0;
  /// TMA_Q (hb6; calls whose group fits a step): Q and dO arrive as one TMA box per 64-column
  /// panel, (64 columns, group heads, BM / group queries) of the [sq][hq][d] tensor, whose
  /// shared-memory image is the packed rows of whole queries. A step then covers
  /// floor(BM / group) * group rows (the launcher needs group <= BM); the rows after them stay zero
  /// (written once) and contribute nothing. One producer warp loads lse/delta and issues the boxes,
  /// instead of 96 threads of cp.async.
  static constexpr bool TMA_Q = TMA_Q_;
  /// DQ_OWN: each consumer computes dQ over its own 64 keys only, for all columns (d128: two column
  /// halves), so the two consumers share no barrier per step; twice the dq additions. Else dQ runs
  /// over all 128 keys after a barrier between the consumers (both key panels of dS), split between
  /// them by columns (d128: consumer c takes columns 64c..) or by query halves (d64, 128-row steps:
  /// consumer c takes rows 64c..).
  static constexpr bool DQ_OWN = DQ_OWN_;
  static constexpr backward_dq DQ = DQ_;
  /// writer_warp / writer_tensor: the consumers copy their dq tile into a shared [BM][D] fp32 tile
  /// (over all keys: both consumers' halves in one tile; DQ_OWN: one tile per consumer) and go on;
  /// warp 3 of the producer warpgroup adds it to dq and frees the tile. Full/empty mbarriers per
  /// tile, DQ_BUFS tiles per unit. writer_warp: the tile is dq's row layout, one bulk reduction per
  /// query (its rows are contiguous in dq). writer_tensor: the tile is D / 32 panels of 32 columns,
  /// each the shared-memory image of a TMA box of the step's whole queries with the 128-byte swizzle,
  /// so each consumer store instruction meets the fewest bank wavefronts, and the writer issues one
  /// tensor reduction per panel.
  static constexpr bool DQ_TENSOR = DQ == backward_dq::writer_tensor;
  static constexpr bool DQ_WRITER = DQ == backward_dq::writer_warp || DQ_TENSOR;
  /// d64 over all keys: consumer c takes query half c of a 128-row step.
  static constexpr bool DQ_QHALF = !DQ_OWN && !DQ_SWAP && BM == 128;
  static constexpr int DQ_UNITS = DQ_WRITER ? (DQ_OWN ? 2 : 1) : 0;
  static constexpr int DQ_BUFS = D == 64 && BM == 64 ? 2 : 1;  // else no room for a second 32 KB tile
  /// dS is read by the other consumer too unless DQ_OWN: two buffers, so one barrier per step
  /// suffices. Read by this consumer only: the writer warp's order drains dQ within the step, so
  /// one buffer does where shared memory is short (128-row steps, d128 over own keys).
  static constexpr int DS_BUFS = !DQ_OWN ? 2 : (BM == 128 || (DQ_WRITER && D == 128)) ? 1 : 2;
  static constexpr int DQ_UNIT_BYTES = BM * D * 4;
  static constexpr int DQ_BYTES = DQ_UNITS * DQ_BUFS * DQ_UNIT_BYTES;
  static constexpr int THREADS = 384;  // producer warpgroup + 2 consumer warpgroups
  /// Producer threads that load Q/dO (the writer warp, when there is one, is not among them).
  static constexpr int LOADERS = DQ_WRITER ? 96 : 128;
  /// Producer threads that load each step (TMA_Q: one warp; its thread 0 also announces the boxes'
  /// bytes, one arrival more on the full barrier).
  static constexpr int STEP_LOADERS = TMA_Q ? 32 : LOADERS;
  static constexpr int FULL_ARRIVALS = TMA_Q ? STEP_LOADERS + 1 : STEP_LOADERS;
  /// The writer_warp order frees a stage only in the next step (its dK reads Q), so with two
  /// stages the loaders must release each step as soon as it lands: a lag of one step would wait
  /// on a stage that only the step it holds back can free.
  static constexpr int LOAD_LAG = DQ_WRITER && STAGES < 3 ? 0 : 1;
  static constexpr int PANELS = D / 64;
  static constexpr int KV_BYTES = BN * D * 2;
  static constexpr int Q_BYTES = BM * D * 2;   // one Q (or dO) stage
  static constexpr int DS_BYTES = BM * BN * 2; // one dS buffer (2 key panels of BM rows)
  /// Sparse: one selection bit per query tile (at most 4096 tiles, the launcher's limit); bits, not
  /// bytes, because d128's TMA_Q configuration has under 1 KB of shared memory to spare.
  static constexpr int SEL_WORDS = 4096 / 32;
  static constexpr int tiles_bytes = 2 * KV_BYTES + 2 * STAGES * Q_BYTES + DS_BUFS * DS_BYTES;
  static constexpr int smem_bytes =
      1024 /* alignment slack */ + tiles_bytes + DQ_BYTES + 2 * STAGES * BM * 4 + SEL_WORDS * 4;
  static constexpr int NBARS = 2 * STAGES + 1 + 2 * DQ_UNITS * DQ_BUFS;
  static constexpr int BAR_BYTES = NBARS * 8;  // static shared memory, sm_90a builds only
  // writer_warp at d128 needs 240 (dq stays live while dK is in flight; at 224 or 232 ptxas
  // serialises the products, C7512), so the producer gets 24 (its loop is not unrolled then).
  static constexpr bool WIDE = DQ_WRITER && (D == 128 || BM == 128);
  static constexpr int PRODUCER_REGS = WIDE ? 24 : 56, CONSUMER_REGS = WIDE ? 240 : 224;
  static_assert(D == 64 || D == 128, "head_dim");
  static_assert(BM == 64 || (BM == 128 && D == 64 && DQ_WRITER) || (BM == 80 && D == 128 && DQ_WRITER && !DQ_OWN),
                "steps of 64 rows; 128 at d64 and 80 at d128 with the writer warp (d128: dQ over all keys)");
  static_assert(D == 128 || DQ_OWN || DQ_QHALF, "d64 over all keys: 128-row steps (query halves)");
  static_assert(!TMA_Q || (DQ_WRITER && LOAD_LAG == 0), "TMA_Q: the writer warp's two-stage pipeline");
  static_assert(!DQ_TENSOR || TMA_Q, "dQ by TMA reductions: boxes of whole queries, as TMA_Q's");
  static_assert(!DQ_TENSOR || tiles_bytes % 1024 == 0, "dQ panels: the 128-byte swizzle needs 1024-byte alignment");
  static_assert(smem_bytes <= 227 * 1024, "shared memory");
  // setmaxnreg moves registers within the CTA: 384 threads start with 168 each (65536 / 384, rounded
  // down to 8), and an increase beyond what the producer released waits forever.
  static_assert(PRODUCER_REGS + 2 * CONSUMER_REGS <= 3 * 168, "register split over the CTA's allocation");
};

/// Where the epilogue adds whole blocks of dK/dV rows by TMA reductions (backward_outputs::tensor_rows):
/// the chunk's own rows, dk_own / dv_own as [sq][hkv][d] (make_query_tensor_map with group 1), and the
/// gradient pool's K / V pages (make_kv_tensor_map); boxes of 32 fp32 columns by the block's 128 rows.
struct backward_rows_maps {
  CUtensorMap dk_own, dv_own, dk_past, dv_past;
};

/// Trace (the benchmark's --trace only): each CTA records its timeline (backward_trace_record) in
/// p.trace; the product kernels are instantiated with Trace = false and hold none of that code.
template <class Cfg, bool Trace = false>
OOMB_KERNEL void __launch_bounds__(Cfg::THREADS, 1)
    attention_backward_sm90_kernel(const __grid_constant__ kernel_params p, const __grid_constant__ CUtensorMap tmap_k,
                                   const __grid_constant__ CUtensorMap tmap_v, const __grid_constant__ CUtensorMap tmap_q,
                                   const __grid_constant__ CUtensorMap tmap_do, const __grid_constant__ CUtensorMap tmap_dq,
                                   const __grid_constant__ backward_rows_maps tmap_rows,
                                   const float* __restrict__ lse,
                                   const float* __restrict__ delta, const std::uint16_t* __restrict__ d_o,
                                   const backward_outputs outp, int token_dim1, int qsplit) {
#if OOMB_ATTENTION_SM90A
  using namespace sm90;
  constexpr int D = Cfg::D, BN = Cfg::BN, BM = Cfg::BM, S = Cfg::STAGES, PANELS = Cfg::PANELS;
  constexpr int KV_BYTES = Cfg::KV_BYTES, Q_BYTES = Cfg::Q_BYTES, DS_BYTES = Cfg::DS_BYTES;
  constexpr int PANEL_K = BN * 128;  // one 64-column panel of the K/V tile
  constexpr int PANEL_Q = BM * 128;  // one 64-column panel of a Q/dO stage; one key panel of dS

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t raw = smem_addr(smem_raw);
  const std::uint32_t sbase = (raw + 1023u) & ~1023u;  // the 128-byte swizzle needs 1024 alignment
  const std::uint32_t sK = sbase, sV = sK + KV_BYTES;
  const std::uint32_t sQ = sV + KV_BYTES;       // stage s at sQ + s * Q_BYTES
  const std::uint32_t sdO = sQ + S * Q_BYTES;   // stage s at sdO + s * Q_BYTES
  const std::uint32_t sdS = sdO + S * Q_BYTES;  // buffer i & 1 at sdS + (i & 1) * DS_BYTES
  const std::uint32_t sdQ = sdS + Cfg::DS_BUFS * DS_BYTES;
  unsigned char* const tail = smem_raw + (sdQ + Cfg::DQ_BYTES - raw);
  float* const sL = reinterpret_cast<float*>(tail);  // [S][BM] lse
  float* const sDl = sL + S * BM;                    // [S][BM] delta
  std::uint32_t* const sSel = reinterpret_cast<std::uint32_t*>(sDl + S * BM);  // [SEL_WORDS] sparse selection bits
  __shared__ alignas(8) std::uint64_t bar_mem[Cfg::NBARS];
  const std::uint32_t bars = smem_addr(bar_mem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (S + s); };
  const std::uint32_t kv_bar = bars + 8u * (2 * S);
  // writer_warp: tile n = unit * DQ_BUFS + buffer of the shared dq tiles.
  constexpr int NDQ = Cfg::DQ_UNITS * Cfg::DQ_BUFS;
  auto dq_full = [&](int n) { return bars + 8u * (2 * S + 1 + n); };
  auto dq_empty = [&](int n) { return bars + 8u * (2 * S + 1 + NDQ + n); };
  auto dq_tile = [&](int n) { return sdQ + static_cast<std::uint32_t>(n * Cfg::DQ_UNIT_BYTES); };

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7;
  constexpr float log2e = 1.4426950408889634f;
  const bool sparse = p.tile_indptr != nullptr;
  // Which key block and KV head this CTA takes. Dense: blockIdx.x, blockIdx.y (all blocks of a KV head
  // do the same work; one KV head at a time keeps its Q/dO and dq in L2). Sparse: a block's work is the
  // tiles that attend it, from none to all, and the heaviest are the chunk's own blocks (causal: every
  // later tile), then the window's first and last pages (sink and local selections), so within each KV
  // head the CTAs in launch order take the own blocks first, then the past blocks alternately from the
  // window's start and its end (longest first: the tail of each head is short walks; hs1). The own
  // blocks and the first plan.ends past blocks come in plan.pieces CTAs each, one per run of query
  // tiles, so that no walk is long enough to end late (hs2; sparse_backward_plan); deterministic
  // plans launch the blocks in window order, the same blocks cut (sparse_backward_plan::block_at).
  // heads_interleaved (bench option) takes the KV heads in turn instead.
  const std::uint64_t t_begin = Trace && tid == 0 ? globaltimer() : 0;
  const window_extent win(p);  // its loads overlap the launch order's
  int kb = static_cast<int>(blockIdx.x), kvh = static_cast<int>(blockIdx.y);
  int piece = -1;  // sparse: this CTA's range of query tiles (-1: all of them)
  if (!sparse && p.heads_interleaved) {  // launch position lin takes block lin / hkv of KV head lin % hkv
    const int lin = kvh * static_cast<int>(gridDim.x) + kb;
    kb = lin / p.hkv;
    kvh = lin - kb * p.hkv;
  }
  if (sparse) {
    int o = kb;
    if (p.heads_interleaved) {
      const int lin = kvh * static_cast<int>(gridDim.x) + kb;
      o = lin / p.hkv;
      kvh = lin - o * p.hkv;
    }
    kb = p.plan.block_at(o, piece);
    if (kb < 0) return;  // uniform: an ordered launch's position past the selected blocks
  }
  const std::int64_t trace_at =  // this CTA's record (bench --trace)
      backward_trace_record::WORDS *
      (blockIdx.x + std::int64_t(gridDim.x) * (blockIdx.y + std::int64_t(gridDim.y) * blockIdx.z));
  if (Trace && tid == 0) {
    p.trace[trace_at + backward_trace_record::BEGIN] = t_begin;
    p.trace[trace_at + backward_trace_record::INFO] = backward_trace_record::info(smid(), kvh, piece, 0, kb);
  }
  if (tid == 0) {  // the descriptors' fetch overlaps the loads below
    prefetch_tensor_map(&tmap_k);
    prefetch_tensor_map(&tmap_v);
    if constexpr (Cfg::TMA_Q) {
      prefetch_tensor_map(&tmap_q);
      prefetch_tensor_map(&tmap_do);
    }
    if constexpr (Cfg::DQ_TENSOR) prefetch_tensor_map(&tmap_dq);
  }

  // This CTA's rows: from the first query that sees the block's keys (a piece: from its first tile)
  // to the end (a piece: its last tile's end). No memory read yet.
  const std::int32_t s0 = kb * BN;
  const std::int64_t pos0 = std::int64_t(p.first_page) << p.log_page;
  const std::int64_t kmin = pos0 + s0;
  const std::int64_t first_q = kmin - p.q_start;
  if (first_q >= p.sq) return;
  const int rows = p.sq * p.group;
  const std::int64_t q0 = first_q > 0 ? first_q : 0;
  const int tile_rows = p.tile * p.group;
  const int first_row = static_cast<int>(q0 * p.group);
  const int first_tile = sparse ? static_cast<int>(p.tile_rows_div.div(static_cast<std::uint32_t>(first_row))) : 0;
  // Per-document bounds: no row after the last query whose document starts at or before the block's
  // last key (BN <= page_size: only the window's last block can be partial, and it is the chunk's own).
  int block_rows = rows;
  if (p.key_lower != nullptr) {
    const int reach = queries_reaching(p, kmin + BN - 1) * p.group;
    if (reach < block_rows) block_rows = reach;
  }
  int row_begin, row_end;
  p.plan.piece_rows(piece, tile_rows, first_tile, first_row, block_rows, row_begin, row_end);
  if (row_begin >= row_end) return;  // uniform: the causal start lies past this piece, or every bound past the block
  // Sparse: the query tiles of those rows (the walk reads no others). Of a past block that the order
  // kernel counted (plan.tiles_of), which of them select its page is read from the workspace, one word
  // per thread from thread 1 on (thread 0 issues K/V), here, where the load overlaps the page id's; of
  // any other past block they are searched for (tile_search), their lists' bounds loaded here.
  const int ta = sparse ? static_cast<int>(p.tile_rows_div.div(static_cast<std::uint32_t>(row_begin))) : 0;
  const int tb = sparse ? static_cast<int>(p.tile_rows_div.div(static_cast<std::uint32_t>(row_end - 1))) + 1 : 0;
  // Deterministic cut blocks: this piece adds its dK/dV once the block's lower pieces that have rows
  // to walk have added theirs (piece_turn), so its selection bits reach back to the block's first
  // tile, where piece 0 starts: they say which lower pieces walk.
  std::int32_t* const piece_turn =
      piece >= 0 && p.piece_turns != nullptr
          ? p.piece_turns + std::int64_t(kvh) * (p.plan.own + p.plan.ends) + p.plan.cut_index(kb)
          : nullptr;
  const int ta_sel = piece_turn != nullptr ? first_tile : ta;
  const int ntiles = sparse ? (p.sq + p.tile - 1) / p.tile : 0, words = (ntiles + 31) / 32;  // words < THREADS
  const std::int32_t page_j = s0 >> p.log_page;  // the block's one page (BN <= page_size)
  const bool listed = sparse && p.plan.tiles_of != nullptr && kb < p.plan.own_kb;
  static_assert(Cfg::SEL_WORDS < Cfg::THREADS, "a selection word per thread from thread 1 on");
  const int wd = tid - 1;
  const std::uint32_t listed_word = listed && wd >= 0 && wd < words
                                        ? p.plan.tiles_of[std::int64_t(page_j) * words + wd] & range_bits(wd, ta, tb)
                                        : 0u;
  const tile_search<Cfg::THREADS> tiles(p, ta_sel, listed ? ta_sel : tb);

  const std::int64_t p_own = first_own_page(p, win);
  if (s0 >= win.len) return;
  const std::int32_t s_end = s0 + BN < win.len ? s0 + BN : win.len;
  const std::int64_t kmax = pos0 + s_end - 1;
  // Packed rows per step: BM, or (TMA_Q) the whole queries that fit, BM / group of them.
  const int step_q = Cfg::TMA_Q ? BM / p.group : 0;
  const int RS = Cfg::TMA_Q ? step_q * p.group : BM;
  const int page_mask = (1 << p.log_page) - 1;
  const std::int32_t page_id = win.ids[page_j];
  // Sparse: an id of -1 is a page the caller brought no memory for, which no tile may select
  // (attention_args): done without the scan below (the trainer's windows are mostly such pages).
  if (sparse && page_id < 0) return;

  // Sparse: bit t of sSel says whether query tile t attends this block's page.
  const std::int64_t page = std::int64_t(p.first_page) + page_j;
  const bool past = sparse && page < p_own;  // own pages: every tile attends them (causally)
  const bool search = past && !listed;

  // K and V of the block, once: TMA boxes of the page when the tile is full, else zero-filled cp.async
  // by the producer (keys past the window's end must read as finite zeros). Issued here, before the
  // selection search, where the block surely has a step: dense and own blocks, and the blocks of an
  // ordered sparse launch, which some tile selects (hs3: the load then overlaps reading the tiles). A CTA
  // whose share of such a walk turns out empty (a query split or a piece) waits for the load before it ends.
  const bool kv_tma = s_end - s0 == BN;
  const bool kv_early = kv_tma && !search;  // uniform
  auto issue_kv = [&] {
    const int tok = s0 & page_mask;
    const int c1 = token_dim1 ? tok : kvh, c2 = token_dim1 ? kvh : tok;
    mbar_expect_tx(kv_bar, 2 * KV_BYTES);
#pragma unroll
    for (int c = 0; c < PANELS; ++c) {
      tma_load_4d(sK + c * PANEL_K, &tmap_k, kv_bar, c * 64, c1, c2, page_id);
      tma_load_4d(sV + c * PANEL_K, &tmap_v, kv_bar, c * 64, c1, c2, page_id);
    }
  };
  if (wd >= 0 && wd < words) sSel[wd] = !past ? range_bits(wd, ta_sel, tb) : listed ? listed_word : 0u;
  if (tid == 0) {
    mbar_init(kv_bar, 1);
    fence_barrier_init();
    if (kv_early) issue_kv();
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), Cfg::FULL_ARRIVALS);
      mbar_init(empty(s), 256);
    }
    for (int n = 0; n < NDQ; ++n) {
      mbar_init(dq_full(n), Cfg::DQ_OWN ? 128 : 256);  // else both consumers write one tile
      mbar_init(dq_empty(n), 1);
    }
    fence_barrier_init();
  }
  __syncthreads();  // barriers and sSel
  if (search) {     // uniform
    tiles.run(p, page, sSel);
    __syncthreads();
  }

  const std::uint64_t t_selected = Trace ? globaltimer() : 0;
  const query_walk walk0(sparse ? sSel : nullptr, ntiles, tile_rows, p.tile_rows_div, row_end, RS, row_begin,
                         static_cast<int>(blockIdx.z), qsplit, sparse && p.dq_turns != nullptr);
  if (walk0.done()) {  // uniform: no step of this block's share sees these keys
    if (kv_early) mbar_wait(kv_bar, 0);  // no load may land in the shared memory of a CTA that ended
    return;
  }
  const int head0 = kvh * p.group;
  const std::int64_t kbase = pos0 + s0 - p.q_start;  // key k of the block sits at query index kbase + k
  const int valid_keys = s_end - s0;

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    const int pt = tid;  // 0..127
    if constexpr (Cfg::DQ_WRITER) {
      if (pt >= Cfg::LOADERS) {
        // The dq writer: per step and tile, wait until the consumers have written it, add each
        // query's rows (contiguous in dq: rows query * group + head) with one bulk reduction, and
        // free the tile once the reductions have read it.
        // writer_tensor: one tensor reduction per 32-column panel of the tile, the step's whole
        // queries (a clipped step's masked rows add zeros; queries past sq are not written).
        // Deterministic plans (dq_turns; no query split): a step's rows get the blocks' dQ in key
        // block order. Dense, the blocks that walk step s are a run [lo, hi]: both ends of a walk grow
        // with the block (the causal start; with bounds, the end of the last document reaching the
        // block), and lo is the block holding the step's first bound, so block kb adds when kb - lo
        // blocks have. Sparse, each tile's steps are its own (tile_steps) and block kb's turn counts
        // the blocks of the tile's virtual sequence from lo up to kb (sparse_dq_order), searched in the
        // tile's list by the warp once per tile (and per bound block). A block passes the turn on once
        // its reductions are complete. (Passing it only after issuing the next step's would take the
        // completion off the writer's path, but then block kb could add to step s only once block
        // kb - 1 had reached step s + 1: the blocks of a wave would start a step apart instead of a
        // reduction apart.) Lower blocks of a KV head launch first (sparse: window order), so every
        // wait is on a CTA that runs or has ended.
        const int spt = (tile_rows + RS - 1) / RS;  // sparse: steps per tile
        const int steps = sparse ? ntiles * spt : (rows + RS - 1) / RS;
        const sparse_dq_order dq_order{p.first_page, static_cast<std::int32_t>(p_own - p.first_page < 0 ? 0
                                                         : p_own - p.first_page > win.pages ? win.pages
                                                                                            : p_own - p.first_page),
                                       (1 << p.log_page) / BN};
        std::uint64_t waited = 0;  // Trace: ns spent waiting for turns
        int cached_tile = -1, cached_lo = -1, below_kb = 0, below_lo = 0;
        bool lo_attended = false;
        int i = 0;
        for (query_walk wk = walk0; !wk.done(); wk.next(), ++i) {
          const int r0 = wk.r0, r1 = wk.r1();
          const int qa = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(r0)));
          const int qb = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(r1 - 1)));
          const int nb = i % Cfg::DQ_BUFS;
          std::int32_t* turn = nullptr;
          if (p.dq_turns != nullptr) {
            const std::int64_t first_key = key_lower_rel(p, qa) + p.q_start - pos0;  // window-relative
            const int lo = first_key > 0 ? static_cast<int>(first_key / BN) : 0;
            int my_turn = kb - lo;
            if (!sparse) {
              turn = p.dq_turns + std::int64_t(kvh) * steps + r0 / RS;
            } else {
              const int t = static_cast<int>(p.tile_rows_div.div(static_cast<std::uint32_t>(r0)));
              turn = p.dq_turns + std::int64_t(kvh) * steps + t * spt + (r0 - t * tile_rows) / RS;
              const std::int32_t* const list = p.tile_pages + p.tile_indptr[t];
              const int cnt = p.tile_indptr[t + 1] - p.tile_indptr[t];
              const auto below = [&](std::int64_t page) { return warp_lower_bound(list, cnt, page, lane); };
              if (t != cached_tile) below_kb = dq_order.pages_below(below, page_j);
              if (t != cached_tile || lo != cached_lo) {
                const int lo_page = lo / dq_order.blocks_per_page;
                below_lo = dq_order.pages_below(below, lo_page);
                lo_attended = dq_order.attends(below, lo_page);
              }
              cached_tile = t;
              cached_lo = lo;
              my_turn = dq_order.turn(kb, lo, below_kb, below_lo, lo_attended);
            }
            if (lane == 0) {
              const std::uint64_t w0 = Trace ? globaltimer() : 0;
              wait_turn(turn, my_turn);
              if (Trace) waited += globaltimer() - w0;
            }
            __syncwarp();
            fence_proxy_async_global();
          }
#pragma unroll
          for (int u = 0; u < Cfg::DQ_UNITS; ++u) {
            const int n = u * Cfg::DQ_BUFS + nb;
            mbar_wait(dq_full(n), static_cast<std::uint32_t>(i / Cfg::DQ_BUFS) & 1u);
            if constexpr (Cfg::DQ_TENSOR) {
              if (lane == 0)
#pragma unroll
                for (int pc = 0; pc < D / 32; ++pc)
                  tma_reduce_add_4d(&tmap_dq, dq_tile(n) + static_cast<std::uint32_t>(pc * BM * 128), pc * 32, 0, kvh, qa);
            } else {
              for (int q = qa + lane; q <= qb; q += 32) {
                const int lo = q * p.group > r0 ? q * p.group : r0;
                const int hi = (q + 1) * p.group < r1 ? (q + 1) * p.group : r1;
                bulk_reduce_add_f32(outp.dq + (std::int64_t(q) * p.hq + head0 + (lo - q * p.group)) * D,
                                    dq_tile(n) + static_cast<std::uint32_t>((lo - r0) * D * 4),
                                    static_cast<std::uint32_t>((hi - lo) * D * 4));
              }
            }
            bulk_commit();
          }
          if (turn != nullptr) {
            bulk_wait<0>();  // this step's sums are in dq
            fence_proxy_async_global();
          } else {
            bulk_wait_read<0>();
          }
          __syncwarp();
          if (lane == 0) {
            if (turn != nullptr) {
              __threadfence();
              pass_turn(turn);
            }
#pragma unroll
            for (int u = 0; u < Cfg::DQ_UNITS; ++u) mbar_arrive(dq_empty(u * Cfg::DQ_BUFS + nb));
          }
        }
        bulk_wait<0>();
        if (Trace && lane == 0) p.trace[trace_at + backward_trace_record::DQ_WAIT] = waited;
        return;
      }
    }
    // K and V of the block (see kv_early), if not issued yet.
    if (kv_tma) {
      if (pt == 0 && !kv_early) issue_kv();
    } else {
      const auto base = reinterpret_cast<const std::uint16_t*>(p.pool.base);
      constexpr int CPR = D / 8;
      for (int e = pt; e < BN * CPR; e += Cfg::LOADERS) {
        const int r = e / CPR, chunk = e % CPR;
        const bool ok = s0 + r < s_end;
        const std::int64_t off = ok ? p.pool.offset(page_id, (s0 + r) & page_mask, kvh) + chunk * 8 : 0;
        const std::uint32_t dst =
            (chunk >> 3) * PANEL_K + r * 128 + ((static_cast<std::uint32_t>(chunk & 7) ^ (r & 7)) << 4);
        cp_async_16(sK + dst, base + off, ok);
        cp_async_16(sV + dst, base + off + (ok ? p.pool.v_offset : 0), ok);
      }
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async();
      named_sync(1, Cfg::LOADERS);
      if (pt == 0) mbar_arrive(kv_bar);
    }

    // Q, dO, lse, delta of each step into stage i % S; the full barrier is released once this
    // thread's copies have landed (cp.async groups LOAD_LAG steps behind: with 1, two steps are in
    // flight).
    constexpr int CPR = D / 8;
    constexpr int LOAD_UNROLL = Cfg::WIDE ? 1 : 4;  // with 24 registers the unrolled loop spills
    if constexpr (Cfg::TMA_Q) {
      if (pt >= Cfg::STEP_LOADERS) return;
      // The rows after the step's RS stay zero: no box writes them (whole 128-byte rows, so the
      // swizzle does not matter).
      const int pad = (BM - RS) * 8;  // 16-byte chunks after the step's rows, per 64-column panel
      for (int e = pt; e < 2 * S * PANELS * pad; e += Cfg::STEP_LOADERS) {
        const int panel = e / pad, chunk = RS * 8 + e % pad;  // panel: (Q | dO, stage, column panel)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sQ + panel * PANEL_Q + chunk * 16), "r"(0)
                     : "memory");
      }
      fence_proxy_async();
    }
    int i = 0, prev_s = -1;
    for (query_walk wk = walk0; !wk.done(); wk.next(), ++i) {
      const int s = i % S;
      const int r0 = wk.r0, n = wk.r1() - r0;  // the step's rows; past n (a clipped step) the consumers mask
      mbar_wait(empty(s), (static_cast<std::uint32_t>(i / S) & 1u) ^ 1u);
      if constexpr (Cfg::TMA_Q) {
        // Box (64 columns, group heads, one KV head, step_q queries) at the step's first query (r0 is a
        // multiple of group: runs start at tiles, steps are whole queries); queries past sq read as 0.
        // A clipped step still loads the whole box: its rows past n are masked.
        if (pt == 0) {
          const int qa = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(r0)));
          mbar_expect_tx(full(s), static_cast<std::uint32_t>(2 * PANELS * RS * 128));
#pragma unroll
          for (int c = 0; c < PANELS; ++c) {
            tma_load_4d(sQ + s * Q_BYTES + c * PANEL_Q, &tmap_q, full(s), c * 64, 0, kvh, qa);
            tma_load_4d(sdO + s * Q_BYTES + c * PANEL_Q, &tmap_do, full(s), c * 64, 0, kvh, qa);
          }
        }
      } else {
#pragma unroll LOAD_UNROLL
        for (int e = pt; e < BM * CPR; e += Cfg::LOADERS) {
          const int r = e / CPR, chunk = e % CPR;
          const int R = r0 + r;
          const bool ok = r < n;
          const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(ok ? R : 0)));
          const std::int64_t off = ok ? (std::int64_t(qi) * p.hq + head0 + (R - qi * p.group)) * D + chunk * 8 : 0;
          const std::uint32_t dst = s * Q_BYTES + (chunk >> 3) * PANEL_Q + r * 128 +
                                    ((static_cast<std::uint32_t>(chunk & 7) ^ (r & 7)) << 4);
          cp_async_16(sQ + dst, p.q + off, ok);
          cp_async_16(sdO + dst, d_o + off, ok);
        }
      }
      // lse and delta of row r of the step, as the consumers use them: lse in base 2 (+inf for a row that
      // saw no key, so P = 0), delta times the softmax scale (so dS^T carries the scale into dQ and dK).
      // Past n: zeros (masked, or P^T = 1 with dS^T = 0).
      auto load_stats = [&](int r) {
        const int R = r0 + r;
        const bool ok = r < n;
        const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(ok ? R : 0)));
        const std::int64_t off = std::int64_t(head0 + (R - qi * p.group)) * p.sq + qi;
        const float l = ok ? lse[off] : 0.0f, d = ok ? delta[off] : 0.0f;
        sL[s * BM + r] = l == -INFINITY ? INFINITY : l * log2e;
        sDl[s * BM + r] = d * p.scale;
      };
      if constexpr (BM <= Cfg::STEP_LOADERS) {
        if (pt < BM) load_stats(pt);
      } else {
#pragma unroll 1  // the producer's 24 registers (unrolled, ptxas spills)
        for (int r = pt; r < BM; r += Cfg::STEP_LOADERS) load_stats(r);
      }
      cp_async_commit();
      if constexpr (Cfg::LOAD_LAG == 0) {
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(full(s));
        continue;
      }
      if (prev_s >= 0) {
        cp_async_wait<1>();
        fence_proxy_async();
        mbar_arrive(full(prev_s));
      }
      prev_s = s;
    }
    cp_async_wait<0>();
    fence_proxy_async();
    if (prev_s >= 0) mbar_arrive(full(prev_s));
    return;
  }

  // ------------------------------------------------------------------ consumers
  setmaxnreg_inc<Cfg::CONSUMER_REGS>();
  const int c = wg - 1;           // keys 64c .. 64c + 63 of the block
  const int ct = tid - 128 * wg;  // thread within the warpgroup
  const int w = ct >> 5, g = lane >> 2, t4 = lane & 3;

  constexpr int NKV = D / 2;  // dK / dV accumulator floats per thread (64 keys x D)
  float acc_dk[NKV], acc_dv[NKV];
#pragma unroll
  for (int k = 0; k < NKV; ++k) acc_dk[k] = acc_dv[k] = 0.0f;

  const int kr0 = c * 64 + w * 16 + g;  // this thread's key rows: kr0, kr0 + 8
  const std::uint32_t sK_c = sK + c * 64 * 128, sV_c = sV + c * 64 * 128;
  // stmatrix row addresses: lane -> matrix mi = lane / 8 (h = mi & 1, column block + (mi >> 1)),
  // stored row lane % 8; this consumer's keys are dS's key panel c, 16-byte chunk 2w + h.
  const int st_mi = lane >> 3, st_r = lane & 7;
  const std::uint32_t st_off = static_cast<std::uint32_t>(c * PANEL_Q + (8 * (st_mi >> 1) + st_r) * 128 +
                                                          (((2 * w + (st_mi & 1)) ^ st_r) << 4));

  // The gradient page's id, read now: the epilogue would otherwise wait for it.
  const std::int32_t grad_id = kmin < p.q_start ? outp.dpast.grad_page[page_j] : 0;
  mbar_wait(kv_bar, 0);
  constexpr bool tracing = Trace;
  const std::uint64_t t_walk = tracing ? globaltimer() : 0;
  std::uint64_t t_first = t_walk;

  // Register tiles of one step: S^T / P^T, dP^T / dS^T (accumulator layout: element 4j + 2h + e is
  // key kr0 + 8h, query column 8j + 2t4 + e), their bf16 A fragments, and dQ.
  // dq[qh]: query rows 64 qh .. 64 qh + 63 of the step.
  // The dQ tile in PARTS accumulators of 64 x 64: query halves (128-row steps) or column halves
  // (d128 over own keys). DQ_SWAP: one accumulator of dQ^T, columns 64c .. 64c + 63 as its 64 rows
  // (element 4j + 2h + e is column 64c + 16w + g + 8h, query row 8j + 2t4 + e of the step).
  constexpr int NS = BM / 2, QH = BM >= 64 && !Cfg::DQ_SWAP ? BM / 64 : 1;
  constexpr int HALVES = D == 128 && Cfg::DQ_OWN ? 2 : 1;
  constexpr int PARTS = Cfg::DQ_QHALF ? 1 : QH > HALVES ? QH : HALVES;
  auto qhalf_of = [&](int part) { return Cfg::DQ_QHALF ? c : QH > 1 ? part : 0; };  // the dQ part's 64 query rows
  constexpr int NDQF = Cfg::DQ_SWAP ? BM / 2 : 32;  // dq floats per part and thread
  float sacc[NS], dpacc[NS], dq[PARTS][NDQF];
  std::uint32_t pa[BM / 16][4], da[BM / 16][4];

  // S^T = K_c Q^T and dP^T = V_c dO^T for stage s: two commit groups.
  // Descriptors are built once per operand base and stepped with desc_at: building each k-step's
  // descriptor from its address put ~10 dependent instructions before every wgmma (hb7).
  const std::uint64_t desc_K = sw128_desc(sK_c, 16, 1024), desc_V = sw128_desc(sV_c, 16, 1024);
  auto issue_sdp = [&](int s) {
    const std::uint64_t desc_q_s = sw128_desc(sQ + s * Q_BYTES, 16, 1024), desc_do_s = sw128_desc(sdO + s * Q_BYTES, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const std::uint32_t off = (k >> 2) * PANEL_K + (k & 3) * 32;
      const std::uint32_t qoff = (k >> 2) * PANEL_Q + (k & 3) * 32;
      if constexpr (BM == 128)
        wgmma_ss_n128(sacc, desc_at(desc_K, off), desc_at(desc_q_s, qoff), k > 0);
      else if constexpr (BM == 80)
        wgmma_ss_n80(sacc, desc_at(desc_K, off), desc_at(desc_q_s, qoff), k > 0);
      else
        wgmma_ss_n64(sacc, desc_at(desc_K, off), desc_at(desc_q_s, qoff), k > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const std::uint32_t off = (k >> 2) * PANEL_K + (k & 3) * 32;
      const std::uint32_t qoff = (k >> 2) * PANEL_Q + (k & 3) * 32;
      if constexpr (BM == 128)
        wgmma_ss_n128(dpacc, desc_at(desc_V, off), desc_at(desc_do_s, qoff), k > 0);
      else if constexpr (BM == 80)
        wgmma_ss_n80(dpacc, desc_at(desc_V, off), desc_at(desc_do_s, qoff), k > 0);
      else
        wgmma_ss_n64(dpacc, desc_at(desc_V, off), desc_at(desc_do_s, qoff), k > 0);
    }
    wgmma_commit();
  };

  // Waits for S (all but the newest commit group), forms P^T; waits for dP, forms dS^T; packs both
  // into A fragments and stores dS ([query][key], key panel c) into buffer i & 1 for dQ = dS K.
  // release >= 0: the stage whose last reader (the previous step's dK) the S wait retires.
  // The step holds rows r0 .. r0 + n - 1; rows past n (a step clipped at its run's end, or sq) are masked.
  auto softmax_ds = [&](int r0, int n, int s, int i, int release) {
    const float* sLs = sL + s * BM;
    const float* sDs = sDl + s * BM;
    // A step needs the mask when it is clipped, crosses the window's end or the diagonal, or its last
    // row's document starts inside the block (the rows' bounds grow along the step). The bounds are
    // read from global memory (L1-resident): the d128 configurations have no shared memory to spare.
    const bool masked =
        valid_keys < BN || n < RS || kmax > p.q_start + std::int64_t(p.group_div.div(static_cast<std::uint32_t>(r0))) ||
        (p.key_lower != nullptr &&
         kbase < key_lower_rel(p, static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(r0 + n - 1)))));
    wgmma_wait<1>();
#pragma unroll
    for (int k = 0; k < NS; ++k) fence_operand(sacc[k]);
    if (release >= 0) mbar_arrive(empty(release));
    // P^T = exp2(S^T scale log2e - lse log2e): sL holds lse log2e (+inf where lse = -inf: P = 0).
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const float2 l = *reinterpret_cast<const float2*>(sLs + 8 * j + 2 * t4);
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sacc[4 * j + 2 * h + e] = fast_exp2(fmaf(sacc[4 * j + 2 * h + e], p.scale_log2, -(e ? l.y : l.x)));
    }
    if (masked) {
      // One bit per entry (4j + 2h + e) of this thread says it is masked; the bounds are read in a
      // rolled loop, so their loads hold no registers across the step, then the bits are applied.
      static_assert(NS <= 64, "a mask bit per accumulator entry");
      std::uint64_t off = 0;
#pragma unroll 1
      for (int j = 0; j < BM / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // the row sees key rows lo .. hi: from its document's bound to its position and the window's end
          const int r = 8 * j + 2 * t4 + e;
          const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(r < n ? r0 + r : r0)));
          const std::int64_t qlim = r < n ? std::int64_t(qi) - kbase : std::int64_t(-1);
          const int hi = qlim < valid_keys - 1 ? (qlim < -1 ? -1 : static_cast<int>(qlim)) : valid_keys - 1;
          const std::int64_t first = p.key_lower != nullptr ? __ldg(p.key_lower + qi) - p.q_start - kbase : 0;
          const int lo = first > 0 ? (first < BN ? static_cast<int>(first) : BN) : 0;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int kr = kr0 + 8 * h;
            off |= std::uint64_t(kr < lo || kr > hi) << (4 * j + 2 * h + e);
          }
        }
#pragma unroll
      for (int x = 0; x < NS; ++x)
        if ((off >> x) & 1u) sacc[x] = 0.0f;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int k = 0; k < NS; ++k) fence_operand(dpacc[k]);
    // dS^T = scale P^T (dP^T - delta) (sDl holds scale delta): the softmax scale rides in dS, so dQ and
    // dK need none. A masked P is exactly 0, and dP there is finite (zero-filled keys).
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const float2 dl = *reinterpret_cast<const float2*>(sDs + 8 * j + 2 * t4);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x = 4 * j + 2 * h + e;
          dpacc[x] = sacc[x] * fmaf(dpacc[x], p.scale, -(e ? dl.y : dl.x));
        }
    }
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pa[k][r] = pack_bf16(sacc[8 * k + 2 * r], sacc[8 * k + 2 * r + 1]);
        da[k][r] = pack_bf16(dpacc[8 * k + 2 * r], dpacc[8 * k + 2 * r + 1]);
      }
    }
    const std::uint32_t sdS_b = sdS + (i % Cfg::DS_BUFS) * DS_BYTES;
    // One dS buffer: every warp of this consumer must be past the previous step's dQ, its reader.
    if constexpr (Cfg::DS_BUFS == 1) named_sync(3 + c, 128);
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) stmatrix_x4_trans(sdS_b + st_off + k * 16 * 128, da[k][0], da[k][1], da[k][2], da[k][3]);
    fence_proxy_async();
  };

  // acc += A_k B_k over the BM queries of stage buffer `sb` (B N-major: [query][d] rows); dV += P^T dO
  // (frag = pa, sb = dO) or dK += dS^T Q (frag = da, sb = Q). No commit.
  auto issue_kv_product = [&](float(&acc)[NKV], const std::uint32_t(&frag)[BM / 16][4], std::uint32_t sb) {
    const std::uint64_t b0 = sw128_desc(sb, PANEL_Q, 1024);
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) {
      const std::uint64_t bd = desc_at(b0, k * 16 * 128);
      if constexpr (D == 128)
        wgmma_rs_n128(acc, frag[k], bd);
      else
        wgmma_rs_n64(acc, frag[k], bd);
    }
  };
  // dV += P^T dO, dK += dS^T Q: one commit group.
  auto issue_dkv = [&](int s) {
    wgmma_fence();
    issue_kv_product(acc_dv, pa, sdO + s * Q_BYTES);
    issue_kv_product(acc_dk, da, sQ + s * Q_BYTES);
    wgmma_commit();
  };

  // dQ = dS K. Over all 128 keys (both key panels of dS: a barrier between the consumers), d128
  // columns 64c.. or d64 query half c. DQ_OWN: each consumer only over its own keys, all columns, so
  // the consumers never wait for each other (d128: two column halves; twice the dq additions).
  constexpr bool OWN = Cfg::DQ_OWN;
  auto ds_barrier = [&] {
    if constexpr (OWN)
      named_sync(3 + c, 128);  // this consumer's key panel of dS is written
    else
      named_sync(2, 256);  // both key panels of dS are written
  };
  auto colp_of = [&](int hf) { return D == 128 ? (Cfg::DQ_OWN ? hf : c) : 0; };  // 64-column panel of dQ and K
  // One commit group: parts lo .. hi - 1 of the dQ tile (hi < 0: all).
  auto issue_dq = [&](int i, int lo = 0, int hi = -1) {
    const std::uint32_t sdS_b = sdS + (i % Cfg::DS_BUFS) * DS_BYTES;
    wgmma_fence();
    if constexpr (Cfg::DQ_SWAP) {
      // dQ^T (columns 64c..) = K^T dS^T over all 128 keys: A is K's column panel c read M-major
      // ([key][d] rows), B the dS buffer ([query][key], K-major) with the step's BM queries as N.
      (void)lo;
      (void)hi;
      const std::uint64_t a0 = sw128_desc(sK + c * PANEL_K, PANEL_K, 1024), b0 = sw128_desc(sdS_b, 16, 1024);
#pragma unroll
      for (int k = 0; k < BN / 16; ++k)
        wgmma_ss_n80_ta(dq[0], desc_at(a0, 16 * k * 128), desc_at(b0, (k >> 2) * PANEL_Q + (k & 3) * 32), k > 0);
    } else {
      constexpr int KQ = OWN ? 4 : BN / 16;
      const int key_lo = OWN ? c * 64 : 0;
      const std::uint64_t a0 = sw128_desc(sdS_b, 16, 1024), b0 = sw128_desc(sK, PANEL_K, 1024);
#pragma unroll
      for (int part = 0; part < PARTS; ++part)
        if (part >= lo && (hi < 0 || part < hi)) {
          const int qh = qhalf_of(part);
          const std::uint32_t kcol = colp_of(HALVES > 1 ? part : 0) * PANEL_K;
#pragma unroll
          for (int k = 0; k < KQ; ++k) {
            const int key0 = key_lo + 16 * k;
            wgmma_ss_n64_tb(dq[part], desc_at(a0, (key0 >> 6) * PANEL_Q + qh * 64 * 128 + ((key0 & 63) >> 4) * 32),
                            desc_at(b0, kcol + key0 * 128), k > 0);
          }
        }
    }
    wgmma_commit();
  };
  auto fence_dq = [&] {
#pragma unroll
    for (int part = 0; part < PARTS; ++part)
#pragma unroll
      for (int k = 0; k < NDQF; ++k) fence_operand(dq[part][k]);
  };
  auto fence_acc = [&] {
    fence_dq();
#pragma unroll
    for (int k = 0; k < NKV; ++k) {
      fence_operand(acc_dk[k]);
      fence_operand(acc_dv[k]);
    }
  };
  // Adds the finished dq tile of step b (rows 16w + g + 8h, columns 64 colp + 8j + 2t4) to global memory.
  // part: the accumulator dq[part] (writer: the first part waits for the tile, the last releases it).
  auto dq_out = [&](int r0, int nr, int i, int part) {  // the step's rows: r0 .. r0 + nr - 1
    const int colp = colp_of(HALVES > 1 ? part : 0);
    if constexpr (Cfg::DQ_WRITER) {
      // Into shared tile n ([BM][D] fp32, the writer warp's source; rows are dq rows, so no
      // swizzle): each thread stores its 8 column blocks of a row in an order rotated by g, so the
      // 8 rows of a store instruction fall on distinct bank groups.
      (void)r0;
      (void)nr;  // the writer warp adds the step's rows
      const int n = (OWN ? c : 0) * Cfg::DQ_BUFS + i % Cfg::DQ_BUFS;
      if (part == 0) mbar_wait(dq_empty(n), (static_cast<std::uint32_t>(i / Cfg::DQ_BUFS) & 1u) ^ 1u);
      if constexpr (Cfg::DQ_TENSOR) {
        // The TMA boxes' image: panel col / 32, row r at 128 r, 16-byte chunk (col / 4) % 8 XOR r % 8.
        // dQ^T (d128): each store instruction covers 4 rows x 8 columns of two chunks, which the
        // XOR spreads over all 32 banks (one wavefront); d64: v2 stores, 2 wavefronts per 256 bytes.
        auto at = [&](int r, int col) {
          return dq_tile(n) + static_cast<std::uint32_t>((col >> 5) * (BM * 128) + r * 128 +
                                                         ((((col >> 2) & 7) ^ (r & 7)) << 4) + (col & 3) * 4);
        };
        if constexpr (Cfg::DQ_SWAP) {
          const int col = 64 * c + 16 * w + g;
#pragma unroll
          for (int j = 0; j < BM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = 8 * j + 2 * t4 + e;
              asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at(r, col)), "f"(dq[0][4 * j + e]) : "memory");
              asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at(r, col + 8)), "f"(dq[0][4 * j + 2 + e])
                           : "memory");
            }
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 64 * qhalf_of(part) + w * 16 + g + 8 * h;
#pragma unroll
            for (int j = 0; j < 8; ++j)
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at(r, colp * 64 + 8 * j + 2 * t4)),
                           "f"(dq[part][4 * j + 2 * h]), "f"(dq[part][4 * j + 2 * h + 1])
                           : "memory");
          }
        }
      } else if constexpr (Cfg::DQ_SWAP) {
        // dQ^T: a thread holds columns col, col + 8 of rows 8j + 2t4 + e. The 4 lanes of one g
        // share banks (rows are 512 B apart), so odd t4 stores its two columns in the other order:
        // 16 distinct banks per store, 2 wavefronts, the minimum for 16 distinct columns.
        const int odd = t4 & 1;
        const std::uint32_t base = dq_tile(n) + static_cast<std::uint32_t>(2 * t4 * D * 4 + (64 * c + 16 * w + g) * 4);
        const std::uint32_t first = base + 32u * odd, second = base + 32u * (1 - odd);
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v0 = dq[0][4 * j + e], v1 = dq[0][4 * j + 2 + e];
            const std::uint32_t row = static_cast<std::uint32_t>((8 * j + e) * D * 4);
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(first + row), "f"(odd ? v1 : v0) : "memory");
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(second + row), "f"(odd ? v0 : v1) : "memory");
          }
      } else {
        const int qh = qhalf_of(part);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 v[8];
#pragma unroll
          for (int j = 0; j < 8; ++j)
            v[j] = make_float2(dq[part][4 * j + 2 * h], dq[part][4 * j + 2 * h + 1]);
#pragma unroll
          for (int bit = 1; bit < 8; bit <<= 1) {  // v[k] = v[(k + g) & 7], one select stage per bit of g
            const bool rot = (g & bit) != 0;
            float2 t[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) t[k] = rot ? v[(k + bit) & 7] : v[k];
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = t[k];
          }
          const std::uint32_t row =
              dq_tile(n) + static_cast<std::uint32_t>((64 * qh + w * 16 + g + 8 * h) * D * 4 + colp * 256 + t4 * 8);
#pragma unroll
          for (int k = 0; k < 8; ++k)
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(row + ((k + g) & 7) * 32), "f"(v[k].x), "f"(v[k].y)
                         : "memory");
        }
      }
      if (part < PARTS - 1) return;
      fence_proxy_async();
      mbar_arrive(dq_full(n));
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int R = r0 + w * 16 + g + 8 * h;
        if (R >= r0 + nr) continue;
        const int qi = static_cast<int>(p.group_div.div(static_cast<std::uint32_t>(R)));
        float* dst = outp.dq + (std::int64_t(qi) * p.hq + head0 + (R - qi * p.group)) * D + colp * 64 + 2 * t4;
#pragma unroll
        for (int j = 0; j < 8; ++j) red_add_v2(dst + 8 * j, dq[part][4 * j + 2 * h], dq[part][4 * j + 2 * h + 1]);
      }
    }
  };
  auto full_parity = [&](int i) { return static_cast<std::uint32_t>(i / S) & 1u; };

  if constexpr (Cfg::DQ_WRITER) {
    // FlashAttention-3's order: dV, then dQ (needs both consumers' dS), then dK; dQ is drained and
    // copied to its shared tile while dK runs, and the writer warp adds it to global memory. dK of
    // step i still reads stage s when step i + 1 starts: the stage is freed after that step's S wait.
#pragma unroll
    for (int k = 0; k < NKV; ++k) {  // the zeroed accumulators are defined before any product is in flight
      fence_operand(acc_dk[k]);
      fence_operand(acc_dv[k]);
    }
    int i = 0, s_prev = -1;
    for (query_walk wk = walk0; !wk.done(); wk.next(), ++i) {
      const int s = i % S;
      const int r0 = wk.r0, nr = wk.r1() - r0;
      mbar_wait(full(s), full_parity(i));
      if (tracing && i == 0) t_first = globaltimer();
      issue_sdp(s);
      softmax_ds(r0, nr, s, i, s_prev);
      wgmma_fence();
      issue_kv_product(acc_dv, pa, sdO + s * Q_BYTES);
      wgmma_commit();
      ds_barrier();
      if constexpr (PARTS == 1) {
        issue_dq(i);
        wgmma_fence();
        issue_kv_product(acc_dk, da, sQ + s * Q_BYTES);
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ done, dK in flight
        fence_dq();
        dq_out(r0, nr, i, 0);
        if constexpr (Cfg::DQ_SWAP || Cfg::DQ_QHALF) {  // dK done here (see BM; d64 over all keys likewise): free the stage now
          wgmma_wait<0>();
          mbar_arrive(empty(s));
        }
      } else {  // two parts: the second after dK (registers)
        issue_dq(i, 0, 1);
        wgmma_fence();
        issue_kv_product(acc_dk, da, sQ + s * Q_BYTES);
        wgmma_commit();
        issue_dq(i, 1, 2);
        wgmma_wait<2>();  // dV and dQ's first part done
        fence_dq();
        dq_out(r0, nr, i, 0);
        wgmma_wait<0>();
        fence_dq();
        dq_out(r0, nr, i, 1);
      }
      s_prev = Cfg::DQ_SWAP || Cfg::DQ_QHALF ? -1 : s;  // else the next step's S wait retires dK
    }
    wgmma_wait<0>();
    fence_acc();
    if (s_prev >= 0) mbar_arrive(empty(s_prev));
  } else {
    int i = 0;
    for (query_walk wk = walk0; !wk.done(); wk.next(), ++i) {
      const int s = i % S;
      const int r0 = wk.r0, nr = wk.r1() - r0;
      mbar_wait(full(s), full_parity(i));
      issue_sdp(s);
      softmax_ds(r0, nr, s, i, -1);
      issue_dkv(s);
      ds_barrier();
#pragma unroll  // constant indices into dq[]
      for (int hf = 0; hf < HALVES; ++hf) {
        issue_dq(i, hf, hf + 1);
        wgmma_wait<0>();
        fence_acc();
        if (hf == 0) mbar_arrive(empty(s));  // Q, dO, lse, delta of stage s are no longer read
        dq_out(r0, nr, i, hf);
      }
    }
  }

  const std::uint64_t t_last = tracing ? globaltimer() : 0;

  // Epilogue: dK and dV of this block's keys added into their rows (thread: key rows kr0 + 8h, columns
  // 8j + 2t4 + e). Key row k's destination rows, or false (past the window or the chunk):
  auto row_dst = [&](int k, float*& dk, float*& dv) {
    const std::int32_t sk = s0 + k;
    if (sk >= s_end) return false;
    const std::int64_t pos = pos0 + sk;
    if (pos >= p.q_start) {
      const std::int64_t row = pos - p.q_start;
      if (row >= p.sq) return false;
      dk = outp.dk_own + (row * p.hkv + kvh) * D;
      dv = outp.dv_own + (row * p.hkv + kvh) * D;
    } else {
      dk = outp.dpast.pool.base + outp.dpast.pool.offset(grad_id, sk & page_mask, kvh);
      dv = dk + outp.dpast.pool.v_offset;
    }
    return true;
  };
  // A whole block of past rows (a full page tile) or of the chunk's own rows (rows past sq are
  // clipped by the map), with tensor_rows: staged in shared memory as the boxes' image (the K/V tile,
  // stages and dS are free once both consumers are past their last products) and added by one thread
  // with D / 32 TMA tensor reductions per matrix, whole 128-row boxes. Otherwise (a block straddling
  // q_start or the window's end, or rows not 16-byte aligned) red.add of 8-byte pairs from every
  // thread, which took ~6 us per CTA at d128 (8 rows x 32 bytes per instruction), the largest fixed
  // cost of a short sparse walk; per-row bulk reductions took longer still (~10 us: 256 small bulk
  // operations per CTA; docs/history/attention.md hs2). Either way no value comes back, and the pieces
  // and query splits of a block add into the same rows.
  const bool own_rows = kmin >= p.q_start;
  const bool tensor_rows = outp.tensor_rows && valid_keys == BN && (own_rows || kmax < p.q_start);  // uniform
  // piece_turn: wait until the block's lower pieces that walk any step (their walks as this CTA's
  // would be: the same selection bits, their own rows) have added.
  auto wait_piece_turn = [&] {
    int lower = 0;
    for (int z = 0; z < piece; ++z) {
      int b, e;
      p.plan.piece_rows(z, tile_rows, first_tile, first_row, block_rows, b, e);
      lower += b < e && !query_walk(sSel, ntiles, tile_rows, p.tile_rows_div, e, RS, b, 0, 1, true).done();
    }
    const std::uint64_t w0 = Trace ? globaltimer() : 0;
    wait_turn(piece_turn, lower);
    if (Trace) p.trace[trace_at + backward_trace_record::PIECE_WAIT] = globaltimer() - w0;
  };
  constexpr int PANEL_ROWS = BN * 128;  // one box: 32 fp32 columns x the block's rows, 128-byte swizzle
  static_assert(2 * D * BN * 4 <= 2 * KV_BYTES + 2 * S * Q_BYTES + Cfg::DS_BUFS * DS_BYTES, "dK/dV staging");
  const std::uint32_t sdK = sbase, sdV = sbase + D / 32 * PANEL_ROWS;
  std::uint64_t t_synced = t_last, t_staged = t_last;
  if (tensor_rows) {
    named_sync(2, 256);  // both consumers are past their last reads of K, V, the stages and dS
    if (tracing) t_synced = globaltimer();
    // Column col of row r: panel col / 32, 16-byte chunk (col / 4) % 8 XOR r % 8; the 8 rows of one
    // store instruction (g) then fill the banks twice over, the minimum for 256 bytes.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = kr0 + 8 * h;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int col = 8 * j + 2 * t4;
        const std::uint32_t at = static_cast<std::uint32_t>((col >> 5) * PANEL_ROWS + r * 128 +
                                                            ((((col >> 2) & 7) ^ (r & 7)) << 4) + (col & 3) * 4);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sdK + at), "f"(acc_dk[4 * j + 2 * h]),
                     "f"(acc_dk[4 * j + 2 * h + 1])
                     : "memory");
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sdV + at), "f"(acc_dv[4 * j + 2 * h]),
                     "f"(acc_dv[4 * j + 2 * h + 1])
                     : "memory");
      }
    }
    fence_proxy_async();
    named_sync(2, 256);
    if (tracing) t_staged = globaltimer();
    if (ct == 0 && c == 0) {
      if (piece_turn != nullptr) {
        wait_piece_turn();
        fence_proxy_async_global();
      }
      const int tok = s0 & page_mask;
      const int c1 = outp.grad_token_dim1 ? tok : kvh, c2 = outp.grad_token_dim1 ? kvh : tok;
      const int row0 = static_cast<int>(kmin - p.q_start);
#pragma unroll
      for (int pc = 0; pc < D / 32; ++pc) {
        const std::uint32_t off = static_cast<std::uint32_t>(pc * PANEL_ROWS);
        if (own_rows) {
          tma_reduce_add_4d(&tmap_rows.dk_own, sdK + off, pc * 32, 0, kvh, row0);
          tma_reduce_add_4d(&tmap_rows.dv_own, sdV + off, pc * 32, 0, kvh, row0);
        } else {
          tma_reduce_add_4d(&tmap_rows.dk_past, sdK + off, pc * 32, c1, c2, grad_id);
          tma_reduce_add_4d(&tmap_rows.dv_past, sdV + off, pc * 32, c1, c2, grad_id);
        }
      }
      bulk_commit();
    }
  } else {
    if (piece_turn != nullptr) {
      if (ct == 0 && c == 0) wait_piece_turn();
      named_sync(2, 256);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float *dk, *dv;
      if (!row_dst(kr0 + 8 * h, dk, dv)) continue;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int col = 8 * j + 2 * t4;
        red_add_v2(dk + col, acc_dk[4 * j + 2 * h], acc_dk[4 * j + 2 * h + 1]);
        red_add_v2(dv + col, acc_dv[4 * j + 2 * h], acc_dv[4 * j + 2 * h + 1]);
      }
    }
  }
  if (tracing && ct == 0 && c == 0) {
    int steps = 0;
    for (query_walk wk = walk0; !wk.done(); wk.next()) ++steps;
    using rec = backward_trace_record;
    p.trace[trace_at + rec::SELECTED] = t_selected;
    p.trace[trace_at + rec::WALK] = t_walk;
    p.trace[trace_at + rec::FIRST] = t_first;
    p.trace[trace_at + rec::LAST] = t_last;
    p.trace[trace_at + rec::SYNCED] = t_synced;
    p.trace[trace_at + rec::STAGED] = t_staged;
    p.trace[trace_at + rec::END] = globaltimer();
    p.trace[trace_at + rec::INFO] = rec::info(smid(), kvh, piece, steps, kb);
  }
  if (piece_turn != nullptr) {  // the block's next piece adds once these sums are in dK/dV
    if (!tensor_rows) {
      __threadfence();
      named_sync(2, 256);
    }
    if (ct == 0 && c == 0) {
      if (tensor_rows) {
        bulk_wait<0>();
        fence_proxy_async_global();
      }
      __threadfence();
      pass_turn(piece_turn);
    }
  } else if (tensor_rows && ct == 0 && c == 0) {
    bulk_wait_read<0>();  // the staged rows stay until the reductions read them
  }
#else
  (void)p;
  (void)tmap_k;
  (void)tmap_v;
  (void)tmap_q;
  (void)tmap_do;
  (void)tmap_dq;
  (void)tmap_rows;
  (void)lse;
  (void)delta;
  (void)d_o;
  (void)outp;
  (void)token_dim1;
  (void)qsplit;
  __trap();  // built without sm_90a: the launcher never selects this kernel then
#endif
}

OOMB_KERNEL_NAMESPACE_END
}  // namespace attention::detail
OOMB_NAMESPACE_END
