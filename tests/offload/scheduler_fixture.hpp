// Two host tiers, three host streams and a residency scheduler, for the scheduler tests.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/residency_scheduler.hpp"

namespace oomb_test {

using far_pool = oomb::block_pool<oomb::host_resource>;

/// Word k of page `page` at content version `version`: zero for version 0 (a page never written:
/// what a zero fill leaves), never zero otherwise, and different for every (page, version, k).
inline std::uint32_t content_word(std::int32_t page, std::uint32_t version, std::size_t k) {
  if (version == 0) return 0;
  std::uint32_t x = static_cast<std::uint32_t>(page) * 2654435761u ^ version * 40503u ^
                    static_cast<std::uint32_t>(k) * 2246822519u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return x | 1u;
}

inline void write_content(std::byte* p, std::size_t bytes, std::int32_t page, std::uint32_t version) {
  for (std::size_t k = 0; k < bytes / 4; ++k) {
    const std::uint32_t w = content_word(page, version, k);
    std::memcpy(p + 4 * k, &w, 4);
  }
}

inline bool has_content(const std::byte* p, std::size_t bytes, std::int32_t page, std::uint32_t version) {
  for (std::size_t k = 0; k < bytes / 4; ++k) {
    std::uint32_t w;
    std::memcpy(&w, p + 4 * k, 4);
    if (w != content_word(page, version, k)) return false;
  }
  return true;
}

/// Delays (microseconds) of the three streams: which side is slow decides which missing wait a
/// test exposes (slow copies: a reader not waiting for a copy; slow compute: a copy or write-back
/// not waiting for the compute work that used the slot).
template <int In, int Out, int Compute>
struct stream_delays {
  static constexpr int in = In, out = Out, compute = Compute;
};
using fast_streams = stream_delays<0, 0, 0>;
using slow_copies = stream_delays<300, 300, 0>;
using slow_compute = stream_delays<0, 0, 300>;

/// Homes, streams and a scheduler over `Backend` (host_backend or one that derives from it) with
/// eviction policy `Eviction`.
template <class Delays = fast_streams, class Backend = oomb::host_backend, class Eviction = oomb::lru_eviction>
struct tiers {
  using scheduler_type = oomb::residency_scheduler<Backend, Eviction>;

  tiers(std::int32_t pages, std::int32_t slots, std::size_t page_bytes = 512, Backend backend = Backend{})
      : far(far_pool::contiguous(mem, page_bytes, pages)),
        copy_in(options(Delays::in)),
        copy_out(options(Delays::out)),
        compute(options(Delays::compute)),
        sched(far, mem, slots, copy_in, copy_out, std::move(backend)) {
    ids.resize(static_cast<std::size_t>(pages));
    far.acquire(pages, ids.data());
  }

  static oomb::host_stream_options options(int us) {
    return oomb::host_stream_options{std::chrono::microseconds(us)};
  }

  std::byte* home(std::int32_t page) const { return far.address(page); }
  std::byte* slot(std::int32_t s) const { return sched.near_pool().address(s); }
  std::size_t bytes() const { return far.block_bytes(); }

  /// Writes version `v` into the home of `page` on the host (the streams must be idle for it).
  void stamp_home(std::int32_t page, std::uint32_t v) { write_content(home(page), bytes(), page, v); }

  /// Enqueues on `compute` a check that slot `s` holds (page, v); counts mismatches in `bad`.
  void check_on_compute(std::int32_t s, std::int32_t page, std::uint32_t v) {
    std::byte* p = slot(s);
    const std::size_t n = bytes();
    compute.enqueue([this, p, n, page, v] {
      if (!has_content(p, n, page, v)) bad.fetch_add(1);
    });
  }
  /// Enqueues on `compute`: check (page, v) (unless `overwrite`), then write (page, v + 1).
  void update_on_compute(std::int32_t s, std::int32_t page, std::uint32_t v, bool overwrite = false) {
    std::byte* p = slot(s);
    const std::size_t n = bytes();
    compute.enqueue([this, p, n, page, v, overwrite] {
      if (!overwrite && !has_content(p, n, page, v)) bad.fetch_add(1);
      write_content(p, n, page, v + 1);
    });
  }

  void settle() {
    compute.synchronize();
    sched.drain();
  }

  oomb::host_resource mem;
  far_pool far;
  oomb::host_stream copy_in, copy_out, compute;
  scheduler_type sched;
  std::vector<std::int32_t> ids;
  std::atomic<int> bad{0};
};

}  // namespace oomb_test
