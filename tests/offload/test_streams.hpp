// Stream variants the offload tests run against.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>

#include "oomb/offload/host_stream.hpp"

namespace oomb_test {

/// A host stream that sleeps before every work item: slow enough that a reader which skipped an
/// event wait reads before the copy lands.
struct slow_host_stream : oomb::host_stream {
  static constexpr std::chrono::microseconds delay{300};
  slow_host_stream() : oomb::host_stream(oomb::host_stream_options{delay}) {}
};

}  // namespace oomb_test
