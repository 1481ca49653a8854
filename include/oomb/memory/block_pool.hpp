// oomb — fixed-size blocks carved from slabs, named by int32 ids.
// SPDX-License-Identifier: Apache-2.0
//
// Thread safety: a block_pool is NOT internally synchronised. acquire() and release() need
// external synchronisation against every other call on the same pool; const calls may run
// concurrently with each other. The address of an acquired block never changes until it is
// released or the pool is destroyed (slabs never move), so kernels and copy engines may use it
// while other threads wait for the pool's lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/memory/growable_resource.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

/// Counters of a block_pool, in blocks unless named bytes.
struct block_pool_stats {
  std::int32_t in_use = 0;        ///< blocks acquired and not yet released
  std::int32_t high_water = 0;    ///< most blocks ever in use at once
  std::int32_t reserved = 0;      ///< blocks with memory behind them (in use + free)
  std::int32_t capacity = 0;      ///< most blocks the pool may ever hold
  std::size_t block_bytes = 0;
  std::size_t reserved_bytes = 0; ///< bytes taken from the resource
  std::int32_t index_growths = 0; ///< reallocations of the id bookkeeping (geometric: O(log reserved))
};

/// A pool of equal blocks over a memory resource, with O(1) acquire and release.
///
/// Three layouts:
///  - contiguous: one range holding `capacity` blocks, taken from the resource up front, so that
///    `address(id) == base() + int64(id) * block_bytes()` — the layout kernels index directly;
///  - growable: the same single range, but only address space for `capacity` blocks is reserved up
///    front and memory is committed `blocks_per_step` blocks at a time as needed (a growable
///    resource, see growable_resource.hpp: CUDA's virtual-memory API on the GPU); base() never moves;
///  - growing: slabs of `blocks_per_slab` blocks, taken as needed, up to `capacity` blocks.
/// Slabs are aligned to `alignment`; a block is aligned to the largest power of two dividing both
/// `alignment` and `block_bytes`.
/// Ids are dense int32 in [0, reserved()); a fresh pool hands them out in ascending order, a
/// released id is handed out again first (LIFO: warm memory, and runs of neighbouring ids).
/// generation(id) counts the releases of an id, so a cache keyed by ids (the residency scheduler)
/// tells a reused id from the page it held before without being told.
template <class Resource>
class block_pool {
  static_assert(is_memory_resource_v<Resource>, "block_pool needs a memory resource");

 public:
  using resource_type = Resource;
  static constexpr memory_kind kind = Resource::kind;
  static constexpr std::int32_t unlimited = std::numeric_limits<std::int32_t>::max();

  /// One range of `capacity` blocks, allocated now; `base() + id * block_bytes` addresses block id.
  static block_pool contiguous(Resource& resource, std::size_t block_bytes, std::int32_t capacity,
                               std::size_t alignment = 256) {
    OOMB_EXPECTS(capacity > 0, "block_pool: capacity must be positive, got ", capacity);
    block_pool pool(resource, block_bytes, capacity, capacity, alignment, true);
    pool.grow();
    return pool;
  }

  /// One range reserved for `capacity` blocks whose memory is committed `blocks_per_step` blocks at
  /// a time, on demand; `base() + id * block_bytes` addresses block id and base() never moves.
  /// Needs a growable resource (is_growable_resource_v).
  static block_pool growable(Resource& resource, std::size_t block_bytes, std::int32_t blocks_per_step,
                             std::int32_t capacity, std::size_t alignment = 256) {
    static_assert(is_growable_resource_v<Resource>,
                  "block_pool::growable needs a growable resource (reserve/commit/unreserve)");
    OOMB_EXPECTS(blocks_per_step > 0, "block_pool: blocks_per_step must be positive, got ",
                 blocks_per_step);
    OOMB_EXPECTS(capacity > 0, "block_pool: capacity must be positive, got ", capacity);
    block_pool pool(resource, block_bytes, capacity, capacity, alignment, true);
    pool.grow_step_ = std::min(blocks_per_step, capacity);
    pool.slabs_.reserve(1);
    pool.slabs_.push_back(static_cast<std::byte*>(resource.reserve(pool.slab_bytes(), alignment)));
    return pool;
  }

  /// Slabs of `blocks_per_slab` blocks allocated on demand, never more than `capacity` blocks.
  static block_pool growing(Resource& resource, std::size_t block_bytes, std::int32_t blocks_per_slab,
                            std::int32_t capacity = unlimited, std::size_t alignment = 256) {
    OOMB_EXPECTS(blocks_per_slab > 0, "block_pool: blocks_per_slab must be positive, got ",
                 blocks_per_slab);
    OOMB_EXPECTS(capacity > 0, "block_pool: capacity must be positive, got ", capacity);
    return block_pool(resource, block_bytes, std::min(blocks_per_slab, capacity), capacity, alignment,
                      false);
  }

  block_pool(const block_pool&) = delete;
  block_pool& operator=(const block_pool&) = delete;
  block_pool(block_pool&& o) noexcept { swap(o); }
  block_pool& operator=(block_pool&& o) noexcept {
    if (this != &o) {
      block_pool tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~block_pool() { release_slabs(); }

  /// Takes one free block. Throws out_of_memory (pool unchanged) when the capacity is reached or
  /// the resource cannot provide another slab.
  std::int32_t acquire() {
    if (free_.empty() && fresh_ == reserved()) {
      OOMB_CHECK(reserved() < capacity_, out_of_memory, "block_pool: asked for 1 block of ",
                 block_bytes_, " bytes, 0 left of capacity ", capacity_, " (", in_use_, " in use)");
      grow();
    }
    const std::int32_t id = take_free();
    mark_acquired(id);
    return id;
  }

  /// Takes `count` blocks at once, all or nothing, writing their ids to `out`. Throws
  /// out_of_memory naming what was asked and what is left (pool unchanged).
  void acquire(std::int32_t count, std::int32_t* out) {
    OOMB_EXPECTS(count >= 0, "block_pool: cannot acquire a negative count (", count, ")");
    const std::int64_t left = available();
    OOMB_CHECK(count <= left, out_of_memory, "block_pool: asked for ", count, " blocks of ",
               block_bytes_, " bytes, ", left, " left of capacity ", capacity_, " (", in_use_,
               " in use)");
    while (free_count() < count) grow();
    for (std::int32_t i = 0; i < count; ++i) {
      out[i] = take_free();
      mark_acquired(out[i]);
    }
  }

  /// Returns a block. Throws invalid_argument (pool unchanged) for an id out of range, never
  /// acquired, or already released.
  void release(std::int32_t id) {
    OOMB_EXPECTS(owns(id), "block_pool: release of block ", id,
                 id >= 0 && id < reserved() ? " which is not in use (released twice?)"
                                            : " which this pool never handed out",
                 " (reserved ", reserved(), ")");
    used_[static_cast<std::size_t>(id)] = 0;
    ++generation_[static_cast<std::size_t>(id)];
    free_.push_back(id);  // never reallocates: grow() keeps room for every reserved id
    --in_use_;
  }

  /// True when `id` is currently acquired from this pool.
  bool owns(std::int32_t id) const noexcept {
    return id >= 0 && id < reserved() && used_[static_cast<std::size_t>(id)] != 0;
  }

  /// How many times `id` was released: a holder of an id that remembers its generation knows the id
  /// was released (and maybe handed out again) when the two differ. 0 for ids not reserved.
  std::uint32_t generation(std::int32_t id) const noexcept {
    return id >= 0 && id < reserved() ? generation_[static_cast<std::size_t>(id)] : 0;
  }

  /// Address of block `id` (which must be below reserved()).
  std::byte* address(std::int32_t id) const {
#if OOMB_ENABLE_BOUNDS_CHECKS
    OOMB_EXPECTS(id >= 0 && id < reserved(), "block_pool: block id ", id, " out of range [0, ",
                 reserved(), ")");
#endif
    const auto slab = static_cast<std::size_t>(id / blocks_per_slab_);
    const auto within = static_cast<std::size_t>(id % blocks_per_slab_);
    return slabs_[slab] + within * block_bytes_;
  }

  /// Start of the single range of a contiguous pool; throws for a growing pool.
  std::byte* base() const {
    OOMB_EXPECTS(contiguous_, "block_pool: base() exists only for a contiguous pool");
    return slabs_.front();
  }

  /// True for the contiguous and growable layouts: base() exists and never moves.
  bool is_contiguous() const noexcept { return contiguous_; }
  /// True for the growable layout (memory committed in steps behind one reserved range).
  bool is_growable() const noexcept { return grow_step_ != 0; }
  std::size_t block_bytes() const noexcept { return block_bytes_; }
  std::size_t alignment() const noexcept { return alignment_; }
  std::int32_t blocks_per_slab() const noexcept { return blocks_per_slab_; }
  std::int32_t capacity() const noexcept { return capacity_; }
  std::int32_t in_use() const noexcept { return in_use_; }
  /// Blocks with memory behind them, in use or free.
  std::int32_t reserved() const noexcept { return static_cast<std::int32_t>(used_.size()); }
  /// Blocks that can still be acquired (free now, or still allowed to be grown).
  std::int32_t available() const noexcept { return capacity_ - in_use_; }
  Resource& resource() const noexcept { return *resource_; }

  block_pool_stats stats() const noexcept {
    return {in_use_,      high_water_, reserved(), capacity_, block_bytes_,
            static_cast<std::size_t>(reserved()) * block_bytes_, index_growths_};
  }

 private:
  block_pool(Resource& r, std::size_t block_bytes, std::int32_t per_slab, std::int32_t capacity,
             std::size_t alignment, bool contiguous)
      : resource_(&r), block_bytes_(block_bytes), alignment_(alignment),
        blocks_per_slab_(per_slab), capacity_(capacity), contiguous_(contiguous) {
    OOMB_EXPECTS(block_bytes > 0, "block_pool: block_bytes must be positive");
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "block_pool: alignment must be a power of two, got ", alignment);
    OOMB_EXPECTS(block_bytes <= std::numeric_limits<std::size_t>::max() / static_cast<std::size_t>(per_slab),
                 "block_pool: a slab of ", per_slab, " blocks of ", block_bytes,
                 " bytes overflows std::size_t");
  }

  std::size_t slab_bytes() const noexcept {
    return static_cast<std::size_t>(blocks_per_slab_) * block_bytes_;
  }
  // Bytes of slab i: full slabs, except a growing pool's last one, which holds only the blocks
  // left below the capacity (so no memory is taken for ids that can never exist).
  std::size_t slab_bytes(std::size_t i) const noexcept {
    const std::int64_t first = static_cast<std::int64_t>(i) * blocks_per_slab_;
    const std::int64_t count = std::min<std::int64_t>(blocks_per_slab_, capacity_ - first);
    return static_cast<std::size_t>(count) * block_bytes_;
  }

  // Free ids: released ones first (the stack, LIFO), then the fresh ids [fresh_, reserved()) in
  // ascending order, so a fresh pool hands out 0, 1, 2, ... even when acquire(n) grows mid-way.
  std::int64_t free_count() const noexcept {
    return static_cast<std::int64_t>(free_.size()) + (reserved() - fresh_);
  }
  std::int32_t take_free() noexcept {
    if (free_.empty()) return fresh_++;
    const std::int32_t id = free_.back();
    free_.pop_back();
    return id;
  }

  // Room for `ids` reserved ids in the bookkeeping, growing geometrically (as page_table does), so
  // n ascending grows of one slab each reallocate O(log n) times, not n times.
  void reserve_ids(std::size_t ids) {
    if (ids <= used_.capacity() && ids <= free_.capacity() && ids <= generation_.capacity()) return;
    const std::size_t cap = std::max(ids, 2 * used_.capacity());
    free_.reserve(cap);
    used_.reserve(cap);
    generation_.reserve(cap);
    ++index_growths_;
  }

  // Adds one slab (or, growable, commits one more step); its ids become fresh ids. free_ keeps
  // room for every reserved id, so release() never reallocates. Strong guarantee.
  void grow() {
    const std::int32_t first = reserved();
    std::int32_t count = std::min(blocks_per_slab_, capacity_ - first);
    bool committed = false;
    if constexpr (is_growable_resource_v<Resource>) {
      if (grow_step_ != 0) {
        count = std::min(grow_step_, capacity_ - first);
        reserve_ids(used_.size() + static_cast<std::size_t>(count));
        resource_->commit(slabs_.front(), static_cast<std::size_t>(first + count) * block_bytes_);
        committed = true;
      }
    }
    if (!committed) {
      if (slabs_.size() == slabs_.capacity()) slabs_.reserve(std::max<std::size_t>(4, 2 * slabs_.size()));
      reserve_ids(used_.size() + static_cast<std::size_t>(count));
      slabs_.push_back(static_cast<std::byte*>(resource_->allocate(slab_bytes(slabs_.size()), alignment_)));
    }
    used_.resize(used_.size() + static_cast<std::size_t>(count), 0);  // within capacity: no throw
    generation_.resize(used_.size(), 0);
  }

  void mark_acquired(std::int32_t id) noexcept {
    used_[static_cast<std::size_t>(id)] = 1;
    high_water_ = std::max(high_water_, ++in_use_);
  }

  void release_slabs() noexcept {
    if constexpr (is_growable_resource_v<Resource>) {
      if (grow_step_ != 0) {
        for (std::byte* s : slabs_) resource_->unreserve(s, slab_bytes());
        slabs_.clear();
        return;
      }
    }
    for (std::size_t i = 0; i < slabs_.size(); ++i)
      resource_->deallocate(slabs_[i], slab_bytes(i), alignment_);
    slabs_.clear();
  }

  void swap(block_pool& o) noexcept {
    std::swap(resource_, o.resource_);
    std::swap(block_bytes_, o.block_bytes_);
    std::swap(alignment_, o.alignment_);
    std::swap(blocks_per_slab_, o.blocks_per_slab_);
    std::swap(capacity_, o.capacity_);
    std::swap(contiguous_, o.contiguous_);
    std::swap(grow_step_, o.grow_step_);
    std::swap(in_use_, o.in_use_);
    std::swap(high_water_, o.high_water_);
    std::swap(fresh_, o.fresh_);
    std::swap(index_growths_, o.index_growths_);
    slabs_.swap(o.slabs_);
    generation_.swap(o.generation_);
    free_.swap(o.free_);
    used_.swap(o.used_);
  }

  Resource* resource_ = nullptr;
  std::size_t block_bytes_ = 0;
  std::size_t alignment_ = 256;
  std::int32_t blocks_per_slab_ = 1;
  std::int32_t capacity_ = 0;
  bool contiguous_ = false;
  std::int32_t grow_step_ = 0;              // growable layout: blocks committed per step; else 0
  std::int32_t in_use_ = 0;
  std::int32_t high_water_ = 0;
  std::vector<std::byte*> slabs_;           // growable: the one reserved range
  std::int32_t fresh_ = 0;                  // ids below were handed out at least once
  std::int32_t index_growths_ = 0;
  std::vector<std::int32_t> free_;          // stack of released ids
  std::vector<std::uint8_t> used_;          // per reserved id: 1 while acquired
  std::vector<std::uint32_t> generation_;   // per reserved id: releases so far
};

OOMB_NAMESPACE_END
