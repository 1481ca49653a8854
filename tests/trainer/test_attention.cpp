// The CPU attention reference (include/oomb/attention/reference.hpp): forward against a naive
// masked softmax, backward against finite differences in double, windows that partition the keys,
// GQA ratios, page-sparse tiles, bf16 pages.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "test_util.hpp"
#include <oomb/attention/reference.hpp>

namespace {

using oomb::attention::reference::attention_args;
using trainer_test::rel_err;

/// A sequence's K/V in a pool whose page ids are scrambled, plus a gradient pool with its own
/// (also scrambled) ids, as the paged cache and gradient mirror would hold them.
template <class E>
struct paged_sequence {
  oomb::page_shape shape;
  std::int32_t n = 0;                 // tokens
  std::vector<E> pool;                // K/V pairs
  std::vector<std::int32_t> ids;      // logical page -> KV id
  std::vector<double> gpool;          // gradient pairs
  std::vector<std::int32_t> grad_id;  // KV id -> gradient id (-1: none): windows take theirs per entry

  paged_sequence(std::int32_t tokens, std::int32_t hkv, std::int32_t d, std::int32_t page,
                 oomb::kv_layout layout, std::uint64_t seed)
      : n(tokens) {
    shape = {page, hkv, d, layout};
    const std::int32_t pages = (tokens + page - 1) / page;
    const std::int32_t capacity = pages + 3;
    // Distinct, scrambled ids for the KV pages and (independently) their gradient pages.
    std::vector<std::int32_t> perm(static_cast<std::size_t>(capacity)), gperm(perm.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::iota(gperm.begin(), gperm.end(), 0);
    std::mt19937_64 rng(seed + 1000);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::shuffle(gperm.begin(), gperm.end(), rng);
    ids.assign(perm.begin(), perm.begin() + pages);
    const auto vals = trainer_test::random_vector<double>(static_cast<std::size_t>(capacity * shape.pair_elements()), seed);
    pool.resize(vals.size());
    for (std::size_t i = 0; i < vals.size(); ++i) pool[i] = oomb::fixed_order::store<E>(vals[i]);
    gpool.assign(static_cast<std::size_t>(capacity * shape.pair_elements()), 0.0);
    grad_id.assign(static_cast<std::size_t>(capacity), -1);
    for (std::int32_t i = 0; i < pages; ++i)
      grad_id[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])] = gperm[static_cast<std::size_t>(i)];
  }

  std::int32_t last_len(std::int32_t page_end) const {
    return std::min(shape.page_size, n - (page_end - 1) * shape.page_size);
  }
  oomb::page_pool_view<const E> pool_view() const { return oomb::page_pool_view<const E>::over(pool.data(), shape); }
  oomb::page_pool_view<E> pool_view_mut() { return oomb::page_pool_view<E>::over(pool.data(), shape); }
  /// The gradient pages of the window over logical pages [first, first + count), one per entry
  /// (held here until the next call).
  template <class G = double>
  oomb::window_grad_view<G> grads(std::int32_t first, std::int32_t count, std::vector<G>& into) {
    entry_grads.clear();
    for (std::int32_t j = 0; j < count; ++j)
      entry_grads.push_back(grad_id[static_cast<std::size_t>(ids[static_cast<std::size_t>(first + j)])]);
    oomb::window_grad_view<G> m;
    m.pool = oomb::page_pool_view<G>::over(into.data(), shape);
    m.grad_page = entry_grads.data();
    m.pages = count;
    return m;
  }
  std::vector<std::int32_t> entry_grads;
  double k(std::int64_t pos, std::int32_t h, std::int32_t x) const {
    const auto id = ids[static_cast<std::size_t>(pos / shape.page_size)];
    return oomb::fixed_order::load<double>(pool_view().k(id, std::int32_t(pos % shape.page_size), h)[x]);
  }
  double v(std::int64_t pos, std::int32_t h, std::int32_t x) const {
    const auto id = ids[static_cast<std::size_t>(pos / shape.page_size)];
    return oomb::fixed_order::load<double>(pool_view().v(id, std::int32_t(pos % shape.page_size), h)[x]);
  }
};

/// A window over logical pages [first, first + count): its own CSR table storage.
struct window {
  std::vector<std::int32_t> indptr, indices, last;
  std::int32_t first = 0, count = 0;
  template <class E>
  window(const paged_sequence<E>& s, std::int32_t first_page, std::int32_t pages) : first(first_page), count(pages) {
    indptr = {0, count};
    indices.assign(s.ids.begin() + first_page, s.ids.begin() + first_page + count);
    last = {s.last_len(first_page + count)};
  }
  template <class T, class E>
  attention_args<T, E> args(const paged_sequence<E>& s, const T* q, std::int64_t q_start, std::int32_t sq,
                            std::int32_t hq) const {
    attention_args<T, E> a;
    a.q = q;
    a.q_start = q_start;
    a.sq = sq;
    a.hq = hq;
    a.hkv = s.shape.kv_heads;
    a.d = s.shape.head_dim;
    a.scale = T(1) / std::sqrt(T(a.d));
    a.kv.pool = s.pool_view();
    a.kv.table.indptr = indptr.data();
    a.kv.table.indices = indices.data();
    a.kv.table.last_page_len = last.data();
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = s.shape.page_size;
    a.first_page = first;
    return a;
  }
  template <class E, class G>
  oomb::window_grad_view<G> grads(paged_sequence<E>& s, std::vector<G>& gpool) const {
    return s.grads(first, count, gpool);
  }
};

/// Naive masked softmax attention over explicit positions: the independent forward oracle.
/// visible(i, pos) says whether query i attends key pos (causality included by the caller).
template <class E>
void naive_forward(const paged_sequence<E>& s, const std::vector<double>& q, std::int64_t q_start,
                   std::int32_t sq, std::int32_t hq, const std::function<bool(std::int32_t, std::int64_t)>& visible,
                   std::vector<double>& o, std::vector<double>& lse) {
  const std::int32_t hkv = s.shape.kv_heads, d = s.shape.head_dim, group = hq / hkv;
  const double scale = 1.0 / std::sqrt(double(d));
  o.assign(static_cast<std::size_t>(sq * hq * d), 0.0);
  lse.assign(static_cast<std::size_t>(hq * sq), -std::numeric_limits<double>::infinity());
  for (std::int32_t i = 0; i < sq; ++i)
    for (std::int32_t h = 0; h < hq; ++h) {
      const std::int32_t g = h / group;
      std::vector<double> sc;
      std::vector<std::int64_t> pos;
      for (std::int64_t p = 0; p < s.n; ++p) {
        if (p > q_start + i || !visible(i, p)) continue;
        double acc = 0;
        for (std::int32_t x = 0; x < d; ++x) acc += q[static_cast<std::size_t>((i * hq + h) * d + x)] * s.k(p, g, x);
        sc.push_back(scale * acc);
        pos.push_back(p);
      }
      if (sc.empty()) continue;
      const double m = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (auto& e : sc) sum += (e = std::exp(e - m));
      for (std::size_t j = 0; j < sc.size(); ++j)
        for (std::int32_t x = 0; x < d; ++x)
          o[static_cast<std::size_t>((i * hq + h) * d + x)] += sc[j] / sum * s.v(pos[j], g, x);
      lse[static_cast<std::size_t>(h * sq + i)] = m + std::log(sum);
    }
}

/// Forward over the given windows merged, and backward over each window with the global (o, lse).
struct run_result {
  std::vector<double> o, lse, dq, dk_own, dv_own, gpool;
};

template <class E>
run_result run_windows(paged_sequence<E>& s, const std::vector<double>& q, std::int64_t q_start, std::int32_t sq,
                       std::int32_t hq, const std::vector<window>& windows, const std::vector<double>& d_o,
                       const std::int32_t* tile_indptr = nullptr, const std::int32_t* tile_pages = nullptr,
                       std::int32_t tile = 128) {
  const std::int32_t d = s.shape.head_dim, hkv = s.shape.kv_heads;
  run_result r;
  r.o.assign(static_cast<std::size_t>(sq * hq * d), 0.0);
  r.lse.assign(static_cast<std::size_t>(hq * sq), -std::numeric_limits<double>::infinity());
  std::vector<double> o(r.o.size()), lse(r.lse.size());
  for (const auto& w : windows) {
    auto a = w.args<double>(s, q.data(), q_start, sq, hq);
    a.tile_indptr = tile_indptr;
    a.tile_pages = tile_pages;
    a.tile = tile;
    oomb::attention::reference::attention_forward(a, o.data(), lse.data());
    oomb::attention::reference::merge_partial(sq, hq, d, r.o.data(), r.lse.data(), o.data(), lse.data());
  }
  r.dq.assign(q.size(), 0.0);
  r.dk_own.assign(static_cast<std::size_t>(sq * hkv * d), 0.0);
  r.dv_own.assign(r.dk_own.size(), 0.0);
  std::fill(s.gpool.begin(), s.gpool.end(), 0.0);
  for (const auto& w : windows) {
    auto a = w.args<double>(s, q.data(), q_start, sq, hq);
    a.tile_indptr = tile_indptr;
    a.tile_pages = tile_pages;
    a.tile = tile;
    oomb::attention::reference::attention_backward(a, r.o.data(), r.lse.data(), d_o.data(), r.dq.data(), r.dk_own.data(),
                                          r.dv_own.data(), w.grads(s, s.gpool));
  }
  r.gpool = s.gpool;
  return r;
}

/// Checks dq, dK and dV of every key against central finite differences of L = sum(w * o).
template <class Forward>
void check_finite_differences(paged_sequence<double>& s, std::vector<double>& q, std::int64_t q_start,
                              std::int32_t sq, const std::vector<double>& w, const run_result& r, Forward&& fwd) {
  const std::int32_t d = s.shape.head_dim, hkv = s.shape.kv_heads;
  auto loss = [&] {
    const auto o = fwd();
    double l = 0;
    for (std::size_t i = 0; i < o.size(); ++i) l += w[i] * o[i];
    return l;
  };
  const double eps = 1e-6;
  auto fd = [&](double& x) {
    const double keep = x;
    x = keep + eps;
    const double lp = loss();
    x = keep - eps;
    const double lm = loss();
    x = keep;
    return (lp - lm) / (2 * eps);
  };
  std::vector<double> dq_fd(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) dq_fd[i] = fd(q[i]);
  CHECK(rel_err(r.dq, dq_fd) < 1e-7);

  // Every key of the sequence: analytic gradient from dk_own (pos >= q_start), the gradient pages
  // (pos < q_start), zero beyond the last query.
  std::vector<double> dk_fd, dk_an, dv_fd, dv_an;
  auto pv = s.pool_view_mut();
  for (std::int64_t pos = 0; pos < s.n; ++pos) {
    const auto page = static_cast<std::size_t>(pos / s.shape.page_size);
    const auto t = static_cast<std::int32_t>(pos % s.shape.page_size);
    const std::int32_t id = s.ids[page];
    const std::int32_t gid = s.grad_id[static_cast<std::size_t>(id)];
    const auto gview = oomb::page_pool_view<const double>::over(r.gpool.data(), s.shape);
    for (std::int32_t h = 0; h < hkv; ++h)
      for (std::int32_t x = 0; x < d; ++x) {
        dk_fd.push_back(fd(pv.k(id, t, h)[x]));
        dv_fd.push_back(fd(pv.v(id, t, h)[x]));
        if (pos >= q_start + sq) {
          dk_an.push_back(0);
          dv_an.push_back(0);
        } else if (pos >= q_start) {
          dk_an.push_back(r.dk_own[static_cast<std::size_t>(((pos - q_start) * hkv + h) * d + x)]);
          dv_an.push_back(r.dv_own[static_cast<std::size_t>(((pos - q_start) * hkv + h) * d + x)]);
        } else {
          dk_an.push_back(gview.k(gid, t, h)[x]);
          dv_an.push_back(gview.v(gid, t, h)[x]);
        }
      }
  }
  CHECK(rel_err(dk_an, dk_fd) < 1e-7);
  CHECK(rel_err(dv_an, dv_fd) < 1e-7);
  double norm = 0;
  for (double x : dk_an) norm += x * x;
  CHECK(norm > 1e-6);  // the check above compared something
}

}  // namespace

TEST_CASE("attention: windows partition the keys; forward matches a naive softmax, backward finite differences") {
  for (auto layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major}) {
    for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{7, 1}}) {
      CAPTURE(hq);
      CAPTURE(hkv);
      // 44 tokens in pages of 16 (the last one partial); the chunk's queries sit at 16..41, so keys
      // 42 and 43 are never seen, page 0 is the past and pages 1-2 are the chunk's own.
      const std::int32_t d = 5, page = 16, n = 44, sq = 26;
      const std::int64_t q_start = 16;
      paged_sequence<double> s(n, hkv, d, page, layout, 11 + hq);
      auto q = trainer_test::random_vector<double>(static_cast<std::size_t>(sq * hq * d), 7);
      const auto w = trainer_test::random_vector<double>(q.size(), 8);

      std::vector<double> o_ref, lse_ref;
      naive_forward(s, q, q_start, sq, hq, [](std::int32_t, std::int64_t) { return true; }, o_ref, lse_ref);

      const std::vector<window> one{window(s, 0, 3)};
      const std::vector<window> two{window(s, 0, 1), window(s, 1, 2)};
      const std::vector<window> split{window(s, 0, 2), window(s, 2, 1)};  // page 2 is invisible to queries 16..31
      const auto r1 = run_windows(s, q, q_start, sq, hq, one, w);
      const auto r2 = run_windows(s, q, q_start, sq, hq, two, w);
      const auto r3 = run_windows(s, q, q_start, sq, hq, split, w);
      CHECK(rel_err(r1.o, o_ref) < 1e-14);
      CHECK(rel_err(r1.lse, lse_ref) < 1e-14);
      for (const auto* r : {&r2, &r3}) {
        CHECK(rel_err(r->o, r1.o) < 1e-14);
        CHECK(rel_err(r->lse, r1.lse) < 1e-14);
        CHECK(rel_err(r->dq, r1.dq) < 1e-13);
        CHECK(rel_err(r->dk_own, r1.dk_own) < 1e-13);
        CHECK(rel_err(r->dv_own, r1.dv_own) < 1e-13);
        CHECK(rel_err(r->gpool, r1.gpool) < 1e-13);
      }
      check_finite_differences(s, q, q_start, sq, w, r1, [&] {
        std::vector<double> o(q.size()), lse(static_cast<std::size_t>(hq * sq));
        oomb::attention::reference::attention_forward(one[0].args<double>(s, q.data(), q_start, sq, hq), o.data(), lse.data());
        return o;
      });
    }
  }
}

TEST_CASE("attention: a window with no visible key gives lse = -inf and o = 0") {
  paged_sequence<double> s(48, 1, 4, 16, oomb::kv_layout::head_major, 3);
  const auto q = trainer_test::random_vector<double>(16 * 2 * 4, 4);
  const window future(s, 2, 1);  // positions 32..47; queries at 0..15
  std::vector<double> o(q.size(), 1.0), lse(2 * 16, 0.0);
  oomb::attention::reference::attention_forward(future.args<double>(s, q.data(), 0, 16, 2), o.data(), lse.data());
  for (double l : lse) CHECK(l == -std::numeric_limits<double>::infinity());
  for (double x : o) CHECK(x == 0.0);
}

TEST_CASE("attention: page-sparse tiles — a subset matches a masked softmax and finite differences; all pages equal dense bit for bit") {
  // 88 tokens: pages 0-3 are the past of a chunk starting at 64, page 4 (partial, 8 tokens) and
  // the rest of the chunk are its own. Tiles of 8 queries over 24 queries: 3 tiles.
  const std::int32_t hq = 4, hkv = 2, d = 6, page = 16, n = 88, sq = 24, tile = 8;
  const std::int64_t q_start = 64;
  paged_sequence<double> s(n, hkv, d, page, oomb::kv_layout::token_major, 21);
  auto q = trainer_test::random_vector<double>(static_cast<std::size_t>(sq * hq * d), 22);
  const auto w = trainer_test::random_vector<double>(q.size(), 23);
  const std::vector<window> one{window(s, 0, 6)};
  const std::vector<window> two{window(s, 0, 3), window(s, 3, 3)};

  const std::vector<std::int32_t> indptr{0, 2, 2, 5}, pages{0, 2, 1, 2, 3};  // tile 1 attends no past page
  std::vector<double> o_ref, lse_ref;
  naive_forward(s, q, q_start, sq, hq,
                [&](std::int32_t i, std::int64_t pos) {
                  if (pos >= q_start) return true;
                  const std::int32_t j = i / tile;
                  return std::find(pages.begin() + indptr[j], pages.begin() + indptr[j + 1], pos / page) !=
                         pages.begin() + indptr[j + 1];
                },
                o_ref, lse_ref);
  const auto r1 = run_windows(s, q, q_start, sq, hq, one, w, indptr.data(), pages.data(), tile);
  const auto r2 = run_windows(s, q, q_start, sq, hq, two, w, indptr.data(), pages.data(), tile);
  CHECK(rel_err(r1.o, o_ref) < 1e-14);
  CHECK(rel_err(r1.lse, lse_ref) < 1e-14);
  CHECK(rel_err(r2.dq, r1.dq) < 1e-13);
  CHECK(rel_err(r2.gpool, r1.gpool) < 1e-13);
  // Page 0 is selected by tile 0 only; page 3 by tile 2 only: both got gradient.
  check_finite_differences(s, q, q_start, sq, w, r1, [&] {
    std::vector<double> o(q.size()), lse(static_cast<std::size_t>(hq * sq));
    auto a = one[0].args<double>(s, q.data(), q_start, sq, hq);
    a.tile_indptr = indptr.data();
    a.tile_pages = pages.data();
    a.tile = tile;
    oomb::attention::reference::attention_forward(a, o.data(), lse.data());
    return o;
  });

  const std::vector<std::int32_t> all_indptr{0, 4, 8, 12}, all{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  for (const auto* ws : {&one, &two}) {
    const auto dense = run_windows(s, q, q_start, sq, hq, *ws, w);
    const auto sparse = run_windows(s, q, q_start, sq, hq, *ws, w, all_indptr.data(), all.data(), tile);
    CHECK(trainer_test::same_bits(sparse.o, dense.o));
    CHECK(trainer_test::same_bits(sparse.lse, dense.lse));
    CHECK(trainer_test::same_bits(sparse.dq, dense.dq));
    CHECK(trainer_test::same_bits(sparse.dk_own, dense.dk_own));
    CHECK(trainer_test::same_bits(sparse.dv_own, dense.dv_own));
    CHECK(trainer_test::same_bits(sparse.gpool, dense.gpool));
    CHECK_FALSE(trainer_test::same_bits(sparse.dq, r1.dq));  // and the subset really differs
  }
}

TEST_CASE("attention: tiles that select no past page read only the chunk's own pages (past ids may be -1)") {
  const std::int32_t hq = 2, hkv = 1, d = 4, page = 16, n = 48, sq = 16;
  const std::int64_t q_start = 32;
  paged_sequence<double> s(n, hkv, d, page, oomb::kv_layout::head_major, 51);
  const auto q = trainer_test::random_vector<double>(static_cast<std::size_t>(sq * hq * d), 52);
  window w(s, 0, 3);
  w.indices[0] = w.indices[1] = -1;  // never transferred: no tile needs them
  const std::vector<std::int32_t> indptr{0, 0, 0};
  auto a = w.args<double>(s, q.data(), q_start, sq, hq);
  a.tile_indptr = indptr.data();
  a.tile_pages = nullptr;  // an empty selection may have no storage at all
  a.tile = 8;
  std::vector<double> o(q.size()), lse(static_cast<std::size_t>(hq * sq)), o_ref, lse_ref;
  oomb::attention::reference::attention_forward(a, o.data(), lse.data());
  naive_forward(s, q, q_start, sq, hq, [&](std::int32_t, std::int64_t pos) { return pos >= q_start; }, o_ref, lse_ref);
  CHECK(rel_err(o, o_ref) < 1e-14);
  CHECK(rel_err(lse, lse_ref) < 1e-14);
}

TEST_CASE("attention: bf16 pages with float arithmetic match double over the same rounded values") {
  const std::int32_t hq = 4, hkv = 2, d = 8, page = 16, n = 40, sq = 24;
  const std::int64_t q_start = 16;
  paged_sequence<oomb::bf16> sb(n, hkv, d, page, oomb::kv_layout::head_major, 31);
  paged_sequence<double> sd(n, hkv, d, page, oomb::kv_layout::head_major, 31);
  for (std::size_t i = 0; i < sb.pool.size(); ++i) sd.pool[i] = static_cast<double>(static_cast<float>(sb.pool[i]));
  const auto qd = trainer_test::random_vector<double>(static_cast<std::size_t>(sq * hq * d), 32);
  const std::vector<float> qf(qd.begin(), qd.end());
  std::vector<double> qr(qf.begin(), qf.end());
  const window wb(sb, 0, 3);
  const window wd(sd, 0, 3);
  std::vector<float> o(qf.size()), lse(static_cast<std::size_t>(hq * sq));
  auto a = wb.args<float>(sb, qf.data(), q_start, sq, hq);
  oomb::attention::reference::attention_forward(a, o.data(), lse.data());
  std::vector<double> od(qr.size()), lsed(lse.size());
  oomb::attention::reference::attention_forward(wd.args<double>(sd, qr.data(), q_start, sq, hq), od.data(), lsed.data());
  CHECK(rel_err(o, od) < 1e-5);
  CHECK(rel_err(lse, lsed) < 1e-5);

  // Backward into float gradient pages.
  const auto dof = trainer_test::random_vector<float>(qf.size(), 33);
  std::vector<float> dq(qf.size()), dk(static_cast<std::size_t>(sq * hkv * d)), dv(dk.size());
  std::vector<float> gpool(sb.gpool.size(), 0.0f);
  oomb::attention::reference::attention_backward(a, o.data(), lse.data(), dof.data(), dq.data(), dk.data(), dv.data(),
                                                 wb.grads(sb, gpool));
  const std::vector<double> dod(dof.begin(), dof.end());
  const auto rd = run_windows(sd, qr, q_start, sq, hq, {wd}, dod);
  CHECK(rel_err(dq, rd.dq) < 1e-4);
  CHECK(rel_err(dk, rd.dk_own) < 1e-4);
  CHECK(rel_err(gpool, rd.gpool) < 1e-4);
}

TEST_CASE("attention: bad arguments are named") {
  paged_sequence<double> s(32, 2, 4, 16, oomb::kv_layout::head_major, 41);
  const auto q = trainer_test::random_vector<double>(16 * 3 * 4, 42);
  const window w(s, 0, 2);
  std::vector<double> o(q.size()), lse(3 * 16);
  auto a = w.args<double>(s, q.data(), 16, 16, 3);  // 3 query heads over 2 KV heads
  CHECK_THROWS_WITH_AS(oomb::attention::reference::attention_forward(a, o.data(), lse.data()),
                       doctest::Contains("query heads (3)"), oomb::invalid_argument);
  a = w.args<double>(s, q.data(), 16, 16, 4);
  s.grad_id[static_cast<std::size_t>(s.ids[0])] = -1;  // the past page lost its gradient page
  std::vector<double> o4(16 * 4 * 4), lse4(4 * 16), dq(o4.size()), dk(16 * 2 * 4), dv(dk.size());
  const auto q4 = trainer_test::random_vector<double>(o4.size(), 43);
  a.q = q4.data();
  oomb::attention::reference::attention_forward(a, o4.data(), lse4.data());
  CHECK_THROWS_WITH_AS(oomb::attention::reference::attention_backward(a, o4.data(), lse4.data(), q4.data(), dq.data(),
                                                             dk.data(), dv.data(), w.grads(s, s.gpool)),
                       doctest::Contains("has no gradient page"), oomb::invalid_argument);
}
