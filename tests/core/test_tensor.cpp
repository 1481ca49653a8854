// tensor_view (indexing, strides, contiguous, bounds) and tensor_traits / as<T>() with a
// user-defined tensor type that receives block_pool pages.
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/core file that includes oomb checks bounds alike

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"

namespace {

std::vector<float> seeded_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("tensor_view: contiguous strides, size and row-major indexing") {
  auto data = seeded_values(2 * 3 * 4 * 5, 1);
  const auto v = oomb::tensor_view<float, 4>::contiguous(data.data(), {2, 3, 4, 5});
  CHECK(v.strides() == std::array<std::int64_t, 4>{60, 20, 5, 1});
  CHECK(v.shape() == std::array<std::int64_t, 4>{2, 3, 4, 5});
  CHECK(v.size() == 120);
  CHECK(v.extent(2) == 4);
  CHECK(v.kind() == oomb::memory_kind::host);
  CHECK(v.data() == data.data());
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d) REQUIRE(&v(a, b, c, d) == &data[std::size_t(((a * 3 + b) * 4 + c) * 5 + d)]);
  v(1, 2, 3, 4) = 42.0f;  // writes through
  CHECK(data.back() == 42.0f);

  const auto r1 = oomb::tensor_view<float, 1>::contiguous(data.data(), {7});
  CHECK(r1.strides()[0] == 1);
  CHECK(r1(6) == data[6]);
  static_assert(std::is_trivially_copyable_v<oomb::tensor_view<oomb::bf16, 2>>);
  static_assert(oomb::tensor_view<float, 3>::rank == 3);
  const oomb::tensor_view<double, 2> empty;
  CHECK(empty.data() == nullptr);
  CHECK(empty.size() == 0);
}

TEST_CASE("tensor_view: arbitrary strides (transpose, slices, broadcast)") {
  auto data = seeded_values(6 * 8, 2);
  const auto m = oomb::tensor_view<float, 2>::contiguous(data.data(), {6, 8});
  const oomb::tensor_view<float, 2> t(data.data(), {8, 6}, {1, 8});  // transpose
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 8; ++j) REQUIRE(t(j, i) == m(i, j));
  // Rows 2..4, every other column starting at 1: a strided slice with an offset.
  const oomb::tensor_view<float, 2> s(&m(2, 1), {3, 4}, {8, 2}, oomb::memory_kind::pinned);
  CHECK(s.kind() == oomb::memory_kind::pinned);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) REQUIRE(s(i, j) == m(2 + i, 1 + 2 * j));
  // Stride 0 broadcasts one row.
  const oomb::tensor_view<const float, 2> b(data.data(), {5, 8}, {0, 1});
  CHECK(b(4, 3) == data[3]);
  CHECK(b.size() == 40);
}

TEST_CASE("tensor_view: out-of-range indices throw naming index, extent and dimension") {
  auto data = seeded_values(3 * 4, 3);
  const auto v = oomb::tensor_view<float, 2>::contiguous(data.data(), {3, 4});
  CHECK_THROWS_WITH_AS((void)v(1, 4), doctest::Contains("index 4 out of range [0, 4) in dimension 1"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS((void)v(3, 0), doctest::Contains("index 3 out of range [0, 3) in dimension 0"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS((void)v(-1, 2), doctest::Contains("index -1 out of range [0, 3) in dimension 0"),
                       oomb::invalid_argument);
  CHECK_NOTHROW((void)v(2, 3));
  const oomb::tensor_view<float, 1> none;  // empty view: every index is out of range
  CHECK_THROWS_AS((void)none(0), oomb::invalid_argument);
}

// --- a user-defined tensor type, plugged in through tensor_traits --------------------------------

namespace user {

/// A tensor type oomb knows nothing about: dynamic rank storage, its own field names.
struct matrix {
  float* ptr = nullptr;
  std::vector<std::int64_t> dims, steps;
  bool on_device = false;
  float& at(std::int64_t r, std::int64_t c) const { return ptr[r * steps[0] + c * steps[1]]; }
};

}  // namespace user

template <>
struct oomb::tensor_traits<user::matrix> {
  using element_type = float;
  static constexpr std::size_t rank = 2;
  static float* data(const user::matrix& m) { return m.ptr; }
  static std::array<std::int64_t, 2> shape(const user::matrix& m) { return {m.dims[0], m.dims[1]}; }
  static std::array<std::int64_t, 2> strides(const user::matrix& m) { return {m.steps[0], m.steps[1]}; }
  static user::matrix make(float* p, const std::array<std::int64_t, 2>& shape,
                           const std::array<std::int64_t, 2>& strides, oomb::memory_kind kind) {
    return {p, {shape[0], shape[1]}, {strides[0], strides[1]}, kind == oomb::memory_kind::device};
  }
};

TEST_CASE("as<T>(): a user-defined tensor type receives views and pool pages") {
  auto data = seeded_values(4 * 6, 4);
  const oomb::tensor_view<float, 2> v(data.data(), {4, 3}, {6, 2}, oomb::memory_kind::device);
  const auto m = oomb::as<user::matrix>(v);
  CHECK(m.ptr == data.data());
  CHECK(m.dims == std::vector<std::int64_t>{4, 3});
  CHECK(m.steps == std::vector<std::int64_t>{6, 2});
  CHECK(m.on_device);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) REQUIRE(&m.at(i, j) == &v(i, j));
  // And back through the traits' readers.
  using tr = oomb::tensor_traits<user::matrix>;
  const auto back = oomb::tensor_view<float, 2>(tr::data(m), tr::shape(m), tr::strides(m));
  CHECK(back.strides() == v.strides());
  CHECK(back.shape() == v.shape());
  // as<tensor_view> is the identity.
  const auto same = oomb::as<oomb::tensor_view<float, 2>>(v);
  CHECK(same.data() == v.data());
  CHECK(same.kind() == oomb::memory_kind::device);

  // Pages of a block_pool handed out as the user's type: each page a [16][8] float matrix.
  oomb::host_resource host;
  auto pool = oomb::block_pool<oomb::host_resource>::contiguous(host, 16 * 8 * sizeof(float), 4);
  std::vector<user::matrix> pages;
  for (int i = 0; i < 3; ++i) {
    const auto id = pool.acquire();
    auto* p = reinterpret_cast<float*>(pool.address(id));
    const auto page = oomb::tensor_view<float, 2>::contiguous(p, {16, 8}, oomb::memory_kind::host);
    pages.push_back(oomb::as<user::matrix>(page));
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) page(r, c) = float(id * 1000 + r * 8 + c + 1);
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(pages[std::size_t(i)].ptr ==
          reinterpret_cast<float*>(pool.base() + std::size_t(i) * pool.block_bytes()));
    CHECK(!pages[std::size_t(i)].on_device);
    CHECK(pages[std::size_t(i)].at(15, 7) == float(i * 1000 + 15 * 8 + 7 + 1));
    CHECK(pages[std::size_t(i)].at(3, 2) == float(i * 1000 + 3 * 8 + 2 + 1));
  }
}
