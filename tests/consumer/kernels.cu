// SPDX-License-Identifier: Apache-2.0
// A shared library whose code launches oomb's header kernels (the page-copy and page-table
// kernels): check.sh checks that none of those kernels is exported from it, so two libraries of
// one program built for different GPUs never bind each other's copies.
#include <oomb/cuda/device_page_table.cuh>
#include <oomb/cuda/page_copy_kernel.cuh>

extern "C" __attribute__((visibility("default"))) int consumer_copy_pages(const oomb::page_copy_desc* desc,
                                                                          std::size_t count, cudaStream_t stream) {
  oomb::launch_page_copy_kernel(desc, count, 4096, 8, stream);
  return 0;
}

extern "C" __attribute__((visibility("default"))) int consumer_sync_table(const oomb::page_table& t,
                                                                          oomb::device_page_table& d,
                                                                          cudaStream_t stream) {
  d.sync(t, oomb::cuda_stream_view(stream));
  return 0;
}
