// oomb tests — per-document bounds in the CPU attention reference (oomb/attention/reference.hpp):
// packed documents attend within themselves. Every case runs the paged, windowed reference (forward
// merged by log-sum-exp, backward summed over the windows) against a plain full-sequence attention
// over contiguous arrays with an explicit block-diagonal causal mask, in double, on fresh random
// inputs; documents start mid-page and mid-chunk.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <oomb/attention/reference.hpp>

namespace {

namespace ref = oomb::attention::reference;
constexpr double ninf = -std::numeric_limits<double>::infinity();

double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](double x, double y) {
           return std::memcmp(&x, &y, sizeof x) == 0;
         });
}

std::vector<double> normal(std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

/// One chunk of sq queries at q_start over the n = q_start + sq keys of a packed sequence, its
/// K/V both contiguous ([n][hkv][d], for the oracle) and in pages under scrambled ids (for the
/// reference), each page with a gradient page of its own scrambled id.
struct problem {
  std::int32_t hq, hkv, d, page, sq;
  std::int64_t q_start, n;
  std::vector<double> q, k, v, d_o;
  std::vector<std::int64_t> lower;  ///< [sq] the start of each query's document
  oomb::page_shape shape;
  std::vector<double> pool, gpool;
  std::vector<std::int32_t> ids, grad_of;  ///< logical page -> K/V id; K/V id -> gradient id
  std::int32_t pages = 0;

  problem(std::int32_t hq_, std::int32_t hkv_, std::int32_t d_, std::int32_t page_, std::int64_t q_start_,
          std::int32_t sq_, const std::vector<std::int64_t>& doc_starts, oomb::kv_layout layout, std::uint64_t seed)
      : hq(hq_), hkv(hkv_), d(d_), page(page_), sq(sq_), q_start(q_start_), n(q_start_ + sq_) {
    std::mt19937_64 rng(seed);
    q = normal(std::size_t(sq) * hq * d, rng);
    d_o = normal(q.size(), rng);
    k = normal(std::size_t(n) * hkv * d, rng);
    v = normal(k.size(), rng);
    for (std::int32_t i = 0; i < sq; ++i)
      lower.push_back(*(std::upper_bound(doc_starts.begin(), doc_starts.end(), q_start + i) - 1));
    shape = {page, hkv, d, layout};
    pages = static_cast<std::int32_t>((n + page - 1) / page);
    const std::int32_t capacity = pages + 2;
    std::vector<std::int32_t> perm(static_cast<std::size_t>(capacity)), gperm(perm.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::iota(gperm.begin(), gperm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::shuffle(gperm.begin(), gperm.end(), rng);
    ids.assign(perm.begin(), perm.begin() + pages);
    grad_of.assign(static_cast<std::size_t>(capacity), -1);
    // Unused ids hold NaN: a read of the wrong page shows.
    pool.assign(static_cast<std::size_t>(capacity) * shape.pair_elements(), std::numeric_limits<double>::quiet_NaN());
    gpool.assign(pool.size(), 0.0);
    const auto pv = oomb::page_pool_view<double>::over(pool.data(), shape);
    for (std::int32_t pg = 0; pg < pages; ++pg) {
      const std::int32_t id = ids[static_cast<std::size_t>(pg)];
      grad_of[static_cast<std::size_t>(id)] = gperm[static_cast<std::size_t>(pg)];
      for (std::int32_t t = 0; t < page && std::int64_t(pg) * page + t < n; ++t)
        for (std::int32_t g = 0; g < hkv; ++g)
          for (std::int32_t x = 0; x < d; ++x) {
            const std::size_t at = static_cast<std::size_t>(((std::int64_t(pg) * page + t) * hkv + g) * d + x);
            pv.k(id, t, g)[x] = k[at];
            pv.v(id, t, g)[x] = v[at];
          }
    }
  }

  /// Whether query i sees key j: causal within its document, and (sparse) a past key only on a
  /// page its tile selects.
  bool visible(std::int32_t i, std::int64_t j, const std::vector<std::vector<std::int32_t>>* tiles,
               std::int32_t tile) const {
    if (j > q_start + i || j < lower[static_cast<std::size_t>(i)]) return false;
    if (tiles == nullptr || j >= q_start) return true;
    const auto& sel = (*tiles)[static_cast<std::size_t>(i / tile)];
    return std::binary_search(sel.begin(), sel.end(), static_cast<std::int32_t>(j / page));
  }
};

struct result {
  std::vector<double> o, lse, dq, dk, dv;  ///< dk, dv: [n][hkv][d], every key of the sequence
};

/// The oracle: full-matrix softmax attention over the contiguous arrays under the mask, and its
/// backward written out (dS = P (dP - rowsum(dO O))).
result full_sequence(const problem& p, const std::vector<std::vector<std::int32_t>>* tiles = nullptr,
                     std::int32_t tile = 0) {
  const std::int32_t group = p.hq / p.hkv, d = p.d;
  const double scale = 1.0 / std::sqrt(double(d));
  result r;
  r.o.assign(p.q.size(), 0.0);
  r.lse.assign(std::size_t(p.hq) * p.sq, ninf);
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.k.size(), 0.0);
  auto dotp = [d](const double* a, const double* b) {
    double s = 0;
    for (std::int32_t x = 0; x < d; ++x) s += a[x] * b[x];
    return s;
  };
  for (std::int32_t i = 0; i < p.sq; ++i)
    for (std::int32_t h = 0; h < p.hq; ++h) {
      const std::int32_t g = h / group;
      const double* qh = p.q.data() + (std::size_t(i) * p.hq + h) * d;
      std::vector<double> s(static_cast<std::size_t>(p.n), ninf);
      double m = ninf;
      for (std::int64_t j = 0; j < p.n; ++j)
        if (p.visible(i, j, tiles, tile)) m = std::max(m, s[j] = scale * dotp(qh, p.k.data() + (j * p.hkv + g) * d));
      double sum = 0;
      for (std::int64_t j = 0; j < p.n; ++j) sum += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - m);
      const double lse = m + std::log(sum);
      r.lse[std::size_t(h) * p.sq + i] = lse;
      double* oh = r.o.data() + (std::size_t(i) * p.hq + h) * d;
      for (std::int64_t j = 0; j < p.n; ++j)
        if (!std::isinf(s[j]))
          for (std::int32_t x = 0; x < d; ++x) oh[x] += std::exp(s[j] - lse) * p.v[(j * p.hkv + g) * d + x];
      const double* doh = p.d_o.data() + (std::size_t(i) * p.hq + h) * d;
      const double delta = dotp(doh, oh);
      for (std::int64_t j = 0; j < p.n; ++j) {
        if (std::isinf(s[j])) continue;
        const std::size_t kr = static_cast<std::size_t>((j * p.hkv + g) * d);
        const double pr = std::exp(s[j] - lse), ds = pr * (dotp(doh, p.v.data() + kr) - delta);
        for (std::int32_t x = 0; x < d; ++x) {
          r.dq[(std::size_t(i) * p.hq + h) * d + x] += scale * ds * p.k[kr + x];
          r.dk[kr + x] += scale * ds * qh[x];
          r.dv[kr + x] += pr * doh[x];
        }
      }
    }
  return r;
}

/// A window over logical pages [first, first + count), with its own one-sequence CSR table.
struct window {
  std::int32_t first, count;
  std::vector<std::int32_t> indptr, indices, last, grads;
  window(const problem& p, std::int32_t first_page, std::int32_t pages) : first(first_page), count(pages) {
    indptr = {0, count};
    indices.assign(p.ids.begin() + first, p.ids.begin() + first + count);
    last = {static_cast<std::int32_t>(std::min<std::int64_t>(p.page, p.n - std::int64_t(first + count - 1) * p.page))};
    for (std::int32_t id : indices) grads.push_back(p.grad_of[static_cast<std::size_t>(id)]);
  }
  ref::attention_args<double, double> args(const problem& p, bool bounded) const {
    ref::attention_args<double, double> a;
    a.q = p.q.data();
    a.q_start = p.q_start;
    a.sq = p.sq;
    a.hq = p.hq;
    a.hkv = p.hkv;
    a.d = p.d;
    a.scale = 1.0 / std::sqrt(double(p.d));
    a.kv.pool = oomb::page_pool_view<const double>::over(p.pool.data(), p.shape);
    a.kv.table.indptr = indptr.data();
    a.kv.table.indices = indices.data();
    a.kv.table.last_page_len = last.data();
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = p.page;
    a.first_page = first;
    if (bounded) a.key_lower = p.lower.data();
    return a;
  }
};

/// Windows of at most `w` pages each over the whole sequence.
std::vector<window> windows_of(const problem& p, std::int32_t w) {
  std::vector<window> out;
  for (std::int32_t first = 0; first < p.pages; first += w) out.emplace_back(p, first, std::min(w, p.pages - first));
  return out;
}

/// A sparse selection in CSR, as the reference reads it.
struct selection {
  std::int32_t tile = 0;
  std::vector<std::vector<std::int32_t>> tiles;
  std::vector<std::int32_t> indptr{0}, pages;
  selection(std::int32_t t, std::vector<std::vector<std::int32_t>> per_tile) : tile(t), tiles(std::move(per_tile)) {
    for (const auto& s : tiles) {
      pages.insert(pages.end(), s.begin(), s.end());
      indptr.push_back(static_cast<std::int32_t>(pages.size()));
    }
    if (pages.empty()) pages.push_back(0);
  }
};

/// The reference over `ws`: forward merged by log-sum-exp, backward of each window given the global
/// (o, lse); dk, dv gathered back per key from the chunk's own rows and the gradient pages.
result paged(problem& p, const std::vector<window>& ws, bool bounded = true, const selection* sel = nullptr) {
  const std::int32_t d = p.d;
  result r;
  r.o.assign(p.q.size(), 0.0);
  r.lse.assign(std::size_t(p.hq) * p.sq, ninf);
  std::vector<double> o(r.o.size()), lse(r.lse.size());
  auto args = [&](const window& w) {
    auto a = w.args(p, bounded);
    if (sel) {
      a.tile_indptr = sel->indptr.data();
      a.tile_pages = sel->pages.data();
      a.tile = sel->tile;
    }
    return a;
  };
  for (const window& w : ws) {
    ref::attention_forward(args(w), o.data(), lse.data());
    ref::merge_partial(p.sq, p.hq, d, r.o.data(), r.lse.data(), o.data(), lse.data());
  }
  r.dq.assign(p.q.size(), 0.0);
  std::vector<double> dk_own(std::size_t(p.sq) * p.hkv * d, 0.0), dv_own(dk_own.size(), 0.0);
  std::fill(p.gpool.begin(), p.gpool.end(), 0.0);
  for (const window& w : ws) {
    oomb::window_grad_view<double> g;
    g.pool = oomb::page_pool_view<double>::over(p.gpool.data(), p.shape);
    g.grad_page = w.grads.data();
    g.pages = w.count;
    ref::attention_backward(args(w), r.o.data(), r.lse.data(), p.d_o.data(), r.dq.data(), dk_own.data(), dv_own.data(), g);
  }
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.k.size(), 0.0);
  const auto gv = oomb::page_pool_view<const double>::over(p.gpool.data(), p.shape);
  for (std::int64_t j = 0; j < p.n; ++j)
    for (std::int32_t h = 0; h < p.hkv; ++h)
      for (std::int32_t x = 0; x < d; ++x) {
        const std::size_t at = static_cast<std::size_t>((j * p.hkv + h) * d + x);
        if (j >= p.q_start) {
          const std::size_t own = static_cast<std::size_t>(((j - p.q_start) * p.hkv + h) * d + x);
          r.dk[at] = dk_own[own];
          r.dv[at] = dv_own[own];
        } else {
          const std::int32_t gid = p.grad_of[static_cast<std::size_t>(p.ids[static_cast<std::size_t>(j / p.page)])];
          r.dk[at] = gv.k(gid, static_cast<std::int32_t>(j % p.page), h)[x];
          r.dv[at] = gv.v(gid, static_cast<std::int32_t>(j % p.page), h)[x];
        }
      }
  return r;
}

void check_close(const result& got, const result& want) {
  CHECK(rel_err(got.o, want.o) <= 1e-13);
  CHECK(rel_err(got.lse, want.lse) <= 1e-13);
  CHECK(rel_err(got.dq, want.dq) <= 1e-12);
  CHECK(rel_err(got.dk, want.dk) <= 1e-12);
  CHECK(rel_err(got.dv, want.dv) <= 1e-12);
}

void check_same_bits(const result& a, const result& b) {
  CHECK(same_bits(a.o, b.o));
  CHECK(same_bits(a.lse, b.lse));
  CHECK(same_bits(a.dq, b.dq));
  CHECK(same_bits(a.dk, b.dk));
  CHECK(same_bits(a.dv, b.dv));
}

// A chunk of 40 queries at 48 (pages of 16: the past is pages 0-2, the chunk pages 3-5, the last
// partial): documents start at 0, mid-page 1 (21) and mid-page 2 (37) in the past, then mid-chunk
// at 51 (mid-page 3) and 69 (mid-page 4). So the chunk's first query belongs to the document from
// 37 and no row sees pages 0 and 1.
const std::vector<std::int64_t> starts{0, 21, 37, 51, 69};

}  // namespace

TEST_CASE("attention reference, documents: dense windows equal a block-diagonal causal full-sequence attention") {
  int cases = 0;
  for (auto layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major})
    for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{6, 1}}) {
      CAPTURE(hq);
      CAPTURE(hkv);
      problem p(hq, hkv, 8, 16, 48, 40, starts, layout, 100 + cases++);
      const result want = full_sequence(p);
      const result one = paged(p, windows_of(p, 6));
      check_close(one, want);
      for (std::int32_t w : {1, 2, 4}) {  // windows of 1 page cut every document; the merge and the sum put them together
        CAPTURE(w);
        check_close(paged(p, windows_of(p, w)), want);
      }
      // The bounds are real: without them the same call attends across documents.
      CHECK(rel_err(paged(p, windows_of(p, 6), /*bounded=*/false).o, want.o) > 1e-2);
      // Keys below a row's document get no gradient from it: nothing below 37 at all.
      for (std::size_t at = 0; at < std::size_t(37) * hkv * 8; ++at) CHECK(one.dk[at] == 0.0);
    }
}

TEST_CASE("attention reference, documents: pages below every row's bound are never read; rows that see nothing get -inf") {
  problem p(4, 2, 8, 16, 48, 40, starts, oomb::kv_layout::head_major, 7);
  const result want = full_sequence(p);
  // Pages 0 and 1 end at 32 <= key_lower[0] = 37: poison them and take their ids and gradient pages away.
  const auto pv = oomb::page_pool_view<double>::over(p.pool.data(), p.shape);
  for (std::int32_t pg : {0, 1}) {
    double* pair = pv.k(p.ids[static_cast<std::size_t>(pg)], 0, 0);
    std::fill(pair, pair + p.shape.pair_elements(), std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<window> ws = windows_of(p, 2);  // {0, 1}, {2, 3}, {4, 5}
  ws[0].indices = {-1, -1};
  ws[0].grads = {-1, -1};
  check_close(paged(p, ws), want);
  // That window alone: lse = -inf and o = 0 for every row; the backward adds nothing.
  std::vector<double> o(p.q.size(), 1.0), lse(std::size_t(p.hq) * p.sq, 0.0);
  ref::attention_forward(ws[0].args(p, true), o.data(), lse.data());
  CHECK(std::all_of(lse.begin(), lse.end(), [](double l) { return l == ninf; }));
  CHECK(std::all_of(o.begin(), o.end(), [](double x) { return x == 0.0; }));
  // Window {2, 3} for the rows of the documents from 51 and 69: page 2 is below them, page 3 holds
  // the keys 51.. they see; the rows of the document from 69 see none of page 3's keys before 64 ..
  ref::attention_forward(ws[1].args(p, true), o.data(), lse.data());
  for (std::int32_t i = 0; i < p.sq; ++i) {
    const bool sees = p.lower[static_cast<std::size_t>(i)] < 64;  // the window ends at 64
    CHECK((lse[static_cast<std::size_t>(i)] == ninf) == !sees);
  }
}

TEST_CASE("attention reference, documents: bounds of one document are no bounds, bit for bit; sparse all pages is dense") {
  problem one_doc(4, 2, 8, 16, 48, 40, {0}, oomb::kv_layout::head_major, 11);
  for (std::int32_t w : {1, 3, 6}) check_same_bits(paged(one_doc, windows_of(one_doc, w), true),
                                                   paged(one_doc, windows_of(one_doc, w), false));
  problem p(4, 2, 8, 16, 48, 40, starts, oomb::kv_layout::head_major, 12);
  const selection all(8, std::vector<std::vector<std::int32_t>>(5, {0, 1, 2}));
  for (std::int32_t w : {2, 6}) check_same_bits(paged(p, windows_of(p, w), true, &all), paged(p, windows_of(p, w), true));
}

TEST_CASE("attention reference, documents: sparse selections, including pages below a row's bound, equal the masked full sequence") {
  int cases = 0;
  for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{6, 1}}) {
    CAPTURE(hq);
    CAPTURE(hkv);
    // Past pages 0-2 (documents from 0, 21 and 37 in them), tiles of 8 over 40 queries: tile 0 holds
    // the document from 37 (rows 0-2) and the one from 51. Tile 0 selects pages 0 and 2 (page 0 is
    // below every row's bound), tile 1 page 1 only (below its rows' bound: nothing past), tile 2
    // nothing, tiles 3-4 everything.
    problem p(hq, hkv, 8, 16, 48, 40, starts, oomb::kv_layout::token_major, 300 + cases++);
    const selection sel(8, {{0, 2}, {1}, {}, {0, 1, 2}, {0, 1, 2}});
    const result want = full_sequence(p, &sel.tiles, sel.tile);
    for (std::int32_t w : {1, 2, 6}) {
      CAPTURE(w);
      check_close(paged(p, windows_of(p, w), true, &sel), want);
    }
    // The selection and the bounds both act: the same selection without bounds differs.
    CHECK(rel_err(paged(p, windows_of(p, 6), false, &sel).o, want.o) > 1e-2);
  }
}

TEST_CASE("attention reference, documents: bad bounds are named") {
  problem p(2, 1, 8, 16, 48, 40, starts, oomb::kv_layout::head_major, 21);
  const window w(p, 0, p.pages);
  std::vector<double> o(p.q.size()), lse(std::size_t(p.hq) * p.sq);
  auto a = w.args(p, true);
  std::vector<std::int64_t> bad = p.lower;
  a.key_lower = bad.data();
  bad[5] = 49 + 5;  // past the query's own position 53
  CHECK_THROWS_WITH_AS(ref::attention_forward(a, o.data(), lse.data()), doctest::Contains("key_lower[5] = 54"),
                       oomb::invalid_argument);
  bad = p.lower;
  bad[10] = 0;  // below key_lower[9]: bounds of packed documents never decrease
  CHECK_THROWS_WITH_AS(ref::attention_forward(a, o.data(), lse.data()), doctest::Contains("must not decrease"),
                       oomb::invalid_argument);
  bad = p.lower;
  bad[0] = -1;
  CHECK_THROWS_AS(ref::attention_forward(a, o.data(), lse.data()), oomb::invalid_argument);
}
