// The ops backend seam (examples/trainer/ops/ops_backend.hpp, cpu/cpu_ops.hpp): the trait accepts the CPU backend and
// rejects types that lack a member; the CPU backend's page ops move rows to and from pages exactly
// (bf16 pages round as oomb::bf16, -1 entries are skipped); attention over window tables split in
// two equals one window, each backward window adding into the gradient pages its table names (a
// past page without one is refused); page_tier reads in place and streamed give the same page contents.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <oomb/memory/block_pool.hpp>

#include "test_util.hpp"
#include "trainer/algo/page_tier.hpp"
#include "trainer/cpu/cpu_ops.hpp"

namespace {

using oomb_trainer::attention_chunk;
using oomb_trainer::cpu_ops;
using oomb_trainer::window_table;

// Has every type of a backend but no ops.
struct types_only {
  using value_type = float;
  using kv_type = float;
  using grad_type = float;
  template <class X>
  using buffer = std::vector<X>;
  using params_type = oomb_trainer::model_params<float>;
  using grads_type = params_type;
  using rope_type = oomb_trainer::cpu::rope_table<float>;
  using residency_backend = oomb::host_backend;
  using selector_type = oomb_trainer::cpu_page_selector<float>;
};

// The CPU backend with a residency backend that is not one.
struct bad_residency : cpu_ops<float> {
  using residency_backend = int;
};

// The CPU backend without the model's types: an attention backend (paged_attention runs over it,
// as the package's GPU path runs over cuda_attention_ops), not an ops backend.
class attention_only : public cpu_ops<float> {
  using params_type = void;  // private: hides the base's type from the trait
};

}  // namespace

TEST_CASE("ops backend: the traits accept the CPU backends and reject incomplete ones") {
  static_assert(oomb_trainer::is_ops_backend_v<cpu_ops<double>>);
  static_assert(oomb_trainer::is_ops_backend_v<cpu_ops<float, oomb::bf16, float>>);
  CHECK_FALSE(oomb_trainer::is_ops_backend_v<int>);
  CHECK_FALSE(oomb_trainer::is_ops_backend_v<types_only>);
  CHECK_FALSE(oomb_trainer::is_ops_backend_v<bad_residency>);
  static_assert(oomb_trainer::is_attention_backend_v<cpu_ops<double>>);
  CHECK_FALSE(oomb_trainer::is_attention_backend_v<bad_residency>);
  CHECK_FALSE(oomb_trainer::is_attention_backend_v<types_only>);
  CHECK(oomb_trainer::is_attention_backend_v<attention_only>);
  CHECK_FALSE(oomb_trainer::is_ops_backend_v<attention_only>);
}

TEST_CASE("cpu backend: write_pages and add_from_pages move rows exactly, bf16 pages round as oomb::bf16") {
  using backend = cpu_ops<float, oomb::bf16, float>;
  backend be;
  const std::int32_t P = 16, hkv = 2, d = 8, kvd = hkv * d;
  const std::int64_t n = 37;  // 3 pages, the last one partial
  for (const auto layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major}) {
    CAPTURE(static_cast<int>(layout));
    const oomb::page_shape shape{P, hkv, d, layout};
    std::vector<oomb::bf16> kv_pool(static_cast<std::size_t>(8 * shape.pair_elements()));
    const auto view = oomb::page_pool_view<oomb::bf16>::over(kv_pool.data(), shape);
    const auto k = trainer_test::random_vector<float>(static_cast<std::size_t>(n * kvd), 1);
    const auto v = trainer_test::random_vector<float>(k.size(), 2);
    const std::vector<std::int32_t> where{5, 2, 7};
    be.write_pages(view, where, n, k.data(), v.data());
    bool exact = true;
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int32_t g = 0; g < hkv; ++g)
        for (std::int32_t i = 0; i < d; ++i) {
          const auto page = where[static_cast<std::size_t>(t / P)];
          const auto tok = static_cast<std::int32_t>(t % P);
          const std::size_t row = static_cast<std::size_t>((t * hkv + g) * d + i);
          exact = exact && view.k(page, tok, g)[i] == oomb::bf16(k[row]) && view.v(page, tok, g)[i] == oomb::bf16(v[row]);
        }
    CHECK(exact);

    // Gradient pages 3 and 0 hold the rows of pages 1 and 2; page 0 has none.
    std::vector<float> grad_pool = trainer_test::random_vector<float>(static_cast<std::size_t>(4 * shape.pair_elements()), 3);
    const auto gview = oomb::page_pool_view<const float>::over(grad_pool.data(), shape);
    auto dk = trainer_test::random_vector<float>(k.size(), 4), dv = trainer_test::random_vector<float>(k.size(), 5);
    const auto dk0 = dk, dv0 = dv;
    be.add_from_pages(gview, {-1, 3, 0}, n, dk.data(), dv.data());
    bool added = true;
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int32_t g = 0; g < hkv; ++g)
        for (std::int32_t i = 0; i < d; ++i) {
          const std::size_t row = static_cast<std::size_t>((t * hkv + g) * d + i);
          const std::int32_t page = t < P ? -1 : t < 2 * P ? 3 : 0;
          const auto tok = static_cast<std::int32_t>(t % P);
          const float ek = page < 0 ? dk0[row] : dk0[row] + gview.k(page, tok, g)[i];
          const float ev = page < 0 ? dv0[row] : dv0[row] + gview.v(page, tok, g)[i];
          added = added && dk[row] == ek && dv[row] == ev;
        }
    CHECK(added);

    std::vector<float> zeroed = grad_pool;
    be.zero_page(oomb::page_pool_view<float>::over(zeroed.data(), shape), 2);
    const auto pair = static_cast<std::size_t>(shape.pair_elements());
    bool only_page_2 = true;
    for (std::size_t i = 0; i < zeroed.size(); ++i)
      only_page_2 = only_page_2 && zeroed[i] == (i / pair == 2 ? 0.0f : grad_pool[i]);
    CHECK(only_page_2);
  }
  std::vector<oomb::bf16> small(static_cast<std::size_t>(oomb::page_shape{P, hkv, d}.pair_elements()));
  const std::vector<float> rows(static_cast<std::size_t>(20 * kvd), 1.0f);
  CHECK_THROWS_WITH_AS(be.write_pages(oomb::page_pool_view<oomb::bf16>::over(small.data(), {P, hkv, d}), {0}, 20,
                                      rows.data(), rows.data()),
                       doctest::Contains("20 rows need 2 pages, given 1"), oomb::invalid_argument);
}

TEST_CASE("cpu backend: attention over two window tables equals one; each window brings its own gradient pages") {
  using backend = cpu_ops<double>;
  backend be;
  const std::int32_t P = 16, hq = 4, hkv = 2, d = 8, sq = 20;
  const oomb::page_shape shape{P, hkv, d};
  // Pages 0-2 are the past (48 tokens), page 3 holds the chunk's 20 queries' keys... of which 16
  // fit, so the chunk spans logical pages 3 and 4 (positions 48..67).
  const std::int64_t q_start = 48;
  const std::vector<std::int32_t> ids{6, 1, 4, 0, 3};  // logical page -> id in the pool
  auto pool = trainer_test::random_vector<double>(static_cast<std::size_t>(8 * shape.pair_elements()), 11);
  const auto kv = oomb::page_pool_view<const double>::over(pool.data(), shape);
  const auto q = trainer_test::random_vector<double>(static_cast<std::size_t>(sq * hq * d), 12);
  attention_chunk<double> c;
  c.q = q.data();
  c.q_start = q_start;
  c.sq = sq;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  const std::int32_t last = static_cast<std::int32_t>(q_start + sq - 4 * P);
  auto table = [&](std::int32_t first, std::int32_t count, const std::int32_t* grads) {
    window_table w;
    w.first_page = first;
    w.pages = count;
    w.last_page_len = first + count == 5 ? last : P;
    w.ids = ids.data() + first;
    w.grad_ids = grads;
    return w;
  };
  const auto ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> o1(q.size(), 0.0), lse1(static_cast<std::size_t>(sq * hq), ninf), o2 = o1, lse2 = lse1;
  be.attention_forward(c, kv, table(0, 5, nullptr), o1.data(), lse1.data());
  be.attention_forward(c, kv, table(0, 2, nullptr), o2.data(), lse2.data());
  be.attention_forward(c, kv, table(2, 3, nullptr), o2.data(), lse2.data());
  CHECK(trainer_test::rel_err(o2, o1) <= 1e-14);
  CHECK(trainer_test::rel_err(lse2, lse1) <= 1e-14);

  // Backward: past pages 0-2 get gradient pages 2, 0, 1 of a 3-pair gradient pool.
  const auto d_o = trainer_test::random_vector<double>(q.size(), 13);
  const std::vector<std::int32_t> grad_of{2, 0, 1, -1, -1};
  auto backward = [&](std::vector<std::vector<std::int32_t>> cuts, std::vector<double>& gpool, std::vector<double>& dq,
                      std::vector<double>& dk) {
    gpool.assign(static_cast<std::size_t>(3 * shape.pair_elements()), 0.0);
    dq.assign(q.size(), 0.0);
    dk.assign(static_cast<std::size_t>(sq * hkv * d), 0.0);
    std::vector<double> dv(dk.size(), 0.0);
    const auto gview = oomb::page_pool_view<double>::over(gpool.data(), shape);
    be.attention_backward_begin(c, o1.data(), d_o.data());
    for (const auto& cut : cuts)
      be.attention_backward(c, kv, table(cut[0], cut[1], grad_of.data() + cut[0]), gview, o1.data(), lse1.data(),
                            d_o.data(), dq.data(), dk.data(), dv.data());
  };
  std::vector<double> g1, dq1, dk1, g2, dq2, dk2;
  backward({{0, 5}}, g1, dq1, dk1);
  backward({{0, 2}, {2, 3}}, g2, dq2, dk2);
  CHECK(trainer_test::rel_err(g2, g1) <= 1e-13);
  CHECK(trainer_test::rel_err(dq2, dq1) <= 1e-13);
  CHECK(trainer_test::rel_err(dk2, dk1) <= 1e-13);
  double g_norm = 0;
  for (double x : g1) g_norm += x * x;
  CHECK(g_norm > 0);

  // A window whose past page has no gradient page fails, naming it.
  const std::vector<std::int32_t> none(5, -1);
  std::vector<double> gp(static_cast<std::size_t>(3 * shape.pair_elements()), 0.0), dq(q.size()), dk(dk1.size()), dv(dk1.size());
  CHECK_THROWS_WITH_AS(be.attention_backward(c, kv, table(0, 5, none.data()), oomb::page_pool_view<double>::over(gp.data(), shape),
                                             o1.data(), lse1.data(), d_o.data(), dq.data(), dk.data(), dv.data()),
                       doctest::Contains("has no gradient page"), oomb::invalid_argument);
}

TEST_CASE("page_tier: pages written through near slots reach the same homes as pages written in place") {
  using backend = cpu_ops<float>;
  using tier = oomb_trainer::page_tier<backend, float>;
  const oomb::page_shape shape{16, 2, 8};
  const auto pair_bytes = static_cast<std::size_t>(shape.pair_elements()) * sizeof(float);
  const auto k = trainer_test::random_vector<float>(static_cast<std::size_t>(48 * 16), 21);  // 3 full pages
  const auto v = trainer_test::random_vector<float>(k.size(), 22);
  std::vector<std::vector<float>> homes;
  for (const std::int32_t slots : {0, 3}) {
    CAPTURE(slots);
    backend be;
    auto far = oomb::block_pool<oomb::host_resource>::contiguous(be.far_memory(), pair_bytes, 6);
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(far.acquire());
    tier t(be, far, shape, slots);
    CHECK(t.streamed() == (slots > 0));
    std::vector<std::int32_t> where;
    t.acquire(ids, oomb::access::overwrite, where);
    CHECK((t.view().base == reinterpret_cast<float*>(far.base())) == (slots == 0));
    if (slots == 0) CHECK(where == ids);
    be.write_pages(t.view(), where, 48, k.data(), v.data());
    t.release(ids);
    t.write_back(ids);
    t.drain();
    std::vector<float> written;
    for (const std::int32_t id : ids) {
      const float* pair = reinterpret_cast<const float*>(far.address(id));
      written.insert(written.end(), pair, pair + shape.pair_elements());
    }
    homes.push_back(std::move(written));
    CHECK(t.stats().bytes_to_far == (slots > 0 ? 3 * pair_bytes : 0));
  }
  CHECK(trainer_test::same_bits(homes[0], homes[1]));
  CHECK(homes[0][1] == k[1]);  // head-major page 0, token 0, head 0: the first row of k
}
