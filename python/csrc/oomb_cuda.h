/* oomb's C ABI for the GPU: the attention kernels of oomb/attention over device memory, as the
 * Python package's CUDA path loads them through ctypes (liboomb_cuda).
 * SPDX-License-Identifier: Apache-2.0
 *
 * A library apart from liboomb_c, so the CPU package builds and loads without CUDA. Plain C again:
 * no torch, no Python; pointers are device memory, the stream is the caller's (cudaStream_t passed as
 * void*: torch.cuda.current_stream().cuda_stream), and every call only enqueues work on it: no
 * allocation, no synchronisation. The CUDA runtime is linked statically; it shares the device's
 * primary context with torch's, so torch's pointers and streams are valid here.
 *
 * Every function returns 0 on success and -1 on failure; oomb_cuda_last_error() (per thread) says
 * what was asked and what was wrong.
 */
#ifndef OOMB_CUDA_H
#define OOMB_CUDA_H

#include <stdint.h>

#include "oomb_c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OOMB_CUDA_ABI_VERSION 3

OOMB_C_API int32_t oomb_cuda_abi_version(void);
OOMB_C_API const char* oomb_cuda_last_error(void);

/* One chunk's queries against the window of every page of its sequence up to and including its own:
 * logical pages 0 .. pages - 1, the past ones and then the chunk's own (which the caller wrote with
 * its K/V first). Causal, GQA (query head h reads KV head h / (hq / hkv)), optionally page-sparse over
 * the past. bf16 K/V pages, token-major: the pool is [pool_pages][2 (K, V)][page_size][hkv][d]. */
typedef struct {
  int32_t struct_size; /* sizeof(oomb_cuda_attention_args) as the caller knows it */
  int32_t device;      /* the CUDA device every pointer lives on (made current for the call) */
  const void* q;       /* bf16 [sq][hq][d], RoPE applied, 16-byte aligned */
  int64_t sq;
  int32_t hq, hkv, d;  /* d: 64 or 128 */
  int64_t q_start;     /* absolute position of query 0; a multiple of page_size */
  double scale;
  const void* pool;    /* bf16, 16-byte aligned */
  int32_t page_size;   /* a power of two >= 16; the Hopper kernels want >= 128 */
  /* int32 [3 + pages] in device memory: 0, pages, the last page's token count (its length in the
   * window), then the pool id of each logical page. */
  const int32_t* table;
  int32_t pages;       /* ceil((q_start + sq) / page_size) */
  /* Page-sparse past (device, int32): per tile of `tile` queries, ascending logical indices of the
   * past pages it attends (indptr [ceil(sq / tile) + 1]); NULL = dense. tile * hq / hkv must be a
   * multiple of 128. */
  const int32_t* tile_indptr;
  const int32_t* tile_pages;
  int32_t tile;
  int32_t portable; /* nonzero: the portable kernels even on Hopper (tests compare the two) */
  /* Packed documents (v2): device int64 [sq], query i attends only keys at positions >=
   * key_lower[i] (non-decreasing, at most q_start + i; not checked on the device); NULL = one document. */
  const int64_t* key_lower;
  /* v3: nonzero: the backward adds dQ in a fixed order, the same bits on every run (the Hopper
   * kernels, dense or page-sparse: pages >= 128 tokens; others are refused). Its workspace is then
   * required. */
  int32_t deterministic;
} oomb_cuda_attention_args;

/* o bf16 [sq][hq][d], lse fp32 [hq][sq] (natural log). */
OOMB_C_API int oomb_cuda_attention_forward(const oomb_cuda_attention_args* args, void* o, float* lse, void* stream);

/* The int32 scratch a backward call wants (0 for dense calls unless deterministic). */
OOMB_C_API int oomb_cuda_attention_backward_workspace(const oomb_cuda_attention_args* args, int64_t* ints);

/* Given the forward's o (bf16) and lse and d_o (bf16): ADDS dq (fp32 [sq][hq][d]), the chunk's own
 * dk, dv (fp32 [sq][hkv][d]) and the past pages' dK/dV into their fp32 gradient pages: grad_pool has
 * the K/V pool's page layout, grad_pages (device int32 [pages]) names each window entry's gradient
 * page (entries of the chunk's own pages and of past pages no tile selects are not read). delta:
 * fp32 scratch [hq][sq]; workspace: oomb_cuda_attention_backward_workspace ints. */
OOMB_C_API int oomb_cuda_attention_backward(const oomb_cuda_attention_args* args, const void* o, const float* lse,
                                            const void* d_o, float* delta, float* dq, float* dk, float* dv,
                                            float* grad_pool, const int32_t* grad_pages, int32_t* workspace,
                                            int64_t workspace_ints, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OOMB_CUDA_H */
