// oomb — the conversion kernels of a page codec on the device: staged homes widened into slots,
// slots rounded into staging.
// SPDX-License-Identifier: Apache-2.0
//
// The converting CUDA residency backend (converting_residency.cuh) moves homes between pinned and
// device memory in their narrow encoding and converts on the device, in device memory only; these
// kernels are that conversion. Page k of a batch is page k of a contiguous staging range
// (`elements` far elements a page) and slot slot_ids[k] of the contiguous slots (`elements` near
// elements a slot). The kernels call the codec's per-element functions (bf16_codec.hpp, compiled
// __host__ __device__), the code the CPU's converting_host_backend runs, so the GPU writes the
// bits the CPU does: page k of an encode batch is written under key first_key + k, as
// converting_host_backend numbers its writes (stochastic rounding included).
// Cost: about 6 bytes of device memory traffic an element (bf16 <-> fp32) against the 2 bytes it
// crosses PCIe with, so plain coalesced element loops take a few percent of the copy's time; no
// vector loads needed. One block row per page (blockIdx.y), no integer division per element.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "oomb/core/error.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/kernel_linkage.cuh"

OOMB_NAMESPACE_BEGIN

namespace detail {

inline constexpr int page_codec_threads = 256;
inline constexpr std::uint32_t page_codec_elements_per_block = 4 * page_codec_threads;  // 4 per thread

// Checks a batch fits the kernels' 32-bit counts and returns its grid: enough blocks across a page
// for 4 elements a thread, one row of blocks per page (at most 65535 rows; more pages loop).
inline dim3 page_codec_grid(std::size_t count, std::size_t elements, const char* who) {
  OOMB_EXPECTS(elements > 0, who, ": pages of 0 elements");
  // 2^31: an element index plus the grid's stride stays below 2^32.
  OOMB_EXPECTS(elements <= (std::size_t(1) << 31) && count <= std::numeric_limits<std::uint32_t>::max(), who, ": ", count,
               " pages of ", elements, " elements exceed the kernels' 32-bit counts");
  const std::size_t across = (elements + page_codec_elements_per_block - 1) / page_codec_elements_per_block;
  return dim3(static_cast<unsigned>(std::min<std::size_t>(across, 65535)),
              static_cast<unsigned>(std::min<std::size_t>(count, 65535)));
}

OOMB_KERNEL_NAMESPACE_BEGIN

template <class Codec>
OOMB_KERNEL void __launch_bounds__(page_codec_threads)
    decode_pages_kernel(const typename Codec::far_type* __restrict__ staged, typename Codec::near_type* __restrict__ slots,
                        const std::int32_t* __restrict__ slot_ids, std::uint32_t count, std::uint32_t elements) {
  for (std::uint32_t k = blockIdx.y; k < count; k += gridDim.y) {
    const typename Codec::far_type* src = staged + std::uint64_t(k) * elements;
    typename Codec::near_type* dst = slots + std::uint64_t(slot_ids[k]) * elements;
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < elements; i += gridDim.x * blockDim.x)
      dst[i] = Codec::decode_element(src[i]);
  }
}

template <class Codec>
OOMB_KERNEL void __launch_bounds__(page_codec_threads)
    encode_pages_kernel(Codec codec, const typename Codec::near_type* __restrict__ slots,
                        const std::int32_t* __restrict__ slot_ids, typename Codec::far_type* __restrict__ staged,
                        std::uint32_t count, std::uint32_t elements, std::uint64_t first_key) {
  for (std::uint32_t k = blockIdx.y; k < count; k += gridDim.y) {
    const typename Codec::near_type* src = slots + std::uint64_t(slot_ids[k]) * elements;
    typename Codec::far_type* dst = staged + std::uint64_t(k) * elements;
    const std::uint64_t stream = codec.write_stream(first_key + k);
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < elements; i += gridDim.x * blockDim.x)
      dst[i] = codec.encode_element(src[i], stream, i);
  }
}

OOMB_KERNEL_NAMESPACE_END

}  // namespace detail

/// Enqueues on `stream`: slot slot_ids[k] of `slots` = Codec's decoding of staging page k, for k <
/// count (`elements` elements a page; slot_ids in device memory, valid until the kernel ran).
template <class Codec>
void launch_decode_pages(const typename Codec::far_type* staged, typename Codec::near_type* slots,
                         const std::int32_t* slot_ids, std::size_t count, std::size_t elements, cudaStream_t stream) {
  const dim3 grid = detail::page_codec_grid(count, elements, "decode_pages kernel");
  if (count == 0) return;
  detail::decode_pages_kernel<Codec><<<grid, detail::page_codec_threads, 0, stream>>>(
      staged, slots, slot_ids, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(elements));
  OOMB_CUDA_CHECK_LAUNCH("decode_pages kernel: ", count, " pages of ", elements, " elements");
}

/// Enqueues on `stream`: staging page k = `codec`'s encoding of slot slot_ids[k] of `slots`, written
/// under key first_key + k, for k < count (as launch_decode_pages otherwise).
template <class Codec>
void launch_encode_pages(const Codec& codec, const typename Codec::near_type* slots, const std::int32_t* slot_ids,
                         typename Codec::far_type* staged, std::size_t count, std::size_t elements,
                         std::uint64_t first_key, cudaStream_t stream) {
  const dim3 grid = detail::page_codec_grid(count, elements, "encode_pages kernel");
  if (count == 0) return;
  detail::encode_pages_kernel<Codec><<<grid, detail::page_codec_threads, 0, stream>>>(
      codec, slots, slot_ids, staged, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(elements), first_key);
  OOMB_CUDA_CHECK_LAUNCH("encode_pages kernel: ", count, " pages of ", elements, " elements");
}

OOMB_NAMESPACE_END
