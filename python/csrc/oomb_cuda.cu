// oomb's C ABI for the GPU (oomb_cuda.h) over the attention layer's kernels.
// SPDX-License-Identifier: Apache-2.0
//
// Each call plans (plan.hpp: host arithmetic) and launches on the caller's stream, as the trainer's
// CUDA backend does; what the library throws becomes -1 plus a per-thread message.
#include "oomb_cuda.h"

#include "c_abi_errors.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include <cuda_runtime.h>

#include "oomb/attention/attention.cuh"
#include "oomb/core/error.hpp"
#include "oomb/paging/page_shape.hpp"

// The twelve kernel configurations, compiled here (this unit is the package library's only
// launcher), unless the build links oomb::attention_kernels, which has them (oomb's own CUDA build).
#if !defined(OOMB_ATTENTION_EXTERN_INSTANCES)
OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_ATTENTION_INSTANCES(template)
}  // namespace attention::detail
OOMB_NAMESPACE_END
#endif

namespace {

using oomb_c_abi::guarded;

#define OOMB_CUDA_EXPECTS(cond, ...) OOMB_EXPECTS(cond, "oomb_cuda: ", __VA_ARGS__)

namespace att = oomb::attention;

/// Checks the call, makes its device current and translates it into the attention layer's args.
att::attention_args translate(const oomb_cuda_attention_args* c) {
  OOMB_CUDA_EXPECTS(c != nullptr, "null args");
  OOMB_CUDA_EXPECTS(c->struct_size >= static_cast<std::int32_t>(sizeof(oomb_cuda_attention_args)),
                    "oomb_cuda_attention_args of ", c->struct_size, " bytes, this library needs ",
                    sizeof(oomb_cuda_attention_args));
  const cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "oomb_cuda: cannot use device ", c->device, ": ", cudaGetErrorString(e));
  OOMB_CUDA_EXPECTS(c->sq > 0 && c->sq <= std::numeric_limits<std::int32_t>::max(), "sq ", c->sq, " out of range");
  OOMB_CUDA_EXPECTS(c->page_size > 0 && c->q_start >= 0 && c->q_start % c->page_size == 0, "q_start ", c->q_start,
                    " must be a non-negative multiple of the page size ", c->page_size);
  const std::int64_t pages = (c->q_start + c->sq + c->page_size - 1) / c->page_size;
  OOMB_CUDA_EXPECTS(c->pages == pages, "the window holds ", c->pages, " pages; q_start ", c->q_start, " and ", c->sq,
                    " queries need ", pages);
  OOMB_CUDA_EXPECTS(c->table != nullptr && c->pool != nullptr, "null table or pool");
  OOMB_CUDA_EXPECTS(std::isfinite(c->scale) && c->scale > 0, "scale ", c->scale, " must be positive and finite");
  oomb::page_shape shape;
  shape.page_size = c->page_size;
  shape.kv_heads = c->hkv;
  shape.head_dim = c->d;
  shape.layout = oomb::kv_layout::token_major;
  att::attention_args a;
  a.q = static_cast<const oomb::bf16*>(c->q);
  a.q_start = c->q_start;
  a.sq = static_cast<std::int32_t>(c->sq);
  a.hq = c->hq;
  a.hkv = c->hkv;
  a.d = c->d;
  a.scale = static_cast<float>(c->scale);
  a.kv.pool = oomb::page_pool_view<const oomb::bf16>::over(static_cast<const oomb::bf16*>(c->pool), shape);
  a.kv.table.indptr = c->table;
  a.kv.table.last_page_len = c->table + 2;
  a.kv.table.indices = c->table + 3;
  a.kv.table.num_seqs = 1;
  a.kv.table.page_size = c->page_size;
  a.first_page = 0;
  a.window_pages = c->pages;
  if (c->tile_indptr != nullptr || c->tile_pages != nullptr) {
    OOMB_CUDA_EXPECTS(c->tile_indptr != nullptr && c->tile_pages != nullptr, "sparse needs tile_indptr and tile_pages");
    a.tile_indptr = c->tile_indptr;
    a.tile_pages = c->tile_pages;
    a.tile = c->tile;
  }
  a.key_lower = c->key_lower;
  return a;
}

att::plan_options options_of(const oomb_cuda_attention_args* c) {
  att::plan_options o;
  o.kernels = c->portable ? att::kernel_choice::portable : att::kernel_choice::automatic;
  o.deterministic = c->deterministic != 0;
  return o;
}

att::backward_plan plan_backward_of(const oomb_cuda_attention_args* c, const att::attention_args& a, const float* dq) {
  return att::plan_backward(att::call_shape::of(a, dq), att::current_device_facts(), options_of(c));
}

}  // namespace

extern "C" {

int32_t oomb_cuda_abi_version(void) { return OOMB_CUDA_ABI_VERSION; }
const char* oomb_cuda_last_error(void) { return oomb_c_abi::last_error().c_str(); }

int oomb_cuda_attention_forward(const oomb_cuda_attention_args* args, void* o, float* lse, void* stream) {
  return guarded([&] {
    const att::attention_args a = translate(args);
    const auto plan = att::plan_forward(att::call_shape::of(a), att::current_device_facts(), options_of(args));
    att::forward(plan, a, static_cast<oomb::bf16*>(o), lse, static_cast<cudaStream_t>(stream));
  });
}

int oomb_cuda_attention_backward_workspace(const oomb_cuda_attention_args* args, int64_t* ints) {
  return guarded([&] {
    OOMB_CUDA_EXPECTS(ints != nullptr, "null argument");
    const att::attention_args a = translate(args);
    // Planned for a 16-byte aligned dq, as torch's allocations are; the backward checks its own.
    *ints = plan_backward_of(args, a, nullptr).workspace_ints;
  });
}

int oomb_cuda_attention_backward(const oomb_cuda_attention_args* args, const void* o, const float* lse,
                                 const void* d_o, float* delta, float* dq, float* dk, float* dv, float* grad_pool,
                                 const int32_t* grad_pages, int32_t* workspace, int64_t workspace_ints,
                                 void* stream) {
  return guarded([&] {
    const att::attention_args a = translate(args);
    OOMB_CUDA_EXPECTS(o != nullptr && d_o != nullptr && delta != nullptr, "null o, d_o or delta");
    const auto s = static_cast<cudaStream_t>(stream);
    att::backward_delta(a.sq, a.hq, a.d, static_cast<const oomb::bf16*>(o), static_cast<const oomb::bf16*>(d_o), delta,
                        s);
    oomb::window_grad_view<float> dpast;
    if (a.q_start > 0) {
      OOMB_CUDA_EXPECTS(grad_pool != nullptr && grad_pages != nullptr, "a window with ", a.q_start / args->page_size,
                        " past pages needs the gradient pool and its page table");
      dpast.pool = oomb::page_pool_view<float>::over(grad_pool, [&] {
        oomb::page_shape shape;
        shape.page_size = args->page_size;
        shape.kv_heads = args->hkv;
        shape.head_dim = args->d;
        shape.layout = oomb::kv_layout::token_major;
        return shape;
      }());
      dpast.grad_page = grad_pages;
      dpast.pages = a.window_pages;
    }
    const auto plan = plan_backward_of(args, a, dq);
    att::backward(plan, a, lse, delta, static_cast<const oomb::bf16*>(d_o), dq, dk, dv, dpast,
                  {workspace, workspace_ints}, s);
  });
}

}  // extern "C"
