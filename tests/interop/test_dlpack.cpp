// DLPack in and out: views of DLTensor / DLManagedTensor checked at run time, the way back with a
// deleter the caller controls, and bf16 types of other libraries read without copies.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/interop/dlpack.hpp"

namespace {

/// A framework's own bfloat16 (as c10::BFloat16 is): same bits as oomb::bf16, a different type.
struct framework_bf16 {
  std::uint16_t x;
};

}  // namespace

template <>
struct oomb::bf16_layout_compatible<framework_bf16> : std::true_type {};

namespace {

DLTensor tensor(void* data, DLDataType type, std::int64_t* shape, int ndim, std::int64_t* strides = nullptr,
                DLDevice device = {kDLCPU, 0}) {
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = ndim;
  t.dtype = type;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

constexpr DLDataType f32{kDLFloat, 32, 1};

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng) + (u(rng) > 0 ? 0.25f : -0.25f);  // never 0
  return v;
}

}  // namespace

TEST_CASE("dlpack: a DLTensor becomes a tensor_view over the same memory, any strides, byte_offset applied") {
  auto buf = random_floats(4 * 6, 1);
  std::int64_t shape[2] = {4, 6};
  DLTensor t = tensor(buf.data(), f32, shape, 2);  // null strides: row-major
  const auto v = oomb::view_of<float, 2>(t);
  CHECK(v.data() == buf.data());
  CHECK(v.kind() == oomb::memory_kind::host);
  bool same = true;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) same = same && v(i, j) == buf[std::size_t(i * 6 + j)];
  CHECK(same);
  // Transposed (strides {1, 4}) over 6 x 4 elements, starting one row in through byte_offset.
  std::int64_t tshape[2] = {5, 4}, tstrides[2] = {1, 5};
  DLTensor tt = tensor(buf.data(), f32, tshape, 2, tstrides);
  tt.byte_offset = sizeof(float);
  const auto tv = oomb::view_of<const float, 2>(tt);
  same = true;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) same = same && tv(i, j) == buf[std::size_t(1 + i + j * 5)];
  CHECK(same);
  v(3, 5) = 7.5f;  // writes land in the producer's memory: no copy
  CHECK(buf[23] == 7.5f);
}

TEST_CASE("dlpack: dtype and rank are known at run time; the typed view is checked against them") {
  std::vector<std::int64_t> ids(24, 5);
  std::int64_t shape[3] = {2, 3, 4};
  DLTensor t = tensor(ids.data(), DLDataType{kDLInt, 64, 1}, shape, 3);
  const oomb::any_tensor_view a = oomb::view_of(t);
  CHECK(a.rank() == 3);
  CHECK(a.type() == oomb::dtype_of<std::int64_t>());
  CHECK(oomb::to_string(a.type()) == "int64");
  CHECK(a.size() == 24);
  CHECK(a.strides()[0] == 12);
  CHECK(a.as<std::int64_t, 3>()(1, 2, 3) == 5);
  CHECK_THROWS_WITH_AS((a.as<std::int32_t, 3>()), doctest::Contains("the tensor holds int64, the view asks for int32"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS((a.as<std::int64_t, 2>()), doctest::Contains("the tensor has 3 dimensions, the view asks for 2"),
                       oomb::invalid_argument);
}

TEST_CASE("dlpack: tensors oomb cannot view are refused, naming what is wrong") {
  float buf[16] = {};
  std::int64_t shape[9] = {2, 2, 1, 1, 1, 1, 1, 1, 1};
  CHECK_THROWS_WITH_AS(oomb::view_of(tensor(buf, DLDataType{kDLFloat, 32, 4}, shape, 2)),
                       doctest::Contains("4-lane vectors are not supported"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::view_of(tensor(buf, DLDataType{kDLComplex, 64, 1}, shape, 2)),
                       doctest::Contains("dtype code 5 is not supported"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::view_of(tensor(buf, f32, shape, 2, nullptr, DLDevice{kDLOpenCL, 0})),
                       doctest::Contains("DLPack device type 4 are not supported"), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::view_of(tensor(buf, f32, shape, 9)), doctest::Contains("a tensor of 9 dimensions"),
                       oomb::invalid_argument);
  std::int64_t negative[1] = {-3};
  CHECK_THROWS_WITH_AS(oomb::view_of(tensor(buf, f32, negative, 1)), doctest::Contains("extent -3"),
                       oomb::invalid_argument);
  DLTensor odd = tensor(buf, f32, shape, 2);
  odd.byte_offset = 2;  // floats at a 2-byte boundary
  CHECK_THROWS_WITH_AS((oomb::view_of<float, 2>(odd)), doctest::Contains("not aligned to the 4 bytes"),
                       oomb::invalid_argument);
}

TEST_CASE("dlpack: device, pinned and managed memory keep their kind and device ordinal") {
  // Never dereferenced: the views only carry the address.
  void* fake = reinterpret_cast<void*>(std::uintptr_t(1) << 40);
  std::int64_t shape[1] = {8};
  const auto d = oomb::view_of(tensor(fake, f32, shape, 1, nullptr, DLDevice{kDLCUDA, 3}));
  CHECK(d.kind() == oomb::memory_kind::device);
  CHECK(d.device() == 3);
  CHECK(oomb::view_of(tensor(fake, f32, shape, 1, nullptr, DLDevice{kDLCUDAHost, 0})).kind() ==
        oomb::memory_kind::pinned);
  CHECK(oomb::view_of(tensor(fake, f32, shape, 1, nullptr, DLDevice{kDLCUDAManaged, 1})).kind() ==
        oomb::memory_kind::pinned);
}

TEST_CASE("dlpack: bf16 tensors read as oomb::bf16 or a framework's own layout-compatible type, no copy") {
  const auto f = random_floats(3 * 5, 9);
  std::vector<oomb::bf16> bits(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) bits[i] = oomb::bf16(f[i]);
  std::int64_t shape[2] = {3, 5};
  DLTensor t = tensor(bits.data(), DLDataType{kDLBfloat, 16, 1}, shape, 2);
  const auto ours = oomb::view_of<const oomb::bf16, 2>(t);
  const auto theirs = oomb::view_of<framework_bf16, 2>(t);
  static_assert(oomb::dtype_of<framework_bf16>() == oomb::dtype_of<oomb::bf16>());
  CHECK(static_cast<void*>(theirs.data()) == static_cast<void*>(bits.data()));
  const auto back = oomb::as_bf16(theirs);  // the framework's view handed to oomb as bf16
  static_assert(std::is_same_v<decltype(back), const oomb::tensor_view<oomb::bf16, 2>>);
  bool same = true;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      same = same && theirs(i, j).x == ours(i, j).bits && back(i, j) == ours(i, j) &&
             static_cast<float>(ours(i, j)) == static_cast<float>(oomb::bf16(f[std::size_t(i * 5 + j)]));
  CHECK(same);
  CHECK_THROWS_WITH_AS((oomb::view_of<std::uint16_t, 2>(t)), doctest::Contains("holds bfloat16, the view asks for uint16"),
                       oomb::invalid_argument);
}

TEST_CASE("dlpack: to_dlpack hands a view out; the consumer's deleter frees it and tells the caller") {
  auto buf = random_floats(2 * 3 * 4, 4);
  // A head-major view of part of the buffer, as a page of a pool would be.
  const oomb::tensor_view<float, 3> v(buf.data() + 1, {2, 3, 3}, {12, 4, 1}, oomb::memory_kind::pinned);
  struct release_log {
    int calls = 0;
  } log;
  DLManagedTensor* m = oomb::to_dlpack(v, /*device=*/2, [](void* c) { ++static_cast<release_log*>(c)->calls; }, &log);
  REQUIRE(m != nullptr);
  const DLTensor& t = m->dl_tensor;
  CHECK(t.data == buf.data() + 1);
  CHECK(t.device.device_type == kDLCUDAHost);
  CHECK(t.device.device_id == 2);
  CHECK(t.ndim == 3);
  CHECK((t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1));
  CHECK((t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 3));
  CHECK((t.strides[0] == 12 && t.strides[1] == 4 && t.strides[2] == 1));
  // Round trip: the view of the managed tensor is the original view.
  const auto w = oomb::view_of<float, 3>(*m);
  CHECK(w.data() == v.data());
  CHECK(w.kind() == oomb::memory_kind::pinned);
  CHECK(w(1, 2, 2) == v(1, 2, 2));
  CHECK(log.calls == 0);
  m->deleter(m);  // what the consumer does when it is done
  CHECK(log.calls == 1);
  CHECK(buf[1] == v(0, 0, 0));  // the memory itself is untouched and still the caller's
  // Without a release hook the deleter only frees the descriptor.
  DLManagedTensor* plain = oomb::to_dlpack(oomb::tensor_view<const float, 1>::contiguous(buf.data(), {24}));
  CHECK(plain->dl_tensor.device.device_type == kDLCPU);
  plain->deleter(plain);
}
