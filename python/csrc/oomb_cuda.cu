// oomb's C ABI for the GPU (oomb_cuda.h) over the attention layer's kernels.
// SPDX-License-Identifier: Apache-2.0
//
// Each call plans (plan.hpp: host arithmetic) and launches on the caller's stream, as the trainer's
// CUDA backend does; what the library throws becomes -1 plus a per-thread message.
#include "oomb_cuda.h"

#include "c_abi_errors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "oomb/attention/attention.cuh"
#include "oomb/core/error.hpp"
#include "oomb/paging/page_shape.hpp"
#include "paged_session.hpp"
#include "trainer/cuda/cuda_attention_ops.cuh"
#include "trainer/cuda/huge_page_host_resource.hpp"

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

// ---- paged attention of one sequence: the trainer's paged_attention over the attention backend ----

namespace trainer = oomb_trainer;

/// One event pair per session: the caller's stream -> the session's compute stream at a call's
/// start, and back at its end, so the session's work sits between the caller's in stream order.
class stream_bridge {
 public:
  stream_bridge() {
    OOMB_CUDA_CHECK(cudaEventCreateWithFlags(&in_, cudaEventDisableTiming), "oomb_cuda: event");
    OOMB_CUDA_CHECK(cudaEventCreateWithFlags(&out_, cudaEventDisableTiming), "oomb_cuda: event");
  }
  stream_bridge(const stream_bridge&) = delete;
  stream_bridge& operator=(const stream_bridge&) = delete;
  ~stream_bridge() {
    (void)cudaEventDestroy(in_);
    (void)cudaEventDestroy(out_);
  }
  void enter(cudaStream_t caller, cudaStream_t compute) {
    OOMB_CUDA_CHECK(cudaEventRecord(in_, caller), "oomb_cuda: ordering after the caller's stream");
    OOMB_CUDA_CHECK(cudaStreamWaitEvent(compute, in_, 0), "oomb_cuda: ordering after the caller's stream");
  }
  void leave(cudaStream_t compute, cudaStream_t caller) {
    OOMB_CUDA_CHECK(cudaEventRecord(out_, compute), "oomb_cuda: ordering the caller's stream after the session");
    OOMB_CUDA_CHECK(cudaStreamWaitEvent(caller, out_, 0), "oomb_cuda: ordering the caller's stream after the session");
  }

 private:
  cudaEvent_t in_ = nullptr, out_ = nullptr;
};

/// The session's interface, one implementation per home memory.
struct paged_session {
  virtual ~paged_session() = default;
  virtual void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) = 0;
  virtual void append(std::int64_t n) = 0;
  virtual void write(std::int32_t l, std::int32_t c, std::int64_t n, const oomb::bf16* k, const oomb::bf16* v,
                     cudaStream_t s) = 0;
  virtual void select(std::int32_t l, std::int32_t c, std::int64_t n, const oomb::bf16* q, cudaStream_t s) = 0;
  virtual void expect_recompute(std::int32_t c) = 0;
  virtual void forward(std::int32_t l, std::int32_t c, std::int64_t n, const oomb::bf16* q, oomb::bf16* o, float* lse,
                       cudaStream_t s) = 0;
  virtual void backward(std::int32_t l, std::int32_t c, std::int64_t n, const oomb::bf16* q, const oomb::bf16* o,
                        const float* lse, const oomb::bf16* d_o, oomb::bf16* dq, oomb::bf16* dk, oomb::bf16* dv,
                        cudaStream_t s) = 0;
  virtual void release_chunk(std::int32_t c, cudaStream_t s) = 0;
  virtual oomb_cuda_paged_stats end_step() = 0;
  virtual const oomb::sparse_page_table& selection(std::int32_t l, std::int32_t c) const = 0;
};

template <class Far>
class paged_session_of final : public paged_session {
  using backend = trainer::basic_cuda_attention_ops<Far>;
  using bf16 = oomb::bf16;

 public:
  paged_session_of(const trainer::model_config& cfg, const trainer::chunk_options& opt, std::int64_t max_tokens)
      : s_(cfg, opt, max_tokens) {
    s_.backend().attention_plan(plan_of(opt));
  }

  void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) override {
    s_.begin_step(chunks, doc_starts);
  }
  void append(std::int64_t n) override { s_.append(n); }
  void write(std::int32_t l, std::int32_t c, std::int64_t n, const bf16* k, const bf16* v, cudaStream_t s) override {
    bridged(s, [&] { s_.write(l, c, n, k, v); });
  }
  void select(std::int32_t l, std::int32_t c, std::int64_t n, const bf16* q, cudaStream_t s) override {
    bridged(s, [&] { s_.select(l, c, n, q); });
  }
  void expect_recompute(std::int32_t c) override { s_.expect_recompute(c); }
  void forward(std::int32_t l, std::int32_t c, std::int64_t n, const bf16* q, bf16* o, float* lse,
               cudaStream_t s) override {
    bridged(s, [&] { s_.forward(l, c, n, q, o, lse); });
  }
  void backward(std::int32_t l, std::int32_t c, std::int64_t n, const bf16* q, const bf16* o, const float* lse,
                const bf16* d_o, bf16* dq, bf16* dk, bf16* dv, cudaStream_t s) override {
    bridged(s, [&] { s_.backward(l, c, n, q, o, lse, d_o, dq, dk, dv); });
  }
  void release_chunk(std::int32_t c, cudaStream_t s) override {
    bridged(s, [&] { s_.release_chunk(c); });
  }
  const oomb::sparse_page_table& selection(std::int32_t l, std::int32_t c) const override { return s_.selection(l, c); }
  oomb_cuda_paged_stats end_step() override { return s_.end_step(); }

 private:
  static att::plan_options plan_of(const trainer::chunk_options& o) {
    att::plan_options p;
    p.kernels = o.attention_kernels;
    p.deterministic = o.deterministic;
    return p;
  }
  template <class F>
  void bridged(cudaStream_t caller, F&& f) {
    const cudaStream_t compute = s_.backend().compute().get();
    bridge_.enter(caller, compute);
    f();
    bridge_.leave(compute, caller);
  }

  oomb_c_abi::paged_session<backend> s_;
  stream_bridge bridge_;
};

std::unique_ptr<paged_session> make_session(const oomb_cuda_paged_config& c) {
  OOMB_CUDA_EXPECTS(c.struct_size >= static_cast<std::int32_t>(sizeof(oomb_cuda_paged_config)),
                    "oomb_cuda_paged_config of ", c.struct_size, " bytes, this library needs ",
                    sizeof(oomb_cuda_paged_config));
  const cudaError_t e = cudaSetDevice(c.device);
  if (e != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "oomb_cuda: cannot use device ", c.device, ": ", cudaGetErrorString(e));
  OOMB_CUDA_EXPECTS(c.head_dim == 64 || c.head_dim == 128, "head_dim ", c.head_dim, ": the kernels take 64 or 128");
  OOMB_CUDA_EXPECTS(c.home_memory == 0 || c.home_memory == 1, "home_memory ", c.home_memory, " is not 0 (pinned) or 1 (pageable)");
  auto [cfg, o] = oomb_c_abi::session_setup(c);
  o.homes = c.home_memory == 1 ? trainer::home_memory::pageable : trainer::home_memory::pinned;
  o.deterministic = c.deterministic != 0;
  o.attention_kernels = c.portable ? att::kernel_choice::portable : att::kernel_choice::automatic;
  o.validate();
  if (o.sparse) trainer::check_gpu_sparse_tile(o.tile, c.hq, c.hkv);
  if (!o.offload) return std::make_unique<paged_session_of<oomb::device_resource>>(cfg, o, c.max_tokens);
  if (o.homes == trainer::home_memory::pageable)
    return std::make_unique<paged_session_of<trainer::huge_page_host_resource>>(cfg, o, c.max_tokens);
  return std::make_unique<paged_session_of<oomb::pinned_resource>>(cfg, o, c.max_tokens);
}

}  // namespace

struct oomb_cuda_paged {
  int device = 0;
  std::unique_ptr<paged_session> session;
};

namespace {

/// Checks the handle and makes its device current.
paged_session& session_of(oomb_cuda_paged* s) {
  OOMB_CUDA_EXPECTS(s != nullptr && s->session, "null session");
  const cudaError_t e = cudaSetDevice(s->device);
  if (e != cudaSuccess) OOMB_FAIL(oomb::cuda_error, "oomb_cuda: cannot use device ", s->device, ": ", cudaGetErrorString(e));
  return *s->session;
}

template <class T>
const T* in(const void* p, const char* what) {
  OOMB_CUDA_EXPECTS(p != nullptr, "null ", what);
  return static_cast<const T*>(p);
}
template <class T>
T* out(void* p, const char* what) {
  OOMB_CUDA_EXPECTS(p != nullptr, "null ", what);
  return static_cast<T*>(p);
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

int oomb_cuda_paged_create(const oomb_cuda_paged_config* config, oomb_cuda_paged** out) {
  return guarded([&] {
    OOMB_CUDA_EXPECTS(config != nullptr && out != nullptr, "null argument");
    *out = nullptr;
    auto s = std::make_unique<oomb_cuda_paged>();
    s->device = config->device;
    s->session = make_session(*config);
    *out = s.release();
  });
}

void oomb_cuda_paged_destroy(oomb_cuda_paged* s) {
  if (s == nullptr) return;
  (void)cudaSetDevice(s->device);
  delete s;
}

int oomb_cuda_paged_begin_step(oomb_cuda_paged* s, int32_t chunks, const int32_t* doc_starts, int32_t docs) {
  return guarded([&] {
    OOMB_CUDA_EXPECTS(chunks > 0 && docs >= 0 && (docs == 0 || doc_starts != nullptr), "bad step: ", chunks,
                      " chunks, ", docs, " documents");
    session_of(s).begin_step(chunks, std::vector<std::int32_t>(doc_starts, doc_starts + docs));
  });
}

int oomb_cuda_paged_append(oomb_cuda_paged* s, int64_t tokens) {
  return guarded([&] { session_of(s).append(tokens); });
}

int oomb_cuda_paged_write(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* k, const void* v,
                          void* stream) {
  return guarded([&] {
    session_of(s).write(layer, chunk, n, in<oomb::bf16>(k, "k"), in<oomb::bf16>(v, "v"),
                        static_cast<cudaStream_t>(stream));
  });
}

int oomb_cuda_paged_select(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, void* stream) {
  return guarded([&] {
    session_of(s).select(layer, chunk, n, in<oomb::bf16>(q, "q"), static_cast<cudaStream_t>(stream));
  });
}

int oomb_cuda_paged_expect_recompute(oomb_cuda_paged* s, int32_t chunk) {
  return guarded([&] { session_of(s).expect_recompute(chunk); });
}

int oomb_cuda_paged_forward(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, void* o,
                            float* lse, void* stream) {
  return guarded([&] {
    session_of(s).forward(layer, chunk, n, in<oomb::bf16>(q, "q"), out<oomb::bf16>(o, "o"), out<float>(lse, "lse"),
                          static_cast<cudaStream_t>(stream));
  });
}

int oomb_cuda_paged_backward(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, const void* o,
                             const float* lse, const void* d_o, void* dq, void* dk, void* dv, void* stream) {
  return guarded([&] {
    session_of(s).backward(layer, chunk, n, in<oomb::bf16>(q, "q"), in<oomb::bf16>(o, "o"), in<float>(lse, "lse"),
                           in<oomb::bf16>(d_o, "d_o"), out<oomb::bf16>(dq, "dq"), out<oomb::bf16>(dk, "dk"),
                           out<oomb::bf16>(dv, "dv"), static_cast<cudaStream_t>(stream));
  });
}

int oomb_cuda_paged_release_chunk(oomb_cuda_paged* s, int32_t chunk, void* stream) {
  return guarded([&] { session_of(s).release_chunk(chunk, static_cast<cudaStream_t>(stream)); });
}

int oomb_cuda_paged_selection(oomb_cuda_paged* s, int32_t layer, int32_t chunk, int32_t* indptr,
                              int64_t indptr_capacity, int32_t* pages, int64_t pages_capacity, int64_t* tiles,
                              int64_t* entries) {
  return guarded([&] {
    OOMB_CUDA_EXPECTS(tiles != nullptr && entries != nullptr, "null size outputs");
    oomb_c_abi::copy_selection(session_of(s).selection(layer, chunk), indptr, indptr_capacity, pages, pages_capacity,
                               tiles, entries);
  });
}

int oomb_cuda_paged_end_step(oomb_cuda_paged* s, oomb_cuda_paged_stats* stats) {
  return guarded([&] {
    OOMB_CUDA_EXPECTS(stats != nullptr, "null stats");
    *stats = session_of(s).end_step();
  });
}

}  // extern "C"
