// The page kernels (include/oomb/attention) against the CPU path's loops (chunk_recurrent.hpp's
// write_kv and the own-page part of attend_backward) over host copies of the same pools: both
// layouts, head_dim 64 and 128, a partial last page, shuffled page ids, pools poisoned first so
// that a stray or missing write shows. Both kernels are exact (a copy, the CPU's rounding steps,
// one fp32 add per element): the comparisons are bitwise.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include <oomb/core/error.hpp>
#include <oomb/paging/page_shape.hpp>
#include <oomb/paging/views.hpp>

#include "trainer/cpu/rope.hpp"
#include "trainer/cuda/ops/rope.cuh"
#include <oomb/attention/own_page_grads.cuh>
#include <oomb/attention/write_kv_pages.cuh>

#include "device_util.cuh"

namespace {

using namespace ops_test;
namespace paging = oomb::attention;
namespace ops = oomb_trainer::gpu::ops;
namespace cpu = oomb_trainer::cpu;

struct geometry {
  std::int32_t page, heads, d;
  oomb::kv_layout layout;
  std::int64_t n;         // chunk tokens
  std::int32_t pool_pages;
  oomb::page_shape shape() const { return {page, heads, d, layout}; }
  std::int64_t chunk_pages() const { return paging::chunk_page_count(n, page); }
};

// Distinct ids in [0, pool_pages), shuffled: page i of the chunk lives at ids[i].
std::vector<std::int32_t> shuffled_ids(const geometry& g, std::uint64_t seed) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(g.pool_pages));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(static_cast<std::size_t>(g.chunk_pages()));
  return all;
}

// chunk_recurrent.hpp's write_kv, over a host pool: k (rotated on the CPU when rope != nullptr);
// a page whose id lies outside the pool is skipped, as the kernel does.
void reference_write(const geometry& g, const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<std::int32_t>& ids, const cpu::rope_table<float>* rope, std::vector<bf16>& pool) {
  std::vector<float> kr = k;
  if (rope != nullptr) cpu::rope_forward(g.n, g.heads, g.d, kr.data(), *rope);
  const auto view = oomb::page_pool_view<bf16>::over(pool.data(), g.shape());
  const std::int64_t kvd = std::int64_t(g.heads) * g.d;
  for (std::int64_t t = 0; t < g.n; ++t) {
    const std::int32_t id = ids[static_cast<std::size_t>(t / g.page)];
    if (id < 0 || id >= g.pool_pages) continue;
    const auto tok = static_cast<std::int32_t>(t % g.page);
    for (std::int32_t h = 0; h < g.heads; ++h) {
      bf16* kd = view.k(id, tok, h);
      bf16* vd = view.v(id, tok, h);
      for (std::int32_t i = 0; i < g.d; ++i) {
        kd[i] = bf16(kr[static_cast<std::size_t>(t * kvd + h * g.d + i)]);
        vd[i] = bf16(v[static_cast<std::size_t>(t * kvd + h * g.d + i)]);
      }
    }
  }
}

void check_write(const geometry& g, bool rotate, std::uint64_t seed) {
  CAPTURE(g.page);
  CAPTURE(g.heads);
  CAPTURE(g.d);
  CAPTURE(g.n);
  CAPTURE(static_cast<int>(g.layout));
  CAPTURE(rotate);
  test_stream stream;
  const std::size_t rows = static_cast<std::size_t>(g.n) * g.heads * g.d;
  const auto k = random_bf16(rows, seed, -2.0, 2.0), v = random_bf16(rows, seed + 1, -2.0, 2.0);
  const auto pool0 = random_bf16(static_cast<std::size_t>(g.pool_pages * g.shape().pair_elements()), seed + 2);
  const auto ids = shuffled_ids(g, seed + 3);
  const cpu::rope_table<float> table(1'000'003, g.n, oomb_trainer::plain_rope_frequencies(g.d, 1e6));  // far positions: large angles

  std::vector<bf16> want = pool0;
  reference_write(g, to_float(k), to_float(v), ids, rotate ? &table : nullptr, want);

  device_array<bf16> dk(k), dv(v), dpool(pool0);
  device_array<std::int32_t> dids(ids), bad(std::vector<std::int32_t>{-1});
  device_array<float> cos_d(table.cos), sin_d(table.sin);
  const ops::rope_table_view rope{cos_d.get(), sin_d.get(), g.n, g.d / 2};
  const auto view = oomb::page_pool_view<bf16>::over(dpool.get(), g.shape());
  if (rotate)
    paging::write_kv_pages_rotating_k(g.n, g.heads, g.d, dk.get(), dv.get(), rope, dids.get(), g.pool_pages, view,
                                      bad.get(), stream.view());
  else
    paging::write_kv_pages(g.n, g.heads, g.d, dk.get(), dv.get(), dids.get(), g.pool_pages, view, bad.get(),
                           stream.view());
  const auto got = dpool.download();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
  CHECK(mismatches == 0);  // pages written bit for bit, everything else (other pages, the tail) untouched
  CHECK(bad.download()[0] == -1);
  CHECK(dk.download() == k);  // k is read only, rotation or not
}

// The end of attend_backward: dk/dv rows += the gradient page rows of the chunk's touched pages.
void reference_own_grads(const geometry& g, const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& grad_id,
                         const std::vector<float>& gpool, std::vector<float>& dk, std::vector<float>& dv) {
  const auto view = oomb::page_pool_view<const float>::over(gpool.data(), g.shape());
  const std::int64_t kvd = std::int64_t(g.heads) * g.d;
  for (std::int64_t t = 0; t < g.n; ++t) {
    const std::int32_t gid = grad_id[static_cast<std::size_t>(ids[static_cast<std::size_t>(t / g.page)])];
    if (gid < 0) continue;
    for (std::int32_t h = 0; h < g.heads; ++h) {
      const float* mk = view.k(gid, static_cast<std::int32_t>(t % g.page), h);
      const float* mv = view.v(gid, static_cast<std::int32_t>(t % g.page), h);
      for (std::int32_t x = 0; x < g.d; ++x) {
        dk[static_cast<std::size_t>(t * kvd + h * g.d + x)] += mk[x];
        dv[static_cast<std::size_t>(t * kvd + h * g.d + x)] += mv[x];
      }
    }
  }
}

void check_own_grads(const geometry& g, std::uint64_t seed) {
  CAPTURE(g.page);
  CAPTURE(g.heads);
  CAPTURE(g.d);
  CAPTURE(g.n);
  CAPTURE(static_cast<int>(g.layout));
  test_stream stream;
  const std::size_t rows = static_cast<std::size_t>(g.n) * g.heads * g.d;
  const auto ids = shuffled_ids(g, seed);
  // The mirror: every other chunk page has a gradient page (the others were never attended by a
  // later chunk: -1), at shuffled gradient ids of a pool of its own.
  const std::int32_t grad_pages = g.pool_pages;
  std::vector<std::int32_t> grad_id(static_cast<std::size_t>(g.pool_pages), -1), gperm(static_cast<std::size_t>(grad_pages));
  std::iota(gperm.begin(), gperm.end(), 0);
  std::shuffle(gperm.begin(), gperm.end(), std::mt19937_64(seed + 1));
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (i % 2 == 0 || i + 1 == ids.size()) grad_id[static_cast<std::size_t>(ids[i])] = gperm[i];
  const auto gpool = random_vector<float>(static_cast<std::size_t>(grad_pages * g.shape().pair_elements()), seed + 2);
  const auto dk0 = random_vector<float>(rows, seed + 3), dv0 = random_vector<float>(rows, seed + 4);
  std::vector<float> dk_want = dk0, dv_want = dv0;
  reference_own_grads(g, ids, grad_id, gpool, dk_want, dv_want);

  device_array<std::int32_t> dids(ids), dgrad_id(grad_id), bad(std::vector<std::int32_t>{-1});
  device_array<float> dgpool(gpool), dk(dk0), dv(dv0);
  oomb::grad_mirror_view<float> mirror;
  mirror.pool = oomb::page_pool_view<float>::over(dgpool.get(), g.shape());
  mirror.grad_id = dgrad_id.get();
  mirror.num_kv_ids = g.pool_pages;
  paging::add_own_page_grads(g.n, g.heads, g.d, dids.get(), mirror, dk.get(), dv.get(), bad.get(), stream.view());
  CHECK(trainer_test::same_bits(dk.download(), dk_want));
  CHECK(trainer_test::same_bits(dv.download(), dv_want));
  CHECK(trainer_test::same_bits(dgpool.download(), gpool));  // the gradient pages are only read
  CHECK(bad.download()[0] == -1);
  CHECK(dk_want != dk0);  // the test added something
}

}  // namespace

TEST_CASE("write_kv_pages: K/V into shuffled pages equal the CPU path's bits, both layouts, with and without RoPE") {
  using L = oomb::kv_layout;
  std::uint64_t seed = 100;
  for (const bool rotate : {false, true}) {
    check_write({16, 2, 64, L::head_major, 3 * 16 + 5, 9}, rotate, seed += 10);     // partial last page
    check_write({16, 2, 64, L::token_major, 3 * 16 + 5, 9}, rotate, seed += 10);
    check_write({64, 4, 128, L::head_major, 2 * 64 + 63, 7}, rotate, seed += 10);  // a 63-token last page
    check_write({64, 4, 128, L::token_major, 2 * 64, 7}, rotate, seed += 10);      // whole pages
    check_write({128, 1, 64, L::head_major, 17, 3}, rotate, seed += 10);           // one partial page
  }
}

TEST_CASE("write_kv_pages: an id outside the pool is reported and skipped, the other pages written") {
  test_stream stream;
  const geometry g{16, 2, 64, oomb::kv_layout::head_major, 40, 5};  // 3 pages
  const std::size_t rows = static_cast<std::size_t>(g.n) * g.heads * g.d;
  const auto k = random_bf16(rows, 7), v = random_bf16(rows, 8);
  const auto pool0 = random_bf16(static_cast<std::size_t>(g.pool_pages * g.shape().pair_elements()), 9);
  const std::vector<std::int32_t> ids{4, g.pool_pages, 0};  // page 1 names no page of the pool
  device_array<bf16> dk(k), dv(v), dpool(pool0);
  device_array<std::int32_t> dids(ids), bad(std::vector<std::int32_t>{-1});
  const auto view = oomb::page_pool_view<bf16>::over(dpool.get(), g.shape());
  paging::write_kv_pages(g.n, g.heads, g.d, dk.get(), dv.get(), dids.get(), g.pool_pages, view, bad.get(), stream.view());
  CHECK(bad.download()[0] == 1);
  std::vector<bf16> want = pool0;
  reference_write(g, to_float(k), to_float(v), ids, nullptr, want);  // skips the same page
  CHECK(dpool.download() == want);
}

TEST_CASE("add_own_page_grads: local + mirror equals the CPU path's bits; untouched pages add nothing") {
  using L = oomb::kv_layout;
  check_own_grads({16, 2, 64, L::head_major, 3 * 16 + 5, 9}, 300);
  check_own_grads({16, 2, 64, L::token_major, 3 * 16 + 5, 9}, 310);
  check_own_grads({64, 4, 128, L::head_major, 2 * 64 + 63, 7}, 320);
  check_own_grads({64, 4, 128, L::token_major, 4 * 64, 6}, 330);
}

TEST_CASE("page kernels: bad arguments are refused before anything is enqueued") {
  test_stream stream;
  const oomb::page_shape shape{16, 2, 64, oomb::kv_layout::head_major};
  device_array<bf16> kv(random_bf16(4096, 1)), pool(random_bf16(static_cast<std::size_t>(4 * shape.pair_elements()), 2));
  device_array<std::int32_t> ids(std::vector<std::int32_t>{0, 1}), bad(std::vector<std::int32_t>{-1});
  device_array<float> f(static_cast<std::size_t>(4 * shape.pair_elements()));
  const auto view = oomb::page_pool_view<bf16>::over(pool.get(), shape);
  CHECK_THROWS_WITH_AS(paging::write_kv_pages(20, 3, 64, kv.get(), kv.get(), ids.get(), 4, view, bad.get(), stream.view()),
                       doctest::Contains("hold 2 heads of dimension 64, the chunk 3"), oomb::invalid_argument);
  const oomb::page_shape odd{16, 2, 72, oomb::kv_layout::head_major};
  CHECK_THROWS_WITH_AS(paging::write_kv_pages(20, 2, 72, kv.get(), kv.get(), ids.get(), 4,
                                              oomb::page_pool_view<bf16>::over(pool.get(), odd), bad.get(), stream.view()),
                       doctest::Contains("multiple of 16"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(paging::write_kv_pages(20, 2, 64, kv.get() + 1, kv.get(), ids.get(), 4, view, bad.get(),
                                              stream.view()),
                       doctest::Contains("16-byte aligned"), oomb::invalid_argument);
  CHECK_THROWS_AS(paging::write_kv_pages(20, 2, 64, kv.get(), kv.get(), ids.get(), 4, view, nullptr, stream.view()),
                  oomb::invalid_argument);
  device_array<float> cs(64 * 32);
  const ops::rope_table_view short_table{cs.get(), cs.get(), 10, 32};
  CHECK_THROWS_WITH_AS(paging::write_kv_pages_rotating_k(20, 2, 64, kv.get(), kv.get(), short_table, ids.get(), 4, view,
                                                         bad.get(), stream.view()),
                       doctest::Contains("holds 10 positions"), oomb::invalid_argument);
  oomb::grad_mirror_view<float> mirror;
  mirror.pool = oomb::page_pool_view<float>::over(f.get(), shape);
  CHECK_THROWS_WITH_AS(paging::add_own_page_grads(20, 2, 64, ids.get(), mirror, f.get(), f.get() + 4096, bad.get(),
                                                  stream.view()),
                       doctest::Contains("no grad_id table"), oomb::invalid_argument);
  mirror.grad_id = ids.get();
  mirror.num_kv_ids = 2;
  CHECK_THROWS_WITH_AS(paging::add_own_page_grads(20, 2, 64, ids.get(), mirror, f.get(), f.get(), bad.get(), stream.view()),
                       doctest::Contains("must be distinct"), oomb::invalid_argument);
}
