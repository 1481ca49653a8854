// The stream-concept conformance suite: what every stream implementation must do, written once.
// SPDX-License-Identifier: Apache-2.0
//
// Instantiate it for a stream type S with
//   TEST_CASE_TEMPLATE_INVOKE(stream_conformance, S, ...);
// S is made by oomb_test::stream_factory<S>::make() (default: S{}); specialise the factory for a
// stream that needs arguments. The suite copies between plain (pageable) host buffers only, so any
// stream whose copies can reach host memory (a CUDA stream with cudaMemcpyDefault) can run it.
// Slow variants of a stream are the point: a missing wait shows up as a stale byte.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "oomb/offload/stream.hpp"

namespace oomb_test {

template <class S>
struct stream_factory {
  static S make() { return S{}; }
};

inline std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(1, 255);  // never zero: a zeroed buffer proves nothing
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(byte(rng));
  return v;
}

// Polls an event until it is ready, with a generous bound so a broken stream fails, not hangs.
template <class E>
bool becomes_ready(const E& e, std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!e.ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace oomb_test

TEST_CASE_TEMPLATE_DEFINE("stream conformance", S, stream_conformance) {
  static_assert(oomb::is_stream_v<S>, "the suite runs on streams only");
  static_assert(oomb::is_event_v<typename S::event_type>);
  static_assert(!std::is_copy_constructible_v<S>, "streams are owners: not copyable");
  static_assert(std::is_move_constructible_v<S>, "streams are owners: movable");

  S stream = oomb_test::stream_factory<S>::make();

  SUBCASE("a copy has landed once the event recorded after it is complete") {
    const auto src = oomb_test::random_bytes(4096 + 17, 11);
    std::vector<unsigned char> dst(src.size(), 0);
    stream.enqueue_copy(dst.data(), src.data(), src.size());
    auto e = stream.record();
    e.wait();
    CHECK(e.ready());
    CHECK(dst == src);
  }

  SUBCASE("work runs in the order it was enqueued: a chain of dependent copies") {
    constexpr int links = 24;
    std::vector<std::vector<unsigned char>> buf(links + 1, std::vector<unsigned char>(1000, 0));
    buf[0] = oomb_test::random_bytes(1000, 12);
    for (int i = 0; i < links; ++i) stream.enqueue_copy(buf[i + 1].data(), buf[i].data(), 1000);
    stream.record().wait();
    for (int i = 1; i <= links; ++i) CHECK(buf[i] == buf[0]);
  }

  SUBCASE("a batch lands every copy; zero-byte copies are allowed") {
    std::mt19937 rng(13);
    std::vector<std::vector<unsigned char>> src, dst;
    std::vector<oomb::copy_op> ops;
    for (int i = 0; i < 40; ++i) {
      const std::size_t n = 1 + rng() % 3000;
      src.push_back(oomb_test::random_bytes(n, 100 + static_cast<std::uint32_t>(i)));
      dst.emplace_back(n, 0);
    }
    for (std::size_t i = 0; i < src.size(); ++i) ops.push_back({dst[i].data(), src[i].data(), src[i].size()});
    ops.push_back({nullptr, nullptr, 0});
    stream.enqueue_copies(ops.data(), ops.size());
    ops.clear();  // the stream copied the batch array: the caller may reuse it at once
    stream.record().wait();
    for (std::size_t i = 0; i < src.size(); ++i) CHECK(dst[i] == src[i]);
  }

  SUBCASE("events complete in order: a later event's completion implies the earlier one's") {
    std::vector<unsigned char> a = oomb_test::random_bytes(1 << 16, 14), b(1 << 16, 0);
    std::vector<typename S::event_type> events;
    for (int i = 0; i < 8; ++i) {
      stream.enqueue_copy(b.data(), a.data(), a.size());
      events.push_back(stream.record());
    }
    events.back().wait();
    for (const auto& e : events) CHECK(e.ready());
    CHECK(oomb_test::becomes_ready(stream.record()));
  }

  SUBCASE("cross-stream wait: later work on the waiting stream sees the other stream's copy") {
    S other = oomb_test::stream_factory<S>::make();
    for (std::uint32_t round = 0; round < 6; ++round) {
      const auto x = oomb_test::random_bytes(1 << 15, 200 + round);
      std::vector<unsigned char> y(x.size(), 0), z(x.size(), 0);
      other.enqueue_copy(y.data(), x.data(), x.size());
      auto copied = other.record();
      stream.wait(copied);
      stream.enqueue_copy(z.data(), y.data(), y.size());
      stream.record().wait();
      CHECK(z == x);
      copied.wait();
    }
  }

  SUBCASE("property: a ping-pong chain across two streams ordered only by events") {
    S other = oomb_test::stream_factory<S>::make();
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
      std::mt19937 rng(seed);
      const std::size_t n = 64 + rng() % 4000;
      const int links = 8 + static_cast<int>(rng() % 24);
      std::vector<std::vector<unsigned char>> buf(static_cast<std::size_t>(links) + 1,
                                                  std::vector<unsigned char>(n, 0));
      buf[0] = oomb_test::random_bytes(n, seed * 7);
      S* streams[2] = {&stream, &other};
      typename S::event_type last = streams[1]->record();
      for (int i = 0; i < links; ++i) {
        S& s = *streams[rng() % 2];  // random stream per link: only the events keep the order
        s.wait(last);
        s.enqueue_copy(buf[static_cast<std::size_t>(i) + 1].data(), buf[static_cast<std::size_t>(i)].data(), n);
        last = s.record();
      }
      last.wait();
      CHECK(buf.back() == buf.front());
      stream.record().wait();
      other.record().wait();
    }
  }

  SUBCASE("a moved stream keeps its queue and its events") {
    const auto src = oomb_test::random_bytes(1 << 14, 15);
    std::vector<unsigned char> dst(src.size(), 0);
    stream.enqueue_copy(dst.data(), src.data(), src.size());
    auto e = stream.record();
    S moved(std::move(stream));
    auto e2 = moved.record();
    e2.wait();
    CHECK(e.ready());
    CHECK(dst == src);
    S assigned = oomb_test::stream_factory<S>::make();
    assigned = std::move(moved);
    std::vector<unsigned char> dst2(src.size(), 0);
    assigned.enqueue_copy(dst2.data(), dst.data(), dst.size());
    assigned.record().wait();
    CHECK(dst2 == src);
  }
}
