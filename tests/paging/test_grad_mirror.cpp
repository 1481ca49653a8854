// grad_mirror: lazy gradient pages, zero-fill on first touch, accumulation, release with the KV
// page, the kernel view, bad input.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/paging/grad_mirror.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "paging_test_util.hpp"

using oomb::grad_mirror;
using oomb::grad_mirror_config;
using oomb::host_resource;
using oomb::kv_layout;
using paging_test::expect_error;

namespace {

grad_mirror_config small_config(kv_layout layout = kv_layout::head_major) {
  grad_mirror_config c;
  c.shape.page_size = 16;
  c.shape.kv_heads = 2;
  c.shape.head_dim = 4;
  c.shape.layout = layout;
  c.kv_ids = 50;
  c.pool.max_pages = 8;
  return c;
}

template <class G>
std::vector<G> random_page(paging_test::rng& r, std::int64_t n) {
  std::vector<G> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = G(r.real());
  return v;
}

}  // namespace

TEST_CASE("grad_mirror: configuration is validated") {
  host_resource r;
  auto c = small_config();
  c.kv_ids = 0;
  expect_error<oomb::invalid_argument>([&] { grad_mirror<float, host_resource>(r, c); }, {"kv_ids", "0"});
  c = small_config();
  c.shape.page_size = 24;
  expect_error<oomb::invalid_argument>([&] { grad_mirror<float, host_resource>(r, c); }, {"page_size", "24"});
  c = small_config();
  c.shape.kv_heads = 0;
  expect_error<oomb::invalid_argument>([&] { grad_mirror<float, host_resource>(r, c); }, {"kv_heads", "0"});
  c = small_config();
  c.pool.max_pages = -3;
  expect_error<oomb::invalid_argument>([&] { grad_mirror<float, host_resource>(r, c); }, {"max_pages", "-3"});
}

TEST_CASE("grad_mirror: touch assigns a page once, -1 until then") {
  host_resource r;
  grad_mirror<float, host_resource> g(r, small_config());
  CHECK(g.num_kv_ids() == 50);
  CHECK(g.pair_bytes() == 2 * 16 * 2 * 4 * sizeof(float));
  CHECK(g.grad_id(7) == -1);
  CHECK_FALSE(g.touched(7));
  CHECK(g.num_touched() == 0);
  const auto t1 = g.touch(7);
  CHECK(t1.fresh);
  CHECK(t1.grad_id >= 0);
  CHECK(g.grad_id(7) == t1.grad_id);
  CHECK(g.touched(7));
  const auto t2 = g.touch(7);
  CHECK_FALSE(t2.fresh);
  CHECK(t2.grad_id == t1.grad_id);
  const auto t3 = g.touch(49);
  CHECK(t3.fresh);
  CHECK(t3.grad_id != t1.grad_id);
  CHECK(g.num_touched() == 2);
  CHECK(g.grad_ids()[49] == t3.grad_id);
  CHECK(g.stats().in_use == 2);
}

TEST_CASE("grad_mirror: a custom zero fill runs for fresh pages only; if it throws, nothing changes") {
  host_resource r;
  grad_mirror<float, host_resource> g(r, small_config());
  std::vector<std::int32_t> filled;
  auto fill = [&](std::int32_t id) { filled.push_back(id); };
  const auto a = g.touch(3, fill);
  g.touch(3, fill);
  CHECK(filled == std::vector<std::int32_t>{a.grad_id});
  CHECK_THROWS_AS(g.touch(4, [](std::int32_t) { throw std::runtime_error("memset failed"); }), std::runtime_error);
  CHECK_FALSE(g.touched(4));
  CHECK(g.num_touched() == 1);
  CHECK(g.touch(4, fill).fresh);  // usable afterwards
}

TEST_CASE("grad_mirror: first touch zero-fills even a reused dirty page") {
  host_resource r;
  paging_test::rng rnd(31);
  grad_mirror<float, host_resource> g(r, small_config());
  const auto id = g.touch_zeroed(10);
  const auto n = g.shape().page_elements();
  auto dk = g.dk_page(10);
  auto dv = g.dv_page(10);
  for (std::int32_t h = 0; h < 2; ++h)
    for (std::int32_t t = 0; t < 16; ++t)
      for (std::int32_t d = 0; d < 4; ++d) {
        CHECK(dk(h, t, d) == 0.0f);
        CHECK(dv(h, t, d) == 0.0f);
        dk(h, t, d) = rnd.real();  // dirty it
        dv(h, t, d) = rnd.real();
      }
  g.release(10);
  CHECK_FALSE(g.touched(10));
  // The pool hands the freed pair out again first; it must come back zeroed.
  CHECK(g.touch_zeroed(11) == id);
  const float* p = g.dk(11, 0, 0);
  for (std::int64_t i = 0; i < 2 * n; ++i) CHECK(p[i] == 0.0f);
}

TEST_CASE_TEMPLATE("grad_mirror: accumulate adds pages in the page layout", G, float, double) {
  for (kv_layout layout : {kv_layout::head_major, kv_layout::token_major}) {
    host_resource r;
    paging_test::rng rnd(40 + static_cast<std::uint64_t>(layout));
    grad_mirror<G, host_resource> g(r, small_config(layout));
    const auto n = g.shape().page_elements();
    const auto k1 = random_page<G>(rnd, n), v1 = random_page<G>(rnd, n);
    const auto k2 = random_page<G>(rnd, n), v2 = random_page<G>(rnd, n);
    g.accumulate(5, k1.data(), v1.data());
    g.accumulate(5, k2.data(), nullptr);  // only dK this time
    g.accumulate(6, nullptr, v2.data());
    const auto& s = g.shape();
    for (std::int32_t h = 0; h < s.kv_heads; ++h)
      for (std::int32_t t = 0; t < s.page_size; ++t)
        for (std::int32_t d = 0; d < s.head_dim; ++d) {
          // Element (h, t, d) sits at the page-layout offset in the caller's arrays too.
          const auto off = static_cast<std::size_t>(h * s.stride_head() + t * s.stride_token() + d);
          CHECK(g.dk(5, t, h)[d] == (G(0) + k1[off]) + k2[off]);
          CHECK(g.dv(5, t, h)[d] == G(0) + v1[off]);
          CHECK(g.dk_page(5)(h, t, d) == (G(0) + k1[off]) + k2[off]);
          CHECK(g.dk(6, t, h)[d] == G(0));
          CHECK(g.dv_page(6)(h, t, d) == G(0) + v2[off]);
        }
  }
}

TEST_CASE("grad_mirror: bf16 gradient pages accumulate through float") {
  host_resource r;
  grad_mirror<oomb::bf16, host_resource> g(r, small_config());
  const auto n = g.shape().page_elements();
  std::vector<oomb::bf16> a(static_cast<std::size_t>(n), oomb::bf16(1.5f)), b(static_cast<std::size_t>(n), oomb::bf16(-0.25f));
  g.accumulate(0, a.data(), b.data());
  g.accumulate(0, a.data(), b.data());
  CHECK(static_cast<float>(*g.dk(0, 3, 1)) == 3.0f);
  CHECK(static_cast<float>(*g.dv(0, 15, 0)) == -0.5f);
}

TEST_CASE("grad_mirror: view() matches the host accessors") {
  host_resource r;
  paging_test::rng rnd(50);
  grad_mirror<float, host_resource> g(r, small_config(kv_layout::token_major));
  const auto n = g.shape().page_elements();
  for (std::int32_t kv : {2, 9, 33}) {
    const auto k = random_page<float>(rnd, n), v = random_page<float>(rnd, n);
    g.accumulate(kv, k.data(), v.data());
  }
  const auto view = g.view();
  CHECK(view.num_kv_ids == 50);
  CHECK(view.grad_id[9] == g.grad_id(9));
  CHECK(view.grad_id[10] == -1);
  for (std::int32_t kv : {2, 9, 33})
    for (std::int32_t t = 0; t < 16; ++t)
      for (std::int32_t h = 0; h < 2; ++h) {
        CHECK(view.dk(kv, t, h) == g.dk(kv, t, h));
        CHECK(view.dv(kv, t, h) == g.dv(kv, t, h));
      }
}

TEST_CASE("grad_mirror: bad input throws naming the values, mirror unchanged") {
  host_resource r;
  auto c = small_config();
  c.pool.max_pages = 2;
  grad_mirror<float, host_resource> g(r, c);
  g.touch_zeroed(1);
  g.touch_zeroed(2);
  const auto ids = g.grad_ids();
  expect_error<oomb::invalid_argument>([&] { g.touch(50); }, {"KV page id 50", "[0, 50)"});
  expect_error<oomb::invalid_argument>([&] { g.touch(-1); }, {"KV page id -1"});
  expect_error<oomb::invalid_argument>([&] { g.grad_id(77); }, {"77"});
  expect_error<oomb::invalid_argument>([&] { g.release(3); }, {"KV page 3", "no gradient page"});
  expect_error<oomb::invalid_argument>([&] { g.release(50); }, {"KV page id 50"});
  expect_error<oomb::invalid_argument>([&] { g.release_if_touched(-5); }, {"KV page id -5"});
  expect_error<oomb::invalid_argument>([&] { g.dk(3, 0, 0); }, {"KV page 3"});
  expect_error<oomb::invalid_argument>([&] { g.dk(1, 16, 0); }, {"token 16"});
  expect_error<oomb::invalid_argument>([&] { g.dv(1, 0, 2); }, {"kv head 2"});
  expect_error<oomb::invalid_argument>([&] { g.dk_page(4); }, {"KV page 4"});
  expect_error<oomb::out_of_memory>([&] { g.touch(3); }, {"KV page 3", "0 left of 2"});
  expect_error<oomb::out_of_memory>([&] { g.accumulate(3, nullptr, nullptr); }, {"0 left of 2"});
  CHECK(g.grad_ids() == ids);
  CHECK(g.num_touched() == 2);

  g.release(1);
  expect_error<oomb::invalid_argument>([&] { g.release(1); }, {"KV page 1", "released twice"});
  CHECK_FALSE(g.release_if_touched(1));
  CHECK(g.release_if_touched(2));
  CHECK(g.num_touched() == 0);
  CHECK(g.touch(3).fresh);  // usable
}

TEST_CASE("grad_mirror: a growing pool has no kernel view") {
  host_resource r;
  auto c = small_config();
  c.pool.mode = oomb::pool_mode::growing;
  c.pool.pages_per_slab = 2;
  grad_mirror<float, host_resource> g(r, c);
  for (std::int32_t kv = 0; kv < 5; ++kv) g.touch_zeroed(kv);
  CHECK(g.stats().reserved == 6);
  CHECK(*g.dk(4, 15, 1) == 0.0f);
  expect_error<oomb::invalid_argument>([&] { g.view(); }, {"contiguous"});
}

TEST_CASE("grad_mirror alongside a bf16 paged_kv_cache: gradients released with their KV pages") {
  host_resource r;
  oomb::paged_kv_config kc;
  kc.layers = 2;
  kc.shape = small_config().shape;
  kc.chunk_size = 32;
  kc.pool.max_pages = 40;
  oomb::paged_kv_cache<oomb::bf16, host_resource> kv(r, kc);
  auto gc = small_config();
  gc.kv_ids = kv.pool().capacity();
  gc.pool.max_pages = 40;
  grad_mirror<float, host_resource> g(r, gc);  // fp32 gradients for bf16 K/V

  paging_test::rng rnd(60);
  const auto s = kv.add_sequence();
  for (int c = 0; c < 3; ++c) kv.append(s, 32);
  // Backward over chunk 2 touches the pages of chunks 0 and 1 (the "past") in both layers.
  const auto n = g.shape().page_elements();
  for (std::int32_t l = 0; l < 2; ++l)
    kv.for_each_page(s, l, 0, 4, [&](std::int32_t, std::int32_t id) {
      const auto k = random_page<float>(rnd, n), v = random_page<float>(rnd, n);
      g.accumulate(id, k.data(), v.data());
    });
  CHECK(g.num_touched() == 8);
  // Popping chunks releases each page's gradient with it; untouched pages (chunk 2) are skipped.
  std::int32_t released = 0;
  while (kv.pop_chunk(s, [&](std::int32_t id) { released += g.release_if_touched(id) ? 1 : 0; }) > 0) {
  }
  CHECK(released == 8);
  CHECK(g.num_touched() == 0);
  CHECK(kv.stats().in_use == 0);
}
