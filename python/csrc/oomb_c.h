/* oomb's C ABI: what the Python package (python/src/oomb) loads through ctypes.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Plain C: no Python, no torch, no C++ types cross it, so one build of the shared library serves
 * every Python version and every torch that can hand out a pointer, a shape and strides. Tensors
 * cross as pointers to contiguous memory plus the sizes below; the Python layer checks shapes,
 * dtypes, devices and contiguity before it calls.
 *
 * Every function returns 0 on success and -1 on failure; then oomb_last_error() (per thread) says
 * what was asked and what was wrong, as the library's exceptions do. Nothing here aborts.
 *
 * Growth is additive: a new entry point or a new trailing field of oomb_attention_args (whose
 * struct_size says how much of it the caller filled in) bumps OOMB_C_ABI_VERSION; nothing existing
 * changes meaning. Version 4 is the one exception: it added the paged session and took out the
 * store's near tiers, page summaries and attention over a store (oomb_store_config lost four fields),
 * whose work is the session's (the trainer's algorithm) now. The CUDA entry points live in a library of their own (oomb_cuda.h), so this one
 * needs no CUDA to build or load.
 */
#ifndef OOMB_C_H
#define OOMB_C_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OOMB_C_ABI_VERSION 4

/* The library is built with hidden visibility: only what carries OOMB_C_API is exported. */
#if defined(_WIN32)
#define OOMB_C_API __declspec(dllexport)
#else
#define OOMB_C_API __attribute__((visibility("default")))
#endif

/* Element types. A BF16 store holds bf16 K/V pages and fp32 gradient pages (the GPU kernels'). */
enum { OOMB_DTYPE_F32 = 0, OOMB_DTYPE_F64 = 1, OOMB_DTYPE_BF16 = 2 };

/* Where a store's pools live. HOST: oomb's host resource (the CPU path, float32/float64). CALLER:
 * blocks from the caller's allocator, the two callbacks of the config (the GPU path passes torch's
 * CUDA caching allocator); the store then never reads or writes the pools' bytes, so fresh gradient
 * pages are zero-filled by the caller (oomb_store_touch_grads_fresh), and oomb_store_touch_grads
 * (which writes zeros) is refused. */
enum { OOMB_MEMORY_HOST = 0, OOMB_MEMORY_CALLER = 1 };
/* NULL (or a throw) for "no memory"; the block must be `alignment`-aligned. */
typedef void* (*oomb_allocate_fn)(void* ctx, int64_t bytes, int64_t alignment);
typedef void (*oomb_deallocate_fn)(void* ctx, void* p, int64_t bytes);

OOMB_C_API int32_t oomb_abi_version(void);
/* "major.minor.patch" of the oomb headers the library was built from. */
OOMB_C_API const char* oomb_version(void);
/* The message of the calling thread's last failure ("" when none). */
OOMB_C_API const char* oomb_last_error(void);

/* ---- Paged store: the library's paged_kv_cache (K/V pages of every layer, one pool) and its
 * grad_mirror (a gradient page pair per KV page that received a gradient), in host memory from
 * oomb's host_resource or in the caller's, counted by a statistics_adaptor; the pages of dense
 * attention read in place. Pages are token-major: the pool is [capacity][2 (K, V)][page][kv_heads]
 * [head_dim]. Offload and page-sparse attention are the paged session's (below). */
typedef struct oomb_store oomb_store;

typedef struct {
  int32_t dtype;
  int32_t layers;
  int32_t page_size; /* a power of two >= 16 */
  int32_t kv_heads;
  int32_t head_dim;
  int32_t chunk_size; /* a multiple of page_size */
  int32_t max_pages;  /* K/V page pairs, all layers together */
  int32_t max_grad_pages;
  /* OOMB_MEMORY_HOST, or OOMB_MEMORY_CALLER with both callbacks (called with ctx). */
  int32_t memory;
  oomb_allocate_fn allocate;
  oomb_deallocate_fn deallocate;
  void* ctx;
} oomb_store_config;

typedef struct {
  int32_t kv_in_use, kv_high_water, kv_capacity;
  int32_t grad_in_use, grad_high_water, grad_capacity;
  int64_t pair_bytes;     /* one K/V (or dK/dV) page pair */
  int64_t bytes_reserved; /* taken from the host resource now */
  int64_t bytes_peak;
} oomb_store_stats;

OOMB_C_API int oomb_store_create(const oomb_store_config* config, oomb_store** out);
OOMB_C_API void oomb_store_destroy(oomb_store* store);
OOMB_C_API int oomb_store_add_sequence(oomb_store* store, int32_t* seq);
/* Appends 1..chunk_size tokens to `seq` in every layer (all pages at once or none). */
OOMB_C_API int oomb_store_append(oomb_store* store, int32_t seq, int64_t tokens, int64_t* first_pos);
/* Pops the last chunk of `seq` in every layer: its K/V pages and their gradient pages. */
OOMB_C_API int oomb_store_pop_chunk(oomb_store* store, int32_t seq, int64_t* tokens);
OOMB_C_API int oomb_store_seq_len(const oomb_store* store, int32_t seq, int64_t* len);
/* Pool ids of logical pages [first, last) of (seq, layer). */
OOMB_C_API int oomb_store_page_ids(const oomb_store* store, int32_t seq, int32_t layer, int32_t first, int32_t last,
                        int32_t* out);
/* The K/V pool's memory (capacity pairs) and the gradient pool's, with the gradient id table
 * (kv_ids entries, indexed by KV page id, -1 = no gradient page). Addresses are stable for the
 * store's lifetime; the table's entries change with touch_grads and pop_chunk. */
OOMB_C_API int oomb_store_kv_pool(oomb_store* store, void** base, int64_t* capacity);
OOMB_C_API int oomb_store_grad_pool(oomb_store* store, void** base, int64_t* capacity, int32_t** grad_ids,
                         int64_t* kv_ids);
/* Gives each KV page in the list a zero-filled gradient page if it has none (idempotent). */
OOMB_C_API int oomb_store_touch_grads(oomb_store* store, const int32_t* kv_ids, int64_t n);
/* The same without writing the pages (any store; the only way for a CALLER store): the gradient ids
 * given out fresh go to fresh_ids (room for n), their count to *fresh; the caller zero-fills them
 * before anything reads them. */
OOMB_C_API int oomb_store_touch_grads_fresh(oomb_store* store, const int32_t* kv_ids, int64_t n, int32_t* fresh_ids,
                                            int64_t* fresh);
OOMB_C_API int oomb_store_stats_get(const oomb_store* store, oomb_store_stats* out);

/* ---- Attention of one chunk's queries over the past pages of a pool plus the chunk's own K/V,
 * causal, GQA, optionally page-sparse over the past; the CPU reference
 * (oomb/attention/reference.hpp), one window for the past and one for the chunk, folded by
 * log-sum-exp. All pointers host memory, contiguous, of `dtype`. */
typedef struct {
  int32_t struct_size; /* sizeof(oomb_attention_args) as the caller knows it */
  int32_t dtype;
  const void* q; /* [sq][hq][d], RoPE applied */
  int64_t sq;
  int32_t hq, hkv, d;
  int64_t q_start; /* absolute position of query 0; a multiple of page_size */
  double scale;
  const void* kv_own; /* [2][sq][hkv][d]: the chunk's K then V (positions q_start..) */
  const void* pool;   /* [pool_pages][2][page_size][hkv][d] */
  int64_t pool_pages;
  int32_t page_size;
  const int32_t* past_ids; /* pool ids of logical pages 0 .. q_start / page_size - 1 */
  /* Page-sparse past: per tile of `tile` queries, ascending logical indices of the past pages
   * the tile attends (indptr [ceil(sq / tile) + 1]); NULL = dense. */
  const int32_t* tile_indptr;
  const int32_t* tile_pages;
  int32_t tile;
  /* Packed documents (v3): query i attends only keys at positions >= key_lower[i], the start of
   * its document (int64 [sq], non-decreasing, at most q_start + i); NULL = one document. */
  const int64_t* key_lower;
} oomb_attention_args;

/* o [sq][hq][d], lse [hq][sq] (natural log). */
OOMB_C_API int oomb_attention_forward(const oomb_attention_args* args, void* o, void* lse);
/* Given the forward's o and lse and d_o: writes dq [sq][hq][d], dk, dv [sq][hkv][d] (the chunk's
 * own keys) and ADDS the past pages' dK/dV into their gradient pages: grad_pool is
 * [grad_pool_pages][2][page_size][hkv][d], grad_ids [num_kv_ids] maps a KV page id to its gradient
 * page (every past page the call attends must have one). */
OOMB_C_API int oomb_attention_backward(const oomb_attention_args* args, const void* o, const void* lse, const void* d_o,
                            void* dq, void* dk, void* dv, void* grad_pool, int64_t grad_pool_pages,
                            const int32_t* grad_ids, int64_t num_kv_ids);

/* ---- Paged attention of one sequence (v4): the chunk-recurrent trainer's algorithm
 * (examples/trainer/algo/paged_attention.hpp) over its CPU backend (examples/trainer/cpu/cpu_ops.hpp),
 * for the package's offload and page-sparse runs on the CPU; liboomb_cuda has the same session over
 * the GPU (oomb_cuda_paged_*). The session owns its pages: K/V and gradient pages in host pools, with
 * offload streamed through fixed sets of near slots by oomb's residency schedulers on host streams
 * (the windows, prefetch and Belady eviction of the trainer); with sparse, page summaries and the tile
 * selection. Layer l's calls for chunk c follow the trainer's order: stage 1 (c = 0, 1, ...): append
 * the chunk's tokens once, then per layer write (its K/V), select (sparse), forward; stage 2 (c = last
 * .. 0): expect_recompute(c), forward for every layer (the recomputation), backward from the last layer
 * down, then release_chunk(c); end_step after chunk 0. Pointers are host memory of the config's dtype:
 * q [n][hq][d], k and v [n][hkv][d], o, d_o, dq [n][hq][d], lse [hq][n]; scores are scaled by
 * 1/sqrt(head_dim). */
typedef struct oomb_paged oomb_paged;

/* A near tier's counters: bytes moved each way, hits, misses, evictions, write-backs, zero-fills;
 * its slots and their bytes (0 in place). */
typedef struct {
  int64_t bytes_to_near, bytes_to_far;
  int64_t hits, misses, evictions, write_backs, zero_fills;
  int32_t slots;
  int64_t slot_bytes;
} oomb_residency_stats;

typedef struct {
  int32_t struct_size; /* sizeof(oomb_paged_config) as the caller knows it */
  int32_t dtype;       /* OOMB_DTYPE_F32 or OOMB_DTYPE_F64: pages, gradient pages and arithmetic */
  int32_t layers, hq, hkv, head_dim;
  int32_t chunk, page; /* page: a power of two >= 16 dividing chunk */
  int64_t max_tokens;  /* the longest sequence a step may bring */
  int32_t offload;     /* 0: every page read in place; 1: streamed through near slots */
  int32_t near_pages;  /* offload: slots for K/V pages, and as many for gradient pages; 0: the trainer's default */
  int32_t window_pages; /* needed pages per attention window; 0: near_pages / 2 (offload), else one window */
  int32_t grad_homes;  /* offload: 0 the dtype, 1 bf16 (rounded to nearest even), 2 bf16 rounded stochastically */
  int32_t sparse;      /* nonzero: page-sparse attention over the past */
  int32_t budget, sink, local, tile;
  int32_t scoring;     /* 0: Quest bound, 1: mean key */
} oomb_paged_config;

/* What a paged session holds and moved (both libraries' sessions report it). */
typedef struct {
  int32_t kv_in_use, grad_in_use;         /* K/V and gradient page pairs held now */
  int32_t kv_high_water, grad_high_water; /* the most held at once since the session was made */
  oomb_residency_stats kv, grad;          /* the near tiers since the session was made (zeros in place) */
  double exposed_transfer_seconds;        /* this step: compute waiting for page copies (GPU only; 0 on the CPU) */
  int64_t near_bytes;                     /* the near slots of both tiers (fixed) */
  int64_t far_bytes;                      /* what the K/V and gradient pools (or homes) hold now */
  int64_t sparse_pages_selected, sparse_pages_candidate; /* this step: sums over tiles */
} oomb_paged_stats;

OOMB_C_API int oomb_paged_create(const oomb_paged_config* config, oomb_paged** out);
OOMB_C_API void oomb_paged_destroy(oomb_paged* session);
/* A step of `chunks` chunks; doc_starts (ascending, first 0; NULL/0: one document) are the positions
 * where packed documents start: each query attends its own document only. */
OOMB_C_API int oomb_paged_begin_step(oomb_paged* s, int32_t chunks, const int32_t* doc_starts, int32_t docs);
OOMB_C_API int oomb_paged_append(oomb_paged* s, int64_t tokens);
OOMB_C_API int oomb_paged_write(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* k, const void* v);
OOMB_C_API int oomb_paged_select(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q);
OOMB_C_API int oomb_paged_expect_recompute(oomb_paged* s, int32_t chunk);
OOMB_C_API int oomb_paged_forward(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, void* o,
                                  void* lse);
/* ADDS into dq, dk, dv (the chunk's own keys, with what later chunks left in its gradient pages). */
OOMB_C_API int oomb_paged_backward(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q,
                                   const void* o, const void* lse, const void* d_o, void* dq, void* dk, void* dv);
OOMB_C_API int oomb_paged_release_chunk(oomb_paged* s, int32_t chunk);
/* Sparse: the selection stage 1 made for (layer, chunk) in the last step: per tile of `tile`
 * queries, ascending logical past pages (indptr [tiles + 1], pages [entries]). *tiles and *entries
 * get the sizes; the arrays are filled when their capacities hold them (NULL with 0: sizes only). */
OOMB_C_API int oomb_paged_selection(oomb_paged* s, int32_t layer, int32_t chunk, int32_t* indptr,
                                    int64_t indptr_capacity, int32_t* pages, int64_t pages_capacity, int64_t* tiles,
                                    int64_t* entries);
OOMB_C_API int oomb_paged_end_step(oomb_paged* s, oomb_paged_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* OOMB_C_H */
