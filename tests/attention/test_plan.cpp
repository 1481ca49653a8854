// oomb tests — the attention plan (oomb/attention/plan.hpp) on the CPU: which kernel configuration a
// call gets on a device of given facts, the splits that fill the GPU's last wave, the sparse
// launch order and workspace, and the refusals; and the Hopper backward's host logic: fast_divmod,
// the query walk, the sparse launch plan's coverage and the deterministic sparse backward's dQ
// turns. No GPU needed: the facts are written by hand.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <oomb/attention/fast_divmod.hpp>
#include <oomb/attention/plan.hpp>
#include <oomb/attention/query_walk.hpp>

namespace {

namespace att = oomb::attention;
using K = att::kernel_config;

/// An H200 as device_facts_of reports it: 132 SMs, the portable kernels 2 (forward) or 1 (backward)
/// CTAs per SM, every Hopper kernel 1 (or none: hopper = false, another GPU or a build without sm_90a).
att::device_facts h200(bool hopper = true) {
  att::device_facts f;
  f.sm_count = 132;
  for (int i = 0; i < att::kernel_config_count; ++i) {
    const auto k = static_cast<K>(i);
    f.blocks_per_sm[i] = att::shape_of(k).hopper ? (hopper ? 1 : 0) : (att::is_forward(k) ? 2 : 1);
  }
  return f;
}

/// A chunk of sq queries at q_start against a window of `pages` pages from page 0.
att::call_shape call(int sq, std::int64_t q_start, int pages, int hq = 28, int hkv = 4, int d = 128, int page = 128) {
  att::call_shape s;
  s.sq = sq;
  s.q_start = q_start;
  s.hq = hq;
  s.hkv = hkv;
  s.d = d;
  s.page_size = page;
  s.window_pages = pages;
  return s;
}

}  // namespace

TEST_CASE("attention plan: the kernel configuration follows the call and the device") {
  const auto f = h200();
  const auto dense = call(4096, 65536, (65536 + 4096) / 128);
  CHECK(att::plan_forward(dense, f).config == K::forward_hopper_d128);
  CHECK(att::plan_backward(dense, f).config == K::backward_hopper_d128);
  CHECK(att::plan_forward(dense, f, {att::kernel_choice::portable}).config == K::forward_portable_d128);
  CHECK(att::plan_backward(dense, f, {att::kernel_choice::portable}).config == K::backward_portable_d128);
  CHECK(att::plan_forward(dense, h200(false)).config == K::forward_portable_d128);
  CHECK(att::plan_backward(dense, h200(false)).config == K::backward_portable_d128);
  auto d64 = call(4096, 65536, 544, 14, 2, 64);
  CHECK(att::plan_forward(d64, f).config == K::forward_hopper_d64);
  CHECK(att::plan_backward(d64, f).config == K::backward_hopper_d64);
  // pages shorter than the Hopper tiles' 128 keys: portable
  CHECK(att::plan_forward(call(512, 1024, 24, 28, 4, 128, 64), f).config == K::forward_portable_d128);
  CHECK(att::plan_backward(call(512, 1024, 24, 28, 4, 128, 64), f).config == K::backward_portable_d128);
  // the Hopper backward's three configurations: whole-query steps where the group fits (80 rows at
  // d128, 128 at d64), cp.async Q/dO for wider groups, red.add dQ for a dq that is not 16-byte aligned
  CHECK(att::plan_backward(call(256, 1024, 10, 80, 1), f).config == K::backward_hopper_d128);
  CHECK(att::plan_backward(call(256, 1024, 10, 81, 1), f).config == K::backward_hopper_d128_wide_group);
  CHECK(att::plan_backward(call(256, 1024, 10, 128, 1, 64), f).config == K::backward_hopper_d64);
  CHECK(att::plan_backward(call(256, 1024, 10, 129, 1, 64), f).config == K::backward_hopper_d64_wide_group);
  auto unaligned = dense;
  unaligned.dq_aligned16 = false;
  CHECK(att::plan_backward(unaligned, f).config == K::backward_hopper_d128_unaligned);
  // whole-query steps: floor(80 / 7) * 7 = 77 rows at group 7
  CHECK(att::plan_backward(dense, f).step_rows == 77);
  CHECK(att::plan_backward(unaligned, f).step_rows == 64);
}

TEST_CASE("attention plan: splits fill the last wave; forced splits are taken") {
  const auto f = h200();
  // Hopper forward, 28/4 heads at d128: 4096 * 7 / 128 = 224 row blocks per KV head, 896 CTAs on 132
  // SMs fill 97.0% of the last wave and 1792 no more: split 1.
  const auto dense = call(4096, 65536, 544);
  const auto fp = att::plan_forward(dense, f);
  CHECK(fp.row_blocks == 224);
  CHECK(fp.split == 1);
  // a short chunk: 7 row blocks x 4 heads = 28 CTAs on 132 SMs (21%) -> 56 (42%): split 2
  CHECK(att::plan_forward(call(128, 65536, 520), f).split == 2);
  // ... unless the window has under 16 key tiles
  CHECK(att::plan_forward(call(128, 1024, 9), f).split == 1);
  // portable forward (264 slots): long windows split 2, small grids 4, short windows 1
  const att::plan_options portable{att::kernel_choice::portable};
  CHECK(att::plan_forward(dense, f, portable).split == 2);
  CHECK(att::plan_forward(call(128, 65536, 520), f, portable).split == 4);
  CHECK(att::plan_forward(call(128, 256, 3), f, portable).split == 1);
  att::plan_options forced;
  forced.split = 3;
  CHECK(att::plan_forward(dense, f, forced).split == 3);
  CHECK(att::plan_backward(dense, f, forced).query_split == 3);
  // backward: 544 key blocks x 4 heads = 2176 CTAs on 132 SMs (99% of the last wave): no split
  const auto bp = att::plan_backward(dense, f);
  CHECK(bp.key_blocks == 544);
  CHECK(bp.ctas_per_head == 544);
  CHECK(bp.query_split == 1);
  CHECK(bp.workspace_ints == 0);  // dense: nothing to order
  // 40 key blocks x 4 = 160 CTAs (61%) -> 320 (81%) -> 480 (91%) -> 640 (97%): split 4
  CHECK(att::plan_backward(call(4096, 1024, 40), f).query_split == 4);
  // an empty window: nothing to launch
  CHECK(att::plan_backward(call(128, 0, 0), f).key_blocks == 0);
}

TEST_CASE("attention plan: sparse backward launch order and workspace") {
  const auto f = h200();
  auto s = call(4096, 262144, (262144 + 4096) / 128);
  s.sparse = true;
  s.tile = 128;
  const auto p = att::plan_backward(s, f);
  CHECK(p.config == K::backward_hopper_d128);
  CHECK(p.sparse.own_kb == 2048);  // the past blocks
  CHECK(p.sparse.own == 32);
  CHECK(p.sparse.pieces == 4);  // 32 tiles in pieces of 8
  CHECK(p.sparse.piece_tiles == 8);
  CHECK(p.sparse.ends == 16);  // the window's first and last 8 pages of 128 keys
  CHECK(p.ctas_per_head == (32 + 16) * 4 + (2080 - 32 - 16));
  // a count and an order slot per block, the number selected, one word of tile bits per page
  CHECK(p.workspace_ints == 2 * 2080 + 1 + 2080 * 1);
  att::plan_options hs1;
  hs1.order = 3;  // hs1's order: no pieces, no workspace
  const auto q = att::plan_backward(s, f, hs1);
  CHECK(q.sparse.pieces == 1);
  CHECK(q.ctas_per_head == 2080);
  CHECK(q.workspace_ints == 0);
  // portable kernels take sparse calls without a launch order
  const auto r = att::plan_backward(s, f, {att::kernel_choice::portable});
  CHECK(r.ctas_per_head == r.key_blocks);
  CHECK(r.workspace_ints == 0);
}

TEST_CASE("attention plan: bad shapes and forced options are refused") {
  const auto f = h200();
  auto s = call(4096, 65536, 544);
  auto bad = s;
  bad.d = 96;
  CHECK_THROWS_AS(att::plan_forward(bad, f), oomb::invalid_argument);
  bad = s;
  bad.hq = 30;  // not a multiple of hkv = 4
  CHECK_THROWS_AS(att::plan_backward(bad, f), oomb::invalid_argument);
  bad = s;
  bad.page_size = 96;
  CHECK_THROWS_AS(att::plan_forward(bad, f), oomb::invalid_argument);
  bad = s;
  bad.sparse = true;
  bad.tile = 0;
  CHECK_THROWS_AS(att::plan_backward(bad, f), oomb::invalid_argument);
  bad.tile = 16;  // 16 queries x group 7 = 112 rows: not a multiple of 128
  CHECK_THROWS_AS(att::plan_backward(bad, f), oomb::invalid_argument);
  att::plan_options o;
  o.split = 5;
  CHECK_THROWS_AS(att::plan_forward(s, f, o), oomb::invalid_argument);
  o = {};
  o.config = K::backward_hopper_d128;  // a backward configuration for a forward plan
  CHECK_THROWS_AS(att::plan_forward(s, f, o), oomb::invalid_argument);
  o.config = K::backward_hopper_d64;  // head_dim 64 for a d128 call
  CHECK_THROWS_AS(att::plan_backward(s, f, o), oomb::invalid_argument);
  o.config = K::backward_hopper_d128;  // whole-query steps for a group of 81
  CHECK_THROWS_AS(att::plan_backward(call(256, 1024, 10, 81, 1), f, o), oomb::invalid_argument);
}

TEST_CASE("attention plan: a call with per-document bounds has its own shape; the Hopper backward splits its walks most") {
  const auto f = h200();
  const std::vector<std::int64_t> lower(64, 0);
  att::attention_args a;
  a.sq = 64;
  a.hq = 28;
  a.hkv = 4;
  a.d = 128;
  a.kv.pool.page_size = 128;
  a.window_pages = 1;
  const att::call_shape plain = att::call_shape::of(a);
  a.key_lower = lower.data();
  const att::call_shape bounded = att::call_shape::of(a);
  CHECK_FALSE(plain.bounded);
  CHECK(bounded.bounded);
  CHECK(plain != bounded);  // a plan made without bounds does not launch a call with them
  // The kernels skip and mask by the bounds inside the same grid: configuration, split and grid match.
  const att::forward_plan fp = att::plan_forward(plain, f), fb = att::plan_forward(bounded, f);
  CHECK(fb.config == fp.config);
  CHECK(fb.split == fp.split);
  CHECK(fb.row_blocks == fp.row_blocks);
  const att::backward_plan bp = att::plan_backward(plain, f), bb = att::plan_backward(bounded, f);
  CHECK(bb.config == bp.config);
  CHECK(bb.key_blocks == bp.key_blocks);
  CHECK(bb.shape == bounded);
  // Walks that end at their document differ in length, so the dense Hopper backward takes the largest
  // split that keeps two query tiles per CTA (the wave rule assumes equal walks): 64 queries x 7 heads
  // are 6 steps of 77 rows (11 whole queries), so split 3.
  CHECK(bp.query_split == att::detail::backward_split(bp.key_blocks * 4, f.resident(bp.config), 6));
  CHECK(bb.query_split == 3);
  CHECK(att::detail::bounded_backward_split(1) == 1);
  CHECK(att::detail::bounded_backward_split(3) == 1);
  CHECK(att::detail::bounded_backward_split(4) == 2);
  CHECK(att::detail::bounded_backward_split(7) == 3);
  CHECK(att::detail::bounded_backward_split(8) == 4);
  CHECK(att::detail::bounded_backward_split(224) == 4);
  // A long chunk of a long window: the wave rule takes 1 or 2, the bounded call 4.
  a.sq = 4096;
  a.q_start = 65536;
  a.window_pages = 544;
  const std::vector<std::int64_t> lower_long(4096, 0);
  a.key_lower = lower_long.data();
  const att::backward_plan long_bounded = att::plan_backward(att::call_shape::of(a), f);
  CHECK(long_bounded.query_split == 4);
  // Forced splits, the portable kernels and sparse calls keep their own rules.
  att::plan_options forced;
  forced.split = 2;
  CHECK(att::plan_backward(att::call_shape::of(a), f, forced).query_split == 2);
  att::plan_options portable;
  portable.kernels = att::kernel_choice::portable;
  const att::call_shape long_shape = att::call_shape::of(a);
  a.key_lower = nullptr;
  CHECK(att::plan_backward(long_shape, f, portable).query_split ==
        att::plan_backward(att::call_shape::of(a), f, portable).query_split);
}

TEST_CASE("attention plan: a deterministic backward takes no query split and a dQ turn per KV head and step") {
  const auto f = h200();
  att::plan_options o;
  o.deterministic = true;
  // 4,096 queries at group 7 in steps of 77 rows (d128: 80-row steps of whole queries): 373 steps
  const auto dense = call(4096, 65536, (65536 + 4096) / 128);
  const auto plan = att::plan_backward(dense, f, o);
  CHECK(plan.deterministic);
  CHECK(plan.config == K::backward_hopper_d128);
  CHECK(plan.query_split == 1);
  CHECK(plan.step_rows == 77);
  CHECK(plan.query_steps() == (4096 * 7 + 76) / 77);
  CHECK(plan.workspace_ints == 4 * plan.query_steps());
  // the default on the same call splits to fill the wave; with bounds it splits 4 ways
  auto bounded = dense;
  bounded.bounded = true;
  CHECK(att::plan_backward(bounded, f).query_split == 4);
  CHECK(att::plan_backward(bounded, f, o).query_split == 1);
  CHECK(!att::plan_backward(dense, f).deterministic);
  // d64: steps of 128 rows at group 7 hold 18 queries
  const auto d64 = att::plan_backward(call(1000, 4096, 40, 14, 2, 64), f, o);
  CHECK(d64.config == K::backward_hopper_d64);
  CHECK(d64.step_rows == 126);
  CHECK(d64.workspace_ints == 2 * ((1000 * 7 + 125) / 126));
  // page-sparse: every block in window order, no order kernel; the blocks the default cuts (the 32
  // own ones, the window's first 8 and its past's last 8) in 4 pieces of 8 tiles, one after another;
  // each tile of 128 queries (896 rows) in steps of its own: 11 of 77 rows and one of 49; after the
  // dQ turns a piece turn per cut block
  auto sp = dense;
  sp.sparse = true;
  sp.tile = 128;
  const auto sparse = att::plan_backward(sp, f, o);
  CHECK(sparse.deterministic);
  CHECK(sparse.query_split == 1);
  CHECK(sparse.sparse.window_order);
  CHECK(sparse.order == 2);  // the KV heads in turn
  CHECK(plan.order == 0);    // dense: one KV head after another
  auto asked = o;
  asked.order = 1;
  CHECK(att::plan_backward(sp, f, asked).order == 1);
  CHECK(sparse.sparse.pieces == 4);
  CHECK(sparse.sparse.piece_tiles == 8);
  CHECK(sparse.sparse.own == 32);
  CHECK(sparse.sparse.ends == 16);
  CHECK(sparse.ctas_per_head == 48 * 4 + (544 - 48));
  CHECK(sparse.turn_steps() == 32 * 12);
  CHECK(sparse.piece_turns() == 48);
  CHECK(sparse.workspace_ints == 4 * (32 * 12 + 48));
  std::vector<std::pair<int, int>> launched;  // (block, piece) in launch order
  for (int pos = 0; pos < sparse.ctas_per_head; ++pos) {
    int piece = 7;
    const int kb = sparse.sparse.block_at(pos, piece);
    launched.emplace_back(kb, piece);
    const bool cut = kb < 8 || kb >= 504;
    CHECK(sparse.sparse.cut_index(kb) == (cut ? (kb < 8 ? kb : kb - 496) : -1));
    CHECK((piece >= 0) == cut);
  }
  CHECK(std::is_sorted(launched.begin(), launched.end()));
  CHECK(launched.front() == std::pair<int, int>(0, 0));
  CHECK(launched[32] == std::pair<int, int>(8, -1));
  CHECK(launched.back() == std::pair<int, int>(543, 3));
  CHECK_FALSE(att::plan_backward(sp, f).sparse.window_order);
  CHECK(att::plan_backward(sp, f).piece_turns() == 0);
  // what it cannot order is refused: the portable kernels (another GPU, short pages, or asked for),
  // an 8-byte aligned dq, a forced query split, the d64 wide-group kernel
  CHECK_THROWS_AS(att::plan_backward(dense, h200(false), o), oomb::invalid_argument);
  CHECK_THROWS_AS(att::plan_backward(call(512, 1024, 24, 28, 4, 128, 64), f, o), oomb::invalid_argument);
  auto unaligned = dense;
  unaligned.dq_aligned16 = false;
  CHECK_THROWS_AS(att::plan_backward(unaligned, f, o), oomb::invalid_argument);
  auto split = o;
  split.split = 2;
  CHECK_THROWS_AS(att::plan_backward(dense, f, split), oomb::invalid_argument);
  split.split = 1;
  CHECK(att::plan_backward(dense, f, split).query_split == 1);
  CHECK_THROWS_AS(att::plan_backward(call(2, 0, 1, 160, 1, 64), f, o), oomb::invalid_argument);
  auto portable = o;
  portable.kernels = att::kernel_choice::portable;
  CHECK_THROWS_AS(att::plan_backward(dense, f, portable), oomb::invalid_argument);
}

TEST_CASE("attention plan: the deterministic sparse backward's dQ turns count the contributors below each block") {
  // sparse_dq_order against a count by hand: over random windows (first page, own pages, pages of
  // one or two key blocks), tile lists (sorted, some pages before the window, some of the window's
  // past not selected) and first bounds, block kb's turn in a step is the number of key blocks below
  // kb that the step's tile attends (a selected past page or an own page) from the bound's block on.
  std::mt19937 rng(35);
  int checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int first_page = static_cast<int>(rng() % 20), pages = 1 + static_cast<int>(rng() % 40);
    const int own_page = static_cast<int>(rng() % (pages + 1));  // == pages: a window of the past only
    const int bpp = 1 + static_cast<int>(rng() % 2);
    // logical pages before the window and of its past; past the window too when it holds no own page
    // (a window of an earlier part of the past: its tiles select later windows' pages as well)
    std::vector<std::int32_t> list;
    for (int pg = 0; pg < first_page + own_page + (own_page == pages ? 10 : 0); ++pg)
      if (rng() % 3 == 0) list.push_back(pg);
    const auto below = [&](std::int64_t y) {
      return static_cast<int>(std::lower_bound(list.begin(), list.end(), y) - list.begin());
    };
    const att::sparse_dq_order order{first_page, own_page, bpp};
    const auto attended = [&](int w) {  // window page w
      return w >= own_page || std::binary_search(list.begin(), list.end(), first_page + w);
    };
    const int blocks = pages * bpp;
    const int lo = static_cast<int>(rng() % blocks);
    int count = 0;  // contributors below kb, counted as kb grows
    for (int kb = lo; kb < blocks; ++kb) {
      if (!attended(kb / bpp)) continue;
      const int turn = order.turn(kb, lo, order.pages_below(below, kb / bpp), order.pages_below(below, lo / bpp),
                                  order.attends(below, lo / bpp));
      INFO("trial " << trial << ": first page " << first_page << ", pages " << pages << ", own page " << own_page
                    << ", blocks per page " << bpp << ", lo " << lo << ", kb " << kb);
      CHECK(turn == count);
      ++count;
      ++checked;
    }
  }
  CHECK(checked > 10000);
}

TEST_CASE("attention: fast_divmod is exact") {
  for (std::uint32_t d = 1; d <= 200; ++d) {
    const att::detail::fast_divmod f(d);
    bool ok = true;
    for (std::uint32_t n = 0; n < 100000; ++n) ok = ok && f.div(n) == n / d;
    for (std::uint32_t n : {0x7fffffffu, 0x7ffffffeu, 0x40000000u, 123456789u}) ok = ok && f.div(n) == n / d;
    INFO("d = ", d);
    CHECK(ok);
  }
}

TEST_CASE("attention: the Hopper backward's query walk covers the selected tiles' rows once, no others") {
  // query_walk (query_walk.hpp), run on the host: over random selections (1..100 tiles, so one to
  // four words of bits), GQA groups, step heights (whole-query steps that do not divide a tile, as
  // hb6's 77 of 80 rows at group 7, and 64/80/128-row cp.async steps), first rows and query splits,
  // the steps of all split CTAs together must hold every row of a selected tile from the first row on
  // exactly once and never a row of an unselected tile (so no step straddles one), each step at most
  // rs rows, starting on a whole query where rs is whole queries. Dense: every row from the first on.
  // tile_steps (deterministic sparse calls): besides, each step lies in one tile and starts k * rs
  // rows after the tile's first, so that all blocks cut a tile into the same steps.
  std::mt19937 rng(12);
  int walks = 0;
  bool ok = true;
  for (int trial = 0; trial < 3000 && ok; ++trial) {
    const int group = std::array<int, 5>{1, 2, 5, 7, 8}[trial % 5];
    const int tile = 128 * (1 + static_cast<int>(rng() % 2)) / std::gcd(128, group);  // tile * group: a multiple of 128
    const int ntiles = 1 + static_cast<int>(rng() % 100);
    const int sq = (ntiles - 1) * tile + 1 + static_cast<int>(rng() % tile);
    const int rows = sq * group, tile_rows = tile * group;
    const int bm = std::array<int, 3>{64, 80, 128}[rng() % 3];
    const bool whole = rng() % 2 == 0 && group <= bm;
    const int rs = whole ? bm / group * group : bm;
    const bool dense = trial % 7 == 0;
    const double keep = std::array<double, 3>{0.1, 0.5, 0.9}[rng() % 3];
    std::vector<std::uint32_t> sel(4, 0u);  // up to 128 tiles
    std::vector<char> on(static_cast<std::size_t>(ntiles));
    for (int t = 0; t < ntiles; ++t) {
      on[static_cast<std::size_t>(t)] = dense || std::uniform_real_distribution<double>(0, 1)(rng) < keep;
      if (on[static_cast<std::size_t>(t)]) sel[static_cast<std::size_t>(t >> 5)] |= 1u << (t & 31);
    }
    const int first_row = static_cast<int>(rng() % static_cast<std::uint32_t>(rows));
    const int split = 1 + static_cast<int>(rng() % 4);
    const bool tile_steps = !dense && rng() % 2 == 0;
    const att::detail::fast_divmod tile_div(static_cast<std::uint32_t>(tile_rows));
    std::vector<int> seen(static_cast<std::size_t>(rows), 0);
    for (int z = 0; z < split; ++z)
      for (att::detail::query_walk wk(dense ? nullptr : sel.data(), ntiles, tile_rows, tile_div, rows, rs, first_row, z,
                                      split, tile_steps);
           !wk.done(); wk.next()) {
        const int r0 = wk.r0, r1 = wk.r1();
        ok = ok && r0 < r1 && r1 - r0 <= rs && r1 <= rows && (!whole || r0 % group == 0);
        ok = ok && (!tile_steps || ((r0 % tile_rows) % rs == 0 && (r1 - 1) / tile_rows == r0 / tile_rows));
        for (int r = r0; ok && r < r1; ++r) {
          ++seen[static_cast<std::size_t>(r)];
          ok = on[static_cast<std::size_t>(r / tile_rows)] != 0;
        }
        ++walks;
      }
    for (int r = 0; ok && r < rows; ++r) {  // (rows of unselected tiles were refused above)
      const int n = seen[static_cast<std::size_t>(r)];
      // rows before first_row may ride along in its step (the causal mask zeroes them): at most once
      ok = r >= first_row && on[static_cast<std::size_t>(r / tile_rows)] ? n == 1 : n <= 1;
    }
    INFO("trial ", trial, ": group ", group, ", tile ", tile, ", tiles ", ntiles, ", rs ", rs, ", first row ", first_row,
         ", split ", split, dense ? ", dense" : "", tile_steps ? ", tile steps" : "");
    CHECK(ok);
  }
  CHECK(walks > 10000);
}

TEST_CASE("attention: the Hopper backward's sparse launch plan takes every block once, a cut one in pieces") {
  // make_sparse_backward_plan and sparse_backward_plan (plan.hpp), on the host, over windows of 1..300
  // blocks of 128 keys (pages of 128 and 256 keys) with none to all of them the chunk's own, 1..80 query
  // tiles: the launch positions of a KV head take every block of the window; an own block and the first
  // `ends` past blocks of the alternation (the window's first ceil(ends / 2) and last floor(ends / 2)
  // past blocks: sink and local pages) in `pieces` positions, one per piece, any other block in one
  // with the whole walk; and a cut block's pieces, each walking its rows (piece_rows) of a random
  // selection, hold every selected row from the block's first row on exactly once.
  std::mt19937 rng(21);
  int cut_blocks = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int ps = trial % 2 == 0 ? 128 : 256, group = std::array<int, 3>{1, 4, 7}[trial % 3];
    const int window_pages = 1 + static_cast<int>(rng() % (300 * 128 / ps));
    const int own_pages = static_cast<int>(rng() % static_cast<std::uint32_t>(window_pages + 1));
    att::call_shape a;
    a.page_size = ps;
    a.first_page = static_cast<int>(rng() % 5);
    a.window_pages = window_pages;
    a.q_start = std::int64_t(a.first_page + window_pages - own_pages) * ps;
    a.sparse = true;
    a.tile = 128;
    a.sq = 1 + static_cast<int>(rng() % (80 * 128));
    const int key_blocks = window_pages * ps / 128;
    // odd trials: the deterministic plan's window order, which cuts the same blocks and launches
    // each block's pieces one after another, the blocks in window order
    auto plan = att::detail::make_sparse_backward_plan(a, key_blocks, 128, trial % 11 != 0);
    plan.window_order = trial % 2 == 1;
    const int tiles = (a.sq + a.tile - 1) / a.tile, npast = key_blocks - plan.own;
    INFO("trial ", trial, ": page ", ps, ", blocks ", key_blocks, ", own ", plan.own, ", tiles ", tiles, ", pieces ",
         plan.pieces, " of ", plan.piece_tiles, " tiles, ends ", plan.ends);
    REQUIRE(plan.own_kb == npast);
    REQUIRE(plan.own == own_pages * ps / 128);
    REQUIRE((plan.pieces == 1 || plan.pieces * plan.piece_tiles >= tiles));
    REQUIRE((plan.pieces == 1 || (plan.pieces - 1) * plan.piece_tiles < tiles));  // a past block's pieces all hold tiles
    std::vector<std::vector<int>> pieces_of(static_cast<std::size_t>(key_blocks));
    std::vector<std::pair<int, int>> launched;
    bool ok = true;
    for (int o = 0; o < plan.ctas_per_head(key_blocks) && ok; ++o) {
      int piece = 0;
      const int kb = plan.block_at(o, piece);
      ok = kb >= 0 && kb < key_blocks;
      if (ok) pieces_of[static_cast<std::size_t>(kb)].push_back(piece);
      launched.emplace_back(kb, piece);
    }
    REQUIRE(ok);
    if (plan.window_order) CHECK(std::is_sorted(launched.begin(), launched.end()));
    int bad = -1;  // the first block that fails
    for (int kb = 0; kb < key_blocks && ok; ++kb) {
      bad = kb;
      const bool cut = plan.pieces > 1 && (kb >= npast || kb < (plan.ends + 1) / 2 || kb >= npast - plan.ends / 2);
      const int index = plan.cut_index(kb);  // the cut blocks numbered in window order
      ok = cut ? index == (kb < (plan.ends + 1) / 2 ? kb : kb - npast + plan.ends) : index == -1;
      auto got = pieces_of[static_cast<std::size_t>(kb)];
      std::sort(got.begin(), got.end());
      std::vector<int> want(1, -1);
      if (cut) {
        want.resize(static_cast<std::size_t>(plan.pieces));
        std::iota(want.begin(), want.end(), 0);
      }
      ok = ok && got == want;
      if (!cut || !ok) continue;
      // the pieces' walks of a random selection, steps of 77 rows (hb6's whole queries at group 7)
      ++cut_blocks;
      const int tile_rows = a.tile * group, rows = a.sq * group, rs = 128 / group * group;
      const int first_row = kb >= npast ? std::min(rows - 1, (kb - npast) * 128 * group) : 0;
      std::vector<std::uint32_t> sel(128, 0u);
      for (int t = 0; t < tiles; ++t)
        if (kb >= npast || rng() % 2 == 0) sel[static_cast<std::size_t>(t >> 5)] |= 1u << (t & 31);
      std::vector<int> seen(static_cast<std::size_t>(rows), 0);
      for (int piece = 0; piece < plan.pieces; ++piece) {
        int begin = 0, end = 0;
        plan.piece_rows(piece, tile_rows, first_row / tile_rows, first_row, rows, begin, end);
        if (begin >= end) continue;
        for (att::detail::query_walk wk(sel.data(), tiles, tile_rows,
                                        att::detail::fast_divmod(static_cast<std::uint32_t>(tile_rows)), end, rs, begin, 0, 1);
             !wk.done(); wk.next())
          for (int r = wk.r0; r < wk.r1(); ++r) ++seen[static_cast<std::size_t>(r)];
      }
      for (int r = 0; r < rows; ++r) {
        const bool on = (sel[static_cast<std::size_t>(r / tile_rows >> 5)] >> (r / tile_rows & 31)) & 1u;
        const int n = seen[static_cast<std::size_t>(r)];
        ok = ok && (r >= first_row && on ? n == 1 : n <= 1 && (on || n == 0));
      }
    }
    INFO("block ", bad);
    CHECK(ok);
  }
  CHECK(cut_blocks > 1000);
}

TEST_CASE("attention: the deterministic sparse backward gives each step's blocks the turns 0, 1, 2, ... in key block order") {
  // The whole protocol on the host, as the kernel runs it: for random page-sparse calls (GQA groups,
  // whole-query steps that do not divide a tile, pages of one or two key blocks, windows that start
  // past page 0, documents or none, cut blocks or none), every CTA of the window-order launch walks
  // the rows the kernel gives it (causal start, the reach of its documents, its piece, its page's
  // tiles) in tile steps (query_walk), and takes at each step the turn sparse_dq_order gives it.
  // Each step's counter must then see the turns 0 .. n-1 exactly once, rising with the block: no
  // block waits for a turn nobody takes (a hang), none shares one (an unordered sum), and the order
  // is the blocks'. Likewise the pieces of a cut block that walk any step count the lower ones that
  // do (their dK/dV piece turn) as 0 .. n-1 in piece order. Counters stay inside tiles x steps per
  // tile, the count backward_plan::turn_steps() gives the workspace (the plan's own test checks
  // turn_steps() against a hand count for the plan's step rows).
  std::mt19937 rng(77);
  constexpr int BN = 128;
  int steps_checked = 0, pieces_checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int group = std::array<int, 5>{1, 2, 4, 5, 7}[trial % 5];
    const int tile = 128 / std::gcd(128, group) * (1 + static_cast<int>(rng() % 2));
    const int rs = std::array<int, 2>{80, 128}[rng() % 2] / group * group;  // whole-query steps
    const int bpp = 1 + static_cast<int>(rng() % 2), page = bpp * BN;
    const int first_page = static_cast<int>(rng() % 4);
    const int sq = 1 + static_cast<int>(rng() % (6 * tile));
    const int own_pages = (sq + page - 1) / page;
    const int past_pages = static_cast<int>(rng() % 24);
    const int pages = past_pages + own_pages;
    const std::int64_t q_start = std::int64_t(first_page + past_pages) * page, pos0 = std::int64_t(first_page) * page;
    const int ntiles = (sq + tile - 1) / tile, rows = sq * group, tile_rows = tile * group;
    // each tile's sorted list: random past pages, some before the window
    std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(ntiles));
    for (auto& l : lists)
      for (int pg = 0; pg < first_page + past_pages; ++pg)
        if (rng() % 3 == 0) l.push_back(pg);
    // documents: non-decreasing starts, each at most its own position
    std::vector<std::int64_t> lower(static_cast<std::size_t>(sq), 0);
    if (trial % 3 == 0) {
      std::int64_t start = 0;
      for (int i = 0; i < sq; ++i) {
        if (rng() % 97 == 0) start = q_start + i - static_cast<std::int64_t>(rng() % 300);
        start = std::max<std::int64_t>(start, lower[static_cast<std::size_t>(std::max(i - 1, 0))]);
        lower[static_cast<std::size_t>(i)] = std::min<std::int64_t>(start, q_start + i);
      }
    }
    const att::sparse_dq_order order{first_page, past_pages, bpp};
    const att::detail::fast_divmod tile_div(static_cast<std::uint32_t>(tile_rows));
    const int spt = (tile_rows + rs - 1) / rs;
    // the launch: window order, the own blocks and `ends` past blocks at the window's two ends cut
    // into pieces of piece_tiles tiles (none in a third of the trials)
    att::sparse_backward_plan plan;
    plan.window_order = true;
    plan.own_kb = past_pages * bpp;
    plan.own = own_pages * bpp;
    if (trial % 3 != 1 && ntiles > 1) {
      plan.pieces = 2 + static_cast<int>(rng() % 2);
      plan.piece_tiles = (ntiles + plan.pieces - 1) / plan.pieces;
      plan.ends = std::min(plan.own_kb, static_cast<int>(rng() % 5));
    }
    std::vector<std::vector<std::pair<int, int>>> turns(static_cast<std::size_t>(ntiles * spt));  // (block, turn)
    std::vector<std::vector<std::pair<int, int>>> piece_turns(static_cast<std::size_t>(pages * bpp));  // (piece, lower)
    bool inside = true;
    for (int o = 0; o < plan.ctas_per_head(pages * bpp); ++o) {
      int piece = -1;
      const int kb = plan.block_at(o, piece);
      const std::int64_t kmin = pos0 + std::int64_t(kb) * BN, first_q = kmin - q_start;
      if (first_q >= sq) continue;
      const int first_row = static_cast<int>(std::max<std::int64_t>(first_q, 0)) * group, first_tile = first_row / tile_rows;
      int reach = 0;  // the first query whose document starts after the block's last key
      while (reach < sq && lower[static_cast<std::size_t>(reach)] <= kmin + BN - 1) ++reach;
      const int block_rows = std::min(rows, reach * group);
      int row_begin, row_end;
      plan.piece_rows(piece, tile_rows, first_tile, first_row, block_rows, row_begin, row_end);
      if (row_begin >= row_end) continue;
      const int page_j = kb / bpp;
      const bool past = page_j < past_pages;
      // a piece's selection bits reach back to its block's first tile, as in the kernel
      const int ta = (piece >= 0 ? first_row : row_begin) / tile_rows, tb = (row_end - 1) / tile_rows + 1;
      std::vector<std::uint32_t> sel(4, 0u);
      for (int t = ta; t < tb; ++t) {
        const auto& l = lists[static_cast<std::size_t>(t)];
        if (!past || std::binary_search(l.begin(), l.end(), first_page + page_j))
          sel[static_cast<std::size_t>(t >> 5)] |= 1u << (t & 31);
      }
      if (piece >= 0 && !att::detail::query_walk(sel.data(), ntiles, tile_rows, tile_div, row_end, rs, row_begin, 0, 1, true)
                             .done()) {
        int below = 0;  // the kernel's count of the lower pieces that walk
        for (int z = 0; z < piece; ++z) {
          int b, e;
          plan.piece_rows(z, tile_rows, first_tile, first_row, block_rows, b, e);
          below += b < e && !att::detail::query_walk(sel.data(), ntiles, tile_rows, tile_div, e, rs, b, 0, 1, true).done();
        }
        piece_turns[static_cast<std::size_t>(kb)].emplace_back(piece, below);
      }
      for (att::detail::query_walk wk(sel.data(), ntiles, tile_rows, tile_div, row_end, rs, row_begin, 0, 1, true);
           !wk.done(); wk.next()) {
        const int r0 = wk.r0, qa = r0 / group, t = r0 / tile_rows;
        const std::int64_t first_key = lower[static_cast<std::size_t>(qa)] - pos0;
        const int lo = first_key > 0 ? static_cast<int>(first_key / BN) : 0;
        const auto& l = lists[static_cast<std::size_t>(t)];
        const auto below = [&](std::int64_t y) {
          return static_cast<int>(std::lower_bound(l.begin(), l.end(), y) - l.begin());
        };
        const int counter = t * spt + (r0 - t * tile_rows) / rs;
        inside = inside && counter < ntiles * spt;
        turns[static_cast<std::size_t>(counter)].emplace_back(
            kb, order.turn(kb, lo, order.pages_below(below, page_j), order.pages_below(below, lo / bpp),
                           order.attends(below, lo / bpp)));
      }
    }
    INFO("trial " << trial << ": group " << group << ", tile " << tile << ", rs " << rs << ", blocks per page " << bpp
                  << ", first page " << first_page << ", past pages " << past_pages << ", sq " << sq
                  << (trial % 3 == 0 ? ", documents" : "") << ", pieces " << plan.pieces << ", ends " << plan.ends);
    CHECK(inside);
    // the pieces of a block that walk take the piece turns 0, 1, 2, ... in piece order (launch order)
    for (std::size_t kb = 0; kb < piece_turns.size(); ++kb) {
      const auto& v = piece_turns[kb];
      bool ok = true;
      for (std::size_t i = 0; i < v.size(); ++i) ok = ok && v[i].second == static_cast<int>(i) && (i == 0 || v[i - 1].first < v[i].first);
      INFO("block " << kb << ": " << v.size() << " pieces walk");
      CHECK(ok);
      pieces_checked += v.size() > 1;
    }
    for (std::size_t s = 0; s < turns.size(); ++s) {
      auto& v = turns[s];
      std::sort(v.begin(), v.end());
      bool ok = true;
      for (std::size_t i = 0; i < v.size(); ++i) ok = ok && v[i].second == static_cast<int>(i);
      INFO("step counter " << s << " of " << v.size() << " blocks");
      CHECK(ok);
      steps_checked += !v.empty();
    }
  }
  CHECK(steps_checked > 5000);
  CHECK(pieces_checked > 300);
}
