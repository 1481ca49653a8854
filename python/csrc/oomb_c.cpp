// oomb's C ABI (oomb_c.h) over the library's headers: the paged store and the CPU attention.
// SPDX-License-Identifier: Apache-2.0
//
// Every entry point catches what the library throws and turns it into -1 plus a per-thread
// message, so no C++ exception crosses into ctypes.
#include "oomb_c.h"

#include "c_abi_errors.hpp"
#include "c_abi_residency.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <type_traits>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "oomb/attention/reference.hpp"
#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/core/version.hpp"
#include "oomb/memory/callback_resource.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/memory/statistics_adaptor.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/host_stream.hpp"
#include "oomb/offload/residency_scheduler.hpp"
#include "oomb/paging/grad_mirror.hpp"
#include "oomb/paging/paged_kv_cache.hpp"
#include "oomb/paging/views.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/sparse_page_table.hpp"
#include "oomb/sparse/tile_selector.hpp"

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

using scheduler_type = oomb::residency_scheduler<oomb::basic_host_backend<far_resource>>;

/// The near tiers of a store with offload: K/V pages and gradient pages stream from their homes
/// (the store's pools) through fixed sets of slots, on the library's host streams. Declared after
/// what they reference and before what references them, so destruction waits for their work.
struct near_tiers {
  oomb::host_stream compute, copy_in, copy_out;
  oomb::host_resource memory;
  std::unique_ptr<scheduler_type> kv, grad;
};

/// K/V pages of E and gradient pages of G in memory from R: the CPU path's host stores (E = G =
/// float or double) and the GPU path's caller store (bf16 pages, fp32 gradients, device memory).
template <class E, class G, class R>
struct typed_store final : store_base {
  using element_type = E;
  using cache_type = oomb::paged_kv_cache<E, R>;
  using mirror_type = oomb::grad_mirror<G, R>;
  static constexpr bool on_host = std::is_same_v<R, far_resource>;

  typed_store(R& r, const oomb::paged_kv_config& kc, const oomb::grad_mirror_config& gc, std::int32_t kv_slots,
              std::int32_t grad_slots)
      : cache(r, kc), grads(r, gc) {
    if constexpr (on_host) init_tiers(kv_slots, grad_slots);
  }

  cache_type cache;
  mirror_type grads;
  std::unique_ptr<near_tiers> tiers;  // null: every page is read and written in place

 private:
  void init_tiers(std::int32_t kv_slots, std::int32_t grad_slots) {
    if (kv_slots > 0) {
      tiers = std::make_unique<near_tiers>();
      tiers->kv = std::make_unique<scheduler_type>(cache.pool(), tiers->memory, kv_slots, tiers->copy_in,
                                                   tiers->copy_out);
      tiers->grad = std::make_unique<scheduler_type>(grads.pool(), tiers->memory, grad_slots, tiers->copy_in,
                                                     tiers->copy_out);
    }
  }
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
  std::unique_ptr<oomb::page_summaries> summaries;

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
  /// The same for what reads or writes the pages on the host (the CPU attention, summaries,
  /// zero-filling): a host store's only.
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
                 "GPU path): the host cannot read or write them (CPU attention, page summaries, touch_grads)");
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
/// pool at `base` (the far pool, or a near tier's slots). Sparse calls keep the tile selection
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

/// Whether the call reads some logical page in [first, first + n): a sparse call's tiles select
/// it, and no page wholly below every query's document bound (key_lower[0]) is read; `need`, if
/// given, gets which (dense, one document: all of them). A page not needed is not brought near and
/// needs no gradient page.
bool reads_any(const oomb_attention_args& a, std::int32_t first, std::int32_t n, std::vector<char>* need) {
  std::vector<char> own;
  std::vector<char>& want = need != nullptr ? *need : own;
  want.assign(static_cast<std::size_t>(n), a.tile_indptr == nullptr ? 1 : 0);
  if (a.tile_indptr != nullptr) {
    const std::int64_t tiles = (a.sq + a.tile - 1) / a.tile;
    for (std::int64_t e = 0; e < a.tile_indptr[tiles]; ++e) {
      const std::int32_t p = a.tile_pages[e] - first;
      if (p >= 0 && p < n) want[static_cast<std::size_t>(p)] = 1;
    }
  }
  if (a.key_lower != nullptr)
    for (std::int32_t i = 0; i < n; ++i)
      if ((std::int64_t(first) + i + 1) * a.page_size <= a.key_lower[0]) want[static_cast<std::size_t>(i)] = 0;
  return std::find(want.begin(), want.end(), 1) != want.end();
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

// ---- the same over a store's own pages: in place, or streamed through its near tiers ----

void check_store_call(const oomb_store& s, const oomb_attention_args& a, std::int32_t seq, std::int32_t layer,
                      std::int32_t np) {
  const auto& c = s.config;
  OOMB_C_EXPECTS(a.dtype == c.dtype && a.page_size == c.page_size && a.hkv == c.kv_heads && a.d == c.head_dim,
                 "the call (dtype ", a.dtype, ", page ", a.page_size, ", ", a.hkv, " KV heads of dim ", a.d,
                 ") does not match the store (dtype ", c.dtype, ", page ", c.page_size, ", ", c.kv_heads,
                 " of dim ", c.head_dim, ")");
  OOMB_C_EXPECTS(layer >= 0 && layer < c.layers, "layer ", layer, " out of range [0, ", c.layers, ")");
  (void)seq;
  (void)np;
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

template <class E>
std::vector<std::int32_t> past_ids_of(const host_store<E>& t, std::int32_t seq, std::int32_t layer, std::int32_t np) {
  OOMB_C_EXPECTS(np <= t.cache.num_pages(seq), "q_start needs ", np, " past pages, sequence ", seq, " has ",
                 t.cache.num_pages(seq));
  const oomb::id_span all = t.cache.page_ids(seq, layer);
  return std::vector<std::int32_t>(all.begin(), all.begin() + np);
}

template <class E>
void store_forward(oomb_store& s, host_store<E>& t, std::int32_t seq, std::int32_t layer, const oomb_attention_args& a,
                   E* o, E* lse) {
  const std::int32_t np = check_call(a);
  check_store_call(s, a, seq, layer, np);
  const std::vector<std::int32_t> ids = past_ids_of(t, seq, layer, np);
  bool first = true;
  if (np > 0 && !t.tiers) {
    forward_window(past_window<E>(a, reinterpret_cast<const E*>(t.cache.pool().base()), ids.data(), 0, np).args, a, true,
                   o, lse);
    first = false;
  } else if (np > 0) {
    auto& tiers = *t.tiers;
    const std::int32_t W = s.config.window_pages;
    std::vector<char> need;
    std::vector<std::int32_t> want, slots, table;
    for (std::int32_t w0 = 0; w0 < np; w0 += W) {
      const std::int32_t n = std::min(W, np - w0);
      if (!reads_any(a, w0, n, &need)) continue;  // a window the call does not read: not even brought near
      want.clear();
      for (std::int32_t i = 0; i < n; ++i)
        if (need[static_cast<std::size_t>(i)]) want.push_back(ids[static_cast<std::size_t>(w0 + i)]);
      slots = tiers.kv->acquire(tiers.compute, want, oomb::access::read);
      tiers.compute.synchronize();  // the copies have landed: the host computes next
      table.assign(static_cast<std::size_t>(n), -1);
      for (std::int32_t i = 0, j = 0; i < n; ++i)
        if (need[static_cast<std::size_t>(i)]) table[static_cast<std::size_t>(i)] = slots[static_cast<std::size_t>(j++)];
      try {
        forward_window(past_window<E>(a, reinterpret_cast<const E*>(tiers.kv->near_pool().base()), table.data(), w0, n)
                           .args,
                       a, first, o, lse);
      } catch (...) {
        tiers.kv->release(tiers.compute, want);
        throw;
      }
      tiers.kv->release(tiers.compute, want);
      first = false;
    }
  }
  forward_window(own_window<E>(a).args, a, first, o, lse);
}

template <class E>
void store_backward(oomb_store& s, host_store<E>& t, std::int32_t seq, std::int32_t layer,
                    const oomb_attention_args& a, const E* o, const E* lse, const E* d_o, E* dq, E* dk, E* dv) {
  const std::int32_t np = check_call(a);
  check_store_call(s, a, seq, layer, np);
  const std::vector<std::int32_t> ids = past_ids_of(t, seq, layer, np);
  zero_grads(a, dq, dk, dv);
  if (np > 0 && !t.tiers) {
    std::vector<std::int32_t> entry_grads(static_cast<std::size_t>(np));
    for (std::int32_t i = 0; i < np; ++i) entry_grads[static_cast<std::size_t>(i)] = t.grads.grad_id(ids[static_cast<std::size_t>(i)]);
    oomb::window_grad_view<E> m;
    m.pool = t.grads.view().pool;
    m.grad_page = entry_grads.data();
    m.pages = np;
    ref::attention_backward(past_window<E>(a, reinterpret_cast<const E*>(t.cache.pool().base()), ids.data(), 0, np).args, o,
                            lse, d_o, dq, dk, dv, m);
  } else if (np > 0) {
    auto& tiers = *t.tiers;
    const std::int32_t W = s.config.window_pages;
    std::vector<char> need;
    std::vector<std::int32_t> want, grad_want, slots, grad_slots, table, entry_grads;
    for (std::int32_t w0 = 0; w0 < np; w0 += W) {
      const std::int32_t n = std::min(W, np - w0);
      if (!reads_any(a, w0, n, &need)) continue;
      want.clear();
      grad_want.clear();
      for (std::int32_t i = 0; i < n; ++i) {
        if (!need[static_cast<std::size_t>(i)]) continue;
        const std::int32_t id = ids[static_cast<std::size_t>(w0 + i)];
        const std::int32_t g = t.grads.grad_id(id);
        OOMB_C_EXPECTS(g >= 0, "backward: past page ", w0 + i, " (id ", id, ") has no gradient page (touch it first)");
        want.push_back(id);
        grad_want.push_back(g);
      }
      slots = tiers.kv->acquire(tiers.compute, want, oomb::access::read);
      try {
        grad_slots = tiers.grad->acquire(tiers.compute, grad_want, oomb::access::write);
      } catch (...) {
        tiers.kv->release(tiers.compute, want);
        throw;
      }
      tiers.compute.synchronize();
      table.assign(static_cast<std::size_t>(n), -1);
      entry_grads.assign(static_cast<std::size_t>(n), -1);
      for (std::int32_t i = 0, j = 0; i < n; ++i) {
        if (!need[static_cast<std::size_t>(i)]) continue;
        table[static_cast<std::size_t>(i)] = slots[static_cast<std::size_t>(j)];
        entry_grads[static_cast<std::size_t>(i)] = grad_slots[static_cast<std::size_t>(j)];
        ++j;
      }
      oomb::window_grad_view<E> m;
      m.pool = oomb::page_pool_view<E>::over(reinterpret_cast<E*>(tiers.grad->near_pool().base()),
                                             token_major(a.page_size, a.hkv, a.d));
      m.grad_page = entry_grads.data();
      m.pages = n;
      std::exception_ptr failed;
      try {
        ref::attention_backward(
            past_window<E>(a, reinterpret_cast<const E*>(tiers.kv->near_pool().base()), table.data(), w0, n).args, o,
            lse, d_o, dq, dk, dv, m);
      } catch (...) {
        failed = std::current_exception();
      }
      tiers.kv->release(tiers.compute, want);
      tiers.grad->release(tiers.compute, grad_want);
      if (failed) std::rethrow_exception(failed);
    }
  }
  ref::attention_backward(own_window<E>(a).args, o, lse, d_o, dq, dk, dv, oomb::window_grad_view<E>{});
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
      OOMB_C_EXPECTS(c.dtype == OOMB_DTYPE_BF16 && c.allocate != nullptr && c.deallocate != nullptr &&
                         c.summaries == 0 && c.near_kv_slots == 0,
                     "a store in the caller's memory holds bf16 pages (dtype 2), needs both callbacks, and keeps "
                     "no page summaries and no near tiers (got dtype ", c.dtype, ", summaries ", c.summaries,
                     ", near_kv_slots ", c.near_kv_slots, ")");
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
    OOMB_C_EXPECTS(c.near_kv_slots >= 0 && (c.near_kv_slots == 0) == (c.near_grad_slots == 0) &&
                       c.near_grad_slots >= 0,
                   "near_kv_slots (", c.near_kv_slots, ") and near_grad_slots (", c.near_grad_slots,
                   ") are both positive (offload) or both 0");
    OOMB_C_EXPECTS(c.near_kv_slots == 0 || (c.window_pages > 0 && c.window_pages <= c.near_kv_slots &&
                                            c.window_pages <= c.near_grad_slots),
                   "window_pages ", c.window_pages, " must be positive and fit both near tiers (",
                   c.near_kv_slots, " K/V slots, ", c.near_grad_slots, " gradient slots)");
    if (c.memory == OOMB_MEMORY_CALLER) {
      kc.record_changes = false;  // the caller uploads the page ids it launches with
      s->caller = std::make_unique<caller_allocator>(
          [c](std::size_t bytes, std::size_t alignment) {
            return c.allocate(c.ctx, static_cast<int64_t>(bytes), static_cast<int64_t>(alignment));
          },
          [c](void* p, std::size_t bytes, std::size_t) { c.deallocate(c.ctx, p, static_cast<int64_t>(bytes)); });
      s->caller_counted = std::make_unique<caller_resource>(*s->caller);
      s->impl = std::make_unique<caller_store>(*s->caller_counted, kc, gc, 0, 0);
    } else if (c.dtype == OOMB_DTYPE_F64) {
      s->impl = std::make_unique<host_store<double>>(s->counted, kc, gc, c.near_kv_slots, c.near_grad_slots);
    } else {
      s->impl = std::make_unique<host_store<float>>(s->counted, kc, gc, c.near_kv_slots, c.near_grad_slots);
    }
    if (c.summaries != 0) s->summaries = std::make_unique<oomb::page_summaries>(c.kv_heads, c.head_dim, c.max_pages);
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
      *tokens = t.cache.pop_chunk(seq, [&](std::int32_t id) {
        t.grads.release_if_touched(id);
        if (store->summaries) store->summaries->clear(id);
      });
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

int oomb_store_summarize(oomb_store* store, int32_t seq, int32_t layer, int32_t first, int32_t last) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(store->summaries != nullptr, "summarize: the store keeps no page summaries");
    store->visit_host([&](auto& t) {
      const std::int32_t n = t.cache.num_pages(seq);
      OOMB_C_EXPECTS(layer >= 0 && layer < t.cache.num_layers() && first >= 0 && first <= last && last <= n,
                     "summarize: pages [", first, ", ", last, ") of layer ", layer, " of a sequence of ", n);
      const auto pool = t.cache.pool_view();
      const auto csr = t.cache.view(layer).table;
      for (std::int32_t i = first; i < last; ++i)
        store->summaries->update_from_pool(pool, t.cache.page_id(seq, layer, i), 0, csr.page_len(seq, i));
    });
  });
}

int oomb_store_select(oomb_store* store, int32_t seq, int32_t layer, const void* q, int64_t sq, int32_t hq,
                      int64_t q_start, int32_t tile, int32_t budget, int32_t sink, int32_t local,
                      int32_t scoring, const int32_t* tile_first, int32_t* indptr, int32_t* pages,
                      int64_t pages_capacity) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(store->summaries != nullptr, "select: the store keeps no page summaries");
    OOMB_C_EXPECTS(scoring == 0 || scoring == 1, "select: scoring ", scoring, " is not 0 (quest) or 1 (mean)");
    const auto& c = store->config;
    OOMB_C_EXPECTS(q_start >= 0 && q_start % c.page_size == 0, "select: q_start ", q_start,
                   " is not a page boundary");
    store->visit_host([&](auto& t) {
      using E = typename std::decay_t<decltype(t.cache)>::element_type;
      oomb::tile_selection_config tc;
      tc.tile_queries = tile;
      tc.kind = scoring == 0 ? oomb::score_kind::quest : oomb::score_kind::mean;
      tc.pages.budget = budget;
      tc.pages.sink = sink;
      tc.pages.local = local;
      oomb::tile_selector selector(tc, hq, c.kv_heads, c.head_dim);
      const auto past = static_cast<std::int32_t>(q_start / c.page_size);
      OOMB_C_EXPECTS(past <= t.cache.num_pages(seq), "select: ", past, " past pages asked, the sequence has ",
                     t.cache.num_pages(seq));
      std::vector<std::int32_t> ids(static_cast<std::size_t>(past));
      const oomb::id_span all = t.cache.page_ids(seq, layer);
      for (std::int32_t i = 0; i < past; ++i) ids[static_cast<std::size_t>(i)] = all[static_cast<std::size_t>(i)];
      const oomb::tensor_view<const E, 3> queries(static_cast<const E*>(q), {sq, hq, c.head_dim},
                                                  {std::int64_t(hq) * c.head_dim, c.head_dim, 1});
      oomb::sparse_page_table out;
      if (tile_first != nullptr)
        selector.select(store->summaries->view(), queries, ids.data(), past, tile_first, out);
      else
        selector.select(store->summaries->view(), queries, ids.data(), past, out);
      OOMB_C_EXPECTS(out.num_entries() <= pages_capacity, "select: ", out.num_entries(),
                     " selected pages, room for ", pages_capacity);
      std::copy(out.indptr().begin(), out.indptr().end(), indptr);
      std::copy(out.indices().begin(), out.indices().end(), pages);
    });
  });
}

int oomb_store_kv_written(oomb_store* store, int32_t seq, int32_t layer, int32_t first, int32_t last) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) {
      const std::int32_t n = t.cache.num_pages(seq);
      OOMB_C_EXPECTS(layer >= 0 && layer < t.cache.num_layers() && first >= 0 && first <= last && last <= n,
                     "kv_written: pages [", first, ", ", last, ") of layer ", layer, " of a sequence of ", n);
      if (!t.tiers) return;
      const oomb::id_span all = t.cache.page_ids(seq, layer);
      t.tiers->kv->mark_written(oomb::id_span(all.data() + first, static_cast<std::size_t>(last - first)));
    });
  });
}

int oomb_store_flush_grads(oomb_store* store) {
  return guarded([&] {
    check_store(store);
    store->visit([&](auto& t) {
      if (!t.tiers) return;
      t.tiers->grad->flush();
      t.tiers->grad->drain();
    });
  });
}

int oomb_store_residency_stats_get(const oomb_store* store, int32_t which, oomb_residency_stats* out) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(which == 0 || which == 1, "which ", which, " is not 0 (K/V) or 1 (gradients)");
    *out = oomb_residency_stats{};
    store->visit([&](const auto& t) {
      if (!t.tiers) return;
      const auto& tier = *(which == 0 ? t.tiers->kv : t.tiers->grad);
      const auto r = tier.stats();
      *out = oomb_c_abi::residency_stats_of(r, r.capacity, static_cast<int64_t>(tier.page_bytes()));
    });
  });
}

int oomb_store_attention_forward(oomb_store* store, int32_t seq, int32_t layer, const oomb_attention_args* args,
                                 void* o, void* lse) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(args != nullptr && o != nullptr && lse != nullptr, "null argument");
    store->visit_host([&](auto& t) {
      using E = typename std::decay_t<decltype(t.cache)>::element_type;
      store_forward(*store, t, seq, layer, *args, static_cast<E*>(o), static_cast<E*>(lse));
    });
  });
}

int oomb_store_attention_backward(oomb_store* store, int32_t seq, int32_t layer, const oomb_attention_args* args,
                                  const void* o, const void* lse, const void* d_o, void* dq, void* dk, void* dv) {
  return guarded([&] {
    check_store(store);
    OOMB_C_EXPECTS(args != nullptr && o != nullptr && lse != nullptr && d_o != nullptr && dq != nullptr &&
                       dk != nullptr && dv != nullptr,
                   "null argument");
    store->visit_host([&](auto& t) {
      using E = typename std::decay_t<decltype(t.cache)>::element_type;
      store_backward(*store, t, seq, layer, *args, static_cast<const E*>(o), static_cast<const E*>(lse),
                     static_cast<const E*>(d_o), static_cast<E*>(dq), static_cast<E*>(dk), static_cast<E*>(dv));
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
