// oomb — the attention plan: what one call will launch, decided on the host before the call.
// SPDX-License-Identifier: Apache-2.0
//
// As in FlashInfer, planning is kept apart from launching. plan_forward / plan_backward read the
// call's shape (call_shape: sizes, the window, dense or sparse) and the device's immutable facts
// (device_facts: SMs, occupancy, whether the Hopper code is there) and choose the kernel
// configuration, the split of the work over CTAs, the sparse launch order and the workspace a
// sparse backward wants. They are plain host arithmetic: no CUDA, no allocation, no global state,
// so they are tested on the CPU and a caller may plan once and launch many times.
// The launch (oomb/attention/attention.cuh: forward, backward) takes the plan, checks that the
// arguments are the shape it was made for, and allocates nothing.
#pragma once

#include <algorithm>
#include <cstdint>

#include "oomb/core/config.hpp"
#include "oomb/core/error.hpp"

#include "oomb/attention/args.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention {

/// Which kernels a call may use. `automatic`: the Hopper kernels (TMA, wgmma, warp specialisation)
/// where they apply (a compute-capability 9.0 device, sm_90a code in the binary, pages of at least
/// 128 tokens), the portable mma.sync ones elsewhere. `portable`: always the latter.
enum class kernel_choice { automatic, portable };

/// Every compiled kernel configuration (variants.cuh names the tile type of each).
enum class kernel_config : int {
  forward_portable_d64,
  forward_portable_d128,
  forward_hopper_d64,
  forward_hopper_d128,
  backward_portable_d64,
  backward_portable_d128,
  backward_hopper_d64,                 ///< groups that fit a step: Q/dO by TMA, whole-query steps
  backward_hopper_d64_wide_group,      ///< wider groups: Q/dO by cp.async, packed rows straddle queries
  backward_hopper_d64_unaligned,       ///< a dq that is 8- but not 16-byte aligned
  backward_hopper_d128,
  backward_hopper_d128_wide_group,
  backward_hopper_d128_unaligned,
  count
};
inline constexpr int kernel_config_count = static_cast<int>(kernel_config::count);

/// What the plan needs of a configuration's tile: query rows per block or step (bm), keys per
/// block (bn), whether a step holds whole queries (the group must fit it), Hopper or portable, and
/// the head size. variants.cuh checks each tile type against this table at compile time.
struct tile_shape {
  int bm, bn;
  bool whole_queries, hopper;
  int d;
};
constexpr tile_shape shape_of(kernel_config c) {
  switch (c) {
    case kernel_config::forward_portable_d64: return {128, 128, false, false, 64};
    case kernel_config::forward_portable_d128: return {128, 64, false, false, 128};
    case kernel_config::forward_hopper_d64: return {128, 128, false, true, 64};
    case kernel_config::forward_hopper_d128: return {128, 128, false, true, 128};
    case kernel_config::backward_portable_d64: return {128, 128, false, false, 64};
    case kernel_config::backward_portable_d128: return {64, 128, false, false, 128};
    case kernel_config::backward_hopper_d64: return {128, 128, true, true, 64};
    case kernel_config::backward_hopper_d64_wide_group: return {128, 128, false, true, 64};
    case kernel_config::backward_hopper_d64_unaligned: return {64, 128, false, true, 64};
    case kernel_config::backward_hopper_d128: return {80, 128, true, true, 128};
    case kernel_config::backward_hopper_d128_wide_group: return {80, 128, false, true, 128};
    case kernel_config::backward_hopper_d128_unaligned: return {64, 128, false, true, 128};
    default: return {0, 0, false, false, 0};
  }
}
constexpr bool is_forward(kernel_config c) { return c <= kernel_config::forward_hopper_d128; }

/// Immutable facts of one device and binary: what a plan depends on besides the call. Queried
/// once per device by current_device_facts (attention.cuh: SM count, each configuration's resident
/// blocks per SM from the occupancy calculator, whether the device is Hopper and the binary holds
/// each Hopper kernel's sm_90a code); tests write them by hand.
struct device_facts {
  int sm_count = 0;
  int blocks_per_sm[kernel_config_count] = {};  ///< 0: the configuration cannot run here
  /// CTAs of configuration c resident at once on the whole device.
  int resident(kernel_config c) const {
    const int per_sm = blocks_per_sm[static_cast<int>(c)];
    return sm_count * (per_sm > 0 ? per_sm : 1);
  }
  bool runs(kernel_config c) const { return blocks_per_sm[static_cast<int>(c)] > 0; }
};

/// What a plan reads of a call: every host-side field of attention_args the launch depends on.
struct call_shape {
  std::int64_t q_start = 0;
  std::int32_t sq = 0, hq = 0, hkv = 0, d = 0;
  std::int32_t page_size = 0, first_page = 0, window_pages = 0;
  bool sparse = false;
  std::int32_t tile = 0;      ///< sparse calls: queries per tile
  bool dq_aligned16 = true;   ///< backward: the Hopper writer's bulk reductions need a 16-byte aligned dq
  bool bounded = false;       ///< per-document bounds (attention_args::key_lower) given

  static call_shape of(const attention_args& a, const void* dq = nullptr) {
    call_shape s;
    s.q_start = a.q_start;
    s.sq = a.sq;
    s.hq = a.hq;
    s.hkv = a.hkv;
    s.d = a.d;
    s.page_size = a.kv.pool.page_size;
    s.first_page = a.first_page;
    s.window_pages = a.window_pages;
    s.sparse = a.tile_indptr != nullptr;
    s.tile = s.sparse ? a.tile : 0;
    s.dq_aligned16 = (reinterpret_cast<std::uintptr_t>(dq) & 15u) == 0;
    s.bounded = a.key_lower != nullptr;
    return s;
  }
  std::int32_t group() const { return hkv > 0 ? hq / hkv : 0; }
  friend bool operator==(const call_shape& x, const call_shape& y) {
    return x.q_start == y.q_start && x.sq == y.sq && x.hq == y.hq && x.hkv == y.hkv && x.d == y.d &&
           x.page_size == y.page_size && x.first_page == y.first_page && x.window_pages == y.window_pages &&
           x.sparse == y.sparse && x.tile == y.tile && x.dq_aligned16 == y.dq_aligned16 && x.bounded == y.bounded;
  }
  friend bool operator!=(const call_shape& x, const call_shape& y) { return !(x == y); }
};

/// What a caller may ask of a plan beyond the default.
struct plan_options {
  kernel_choice kernels = kernel_choice::automatic;
  /// > 0 forces the split (forward: CTAs of a cluster per row block, 1..4; backward: CTAs sharing a
  /// key block's query tiles, 1..4); 0: the plan chooses. Tests and the benchmark.
  int split = 0;
  /// Portable backward: 2 staggers each block's query walk (1, 0: lockstep). Hopper sparse
  /// backward: 2 takes the KV heads in turn, 3 hs1's order (no walk in pieces, no workspace); 0, 1:
  /// the default. The benchmark times them.
  int order = 0;
  /// Forces this configuration (tests, benchmark); count: the plan chooses.
  kernel_config config = kernel_config::count;
  /// Backward: the same bits on every run. The Hopper backward then adds each dQ step in key block
  /// order (a turn counter per KV head and step in the workspace: backward_plan::workspace_ints) and
  /// takes no query split, so no sum depends on which CTA finishes first. Page-sparse calls launch
  /// their blocks in window order with the KV heads in turn (order 2, unless another is asked for),
  /// walk each query tile in steps of its own (sparse_dq_order) and add the dK/dV of a cut block's
  /// pieces in piece order.
  /// The portable kernels and an 8-byte aligned dq are refused (their sums are still unordered).
  bool deterministic = false;
};

/// The Hopper backward's launch order on page-sparse calls, computed on the host (hs2). Per KV head,
/// in launch order: the chunk's own key blocks [own_kb, own_kb + own), then the first `ends` past
/// blocks of the alternation from the window's two ends (0, own_kb - 1, 1, own_kb - 2, ...: the sink
/// and local pages, which every tile selects), each of those cut into `pieces` CTAs that take
/// piece_tiles query tiles each (piece_rows); then the remaining past blocks of the alternation, one
/// CTA each. A block's pieces add their dK/dV atomically.
/// With a workspace (sparse_backward_order_kernel) the past blocks come in order of how many tiles
/// select them instead, most first, the unselected ones not at all: `order` lists them, `*selected` of
/// them; the first `ends` of that order are the ones cut into pieces. The order kernel also leaves, per
/// past page, the bits of the tiles that select it (`tiles_of`), so that a CTA reads its walk's tiles
/// instead of searching the tiles' lists.
/// Deterministic calls (`window_order`): the blocks in window order, each cut block's pieces in turn
/// (the same blocks are cut), so that every CTA a dQ step waits for (a lower block: sparse_dq_order)
/// and every piece a block's dK/dV add waits for (a lower piece: piece_turn) launched before it.
struct sparse_backward_plan {
  std::int32_t own_kb = 0;       // first key block of the chunk's own pages (from the host's q_start)
  std::int32_t own = 0;          // own key blocks
  std::int32_t ends = 0;         // past blocks cut into pieces
  std::int32_t pieces = 1;       // CTAs per cut block
  std::int32_t piece_tiles = 0;  // query tiles per piece
  const std::int32_t* order = nullptr;     // device: past blocks, most selected first (nullptr: the alternation)
  const std::int32_t* selected = nullptr;  // device: how many blocks `order` lists
  const std::uint32_t* tiles_of = nullptr;  // device: per past page (window order), ceil(tiles / 32) words of tile bits
  bool window_order = false;                 // deterministic calls: the blocks in window order
  OOMB_HOST_DEVICE int ctas_per_head(int key_blocks) const { return (own + ends) * pieces + (key_blocks - own - ends); }
  /// The cut blocks, in window order: the first ceil(ends / 2) past blocks, then from the window's
  /// last floor(ends / 2) past blocks on (with the own blocks) to its end.
  OOMB_HOST_DEVICE int head_cut() const { return (ends + 1) / 2; }
  OOMB_HOST_DEVICE int tail_cut() const { return own_kb - ends / 2; }
  /// Cut block kb's index among the cut blocks in window order (what piece_turns counts by), or -1.
  OOMB_HOST_DEVICE int cut_index(int kb) const {
    if (pieces <= 1) return -1;
    return kb < head_cut() ? kb : kb >= tail_cut() ? kb - tail_cut() + head_cut() : -1;
  }
  /// The key block that launch position o (within a KV head) takes, and which piece of it (-1: the
  /// whole walk); -1: none (an ordered launch's position past the selected blocks).
  OOMB_HOST_DEVICE int block_at(int o, int& piece) const {
    piece = -1;
    if (window_order) {
      const int head = head_cut() * pieces, middle = tail_cut() - head_cut();
      if (pieces <= 1) return o;
      if (o >= head && o < head + middle) return head_cut() + (o - head);
      const int x = o < head ? o : o - head - middle;
      piece = x % pieces;
      return (o < head ? 0 : tail_cut()) + x / pieces;
    }
    const int cut = (own + ends) * pieces;
    int k;  // own block b: -1 - b; past: the position in the alternation
    if (o < cut) {
      const int b = o / pieces;
      if (pieces > 1) piece = o - b * pieces;
      k = b < own ? -1 - b : b - own;
    } else {
      k = ends + (o - cut);
    }
    if (k < 0) return own_kb - 1 - k;
    if (order != nullptr) {  // both loads at once (k < past blocks: in bounds; unused past *selected)
      const int b = order[k];
      return k < *selected ? b : -1;
    }
    return (k & 1) ? own_kb - 1 - (k >> 1) : k >> 1;
  }
  /// The packed rows [begin, end) of a block's walk that `piece` takes (-1: all): the block's rows are
  /// [first_row, rows), first_row in query tile first_tile; piece z keeps those of the tiles
  /// [first_tile + z * piece_tiles, first_tile + (z + 1) * piece_tiles). Counted from the block's own
  /// first tile, so the pieces of the chunk's own blocks (causal: block j from tile ~j) walk different
  /// tiles at any moment, as their whole walks did (hs1), and do not add into the same dq rows at once.
  /// begin >= end: none.
  OOMB_HOST_DEVICE void piece_rows(int piece, int tile_rows, int first_tile, int first_row, int rows, int& begin,
                                   int& end) const {
    begin = first_row;
    end = rows;
    if (piece < 0) return;
    const int a = (first_tile + piece * piece_tiles) * tile_rows, b = a + piece_tiles * tile_rows;
    if (a > begin) begin = a;
    if (b < end) end = b;
  }
};

/// The deterministic page-sparse backward's dQ order (plan_options::deterministic). Every block walks
/// a query tile in steps of its own, counted from the tile's first row (query_walk's tile_steps), so
/// all blocks that attend a tile cut it into the same steps, and each step has a turn counter: step k
/// of tile t of KV head h is counter (h * tiles + t) * steps_per_tile + k (backward_plan::turn_steps).
/// A step's contributors are the key blocks of its tile's virtual key sequence (the selected past
/// pages inside the window, then the chunk's own pages) in window order, from the block holding the
/// step's first bound on (block 0 without bounds), up to the causal end. Block kb adds its dQ when
/// the contributors below it have: `turn` of them. `below(y)` says how many entries of the tile's
/// sorted page list lie below logical page y (std::lower_bound in the CPU test, a warp's search in the
/// kernel); a past page outside the window is never counted.
struct sparse_dq_order {
  std::int32_t first_page;       // the window's first logical page
  std::int32_t own_page;         // window index of the chunk's first own page, in [0, window pages]
  std::int32_t blocks_per_page;  // page_size / bn
  /// Pages of the tile's virtual sequence with window index < x.
  template <class Below>
  OOMB_HOST_DEVICE int pages_below(const Below& below, int x) const {
    const int past = x < own_page ? x : own_page;
    return below(first_page + past) - below(first_page) + (x > own_page ? x - own_page : 0);
  }
  /// Whether the tile attends window page x.
  template <class Below>
  OOMB_HOST_DEVICE bool attends(const Below& below, int x) const {
    return x >= own_page || below(first_page + x + 1) > below(first_page + x);
  }
  /// The turn of block kb (a contributor: its page attended, kb >= lo, the block of the step's first
  /// bound), given pages_below of kb's page and of lo's, and whether lo's page is attended.
  OOMB_HOST_DEVICE int turn(int kb, int lo, int below_kb_page, int below_lo_page, bool lo_page_attended) const {
    return (below_kb_page - below_lo_page) * blocks_per_page - (lo_page_attended ? lo % blocks_per_page : 0) +
           kb % blocks_per_page;
  }
};

/// One forward call's launch: the configuration, the cluster split and the grid's row blocks.
struct forward_plan {
  call_shape shape;
  kernel_config config = kernel_config::count;
  int split = 1;       ///< CTAs (one cluster) per row block
  int row_blocks = 0;  ///< per KV head: ceil(sq * group / bm)
};

/// One backward call's launch. key_blocks == 0: nothing to launch (an empty window).
struct backward_plan {
  call_shape shape;
  kernel_config config = kernel_config::count;
  int key_blocks = 0;     ///< per KV head: ceil(window keys / bn)
  int ctas_per_head = 0;  ///< grid x: key_blocks, or the sparse launch order's CTAs
  int query_split = 1;    ///< grid z: CTAs sharing one key block's query tiles
  int step_rows = 0;      ///< packed query rows per step
  int order = 0;          ///< plan_options::order
  sparse_backward_plan sparse;  ///< Hopper sparse calls (device pointers filled at launch)
  /// plan_options::deterministic: dQ is added step by step in key block order, with no query split.
  bool deterministic = false;
  /// int32 words of device workspace the launch wants (sparse Hopper calls: the launch order by
  /// selection and each page's tile bits; deterministic calls: a turn counter per KV head and query
  /// step, then per KV head and cut block a piece turn: piece_turns()); 0: none. A smaller workspace
  /// is refused; a sparse call with none at all launches in the window-ends-first order, a
  /// deterministic one is refused.
  std::int64_t workspace_ints = 0;
  /// Steps of step_rows packed query rows per KV head.
  std::int64_t query_steps() const {
    return step_rows > 0 ? (std::int64_t(shape.sq) * shape.group() + step_rows - 1) / step_rows : 0;
  }
  /// Deterministic sparse calls with cut blocks: per KV head, a counter per cut block of how many of
  /// its pieces have added their dK/dV (the pieces add in turn), after the dQ turns in the workspace.
  std::int64_t piece_turns() const {
    return deterministic && shape.sparse && sparse.pieces > 1 ? sparse.own + sparse.ends : 0;
  }
  /// Deterministic calls: the dQ turn counters per KV head, one per step: query_steps() dense; sparse,
  /// where each tile is walked in steps of its own (sparse_dq_order), tiles * ceil(tile rows / step_rows).
  std::int64_t turn_steps() const {
    if (!shape.sparse) return query_steps();
    const std::int64_t tiles = (shape.sq + shape.tile - 1) / shape.tile, tile_rows = std::int64_t(shape.tile) * shape.group();
    return step_rows > 0 ? tiles * ((tile_rows + step_rows - 1) / step_rows) : 0;
  }
};

namespace detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// Fraction of the last wave's slots a grid of n CTAs keeps busy on `slots` resident CTAs.
inline double wave_efficiency(std::int64_t n, int slots) {
  return double(n) / double(ceil_div(n, slots) * slots);
}

/// How many CTAs (one thread-block cluster) share each row block of the portable forward, each
/// taking a contiguous part of its key tiles. Measured on the H200 (docs/history/attention.md): 2
/// beats 1 by ~12% on long windows (896 blocks on 264 slots fill 85% of the last wave; split 2 fills
/// 97% and balances the causal tail), 3 and 4 lose to 2. A grid far smaller than the GPU splits 4
/// ways; short windows do not split.
inline int forward_split(int blocks, int slots, std::int64_t key_tiles) {
  if (key_tiles < 8) return 1;
  if (2 * blocks < slots / 2 && key_tiles >= 16) return 4;
  return 2;
}

/// Cluster split of the Hopper forward (one CTA per SM): 2 when it fills the last wave clearly
/// better (e.g. 448 row blocks on 132 SMs: 85% -> 97%), else 1; each rank keeps >= 8 key tiles.
inline int forward_sm90_split(int blocks, int slots, std::int64_t key_tiles) {
  return key_tiles >= 16 && wave_efficiency(2 * std::int64_t(blocks), slots) > wave_efficiency(blocks, slots) + 0.05 ? 2
                                                                                                                     : 1;
}

/// How many CTAs share one key block's query tiles in the backward: enough to fill the last wave
/// (e.g. 320 blocks on 132 SMs run 2.4 waves, 81% busy; 640 run 4.85, 97%), at least two query
/// tiles each.
inline int backward_split(int blocks, int slots, int query_tiles) {
  double best_eff = 0;
  int best = 1;
  for (int s = 1; s <= 4 && (s == 1 || query_tiles >= 2 * s); ++s) {
    const double eff = wave_efficiency(std::int64_t(blocks) * s, slots);
    if (eff > best_eff + 0.03) {  // a split costs atomics and K/V loads: take it for a clear gain
      best_eff = eff;
      best = s;
    }
  }
  return best;
}

/// The query split of a dense Hopper backward with per-document bounds: the most CTAs per key block
/// (4) that keep two query tiles each. With documents a block's walk ends where its document does, so
/// walks differ by up to the whole chunk and the wave arithmetic above (equal walks) does not hold;
/// the longest walks set the time, and a split cuts every walk in interleaved steps. Measured on the
/// H100 (bench_attention --documents, 18 shapes: 2K-16K documents, 16K-256K past, d64 and d128): split
/// 4 was the fastest in 17 and within 1% in the last; the wave rule's choice was up to 2.1x slower
/// (docs/attention.md).
inline int bounded_backward_split(int query_tiles) {
  int s = 4;
  while (s > 1 && query_tiles < 2 * s) --s;
  return s;
}

/// The sparse launch order (sparse_backward_plan) for `key_blocks` blocks of bn keys. cut = false:
/// hs1's order, no block in pieces. Otherwise a block that every tile may attend (the own blocks;
/// the window's first and last backward_sparse_end_pages pages) is cut into pieces of at most
/// backward_sparse_piece_tiles query tiles: with one CTA per SM a walk longer than the SM's share of
/// the call, started late (the last KV head's own and sink/local blocks), ended ~10% after the rest.
inline constexpr int backward_sparse_piece_tiles = 8;
inline constexpr int backward_sparse_end_pages = 8;
inline sparse_backward_plan make_sparse_backward_plan(const call_shape& s, int key_blocks, int bn, bool cut) {
  const std::int64_t ps = s.page_size;
  const std::int64_t own_page = std::clamp<std::int64_t>(s.q_start / ps - s.first_page, 0, s.window_pages);
  sparse_backward_plan plan;
  plan.own_kb = static_cast<std::int32_t>(own_page * ps / bn);
  plan.own = key_blocks - plan.own_kb;
  const int tiles = static_cast<int>(ceil_div(s.sq, s.tile));
  if (cut && tiles > backward_sparse_piece_tiles) {
    plan.pieces = static_cast<int>(ceil_div(tiles, backward_sparse_piece_tiles));
    plan.piece_tiles = static_cast<int>(ceil_div(tiles, plan.pieces));
    plan.ends = static_cast<std::int32_t>(std::min<std::int64_t>(plan.own_kb, 2 * backward_sparse_end_pages * ps / bn));
  }
  return plan;
}

/// The checks every plan makes of a shape (the launch checks pointers and strides).
inline void check_shape(const call_shape& s, const char* what) {
  OOMB_EXPECTS(s.sq > 0, what, ": sq must be positive, got ", s.sq);
  OOMB_EXPECTS(s.hq > 0 && s.hkv > 0 && s.hq % s.hkv == 0, what, ": hq (", s.hq, ") must be a positive multiple of hkv (",
               s.hkv, ")");
  OOMB_EXPECTS(s.d == 64 || s.d == 128, what, ": head_dim must be 64 or 128, got ", s.d);
  OOMB_EXPECTS(s.page_size >= 16 && (s.page_size & (s.page_size - 1)) == 0, what,
               ": page_size must be a power of two >= 16, got ", s.page_size);
  OOMB_EXPECTS(s.window_pages >= 0 && std::int64_t(s.window_pages) * s.page_size < (std::int64_t(1) << 31), what,
               ": window_pages out of range: ", s.window_pages);
  OOMB_EXPECTS(!s.sparse || s.tile > 0, what, ": a sparse call needs a positive tile, got ", s.tile);
  OOMB_EXPECTS(!s.sparse || ceil_div(s.sq, s.tile) <= 4096, what, ": at most 4096 sparse query tiles per call, got ",
               ceil_div(s.sq, s.tile));
}

inline void check_forced(const plan_options& o, bool forward, const char* what) {
  OOMB_EXPECTS(o.split >= 0 && o.split <= 4, what, ": split must be 0..4, got ", o.split);
  OOMB_EXPECTS(o.order >= 0 && o.order <= 3, what, ": order must be 0..3, got ", o.order);
  OOMB_EXPECTS(o.config == kernel_config::count || is_forward(o.config) == forward, what,
               ": the forced configuration is for the other direction");
}

inline kernel_config pick(int d, kernel_config d64, kernel_config d128) { return d == 64 ? d64 : d128; }

}  // namespace detail

/// The forward's launch for a call of shape s on a device with facts f.
inline forward_plan plan_forward(const call_shape& s, const device_facts& f, const plan_options& o = {}) {
  detail::check_shape(s, "plan_forward");
  detail::check_forced(o, true, "plan_forward");
  forward_plan p;
  p.shape = s;
  const kernel_config hopper =
      detail::pick(s.d, kernel_config::forward_hopper_d64, kernel_config::forward_hopper_d128);
  const kernel_config portable =
      detail::pick(s.d, kernel_config::forward_portable_d64, kernel_config::forward_portable_d128);
  if (o.config != kernel_config::count)
    p.config = o.config;
  else
    p.config = o.kernels == kernel_choice::automatic && f.runs(hopper) && s.page_size >= shape_of(hopper).bn
                   ? hopper
                   : portable;
  const tile_shape t = shape_of(p.config);
  OOMB_EXPECTS(t.d == s.d, "plan_forward: the forced configuration is for head_dim ", t.d, ", the call's is ", s.d);
  OOMB_EXPECTS(!t.hopper || s.page_size >= t.bn, "plan_forward (sm90): page_size must be >= ", t.bn, ", got ",
               s.page_size);
  OOMB_EXPECTS(!s.sparse || (std::int64_t(s.tile) * s.group()) % t.bm == 0, "plan_forward: sparse tile (", s.tile,
               " queries) times group (", s.group(), ") must be a multiple of ", t.bm, " rows");
  p.row_blocks = static_cast<int>(detail::ceil_div(std::int64_t(s.sq) * s.group(), t.bm));
  const std::int64_t key_tiles = std::int64_t(s.window_pages) * s.page_size / t.bn;
  const int blocks = p.row_blocks * s.hkv;
  if (o.split > 0)
    p.split = o.split;
  else
    p.split = t.hopper ? detail::forward_sm90_split(blocks, f.resident(p.config), key_tiles)
                       : detail::forward_split(blocks, f.resident(p.config), key_tiles);
  return p;
}

/// The backward's launch for a call of shape s (call_shape::of(args, dq)) on a device with facts f.
inline backward_plan plan_backward(const call_shape& s, const device_facts& f, const plan_options& o = {}) {
  detail::check_shape(s, "plan_backward");
  detail::check_forced(o, false, "plan_backward");
  backward_plan p;
  p.shape = s;
  p.order = o.order;
  const int group = s.group();
  if (o.config != kernel_config::count) {
    p.config = o.config;
  } else {
    const kernel_config dense = detail::pick(s.d, kernel_config::backward_hopper_d64, kernel_config::backward_hopper_d128);
    const kernel_config hopper =
        !s.dq_aligned16 ? detail::pick(s.d, kernel_config::backward_hopper_d64_unaligned,
                                       kernel_config::backward_hopper_d128_unaligned)
        : group > shape_of(dense).bm
            ? detail::pick(s.d, kernel_config::backward_hopper_d64_wide_group, kernel_config::backward_hopper_d128_wide_group)
            : dense;
    p.config = o.kernels == kernel_choice::automatic && f.runs(hopper) && s.page_size >= shape_of(hopper).bn
                   ? hopper
                   : detail::pick(s.d, kernel_config::backward_portable_d64, kernel_config::backward_portable_d128);
  }
  const tile_shape t = shape_of(p.config);
  OOMB_EXPECTS(t.d == s.d, "plan_backward: the forced configuration is for head_dim ", t.d, ", the call's is ", s.d);
  OOMB_EXPECTS(!t.hopper || s.page_size >= t.bn, "plan_backward (sm90): page_size must be >= ", t.bn, ", got ",
               s.page_size);
  OOMB_EXPECTS(!t.whole_queries || group <= t.bm, "plan_backward (sm90, TMA Q/dO): a step holds whole queries, so the group (",
               group, ") must be <= ", t.bm);
  const int tile_rows = t.hopper ? 128 : t.bm;  // the Hopper steps never straddle a sparse tile; the portable blocks are tiles
  OOMB_EXPECTS(!s.sparse || (std::int64_t(s.tile) * group) % tile_rows == 0, "plan_backward: sparse tile (", s.tile,
               " queries) times group (", group, ") must be a multiple of ", tile_rows, " rows");
  p.step_rows = t.whole_queries ? t.bm / group * group : t.bm;
  p.key_blocks = static_cast<int>(detail::ceil_div(std::int64_t(s.window_pages) * s.page_size, t.bn));
  p.ctas_per_head = p.key_blocks;
  if (t.hopper && s.sparse) {
    p.sparse = detail::make_sparse_backward_plan(s, p.key_blocks, t.bn, o.order != 3);
    p.ctas_per_head = p.sparse.ctas_per_head(p.key_blocks);
    if (o.order != 3 && p.sparse.own_kb > 0) {
      // a count and an order slot per past block, the number selected, and per page the bits of the
      // query tiles that select it
      const std::int64_t tile_words = (detail::ceil_div(s.sq, s.tile) + 31) >> 5;
      p.workspace_ints = 2 * std::int64_t(s.window_pages) * s.page_size / 128 + 1 + std::int64_t(s.window_pages) * tile_words;
    }
  }
  const int query_tiles = static_cast<int>(p.query_steps());
  if (o.deterministic) {
    // The kernel orders dQ by key block: dense, every step's contributors are a run of consecutive
    // blocks; sparse, the blocks of the tile's virtual sequence (sparse_dq_order), launched in window
    // order. Only the writer warp's configurations reduce a step from one thread group.
    OOMB_EXPECTS(t.hopper, "plan_backward (deterministic): needs the Hopper backward (an sm_90 GPU with sm_90a code and "
                 "pages of >= 128 tokens); the portable kernels add dQ in arbitrary order");
    OOMB_EXPECTS(s.dq_aligned16 && p.config != kernel_config::backward_hopper_d64_unaligned &&
                     p.config != kernel_config::backward_hopper_d128_unaligned,
                 "plan_backward (deterministic): dq must be 16-byte aligned (the unaligned kernel adds dQ from every thread)");
    OOMB_EXPECTS(p.config != kernel_config::backward_hopper_d64_wide_group,
                 "plan_backward (deterministic): a GQA group wider than 128 at head_dim 64 is not supported (its two "
                 "consumers add into the same dQ rows)");
    OOMB_EXPECTS(o.split <= 1, "plan_backward (deterministic): a query split adds dK/dV in arbitrary order; got split ",
                 o.split);
    p.deterministic = true;
    p.query_split = 1;
    if (s.sparse) {
      p.sparse = detail::make_sparse_backward_plan(s, p.key_blocks, t.bn, true);
      p.sparse.window_order = true;
      p.ctas_per_head = p.sparse.ctas_per_head(p.key_blocks);
      // The KV heads in turn: the CTAs that run together then hold a quarter of one head's blocks
      // each (28/4 heads), so fewer of them wait on each other's turns; at a 256K past (H100) 2.06x
      // the default's time against 2.90x one head after another (dense: slower, kept).
      if (o.order == 0) p.order = 2;
    }
    p.workspace_ints = std::int64_t(s.hkv) * (p.turn_steps() + p.piece_turns());
    return p;
  }
  if (o.split > 0)
    p.query_split = o.split;
  else if (s.bounded && t.hopper && !s.sparse)
    p.query_split = detail::bounded_backward_split(query_tiles);
  else
    p.query_split = detail::backward_split(p.key_blocks * s.hkv, f.resident(p.config), query_tiles);
  return p;
}

}  // namespace attention
OOMB_NAMESPACE_END
