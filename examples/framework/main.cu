// SPDX-License-Identifier: Apache-2.0
// Plays a training framework that plugs oomb in (docs/interop.md walks through it):
//   - its own compute stream, a cudaStream_t it created, handed to oomb as a temporary
//     cuda_stream_view (as at::cuda::getCurrentCUDAStream() would be);
//   - its own allocators, a stream-ordered device allocator (cudaMallocAsync on its stream, as
//     PyTorch's caching allocator or RMM is) and a pinned one, plugged in through
//     callback_resource: they back the scheduler's near slots and the far tier's block_pool;
//   - its tensors in and out through DLPack: K pages written by the "framework" as a bf16 tensor
//     of __nv_bfloat16 come in without a copy, the output tensor the framework allocated comes in,
//     and a slot of the near tier goes out as a DLManagedTensor the framework reads and frees.
// A kernel on the framework's stream reads each page from its slot: out = 2 * k + 1, exact in
// float for these bf16 inputs, so it is compared with the CPU reference for equality. Exits 1 on
// any mismatch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/residency.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/interop/dlpack.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/callback_resource.hpp"

namespace {

constexpr std::int32_t page_tokens = 16, heads = 2, head_dim = 64;
constexpr std::int32_t page_elems = page_tokens * heads * head_dim;
constexpr std::int32_t pages = 24, slots = 8;  // three windows through a near tier of 8 slots

// --- the framework's side: its allocators, its stream, its tensors ------------------------------

// Stream-ordered device memory on the framework's stream (what its caching allocator does).
// snippet-begin: allocator
using framework_device_memory = oomb::callback_resource<oomb::memory_kind::device, oomb::cuda_stream_view>;
framework_device_memory device_allocator(cudaStream_t stream) {
  return framework_device_memory(
      [](std::size_t bytes, std::size_t, oomb::cuda_stream_view s) -> void* {
        void* p = nullptr;
        return cudaMallocAsync(&p, bytes, s.get()) == cudaSuccess ? p : ((void)cudaGetLastError(), nullptr);
      },
      [](void* p, std::size_t, std::size_t, oomb::cuda_stream_view s) { (void)cudaFreeAsync(p, s.get()); },
      oomb::cuda_stream_view(stream));
}
// snippet-end: allocator

// Pinned host memory, mapped, as a framework's pinned allocator hands out.
using framework_pinned_memory = oomb::callback_resource<oomb::memory_kind::pinned>;
framework_pinned_memory pinned_allocator() {
  return framework_pinned_memory(
      [](std::size_t bytes, std::size_t) -> void* {
        void* p = nullptr;
        return cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess
                   ? p
                   : ((void)cudaGetLastError(), nullptr);
      },
      [](void* p, std::size_t, std::size_t) { (void)cudaFreeHost(p); });
}

// A DLManagedTensor as a framework exports one (at::toDLPack): it owns shape storage and frees it
// in its deleter; the data stays the framework's.
struct exported_tensor {
  DLManagedTensor managed{};
  std::int64_t shape[3];
};
DLManagedTensor* framework_export(void* data, DLDevice device, DLDataType type, std::int64_t a, std::int64_t b,
                                  std::int64_t c) {
  auto* e = new exported_tensor;
  e->shape[0] = a, e->shape[1] = b, e->shape[2] = c;
  e->managed.dl_tensor = DLTensor{data, device, 3, type, e->shape, nullptr, 0};
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<exported_tensor*>(self->manager_ctx); };
  return &e->managed;
}

// --- the kernel the framework runs on its stream over oomb's slots -----------------------------

__global__ void scale_pages_kernel(const __nv_bfloat16* near_base, const std::int32_t* slot_of_page,
                                   oomb::tensor_view<float, 3> out, std::int32_t first_page) {
  const std::int32_t p = blockIdx.x;
  const __nv_bfloat16* k = near_base + std::int64_t(slot_of_page[p]) * page_elems;
  for (std::int32_t e = threadIdx.x; e < page_elems; e += blockDim.x)
    out(first_page + p, e / (heads * head_dim), e % (heads * head_dim)) = 2.0f * __bfloat162float(k[e]) + 1.0f;
}

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "framework example: MISMATCH: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() try {
  // The framework's stream and allocators.
  cudaStream_t framework_stream = nullptr;
  OOMB_CUDA_CHECK(cudaStreamCreateWithFlags(&framework_stream, cudaStreamNonBlocking), "creating the stream");
  framework_device_memory device_memory = device_allocator(framework_stream);
  framework_pinned_memory pinned_memory = pinned_allocator();

  // The framework's K pages: a host tensor [pages][page_elems] of __nv_bfloat16, seeded random.
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<__nv_bfloat16> k_host(std::size_t(pages) * page_elems);
  std::vector<float> k_ref(k_host.size());
  for (std::size_t i = 0; i < k_host.size(); ++i) {
    float x = u(rng);
    x = x == 0.0f ? 0.5f : x;
    k_host[i] = __float2bfloat16_rn(x);
    k_ref[i] = __bfloat162float(k_host[i]);
  }
  DLManagedTensor* k_in = framework_export(k_host.data(), DLDevice{kDLCPU, 0}, DLDataType{kDLBfloat, 16, 1}, pages,
                                           page_tokens, heads * head_dim);
  // The output tensor the framework allocated on its device: [pages][page_tokens][heads*head_dim].
  float* out_device = nullptr;
  OOMB_CUDA_CHECK(cudaMallocAsync(&out_device, k_ref.size() * sizeof(float), framework_stream), "output tensor");
  OOMB_CUDA_CHECK(cudaMemsetAsync(out_device, 0, k_ref.size() * sizeof(float), framework_stream), "output tensor");
  DLManagedTensor* out_in = framework_export(out_device, DLDevice{kDLCUDA, 0}, DLDataType{kDLFloat, 32, 1}, pages,
                                             page_tokens, heads * head_dim);

  {
    // oomb: the far tier is a block_pool over the framework's pinned allocator; the near tier's
    // slots come from its stream-ordered device allocator.
    const std::size_t page_bytes = std::size_t(page_elems) * sizeof(oomb::bf16);
    // snippet-begin: scheduler
    auto far = oomb::block_pool<framework_pinned_memory>::growing(pinned_memory, page_bytes, 8);
    oomb::cuda_stream copy_in, copy_out;
    oomb::residency_scheduler<oomb::cuda_backend<framework_device_memory, oomb::cuda_stream, framework_pinned_memory>>
        sched(far, device_memory, slots, copy_in, copy_out);
    // The slots were allocated on the framework's stream: the copy streams wait for it.
    const oomb::cuda_event allocated = oomb::cuda_stream_view(framework_stream).record();
    copy_in.wait(allocated);
    copy_out.wait(allocated);
    // snippet-end: scheduler

    // Tensors in: the K tensor as __nv_bfloat16 (layout-compatible with oomb::bf16, no copy),
    // written into far pages, its home; the output tensor as float on the device.
    // snippet-begin: dlpack-in
    const auto k = oomb::as_bf16(oomb::view_of<const __nv_bfloat16, 3>(*k_in));
    const auto out = oomb::view_of<float, 3>(*out_in);
    // snippet-end: dlpack-in
    expect(out.kind() == oomb::memory_kind::device, "the output tensor is device memory");
    std::vector<std::int32_t> ids(pages);
    far.acquire(pages, ids.data());
    for (std::int32_t p = 0; p < pages; ++p)
      std::memcpy(far.address(ids[std::size_t(p)]), &k(p, 0, 0), page_bytes);
    sched.mark_written(ids);

    std::int32_t* slot_list = nullptr;  // per-window slot lists the kernel reads (mapped pinned)
    OOMB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&slot_list), pages * sizeof(std::int32_t), cudaHostAllocMapped),
                    "slot lists");
    for (std::int32_t w = 0; w < pages / slots; ++w) {
      const oomb::id_span window(ids.data() + w * slots, std::size_t(slots));
      sched.prefetch(window);
      // snippet-begin: stream
      // The framework's current stream, as a temporary view: nothing to keep alive.
      const auto got = sched.acquire(oomb::cuda_stream_view(framework_stream), window, oomb::access::read);
      std::copy(got.begin(), got.end(), slot_list + w * slots);
      const auto* near_base = reinterpret_cast<const __nv_bfloat16*>(sched.near_pool().base());
      scale_pages_kernel<<<slots, 256, 0, framework_stream>>>(near_base, slot_list + w * slots, out, w * slots);
      OOMB_CUDA_CHECK_LAUNCH("scale_pages_kernel");
      // snippet-end: stream

      // Tensor out: the window's first slot, as a DLManagedTensor the framework consumes; its
      // deleter tells us when the framework is done, and only then is the page released.
      // snippet-begin: dlpack-out
      const oomb::tensor_view<const oomb::bf16, 3> slot_view(
          reinterpret_cast<const oomb::bf16*>(sched.near_pool().address(got[0])), {page_tokens, heads, head_dim},
          {heads * head_dim, head_dim, 1}, oomb::memory_kind::device);
      struct release_ctx {
        bool done = false;
      } ctx;
      DLManagedTensor* slot_out =
          oomb::to_dlpack(slot_view, 0, [](void* c) { static_cast<release_ctx*>(c)->done = true; }, &ctx);
      // snippet-end: dlpack-out
      std::vector<__nv_bfloat16> seen(page_elems);
      // The framework reads it on its stream (the acquire ordered the copy before this).
      OOMB_CUDA_CHECK(cudaMemcpyAsync(seen.data(), slot_out->dl_tensor.data, page_bytes, cudaMemcpyDeviceToHost,
                                      framework_stream),
                      "framework reading the exported slot");
      OOMB_CUDA_CHECK(cudaStreamSynchronize(framework_stream), "framework stream");
      expect(slot_out->dl_tensor.device.device_type == kDLCUDA && slot_out->dl_tensor.ndim == 3 &&
                 slot_out->dl_tensor.dtype.code == kDLBfloat,
             "the exported slot describes a 3-d bf16 device tensor");
      expect(std::memcmp(seen.data(), &k(w * slots, 0, 0), page_bytes) == 0, "the exported slot holds its page");
      slot_out->deleter(slot_out);
      expect(ctx.done, "the framework's deleter reached our release hook");
      sched.release(oomb::cuda_stream_view(framework_stream), window);
    }
    OOMB_CUDA_CHECK(cudaStreamSynchronize(framework_stream), "framework stream");

    std::vector<float> out_host(k_ref.size());
    OOMB_CUDA_CHECK(cudaMemcpy(out_host.data(), out_device, out_host.size() * sizeof(float), cudaMemcpyDeviceToHost),
                    "reading the output");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < out_host.size(); ++i) wrong += out_host[i] != 2.0f * k_ref[i] + 1.0f;
    expect(wrong == 0, "every output element equals 2 * k + 1 (exact)");
    std::printf("framework example: %d pages of %d bf16 through %d slots on the framework's stream; "
                "%zu of %zu outputs wrong; %lld copies to the near tier\n",
                pages, page_elems, slots, wrong, out_host.size(), static_cast<long long>(sched.stats().copies_to_near));
    OOMB_CUDA_CHECK(cudaFreeHost(slot_list), "slot lists");
  }  // the scheduler waits for its events, then gives the slots back through the allocator
  k_in->deleter(k_in);
  out_in->deleter(out_in);
  OOMB_CUDA_CHECK(cudaFreeAsync(out_device, framework_stream), "output tensor");
  OOMB_CUDA_CHECK(cudaStreamSynchronize(framework_stream), "framework stream");
  OOMB_CUDA_CHECK(cudaStreamDestroy(framework_stream), "framework stream");
  if (failures == 0) std::puts("framework example: OK");
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "framework example: %s\n", e.what());
  return 1;
}
