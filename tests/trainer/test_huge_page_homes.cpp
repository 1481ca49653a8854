// huge_page_host_resource (the CUDA trainer's pageable homes): large blocks on 2 MiB boundaries,
// small ones from operator new, every byte usable, a block pool of homes over it. Whether the kernel
// gives huge pages is the host's choice (THP mode): not asserted.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <oomb/memory/block_pool.hpp>

#include "trainer/cuda/huge_page_host_resource.hpp"

using oomb_trainer::huge_page_host_resource;

TEST_CASE("huge_page_host_resource: blocks of 2 MiB and more on 2 MiB boundaries, smaller ones as asked, all usable") {
  huge_page_host_resource r;
  for (std::size_t bytes : {std::size_t(64), std::size_t(4096), huge_page_host_resource::huge_bytes - 1,
                            huge_page_host_resource::huge_bytes, std::size_t(5) << 20, (std::size_t(3) << 20) + 7}) {
    CAPTURE(bytes);
    void* p = r.allocate(bytes, 256);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    if (bytes >= huge_page_host_resource::huge_bytes)
      CHECK(reinterpret_cast<std::uintptr_t>(p) % huge_page_host_resource::huge_bytes == 0);
    std::memset(p, 0x5c, bytes);
    CHECK(static_cast<unsigned char*>(p)[bytes - 1] == 0x5c);
    r.deallocate(p, bytes, 256);
  }
  // An alignment above 2 MiB is honoured (operator new's path).
  void* p = r.allocate(std::size_t(8) << 20, std::size_t(4) << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % (std::size_t(4) << 20) == 0);
  r.deallocate(p, std::size_t(8) << 20, std::size_t(4) << 20);
}

TEST_CASE("huge_page_host_resource: a growing pool of homes over it keeps every page's bytes") {
  huge_page_host_resource r;
  auto pool = oomb::block_pool<huge_page_host_resource>::growing(r, 256 << 10, 12);  // 3 MiB slabs
  std::vector<std::int32_t> ids(40);
  pool.acquire(40, ids.data());
  for (std::int32_t id : ids) std::memset(pool.address(id), id & 0xff, 256 << 10);
  for (std::int32_t id : ids) {
    const auto* b = reinterpret_cast<const unsigned char*>(pool.address(id));
    CHECK(b[0] == (id & 0xff));
    CHECK(b[(256 << 10) - 1] == (id & 0xff));
  }
  for (std::int32_t id : ids) pool.release(id);
}
