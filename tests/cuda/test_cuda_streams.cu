// cuda_stream / cuda_event / cuda_stream_view: the stream concept's conformance suite and more.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda_test_util.cuh"
#include "offload/stream_conformance.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/memcpy_batch.hpp"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"

using namespace oomb_cuda_test;

static_assert(oomb::is_stream_v<oomb::cuda_stream>);
static_assert(oomb::is_stream_v<oomb::cuda_stream_view>);
static_assert(oomb::is_stream_v<slow_cuda_stream>);
static_assert(oomb::is_event_v<oomb::cuda_event>);
static_assert(!std::is_copy_constructible_v<oomb::cuda_event>);
static_assert(std::is_nothrow_move_constructible_v<oomb::cuda_event>);
// The view: no construction from 0 or nullptr (the legacy default stream by accident).
static_assert(!std::is_constructible_v<oomb::cuda_stream_view, int>);
static_assert(!std::is_constructible_v<oomb::cuda_stream_view, std::nullptr_t>);
static_assert(std::is_constructible_v<oomb::cuda_stream_view, cudaStream_t>);
static_assert(!std::is_convertible_v<cudaStream_t, oomb::cuda_stream_view>);  // explicit
static_assert(std::is_trivially_copyable_v<oomb::cuda_stream_view>);
static_assert(std::is_convertible_v<const oomb::cuda_stream&, oomb::cuda_stream_view>);

TEST_CASE_TEMPLATE_INVOKE(stream_conformance, oomb::cuda_stream, slow_cuda_stream);

TEST_CASE("memcpy_batch_async: report whether the batch API fell back to single copies") {
  // Not a requirement (the suite above copies pageable memory, which some drivers refuse to batch);
  // the count says which path the conformance suite took on this machine.
  MESSAGE("cudaMemcpyBatchAsync fallbacks so far: ", oomb::memcpy_batch_fallbacks());
  CHECK(oomb::memcpy_batch_fallbacks() < 1000000);
}

TEST_CASE("cuda_stream: events order work across streams; the host never waits in the middle") {
  oomb::cuda_stream a, b;
  oomb::pinned_resource pinned;
  const std::size_t n = 8 << 20;
  auto* src = static_cast<unsigned char*>(pinned.allocate(n, 256));
  auto* dst = static_cast<unsigned char*>(pinned.allocate(n, 256));
  fill_random(src, n, 42);
  std::memset(dst, 0, n);
  device_buffer<unsigned char> mid(n);
  // a: a slow kernel, then host -> device. b waits for a's event, then device -> host.
  enqueue_delay(a.get(), 20'000'000);  // 20 ms
  a.enqueue_copy(mid.ptr, src, n);
  oomb::cuda_event landed = a.record();
  CHECK_FALSE(landed.ready());  // the delay is still running: a non-blocking query says so
  b.wait(landed);
  b.enqueue_copy(dst, mid.ptr, n);
  oomb::cuda_event done = b.record();
  CHECK_FALSE(done.ready());
  done.wait();
  CHECK(landed.ready());
  CHECK(std::memcmp(src, dst, n) == 0);
  // re-recording an existing event
  oomb::cuda_event again;
  CHECK(again.ready());  // empty: complete
  a.record(again);
  again.wait();
  CHECK(a.ready());
  pinned.deallocate(src, n, 256);
  pinned.deallocate(dst, n, 256);
}

TEST_CASE("cuda_stream: memset and batches of scattered device/pinned copies land in stream order") {
  oomb::cuda_stream s(oomb::cuda_stream::greatest_priority());
  oomb::pinned_resource pinned;
  const std::size_t page = 24 << 10, pages = 300;
  auto* host = static_cast<unsigned char*>(pinned.allocate(page * pages, 256));
  auto* back = static_cast<unsigned char*>(pinned.allocate(page * pages, 256));
  fill_random(host, page * pages, 7);
  device_buffer<unsigned char> dev(page * pages);
  std::vector<std::size_t> perm(pages);
  for (std::size_t i = 0; i < pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  std::vector<oomb::copy_op> in, out;
  for (std::size_t i = 0; i < pages; ++i) {
    in.push_back({dev.ptr + perm[i] * page, host + i * page, page});
    out.push_back({back + i * page, dev.ptr + perm[i] * page, page});
  }
  s.enqueue_memset(back, 0, page * pages);
  s.enqueue_copies(in.data(), in.size());
  s.enqueue_copies(out.data(), out.size());
  s.synchronize();
  CHECK(std::memcmp(host, back, page * pages) == 0);
  s.enqueue_memset(dev.ptr, 0, page * pages);
  s.enqueue_copies(out.data(), out.size());
  s.synchronize();
  bool zero = true;
  for (std::size_t i = 0; i < page * pages; ++i) zero &= back[i] == 0;
  CHECK(zero);
  pinned.deallocate(host, page * pages, 256);
  pinned.deallocate(back, page * pages, 256);
}

TEST_CASE("cuda_stream_view: names a stream without owning it; default streams only by name") {
  oomb::cuda_stream owner;
  oomb::cuda_stream_view v = owner;
  CHECK(v.get() == owner.get());
  CHECK(v == owner.view());
  oomb::cuda_stream_view copy = v;
  CHECK(copy == v);
  CHECK(oomb::cuda_stream_view::per_thread().get() == cudaStreamPerThread);
  CHECK(oomb::cuda_stream_view::legacy_default().get() == cudaStreamLegacy);
  std::vector<unsigned char> x(4096, 3), y(4096, 0);
  v.enqueue_copy(y.data(), x.data(), x.size());
  v.synchronize();
  CHECK(y == x);
  oomb::cuda_stream moved(std::move(owner));
  CHECK(moved.get() == v.get());
  CHECK_THROWS_AS((void)owner.view(), oomb::invalid_argument);  // NOLINT: use after move, on purpose
}
