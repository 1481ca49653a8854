// Stream variants the offload tests run against.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <future>

#include "oomb/offload/host_stream.hpp"

namespace oomb_test {

/// A host stream that sleeps before every work item: slow enough that a reader which skipped an
/// event wait reads before the copy lands.
struct slow_host_stream : oomb::host_stream {
  static constexpr std::chrono::microseconds delay{300};
  slow_host_stream() : oomb::host_stream(oomb::host_stream_options{delay}) {}
};

/// Holds a stream at a point of its queue until open(): makes "still in flight" deterministic.
struct gate {
  std::promise<void> promise;
  std::shared_future<void> opened = promise.get_future().share();
  /// Enqueue this on a host stream: its later work waits until open().
  auto task() const {
    return [f = opened] { f.wait(); };
  }
  void open() { promise.set_value(); }
};

}  // namespace oomb_test
