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

#define OOMB_CUDA_ABI_VERSION 4

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

/* ---- Paged attention of one sequence (v4): the chunk-recurrent trainer's algorithm
 * (examples/trainer/algo/paged_attention.hpp) over the CUDA attention backend
 * (examples/trainer/cuda/cuda_attention_ops.cuh), for the package's offload and page-sparse runs.
 * The session owns its pages: K/V (bf16) and gradient (fp32) pages in device memory, or with offload
 * their homes in host memory (pinned or pageable) streamed through fixed sets of device slots by the
 * CUDA residency scheduler; with sparse, device page summaries and the tile selection. Its work runs
 * on its own streams, ordered after what the caller's stream had enqueued at each call and before
 * what it enqueues next (events, no host wait), so torch's tensors may be passed and freed as usual.
 * Layer l's calls for chunk c follow the trainer's order: stage 1 (c = 0, 1, ...): append the chunk's
 * tokens once, then per layer write (its K/V), select (sparse), forward; stage 2 (c = last .. 0):
 * expect_recompute(c), forward for every layer (the recomputation), backward from the last layer down,
 * then release_chunk(c); end_step after chunk 0. Pointers are device memory of the session's device;
 * q [n][hq][d], k and v [n][hkv][d], o, d_o, dq [n][hq][d] bf16, lse fp32 [hq][n]. */
typedef struct oomb_cuda_paged oomb_cuda_paged;

typedef struct {
  int32_t struct_size; /* sizeof(oomb_cuda_paged_config) as the caller knows it */
  int32_t device;
  int32_t layers, hq, hkv, head_dim; /* head_dim 64 or 128 */
  int32_t chunk, page;               /* page: a power of two >= 16 dividing chunk; >= 128 for the Hopper kernels */
  int64_t max_tokens;                /* the longest sequence a step may bring */
  int32_t offload;                   /* 0: every page in device memory; 1: homes in host memory, streamed */
  int32_t near_pages;   /* offload: device slots for K/V pages, and as many for gradient pages; 0: the trainer's default */
  int32_t window_pages; /* needed pages per attention window; 0: near_pages / 2 (offload), else one window */
  int32_t home_memory;  /* offload: 0 pinned, 1 pageable (no device memory grows with the homes) */
  int32_t grad_homes;   /* offload: 0 fp32, 1 bf16 (rounded to nearest even), 2 bf16 rounded stochastically */
  int32_t sparse;       /* nonzero: page-sparse attention over the past */
  int32_t budget, sink, local, tile;
  int32_t scoring;      /* 0: Quest bound, 1: mean key */
  int32_t deterministic; /* the attention backward adds dQ in a fixed order (pages >= 128) */
  int32_t portable;      /* the portable kernels even on Hopper */
} oomb_cuda_paged_config;

/* What a paged session holds and moved: oomb_c.h's struct, the CPU session's too. */
typedef oomb_paged_stats oomb_cuda_paged_stats;

OOMB_C_API int oomb_cuda_paged_create(const oomb_cuda_paged_config* config, oomb_cuda_paged** out);
OOMB_C_API void oomb_cuda_paged_destroy(oomb_cuda_paged* session);
/* A step of `chunks` chunks; doc_starts (host, ascending, first 0; NULL/0: one document) are the
 * positions where packed documents start: each query attends its own document only. */
OOMB_C_API int oomb_cuda_paged_begin_step(oomb_cuda_paged* s, int32_t chunks, const int32_t* doc_starts, int32_t docs);
OOMB_C_API int oomb_cuda_paged_append(oomb_cuda_paged* s, int64_t tokens);
OOMB_C_API int oomb_cuda_paged_write(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* k,
                                     const void* v, void* stream);
OOMB_C_API int oomb_cuda_paged_select(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q,
                                      void* stream);
OOMB_C_API int oomb_cuda_paged_expect_recompute(oomb_cuda_paged* s, int32_t chunk);
OOMB_C_API int oomb_cuda_paged_forward(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q,
                                       void* o, float* lse, void* stream);
/* ADDS into dq, dk, dv (the chunk's own keys, with what later chunks left in its gradient pages). */
OOMB_C_API int oomb_cuda_paged_backward(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q,
                                        const void* o, const float* lse, const void* d_o, void* dq, void* dk,
                                        void* dv, void* stream);
OOMB_C_API int oomb_cuda_paged_release_chunk(oomb_cuda_paged* s, int32_t chunk, void* stream);
/* Sparse: the selection stage 1 made for (layer, chunk) in the last step, as the kernels read it:
 * per tile of `tile` queries, ascending logical past pages (indptr [tiles + 1], pages [entries]).
 * *tiles and *entries get the sizes; the arrays (host) are filled when their capacities hold them
 * (NULL with 0: sizes only). */
OOMB_C_API int oomb_cuda_paged_selection(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int32_t* indptr,
                                         int64_t indptr_capacity, int32_t* pages, int64_t pages_capacity,
                                         int64_t* tiles, int64_t* entries);
/* Waits for every copy and kernel of the step, throws what a kernel reported, and fills *stats. */
OOMB_C_API int oomb_cuda_paged_end_step(oomb_cuda_paged* s, oomb_cuda_paged_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* OOMB_CUDA_H */
