// SPDX-License-Identifier: Apache-2.0
// A CUDA consumer of oomb linking only oomb::cuda: the VMM resource calls the driver API, the
// pinned resource and streams the runtime. Compiled by tests/consumer/check.sh; it needs a GPU to
// run, and exits 0 without one.
#include <oomb/cuda/pinned_resource.hpp>
#include <oomb/cuda/stream.hpp>
#include <oomb/cuda/vmm_resource.hpp>
#include <oomb/memory/block_pool.hpp>

#include <cstdio>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("consumer_cuda: no GPU, nothing to run");
    return 0;
  }
  oomb::vmm_device_resource vmm;
  oomb::pinned_resource pinned;
  auto near = oomb::block_pool<oomb::vmm_device_resource>::contiguous(vmm, 64 << 10, 16);
  auto far = oomb::block_pool<oomb::pinned_resource>::growing(pinned, 64 << 10, 16);
  std::int32_t a = near.acquire(), b = far.acquire();
  oomb::cuda_stream s;
  s.enqueue_copy(near.address(a), far.address(b), 64 << 10);
  s.synchronize();
  std::puts("consumer_cuda: OK");
  return 0;
}
