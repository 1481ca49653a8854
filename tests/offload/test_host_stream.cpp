// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/host_stream_view.hpp"
#include "stream_conformance.hpp"
#include "test_streams.hpp"

TEST_CASE_TEMPLATE_INVOKE(stream_conformance, oomb::host_stream, oomb_test::slow_host_stream);

static_assert(oomb::is_stream_v<oomb_test::slow_host_stream>);

TEST_CASE_TEMPLATE("host stream: callables run in order with copies", S, oomb::host_stream,
                   oomb_test::slow_host_stream) {
  S s = oomb_test::stream_factory<S>::make();
  std::vector<int> order;  // touched only by the worker until the event completes
  const auto src = oomb_test::random_bytes(256, 3);
  std::vector<unsigned char> dst(256, 0);
  std::vector<unsigned char> seen;
  s.enqueue([&] { order.push_back(1); });
  s.enqueue_copy(dst.data(), src.data(), dst.size());
  s.enqueue([&] {
    order.push_back(2);
    seen = dst;  // the copy before this callable has landed
  });
  auto move_only = std::make_unique<int>(3);
  s.enqueue([&order, p = std::move(move_only)] { order.push_back(*p); });
  s.record().wait();
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(seen == src);
}

TEST_CASE("host stream: op_delay makes the worker slow") {
  oomb::host_stream slow(oomb::host_stream_options{std::chrono::milliseconds(30)});
  CHECK(slow.options().op_delay == std::chrono::milliseconds(30));
  const auto src = oomb_test::random_bytes(64, 4);
  std::vector<unsigned char> dst(64, 0);
  const auto t0 = std::chrono::steady_clock::now();
  slow.enqueue_copy(dst.data(), src.data(), dst.size());
  auto e = slow.record();
  e.wait();
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
  CHECK(dst == src);
  CHECK(slow.pending() == 0);
}

TEST_CASE("host stream: an event is not ready while the work before it is held back") {
  oomb::host_stream s;
  oomb_test::gate g;
  const auto src = oomb_test::random_bytes(64, 4);
  std::vector<unsigned char> dst(64, 0);
  s.enqueue(g.task());
  s.enqueue_copy(dst.data(), src.data(), dst.size());
  auto e = s.record();
  CHECK_FALSE(e.ready());
  CHECK(s.pending() == 3);  // the gate (running), the copy, the event
  g.open();
  e.wait();
  CHECK(e.ready());
  CHECK(dst == src);
}

TEST_CASE("host stream: a reader that skips the event sees stale data") {
  // The harness itself must be able to fail: without the wait the compute side reads early.
  oomb::host_stream copy, compute;
  oomb_test::gate g;
  const auto src = oomb_test::random_bytes(128, 5);
  std::vector<unsigned char> slot(128, 0);
  std::vector<unsigned char> early, late;
  copy.enqueue(g.task());
  copy.enqueue_copy(slot.data(), src.data(), slot.size());
  auto copied = copy.record();
  compute.enqueue([&] { early = slot; });  // no wait: races the copy and loses
  compute.record().wait();
  g.open();
  compute.wait(copied);
  compute.enqueue([&] { late = slot; });
  compute.record().wait();
  CHECK(early != src);
  CHECK(late == src);
}

TEST_CASE("host stream: an error surfaces from later events and synchronize, then clears") {
  oomb::host_stream s;
  int ran_after = 0;
  auto before = s.record();
  s.enqueue([] { throw std::runtime_error("boom in work item"); });
  s.enqueue([&] { ++ran_after; });  // skipped: the stream failed
  auto after = s.record();
  before.wait();  // recorded before the failure: completes cleanly
  CHECK_FALSE(before.failed());
  CHECK_THROWS_WITH_AS(after.wait(), "boom in work item", std::runtime_error);
  CHECK(after.failed());
  CHECK_THROWS_WITH_AS(after.wait(), "boom in work item", std::runtime_error);  // every time
  CHECK_THROWS_WITH_AS(s.synchronize(), "boom in work item", std::runtime_error);
  CHECK(ran_after == 0);
  // synchronize() cleared the error: the stream runs work again.
  s.enqueue([&] { ++ran_after; });
  s.synchronize();
  CHECK(ran_after == 1);
  CHECK_NOTHROW(s.record().wait());
}

TEST_CASE("host stream: an error crosses streams through wait()") {
  oomb::host_stream producer, consumer;
  int consumed = 0;
  producer.enqueue([] { throw oomb::out_of_memory("producer failed"); });
  auto e = producer.record();
  consumer.wait(e);
  consumer.enqueue([&] { ++consumed; });  // depends on failed work: skipped
  auto c = consumer.record();
  CHECK_THROWS_AS(c.wait(), oomb::out_of_memory);
  CHECK(consumed == 0);
  CHECK_THROWS_AS(consumer.synchronize(), oomb::out_of_memory);
  CHECK_THROWS_AS(producer.synchronize(), oomb::out_of_memory);
  consumer.wait(producer.record());  // producer is clean again
  consumer.enqueue([&] { ++consumed; });
  consumer.synchronize();
  CHECK(consumed == 1);
}

TEST_CASE("host stream: bad copies are refused at enqueue time, naming them") {
  oomb::host_stream s;
  std::vector<unsigned char> buf(64, 1);
  CHECK_THROWS_AS(s.enqueue_copy(nullptr, buf.data(), 8), oomb::invalid_argument);
  CHECK_THROWS_AS(s.enqueue_copy(buf.data(), nullptr, 8), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(s.enqueue_copy(buf.data() + 4, buf.data(), 8),
                       doctest::Contains("overlapping"), oomb::invalid_argument);
  CHECK_NOTHROW(s.enqueue_copy(buf.data() + 8, buf.data(), 8));  // touching, not overlapping
  CHECK_NOTHROW(s.enqueue_copy(nullptr, nullptr, 0));
  oomb::copy_op ops[2] = {{buf.data() + 32, buf.data(), 16}, {buf.data() + 40, nullptr, 4}};
  CHECK_THROWS_WITH_AS(s.enqueue_copies(ops, 2), doctest::Contains("copy 1 of 4 bytes"),
                       oomb::invalid_argument);
  CHECK_THROWS_AS(s.enqueue_copies(nullptr, 3), oomb::invalid_argument);
  s.synchronize();  // the refused batch enqueued nothing: no error, and buf got only the good copy
  CHECK(buf[40] == 1);
}

TEST_CASE("host stream: a moved-from stream refuses work; destruction drains the queue") {
  std::atomic<int> ran{0};
  oomb::host_event last;
  {
    oomb::host_stream s(oomb::host_stream_options{std::chrono::milliseconds(2)});
    for (int i = 0; i < 10; ++i) s.enqueue([&] { ran.fetch_add(1); });
    last = s.record();
    oomb::host_stream t(std::move(s));
    CHECK_THROWS_AS(s.record(), oomb::invalid_argument);  // NOLINT(bugprone-use-after-move)
    CHECK_THROWS_AS(s.enqueue([] {}), oomb::invalid_argument);
  }  // t's destructor runs what is queued, then joins
  CHECK(ran.load() == 10);
  CHECK(last.ready());
  CHECK_NOTHROW(last.wait());
}

TEST_CASE("host stream: a default event is complete; waiting on it is free") {
  oomb::host_event e;
  CHECK(e.ready());
  CHECK_FALSE(e.failed());
  CHECK_NOTHROW(e.wait());
  oomb::host_stream s;
  s.wait(e);
  CHECK(s.pending() == 0);  // nothing was enqueued for a complete event
}

TEST_CASE("host stream: enqueueing from several threads is safe") {
  oomb::host_stream s;
  std::atomic<int> sum{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) s.enqueue([&sum, t] { sum.fetch_add(t + 1); });
      s.record();  // records from several threads too
    });
  for (auto& th : threads) th.join();
  s.synchronize();
  CHECK(sum.load() == 200 * (1 + 2 + 3 + 4));
}

TEST_CASE("host_stream_view: a non-owning view, by value, of a host stream") {
  static_assert(std::is_trivially_copyable_v<oomb::host_stream_view>);
  static_assert(!std::is_constructible_v<oomb::host_stream_view, std::nullptr_t>);
  static_assert(std::is_convertible_v<oomb::host_stream&, oomb::host_stream_view>);
  oomb::host_stream a, b;
  const oomb::host_stream_view va(a), va2 = a, vb(b);
  CHECK(va == va2);
  CHECK(va != vb);
  CHECK(&va.get() == &a);
  int x = 0;
  oomb_test::gate g;
  b.enqueue(g.task());
  const oomb::host_event held = vb.record();
  va.wait(held);  // work on `a` after this waits for `b`
  va.enqueue([&x] { x = 1; });
  const oomb::host_event done = va.record();
  CHECK_FALSE(done.ready());
  g.open();
  done.wait();
  CHECK(x == 1);
}
