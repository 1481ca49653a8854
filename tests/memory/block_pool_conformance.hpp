// The block_pool conformance check: seeded random acquire / acquire(n) / release sequences,
// including bad releases and resource exhaustion mid-growth, against a simple model, over any
// memory resource.
// SPDX-License-Identifier: Apache-2.0
//
// oomb_test::block_pool_sequence<Upstream>(seed, contiguous) runs one sequence on a
// block_pool<limiting_adaptor<statistics_adaptor<Upstream>>>; the pool's memory is touched only
// through resource_traits<Upstream>::write/read (resource_conformance.hpp), so device memory is
// stamped and checked through cudaMemcpy. Checked after every step: ids (fresh ones ascending,
// released ones LIFO), owns(), in_use/available/reserved/high water, stats().reserved_bytes against
// the bytes the resource handed out, every block in use keeps its stamp, and blocks in use occupy
// disjoint address ranges; at the end, every byte went back to the resource.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/limiting_adaptor.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "resource_conformance.hpp"

namespace oomb_test {

// A block is stamped with a 32-bit tag repeated, so overlap or a lost block shows on release.
template <class Traits>
void stamp_block(std::byte* p, std::size_t bytes, std::uint32_t tag) {
  std::vector<std::uint32_t> words(bytes / sizeof tag, tag);
  Traits::write(p, words.data(), words.size() * sizeof tag);
}

inline bool has_stamp(const unsigned char* p, std::size_t bytes, std::uint32_t tag) {
  for (std::size_t i = 0; i + sizeof tag <= bytes; i += sizeof tag) {
    std::uint32_t x;
    std::memcpy(&x, p + i, sizeof x);
    if (x != tag) return false;
  }
  return true;
}

template <class Traits>
bool block_has_stamp(const std::byte* p, std::size_t bytes, std::uint32_t tag) {
  std::vector<unsigned char> back(bytes);
  Traits::read(back.data(), p, bytes);
  return has_stamp(back.data(), bytes, tag);
}

// Plain loops and one REQUIRE per property: thousands of steps stay fast (and under sanitizers).
// Contents are read slab by slab (blocks_per_slab() ids are contiguous in memory), one read each.
template <class Traits, class Pool>
void check_pool_model(const Pool& pool, const std::map<std::int32_t, std::uint32_t>& model) {
  REQUIRE(pool.in_use() == static_cast<std::int32_t>(model.size()));
  // free + used = capacity
  REQUIRE(pool.available() + pool.in_use() == pool.capacity());
  REQUIRE(pool.reserved() <= pool.capacity());
  REQUIRE(pool.stats().high_water >= pool.in_use());
  REQUIRE(pool.stats().in_use == pool.in_use());
  bool owners_agree = true;
  for (std::int32_t id = 0; id < pool.reserved(); ++id)
    owners_agree = owners_agree && pool.owns(id) == (model.count(id) == 1);
  REQUIRE(owners_agree);
  // Blocks in use occupy disjoint address ranges and keep their contents.
  const std::size_t block = pool.block_bytes();
  std::vector<unsigned char> slab;
  std::int32_t loaded = -1;  // first id of the slab in `slab`
  bool intact = true;
  for (const auto& kv : model) {  // ascending ids: each slab with a block in use is read once
    const std::int32_t first = kv.first / pool.blocks_per_slab() * pool.blocks_per_slab();
    if (first != loaded) {
      const std::int32_t count = std::min(pool.blocks_per_slab(), pool.reserved() - first);
      slab.resize(std::size_t(count) * block);
      Traits::read(slab.data(), pool.address(first), slab.size());
      loaded = first;
    }
    intact = intact && has_stamp(slab.data() + std::size_t(kv.first - first) * block, block, kv.second);
  }
  REQUIRE(intact);
  std::vector<const std::byte*> starts;
  for (const auto& kv : model) starts.push_back(pool.address(kv.first));
  std::sort(starts.begin(), starts.end());
  bool disjoint = true;
  for (std::size_t i = 1; i < starts.size(); ++i) disjoint = disjoint && starts[i] >= starts[i - 1] + block;
  REQUIRE(disjoint);
}

/// One seeded sequence of `steps` operations on a contiguous or growing pool over Upstream.
template <class Upstream>
void block_pool_sequence(std::uint64_t seed, bool contiguous, int steps = 1500) {
  using traits = resource_traits<Upstream>;
  using counted = oomb::statistics_adaptor<Upstream>;
  using limited = oomb::limiting_adaptor<counted>;
  CAPTURE(seed);
  CAPTURE(contiguous);
  std::mt19937_64 rng(seed);
  const std::size_t block = std::size_t(16) << (rng() % 4);  // 16..128 bytes
  const std::int32_t capacity = 1 + static_cast<std::int32_t>(rng() % 200);
  const std::int32_t per_slab = 1 + static_cast<std::int32_t>(rng() % 16);
  // The resource may run out before the pool's capacity: growth then fails mid-way.
  const std::size_t limit = block * (1 + rng() % (2 * std::size_t(capacity)));
  typename traits::holder up;
  counted stats(up.get());
  {
    limited lim(stats, contiguous ? block * std::size_t(capacity) : limit);
    auto pool = contiguous ? oomb::block_pool<limited>::contiguous(lim, block, capacity, 64)
                           : oomb::block_pool<limited>::growing(lim, block, per_slab, capacity, 64);
    REQUIRE(pool.kind == Upstream::kind);
    std::map<std::int32_t, std::uint32_t> model;  // id -> tag written into it
    std::uint32_t next_tag = 1;
    std::int32_t expected_fresh = 0;  // a fresh id is the lowest never handed out
    std::vector<std::int32_t> released;  // LIFO model of released ids
    std::vector<std::int32_t> out;
    for (int step = 0; step < steps; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4) {  // acquire one
        const bool can = !released.empty() || pool.reserved() > expected_fresh ||
                         pool.reserved() < capacity;
        try {
          const auto id = pool.acquire();
          REQUIRE(can);
          REQUIRE(model.count(id) == 0);
          if (!released.empty()) {
            REQUIRE(id == released.back());
            released.pop_back();
          } else {
            REQUIRE(id == expected_fresh);
            ++expected_fresh;
          }
          stamp_block<traits>(pool.address(id), block, next_tag);
          model[id] = next_tag++;
        } catch (const oomb::out_of_memory&) {
          REQUIRE(released.empty());  // refused only with nothing free
        }
      } else if (op < 6) {  // acquire n, all or nothing
        const auto n = static_cast<std::int32_t>(rng() % 12);
        out.assign(std::size_t(n) + 1, -5);
        const auto before = model.size();
        try {
          pool.acquire(n, out.data());
          for (std::int32_t i = 0; i < n; ++i) {
            const auto id = out[std::size_t(i)];
            REQUIRE(model.count(id) == 0);
            if (!released.empty()) {
              REQUIRE(id == released.back());
              released.pop_back();
            } else {
              REQUIRE(id == expected_fresh);
              ++expected_fresh;
            }
            stamp_block<traits>(pool.address(id), block, next_tag);
            model[id] = next_tag++;
          }
          REQUIRE(out[std::size_t(n)] == -5);  // wrote exactly n ids
        } catch (const oomb::out_of_memory&) {
          REQUIRE(model.size() == before);
          REQUIRE(std::all_of(out.begin(), out.end(), [](std::int32_t x) { return x == -5; }));
        }
      } else if (op < 9) {  // release one in use
        if (model.empty()) continue;
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        REQUIRE(block_has_stamp<traits>(pool.address(it->first), block, it->second));
        pool.release(it->first);
        released.push_back(it->first);
        model.erase(it);
      } else {  // a bad release: twice, never acquired, or out of range
        const std::int32_t bad = static_cast<std::int32_t>(rng() % (std::uint64_t(capacity) + 10)) - 5;
        if (model.count(bad)) continue;
        CHECK_THROWS_AS(pool.release(bad), oomb::invalid_argument);
      }
      check_pool_model<traits>(pool, model);
      REQUIRE(pool.stats().reserved_bytes == stats.statistics().bytes_in_use);
      REQUIRE(lim.bytes_in_use() == stats.statistics().bytes_in_use);
    }
  }
  // Nothing leaked: the pool gave every slab back.
  CHECK(stats.statistics().bytes_in_use == 0);
  CHECK(stats.statistics().allocations_in_use == 0);
}

}  // namespace oomb_test
