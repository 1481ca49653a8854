// A caller's own tensor type plugged in through tensor_traits receives pages via as<T>().
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "oomb/core/tensor.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/paging/grad_mirror.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "paging_test_util.hpp"

namespace user {

/// What a framework's tensor might look like: its own field names, int strides in a vector, a
/// device tag instead of oomb's memory_kind.
template <class T>
struct strided_tensor {
  T* ptr = nullptr;
  std::vector<long> sizes;
  std::vector<long> steps;
  bool on_device = false;

  T& at(long i, long j, long k) const { return ptr[i * steps[0] + j * steps[1] + k * steps[2]]; }
};

}  // namespace user

template <class T>
struct oomb::tensor_traits<user::strided_tensor<T>> {
  using element_type = T;
  static constexpr std::size_t rank = 3;
  using index_array = std::array<std::int64_t, 3>;
  static T* data(const user::strided_tensor<T>& t) { return t.ptr; }
  static index_array shape(const user::strided_tensor<T>& t) { return {t.sizes[0], t.sizes[1], t.sizes[2]}; }
  static index_array strides(const user::strided_tensor<T>& t) { return {t.steps[0], t.steps[1], t.steps[2]}; }
  static user::strided_tensor<T> make(T* p, const index_array& shape, const index_array& strides,
                                      oomb::memory_kind kind) {
    user::strided_tensor<T> t;
    t.ptr = p;
    t.sizes.assign(shape.begin(), shape.end());
    t.steps.assign(strides.begin(), strides.end());
    t.on_device = kind == oomb::memory_kind::device;
    return t;
  }
};

TEST_CASE("a user-defined tensor type receives K/V and gradient pages through as<T>()") {
  for (auto layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major}) {
    CAPTURE(static_cast<int>(layout));
    oomb::host_resource r;
    oomb::paged_kv_config c;
    c.layers = 2;
    c.shape = {16, 3, 8, layout};
    c.chunk_size = 16;
    c.pool.max_pages = 16;
    oomb::paged_kv_cache<float, oomb::host_resource> kv(r, c);
    const auto s = kv.add_sequence();
    kv.append(s, 16);
    kv.append(s, 16);
    paging_test::rng rnd(70 + static_cast<std::uint64_t>(layout));
    for (std::int64_t p = 0; p < 32; ++p)
      for (std::int32_t h = 0; h < 3; ++h)
        for (std::int32_t d = 0; d < 8; ++d) {
          kv.k(s, 1, p, h)[d] = rnd.real();
          kv.v(s, 1, p, h)[d] = rnd.real();
        }

    const auto k = oomb::as<user::strided_tensor<float>>(kv.k_page(s, 1, 1));
    const auto v = oomb::as<user::strided_tensor<float>>(kv.v_page(s, 1, 1));
    CHECK(k.sizes == std::vector<long>{3, 16, 8});
    CHECK(k.steps[2] == 1);
    CHECK_FALSE(k.on_device);
    // Writing through the user's type lands where the cache addresses the token.
    k.at(2, 5, 7) = 123.0f;
    CHECK(kv.k(s, 1, 16 + 5, 2)[7] == 123.0f);
    for (long h = 0; h < 3; ++h)
      for (long t = 0; t < 16; ++t)
        for (long d = 0; d < 8; ++d) {
          CHECK(k.at(h, t, d) == kv.k(s, 1, 16 + t, static_cast<std::int32_t>(h))[d]);
          CHECK(v.at(h, t, d) == kv.v(s, 1, 16 + t, static_cast<std::int32_t>(h))[d]);
        }

    // Gradient pages (a different element type) go the same way.
    oomb::grad_mirror_config gc;
    gc.shape = c.shape;
    gc.kv_ids = kv.pool().capacity();
    gc.pool.max_pages = 4;
    oomb::grad_mirror<double, oomb::host_resource> g(r, gc);
    const auto id = kv.page_id(s, 0, 0);
    g.touch_zeroed(id);
    const auto dk = oomb::as<user::strided_tensor<double>>(g.dk_page(id));
    dk.at(1, 2, 3) = 0.5;
    CHECK(g.dk(id, 2, 1)[3] == 0.5);
    CHECK(dk.sizes == std::vector<long>{3, 16, 8});
  }
}
