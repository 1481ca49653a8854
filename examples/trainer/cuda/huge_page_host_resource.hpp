// oomb trainer — pageable host memory for the homes, in transparent huge pages where the host has them.
// SPDX-License-Identifier: Apache-2.0
//
// Why: pageable homes are copied page by page between ordinary host memory and pinned staging by the
// shared copier's threads (oomb/cuda/staged_page_transfer.cuh), in the order the trainer asks for
// pages, not the order they lie in. On a host whose THP mode is `madvise` (the H200's), memory from
// operator new comes in 4 KiB pages, so each 256 KiB K/V page a thread copies walks 64 TLB entries.
// This resource places blocks of 2 MiB or more on 2 MiB boundaries and asks the kernel to back them
// with huge pages (madvise(MADV_HUGEPAGE)). The advice is a hint: where THP is off or no huge page
// is free the memory is ordinary pages and nothing else changes. Smaller blocks come from operator
// new. Linux only (the trainer's CUDA side is). Measured: bench/home_copy_bench.cpp.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

#include <oomb/core/error.hpp>
#include <oomb/core/memory_kind.hpp>
#include <oomb/memory/host_resource.hpp>
#include <oomb/memory/resource.hpp>

namespace oomb_trainer {

/// Pageable host memory; blocks of huge_bytes or more in transparent huge pages (see the file comment).
class huge_page_host_resource {
 public:
  static constexpr oomb::memory_kind kind = oomb::memory_kind::host;
  static constexpr std::size_t huge_bytes = std::size_t(2) << 20;

  void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    if (bytes < huge_bytes || alignment > huge_bytes) return small_.allocate(bytes, alignment);
    void* p = std::aligned_alloc(huge_bytes, rounded(bytes));
    if (p == nullptr) OOMB_FAIL(oomb::out_of_memory, "huge_page_host_resource: could not allocate ", bytes, " bytes");
    (void)madvise(p, rounded(bytes), MADV_HUGEPAGE);  // a hint: refused (THP off), the pages stay small
    return p;
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) noexcept {
    if (bytes < huge_bytes || alignment > huge_bytes) small_.deallocate(p, bytes, alignment);
    else std::free(p);
  }

 private:
  static std::size_t rounded(std::size_t bytes) noexcept { return (bytes + huge_bytes - 1) / huge_bytes * huge_bytes; }
  oomb::host_resource small_;
};

static_assert(oomb::is_memory_resource_v<huge_page_host_resource>);

}  // namespace oomb_trainer
