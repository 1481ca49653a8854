// oomb — the growable-resource concept: one address range that gains memory without moving.
// SPDX-License-Identifier: Apache-2.0
//
// A memory resource R is also growable when it has
//   void* reserve(std::size_t max_bytes, std::size_t alignment);   // address space only
//   void  commit(void* base, std::size_t bytes);                   // [base, base + bytes) usable
//   void  unreserve(void* base, std::size_t max_bytes) noexcept;   // gives everything back
// reserve() takes address space for `max_bytes` and backs none of it; commit() backs the range's
// first `bytes` (monotone: a smaller value than before is a no-op) and throws out_of_memory, range
// unchanged, when it cannot; unreserve() releases what was committed and the reservation. The
// base never moves, so a pool on such a range keeps `address = base + id * block_bytes` while it
// grows — the layout kernels index (CUDA's virtual-memory API: vmm_device_resource).
//
// host_growable_resource is the CPU implementation: the reservation is one operator new of
// max_bytes (an OS that overcommits backs only the pages touched), and commit() enforces an
// optional byte limit so tests can drive growth into exhaustion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "oomb/core/error.hpp"
#include "oomb/memory/resource.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {
template <class R, class = void>
struct is_growable : std::false_type {};
template <class R>
struct is_growable<
    R, std::enable_if_t<
           std::is_same_v<decltype(std::declval<R&>().reserve(std::size_t{}, std::size_t{})), void*> &&
           std::is_void_v<decltype(std::declval<R&>().commit(static_cast<void*>(nullptr), std::size_t{}))> &&
           noexcept(std::declval<R&>().unreserve(static_cast<void*>(nullptr), std::size_t{}))>>
    : std::true_type {};
}  // namespace detail

/// True when R is a memory resource that can also grow one range in place (see the file comment).
template <class R>
inline constexpr bool is_growable_resource_v = is_memory_resource_v<R> && detail::is_growable<R>::value;

/// Host memory as a growable resource (see the file comment). Thread-safe.
class host_growable_resource {
 public:
  static constexpr memory_kind kind = memory_kind::host;
  static constexpr std::size_t no_limit = static_cast<std::size_t>(-1);

  /// `commit_limit`: most bytes committed over all ranges at once.
  explicit host_growable_resource(std::size_t commit_limit = no_limit) noexcept : limit_(commit_limit) {}
  host_growable_resource(const host_growable_resource&) = delete;
  host_growable_resource& operator=(const host_growable_resource&) = delete;

  // A plain resource: a range committed whole.
  void* allocate(std::size_t bytes, std::size_t alignment) {
    void* p = reserve(bytes, alignment);
    try {
      commit(p, bytes);
    } catch (...) {
      unreserve(p, bytes);
      throw;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t /*alignment*/) noexcept { unreserve(p, bytes); }

  void* reserve(std::size_t max_bytes, std::size_t alignment) {
    OOMB_EXPECTS(alignment != 0 && (alignment & (alignment - 1)) == 0,
                 "host_growable_resource: alignment must be a power of two, got ", alignment);
    OOMB_EXPECTS(max_bytes > 0, "host_growable_resource: cannot reserve 0 bytes");
    void* p = nullptr;
    try {
      p = ::operator new(max_bytes, std::align_val_t{alignment});
    } catch (const std::bad_alloc&) {
      OOMB_FAIL(out_of_memory, "host_growable_resource: could not reserve ", max_bytes, " bytes");
    }
    std::lock_guard<std::mutex> lock(m_);
    ranges_.emplace(p, range{max_bytes, 0, alignment});
    return p;
  }

  void commit(void* base, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = ranges_.find(base);
    OOMB_EXPECTS(it != ranges_.end(), "host_growable_resource: commit on ", base,
                 " which is no range of this resource");
    range& r = it->second;
    OOMB_EXPECTS(bytes <= r.reserved, "host_growable_resource: commit of ", bytes,
                 " bytes past the range's reservation of ", r.reserved);
    if (bytes <= r.committed) return;
    const std::size_t more = bytes - r.committed;
    OOMB_CHECK(more <= limit_ - committed_, out_of_memory, "host_growable_resource: asked to commit ",
               more, " more bytes, ", limit_ - committed_, " left of the ", limit_, "-byte limit");
    committed_ += more;
    r.committed = bytes;
  }

  void unreserve(void* base, std::size_t /*max_bytes*/) noexcept {
    if (base == nullptr) return;
    std::size_t alignment = 1;
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = ranges_.find(base);
      if (it == ranges_.end()) return;
      committed_ -= it->second.committed;
      alignment = it->second.alignment;
      ranges_.erase(it);
    }
    ::operator delete(base, std::align_val_t{alignment});
  }

  /// Bytes committed over all ranges.
  std::size_t committed_bytes() const {
    std::lock_guard<std::mutex> lock(m_);
    return committed_;
  }

 private:
  struct range {
    std::size_t reserved, committed, alignment;
  };
  std::size_t limit_;
  std::size_t committed_ = 0;
  mutable std::mutex m_;
  std::unordered_map<void*, range> ranges_;
};

static_assert(is_memory_resource_v<host_growable_resource>);
static_assert(is_growable_resource_v<host_growable_resource>);

OOMB_NAMESPACE_END
