// SPDX-License-Identifier: Apache-2.0
// A consumer of oomb: includes the umbrella header, builds a page pool, prints what it holds.
#include <oomb/oomb.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>

int main() {
  oomb::host_resource host;
  oomb::statistics_adaptor<oomb::host_resource> counted(host);
  const oomb::page_shape shape{16, 2, 64, oomb::kv_layout::token_major};
  shape.validate();
  const std::size_t pair_bytes = std::size_t(shape.pair_elements()) * sizeof(oomb::bf16);
  auto pool = oomb::block_pool<decltype(counted)>::growing(counted, pair_bytes, 8);

  std::int32_t ids[20];
  pool.acquire(20, ids);  // three slabs of 8
  for (std::int32_t id : ids) std::memset(pool.address(id), 0x3f, pair_bytes);
  pool.release(ids[7]);

  const auto s = pool.stats();
  std::printf("oomb %s: %d pages in use, %d reserved in %zu bytes from the host\n",
              OOMB_VERSION_STRING, s.in_use, s.reserved, counted.statistics().bytes_in_use);
  const bool ok = s.in_use == 19 && s.reserved == 24 &&
                  counted.statistics().bytes_in_use == 24 * pair_bytes &&
                  std::strcmp(OOMB_VERSION_STRING, "") != 0;
  if (!ok) std::puts("consumer: unexpected pool state");
  return ok ? 0 : 1;
}
