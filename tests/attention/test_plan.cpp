// oomb tests — the attention plan (oomb/attention/plan.hpp) on the CPU: which kernel configuration a
// call gets on a device of given facts, the splits that fill the GPU's last wave, the sparse
// launch order and workspace, and the refusals. No GPU needed: the facts are written by hand.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include <oomb/attention/plan.hpp>

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
  // page-sparse: every block in window order, whole walks, no order kernel; each tile of 128
  // queries (896 rows) in steps of its own: 11 of 77 rows and one of 49
  auto sp = dense;
  sp.sparse = true;
  sp.tile = 128;
  const auto sparse = att::plan_backward(sp, f, o);
  CHECK(sparse.deterministic);
  CHECK(sparse.query_split == 1);
  CHECK(sparse.sparse.window_order);
  CHECK(sparse.ctas_per_head == sparse.key_blocks);
  CHECK(sparse.sparse.pieces == 1);
  CHECK(sparse.turn_steps() == 32 * 12);
  CHECK(sparse.workspace_ints == 4 * 32 * 12);
  for (int pos = 0; pos < sparse.ctas_per_head; pos += 97) {
    int piece = 7;
    CHECK(sparse.sparse.block_at(pos, piece) == pos);
    CHECK(piece == -1);
  }
  CHECK_FALSE(att::plan_backward(sp, f).sparse.window_order);
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
