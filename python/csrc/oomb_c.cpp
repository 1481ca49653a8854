// oomb's C ABI (oomb_c.h) over the library's headers: the paged store and the CPU attention (the
// paged session is oomb_c_paged.cpp).
// SPDX-License-Identifier: Apache-2.0
//
// Every entry point catches what the library throws and turns it into -1 plus a per-thread
// message, so no C++ exception crosses into ctypes.
#include "oomb_c.h"

#include "c_abi_errors.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "oomb/attention/reference.hpp"
#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/version.hpp"
#include "oomb/memory/callback_resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "oomb/paging/grad_mirror.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "oomb/paging/views.hpp"

// The CPU reference's names, in one place (the attention layer may still rename them).
namespace ref = oomb::attention::reference;
template <class T>
using ref_args = ref::attention_args<T, T>;

namespace {

using oomb_c_abi::guarded;

#define OOMB_C_EXPECTS(cond, ...) OOMB_EXPECTS(cond, "oomb_c: ", __VA_ARGS__)

using far_resource = oomb::statistics_adaptor<oomb::host_resource>;
/// The caller's allocator (the GPU path: torch's CUDA caching allocator), counted the same way.
using caller_allocator = oomb::callback_resource<oomb::memory_kind::device>;
using caller_resource = oomb::statistics_adaptor<caller_allocator>;

/// One element type's store; the C handle holds one of the two.
struct store_base {
  virtual ~store_base() = default;
};

/// K/V pages of E and gradient pages of G in memory from R: the CPU path's host stores (E = G =
/// float or double) and the GPU path's caller store (bf16 pages, fp32 gradients, device memory).
template <class E, class G, class R>
struct typed_store final : store_base {
  using element_type = E;
  using cache_type = oomb::paged_kv_cache<E, R>;
  using mirror_type = oomb::grad_mirror<G, R>;

  typed_store(R& r, const oomb::paged_kv_config& kc, const oomb::grad_mirror_config& gc) : cache(r, kc), grads(r, gc) {}

  cache_type cache;
  mirror_type grads;
};

template <class E>
using host_store = typed_store<E, E, far_resource>;
using caller_store = typed_store<oomb::bf16, float, caller_resource>;

}  // namespace

struct oomb_store {
  oomb_store_config config{};
  oomb::host_resource host;
  far_resource counted{host};
  std::unique_ptr<caller_allocator> caller;     // CALLER stores: the config's callbacks
  std::unique_ptr<caller_resource> caller_counted;
  std::unique_ptr<store_base> impl;             // declared last of the memory: destroyed first

  template <class T>
  T& as() {
    return static_cast<T&>(*impl);
  }
  template <class T>
  const T& as() const {
    return static_cast<const T&>(*impl);
  }
  /// Calls f(typed store&) with the store's types: any store.
  template <class F>
  void visit(F&& f) {
    if (config.dtype == OOMB_DTYPE_BF16) return f(as<caller_store>());
    visit_host(f);
  }
  template <class F>
  void visit(F&& f) const {
    if (config.dtype == OOMB_DTYPE_BF16) return f(as<caller_store>());
    visit_host(f);
  }
  /// The same for what writes the pages on the host (zero-filling): a host store's only.
  template <class F>
  void visit_host(F&& f) {
    check_host();
    if (config.dtype == OOMB_DTYPE_F64)
      f(as<host_store<double>>());
    else
      f(as<host_store<float>>());
  }
  template <class F>
  void visit_host(F&& f) const {
    check_host();
    if (config.dtype == OOMB_DTYPE_F64)
      f(as<host_store<double>>());
    else
      f(as<host_store<float>>());
  }
  void check_host() const {
    OOMB_EXPECTS(config.memory == OOMB_MEMORY_HOST, "oomb_c: this store's pages are in the caller's memory (bf16, the ",
                 "GPU path): the host cannot write them (touch_grads)");
  }
  oomb::resource_statistics statistics() const {
    return caller_counted ? caller_counted->statistics() : counted.statistics();
  }
};

namespace {

void check_dtype(std::int32_t dtype) {
  OOMB_C_EXPECTS(dtype == OOMB_DTYPE_F32 || dtype == OOMB_DTYPE_F64, "dtype ", dtype,
                 " is not one of the CPU path's (0: float32, 1: float64)");
}

void check_store(const oomb_store* s) { OOMB_C_EXPECTS(s != nullptr, "null store"); }

oomb::page_shape shape_of(const oomb_store_config& c) {
  oomb::page_shape s;
  s.page_size = c.page_size;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.layout = oomb::kv_layout::token_major;
  return s;
}

// ---- attention over the past pages of a pool plus the chunk's own K/V ----

oomb::page_shape token_major(std::int32_t page_size, std::int32_t hkv, std::int32_t d) {
  oomb::page_shape s;
  s.page_size = page_size;
  s.kv_heads = hkv;
  s.head_dim = d;
  s.layout = oomb::kv_layout::token_major;
  return s;
}

/// Checks what every call needs and returns the number of past pages (q_start / page_size).
std::int32_t check_call(const oomb_attention_args& a) {
  OOMB_C_EXPECTS(a.struct_size >= static_cast<std::int32_t>(sizeof(oomb_attention_args)),
                 "oomb_attention_args of ", a.struct_size, " bytes, this library needs ",
                 sizeof(oomb_attention_args));
  OOMB_C_EXPECTS(a.sq > 0 && a.sq <= std::numeric_limits<std::int32_t>::max(), "sq ", a.sq, " out of range");
  OOMB_C_EXPECTS(a.page_size > 0 && a.q_start >= 0 && a.q_start % a.page_size == 0, "q_start ", a.q_start,
                 " must be a non-negative multiple of the page size ", a.page_size);
  OOMB_C_EXPECTS(a.q != nullptr && a.kv_own != nullptr, "null q or kv_own");
  OOMB_C_EXPECTS(a.hq > 0 && a.hkv > 0 && a.d > 0, "bad heads/head_dim ", a.hq, "/", a.hkv, "/", a.d);
  OOMB_C_EXPECTS(a.tile_indptr == nullptr || a.tile > 0, "a sparse call needs tile > 0, got ", a.tile);
  const std::int64_t past_pages = a.q_start / a.page_size;
  OOMB_C_EXPECTS(past_pages <= std::numeric_limits<std::int32_t>::max(), "too many past pages");
  return static_cast<std::int32_t>(past_pages);
}

template <class T>
ref_args<T> base_args(const oomb_attention_args& a) {
  ref_args<T> r{};
  r.q = static_cast<const T*>(a.q);
  r.q_start = a.q_start;
  r.sq = static_cast<std::int32_t>(a.sq);
  r.hq = a.hq;
  r.hkv = a.hkv;
  r.d = a.d;
  r.scale = static_cast<T>(a.scale);
  r.key_lower = a.key_lower;  // every window of the call: the reference checks the bounds
  return r;
}

/// A window of past pages: logical pages first, first + 1, ... (n of them), named by `ids` in the
/// pool at `base`. Sparse calls keep the tile selection
/// (logical indices over the whole past); a page no tile selects may have id -1.
template <class T>
struct past_window {
  std::vector<std::int32_t> indptr, last;
  ref_args<T> args;
  past_window(const oomb_attention_args& a, const T* base, const std::int32_t* ids, std::int32_t first,
              std::int32_t n)
      : indptr{0, n}, last{a.page_size}, args(base_args<T>(a)) {
    args.kv.pool = oomb::page_pool_view<const T>::over(base, token_major(a.page_size, a.hkv, a.d));
    args.kv.table.indptr = indptr.data();
    args.kv.table.indices = ids;
    args.kv.table.last_page_len = last.data();
    args.kv.table.num_seqs = 1;
    args.kv.table.page_size = a.page_size;
    args.first_page = first;
    if (a.tile_indptr != nullptr) {
      args.tile_indptr = a.tile_indptr;
      args.tile_pages = a.tile_pages;
      args.tile = a.tile;
    }
  }
};

/// The chunk itself: its [2][sq][hkv][d] K/V tensor seen as pages of page_size tokens (page i of K
/// at kv_own + i * page elements, V sq rows further), logical pages q_start / page_size on.
template <class T>
struct own_window {
  std::vector<std::int32_t> indptr, ids, last;
  ref_args<T> args;
  explicit own_window(const oomb_attention_args& a) : args(base_args<T>(a)) {
    const auto sq = static_cast<std::int32_t>(a.sq);
    const std::int64_t row = std::int64_t(a.hkv) * a.d;
    const std::int32_t n = (sq + a.page_size - 1) / a.page_size;
    indptr = {0, n};
    ids.resize(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i;
    last = {sq - (n - 1) * a.page_size};
    auto& p = args.kv.pool;
    p.base = static_cast<const T*>(a.kv_own);
    p.pair_stride = std::int64_t(a.page_size) * row;
    p.v_offset = std::int64_t(sq) * row;
    p.stride_token = row;
    p.stride_head = a.d;
    p.page_size = a.page_size;
    p.kv_heads = a.hkv;
    p.head_dim = a.d;
    args.kv.table.indptr = indptr.data();
    args.kv.table.indices = ids.data();
    args.kv.table.last_page_len = last.data();
    args.kv.table.num_seqs = 1;
    args.kv.table.page_size = a.page_size;
    args.first_page = static_cast<std::int32_t>(a.q_start / a.page_size);
  }
};

/// Forward of one window into (o, lse): the first window writes them, later ones merge into them.
template <class T>
void forward_window(const ref_args<T>& w, const oomb_attention_args& a, bool first, T* o, T* lse) {
  if (first) {
    ref::attention_forward(w, o, lse);
    return;
  }
  const std::int64_t n_o = a.sq * a.hq * a.d, n_l = a.sq * a.hq;
  std::vector<T> o2(static_cast<std::size_t>(n_o)), l2(static_cast<std::size_t>(n_l));
  ref::attention_forward(w, o2.data(), l2.data());
  ref::merge_partial(static_cast<std::int32_t>(a.sq), a.hq, a.d, o, lse, o2.data(), l2.data());
}

template <class T>
void forward_impl(const oomb_attention_args& a, T* o, T* lse) {
  const std::int32_t np = check_call(a);
  OOMB_C_EXPECTS(np == 0 || (a.pool != nullptr && a.past_ids != nullptr), "q_start ", a.q_start, " needs ", np,
                 " past pages but the pool or its ids are null");
  for (std::int32_t i = 0; i < np; ++i)
    OOMB_C_EXPECTS(a.past_ids[i] >= 0 && a.past_ids[i] < a.pool_pages, "past page ", i, " has id ", a.past_ids[i],
                   ", outside the pool's ", a.pool_pages, " pages");
  if (np > 0) forward_window(past_window<T>(a, static_cast<const T*>(a.pool), a.past_ids, 0, np).args, a, true, o, lse);
  forward_window(own_window<T>(a).args, a, np == 0, o, lse);
}

template <class T>
void zero_grads(const oomb_attention_args& a, T* dq, T* dk, T* dv) {
  const std::int64_t n_q = a.sq * a.hq * a.d, n_k = a.sq * a.hkv * a.d;
  std::fill(dq, dq + n_q, T(0));
  std::fill(dk, dk + n_k, T(0));
  std::fill(dv, dv + n_k, T(0));
}

template <class T>
void backward_impl(const oomb_attention_args& a, const T* o, const T* lse, const T* d_o, T* dq, T* dk, T* dv,
                   T* grad_pool, std::int64_t grad_pool_pages, const std::int32_t* grad_ids,
                   std::int64_t num_kv_ids) {
  const std::int32_t np = check_call(a);
  zero_grads(a, dq, dk, dv);
  if (np > 0) {
    OOMB_C_EXPECTS(a.pool != nullptr && a.past_ids != nullptr, "q_start ", a.q_start, " needs ", np,
                   " past pages but the pool or its ids are null");
    OOMB_C_EXPECTS(grad_pool != nullptr && grad_ids != nullptr && num_kv_ids >= a.pool_pages,
                   "a backward over ", np, " past pages needs the gradient pool and an id table of ",
                   a.pool_pages, " entries (got ", num_kv_ids, ")");
    OOMB_C_EXPECTS(num_kv_ids <= std::numeric_limits<std::int32_t>::max(), "id table too large");
    for (std::int32_t i = 0; i < np; ++i) {
      OOMB_C_EXPECTS(a.past_ids[i] >= 0 && a.past_ids[i] < a.pool_pages, "past page ", i, " has id ",
                     a.past_ids[i], ", outside the pool's ", a.pool_pages, " pages");
      const std::int32_t g = grad_ids[a.past_ids[i]];
      OOMB_C_EXPECTS(g < grad_pool_pages, "past page ", i, " (id ", a.past_ids[i], ") has gradient page ", g,
                     ", outside the gradient pool's ", grad_pool_pages, " pages");
    }
    // The caller's table is by K/V id; the reference takes one gradient page per window entry.
    std::vector<std::int32_t> entry_grads(static_cast<std::size_t>(np));
    for (std::int32_t i = 0; i < np; ++i) entry_grads[static_cast<std::size_t>(i)] = grad_ids[a.past_ids[i]];
    oomb::window_grad_view<T> m;
    m.pool = oomb::page_pool_view<T>::over(grad_pool, token_major(a.page_size, a.hkv, a.d));
    m.grad_page = entry_grads.data();
    m.pages = np;
    ref::attention_backward(past_window<T>(a, static_cast<const T*>(a.pool), a.past_ids, 0, np).args, o, lse, d_o,
                            dq, dk, dv, m);
  }
  ref::attention_backward(own_window<T>(a).args, o, lse, d_o, dq, dk, dv, oomb::window_grad_view<T>{});
}

/// Touching `kv_ids` is all or nothing on running out: the ids are checked and the fresh pages
/// they need counted against what the gradient pool has left before any is given out.
template <class Mirror>
void check_room_for_touches(const Mirror& grads, const std::int32_t* kv_ids, std::int64_t n) {
  std::int64_t fresh = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    OOMB_C_EXPECTS(kv_ids[i] >= 0 && kv_ids[i] < grads.num_kv_ids(), "KV page id ", kv_ids[i], " out of range [0, ",
                   grads.num_kv_ids(), ")");
    fresh += grads.touched(kv_ids[i]) ? 0 : 1;
  }
  const auto st = grads.stats();
  OOMB_CHECK(fresh <= st.capacity - st.in_use, oomb::out_of_memory, "oomb_c: ", fresh,
             " new gradient pages needed, the gradient pool has ", st.capacity - st.in_use, " left of ", st.capacity);
}

}  // namespace

extern "C" {

int32_t oomb_abi_version(void) { return OOMB_C_ABI_VERSION; }
const char* oomb_version(void) { return OOMB_VERSION_STRING; }
const char* oomb_last_error(void) { return oomb_c_abi::last_error().c_str(); }

int oomb_store_create(const oomb_store_config* config, oomb_store** out) {
  return guarded([&] {
    OOMB_C_EXPECTS(config != nullptr && out != nullptr, "null argument");
    *out = nullptr;
    const oomb_store_config c = *config;
    OOMB_C_EXPECTS(c.memory == OOMB_MEMORY_HOST || c.memory == OOMB_MEMORY_CALLER, "memory ", c.memory,
                   " is not 0 (host) or 1 (the caller's)");
    if (c.memory == OOMB_MEMORY_HOST)
      check_dtype(c.dtype);
    else
      OOMB_C_EXPECTS(c.dtype == OOMB_DTYPE_BF16 && c.allocate != nullptr && c.deallocate != nullptr,
                     "a store in the caller's memory holds bf16 pages (dtype 2) and needs both callbacks (got dtype ",
                     c.dtype, ")");
    OOMB_C_EXPECTS(c.max_grad_pages > 0, "max_grad_pages must be positive, got ", c.max_grad_pages);
    auto s = std::make_unique<oomb_store>();
    s->config = c;
    oomb::paged_kv_config kc;
    kc.layers = c.layers;
    kc.shape = shape_of(c);
    kc.chunk_size = c.chunk_size;
    kc.pool.max_pages = c.max_pages;
    kc.record_changes = false;  // no device table to update on the CPU path
    kc.validate();
    oomb::grad_mirror_config gc;
    gc.shape = kc.shape;
    gc.kv_ids = c.max_pages;
    gc.pool.max_pages = c.max_grad_pages;
    gc.validate();
    if (c.memory == OOMB_MEMORY_CALLER) {
      kc.record_changes = false;  // the caller uploads the page ids it launches with
      s->caller = std::make_unique<caller_allocator>(
          [c](std::size_t bytes, std::size_t alignment) {
            return c.allocate(c.ctx, static_cast<int64_t>(bytes), static_cast<int64_t>(alignment));
          },
          [c](void* p, std::size_t bytes, std::size_t) { c.deallocate(c.ctx, p, static_cast<int64_t>(bytes)); });
      s->caller_counted = std::make_unique<caller_resource>(*s->caller);
      s->impl = std::make_unique<caller_store>(*s->caller_counted, kc, gc);
    } else if (c.dtype == OOMB_DTYPE_F64) {
      s->impl = std::make_unique<host_store<double>>(s->counted, kc, gc);
    } else {
      s->impl = std::make_unique<host_store<float>>(s->counted, kc, gc);
    }
    *out = s.release();
  });
}

void oomb_store_destroy(oomb_store* store) { delete store; }

int oomb_store_add_sequence(oomb_store* store, int32_t* seq) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) { *seq = t.cache.add_sequence(); });
  });
}

int oomb_store_append(oomb_store* store, int32_t seq, int64_t tokens, int64_t* first_pos) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) { *first_pos = t.cache.append(seq, tokens); });
  });
}

int oomb_store_pop_chunk(oomb_store* store, int32_t seq, int64_t* tokens) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) {
      *tokens = t.cache.pop_chunk(seq, [&](std::int32_t id) { t.grads.release_if_touched(id); });
    });
  });
}

int oomb_store_seq_len(const oomb_store* store, int32_t seq, int64_t* len) {
  return guarded([&] {
    check_store(store);
    store->visit([&](const auto& t) { *len = t.cache.seq_len(seq); });
  });
}

int oomb_store_page_ids(const oomb_store* store, int32_t seq, int32_t layer, int32_t first, int32_t last,
                        int32_t* out) {
  return guarded([&] {
    check_store(store);
    store->visit([&](const auto& t) {
      OOMB_C_EXPECTS(layer >= 0 && layer < t.cache.num_layers(), "layer ", layer, " out of range [0, ",
                     t.cache.num_layers(), ")");
      const std::int32_t n = t.cache.num_pages(seq);
      OOMB_C_EXPECTS(first >= 0 && first <= last && last <= n, "pages [", first, ", ", last,
                     ") of sequence ", seq, " which has ", n);
      const oomb::id_span ids = t.cache.page_ids(seq, layer);
      for (std::int32_t i = first; i < last; ++i) out[i - first] = ids[static_cast<std::size_t>(i)];
    });
  });
}

int oomb_store_kv_pool(oomb_store* store, void** base, int64_t* capacity) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) {
      *base = t.cache.pool().base();
      *capacity = t.cache.pool().capacity();
    });
  });
}

int oomb_store_grad_pool(oomb_store* store, void** base, int64_t* capacity, int32_t** grad_ids, int64_t* kv_ids) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) {
      *base = t.grads.pool().base();
      *capacity = t.grads.pool().capacity();
      // The table is the mirror's own vector, sized once at construction: its address is stable.
      *grad_ids = const_cast<std::int32_t*>(t.grads.grad_ids().data());
      *kv_ids = t.grads.num_kv_ids();
    });
  });
}

int oomb_store_touch_grads(oomb_store* store, const int32_t* kv_ids, int64_t n) {
  return guarded([&] {
    check_store(store);
    store->visit_host([&](auto& t) {
      check_room_for_touches(t.grads, kv_ids, n);
      for (std::int64_t i = 0; i < n; ++i) t.grads.touch_zeroed(kv_ids[i]);
    });
  });
}

int oomb_store_touch_grads_fresh(oomb_store* store, const int32_t* kv_ids, int64_t n, int32_t* fresh_ids,
                                 int64_t* fresh) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(fresh != nullptr && (n == 0 || (kv_ids != nullptr && fresh_ids != nullptr)), "null argument");
    store->visit([&](auto& t) {
      check_room_for_touches(t.grads, kv_ids, n);
      std::int64_t k = 0;
      for (std::int64_t i = 0; i < n; ++i) t.grads.touch(kv_ids[i], [&](std::int32_t g) { fresh_ids[k++] = g; });
      *fresh = k;
    });
  });
}

int oomb_store_stats_get(const oomb_store* store, oomb_store_stats* out) {
  return guarded([&] {
    check_store(store);
    store->visit([&](const auto& t) {
      const auto kv = t.cache.stats();
      const auto g = t.grads.stats();
      out->kv_in_use = kv.in_use;
      out->kv_high_water = kv.high_water;
      out->kv_capacity = kv.capacity;
      out->grad_in_use = g.in_use;
      out->grad_high_water = g.high_water;
      out->grad_capacity = g.capacity;
      out->pair_bytes = static_cast<int64_t>(t.cache.pair_bytes());
      const auto rs = store->statistics();
      out->bytes_reserved = static_cast<int64_t>(rs.bytes_in_use);
      out->bytes_peak = static_cast<int64_t>(rs.bytes_high_water);
    });
  });
}

int oomb_attention_forward(const oomb_attention_args* args, void* o, void* lse) {
  return guarded([&] {
    OOMB_C_EXPECTS(args != nullptr && o != nullptr && lse != nullptr, "null argument");
    check_dtype(args->dtype);
    if (args->dtype == OOMB_DTYPE_F64)
      forward_impl(*args, static_cast<double*>(o), static_cast<double*>(lse));
    else
      forward_impl(*args, static_cast<float*>(o), static_cast<float*>(lse));
  });
}

int oomb_attention_backward(const oomb_attention_args* args, const void* o, const void* lse, const void* d_o,
                            void* dq, void* dk, void* dv, void* grad_pool, int64_t grad_pool_pages,
                            const int32_t* grad_ids, int64_t num_kv_ids) {
  return guarded([&] {
    OOMB_C_EXPECTS(args != nullptr && o != nullptr && lse != nullptr && d_o != nullptr && dq != nullptr &&
                       dk != nullptr && dv != nullptr,
                   "null argument");
    check_dtype(args->dtype);
    if (args->dtype == OOMB_DTYPE_F64)
      backward_impl(*args, static_cast<const double*>(o), static_cast<const double*>(lse),
                    static_cast<const double*>(d_o), static_cast<double*>(dq), static_cast<double*>(dk),
                    static_cast<double*>(dv), static_cast<double*>(grad_pool), grad_pool_pages, grad_ids,
                    num_kv_ids);
    else
      backward_impl(*args, static_cast<const float*>(o), static_cast<const float*>(lse),
                    static_cast<const float*>(d_o), static_cast<float*>(dq), static_cast<float*>(dk),
                    static_cast<float*>(dv), static_cast<float*>(grad_pool), grad_pool_pages, grad_ids,
                    num_kv_ids);
  });
}

}  // extern "C"
