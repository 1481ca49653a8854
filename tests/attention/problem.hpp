// oomb tests — random attention problems over a paged KV pool, on the host and on the device.
// Shared by tests/attention and bench/attention.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <oomb/core/bf16.hpp>
#include <oomb/paging/page_shape.hpp>
#include <oomb/paging/views.hpp>

#include <oomb/attention/args.hpp>
#include "reference_gpu.cuh"

namespace attn_test {

/// Owning device buffer (tests only).
template <class T>
struct dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dev(std::size_t count) : n(count) {
    cuda_check(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  explicit dev(const std::vector<T>& h) : dev(h.size()) { upload(h); }
  ~dev() { cudaFree(p); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
  void upload(const std::vector<T>& h) {
    cuda_check(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cuda_check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void fill_bytes(int byte) { cuda_check(cudaMemset(p, byte, n * sizeof(T)), "memset"); }
};

struct config {
  std::string name;
  std::int32_t sq = 0;
  std::int64_t q_start = 0;
  std::int32_t hq = 1, hkv = 1, d = 128, page = 128;
  oomb::kv_layout layout = oomb::kv_layout::head_major;
  bool sparse = false;
  std::int32_t tile = 128;
  double keep = 0.5;          // sparse: chance a past page is selected by a tile
  std::int32_t windows = 1;   // contiguous windows the pages are split into
  bool shuffle_ids = true;    // false: ids in logical order (a contiguous KV layout)
  /// Packed documents: per-document bounds (attention_args::key_lower) with documents starting at
  /// 0 and at each of doc_starts (absolute positions, increasing); none: one document.
  bool documents = false;
  std::vector<std::int64_t> doc_starts;
  std::uint64_t seed = 1;
};

struct window_range {
  std::int32_t first = 0, count = 0;
};

/// Host side of one problem: a pool holding the sequence's pages under shuffled ids, the queries,
/// dO, sparse tiles, each page's gradient page (by K/V id), and how the pages split into windows.
struct problem {
  config c;
  oomb::page_shape shape;
  std::int32_t n_ids = 0, n_grad = 0, npages = 0, last_len = 0;
  std::int64_t total = 0;
  std::vector<oomb::bf16> pool, q, d_o;
  std::vector<std::int32_t> seq_ids, grad_id, tile_indptr, tile_pages;
  std::vector<std::int64_t> key_lower;  // [sq] with c.documents, else empty
  std::vector<window_range> windows;

  explicit problem(const config& cfg, bool fill_random = true) : c(cfg) {
    std::mt19937_64 rng(c.seed);
    shape.page_size = c.page;
    shape.kv_heads = c.hkv;
    shape.head_dim = c.d;
    shape.layout = c.layout;
    total = c.q_start + c.sq;
    npages = static_cast<std::int32_t>((total + c.page - 1) / c.page);
    last_len = static_cast<std::int32_t>(total - std::int64_t(npages - 1) * c.page);
    n_ids = npages + 3;
    std::vector<std::int32_t> perm(static_cast<std::size_t>(n_ids));
    std::iota(perm.begin(), perm.end(), 0);
    if (c.shuffle_ids) std::shuffle(perm.begin(), perm.end(), rng);
    seq_ids.assign(perm.begin(), perm.begin() + npages);
    n_grad = npages + 2;
    std::vector<std::int32_t> gperm(static_cast<std::size_t>(n_grad));
    std::iota(gperm.begin(), gperm.end(), 0);
    std::shuffle(gperm.begin(), gperm.end(), rng);
    grad_id.assign(static_cast<std::size_t>(n_ids), -1);
    for (std::int32_t i = 0; i < npages; ++i) grad_id[static_cast<std::size_t>(seq_ids[static_cast<std::size_t>(i)])] = gperm[static_cast<std::size_t>(i)];

    pool.resize(static_cast<std::size_t>(std::int64_t(n_ids) * shape.pair_elements()));
    q.resize(static_cast<std::size_t>(std::int64_t(c.sq) * c.hq * c.d));
    d_o.resize(q.size());
    if (fill_random) {
      fill_normal(pool, rng, 1.0);
      fill_normal(q, rng, 1.0);
      fill_normal(d_o, rng, 1.0);
    } else {  // large benchmark data: a cheap deterministic pattern, still never zero
      fill_fast(pool, c.seed);
      fill_fast(q, c.seed + 1);
      fill_fast(d_o, c.seed + 2);
    }

    if (c.sparse) {
      const std::int32_t ntiles = (c.sq + c.tile - 1) / c.tile;
      const std::int32_t past_pages = static_cast<std::int32_t>(c.q_start / c.page);  // wholly before q_start
      std::bernoulli_distribution keep(c.keep);
      tile_indptr.push_back(0);
      for (std::int32_t t = 0; t < ntiles; ++t) {
        for (std::int32_t pg = 0; pg < past_pages; ++pg) {
          const bool on = t == 0 ? false : (t == 1 ? true : keep(rng));  // tile 0: none, tile 1: all
          if (on) tile_pages.push_back(pg);
        }
        tile_indptr.push_back(static_cast<std::int32_t>(tile_pages.size()));
      }
      if (tile_pages.empty()) tile_pages.push_back(0);
    }

    if (c.documents)
      for (std::int32_t i = 0; i < c.sq; ++i) {
        std::int64_t lo = 0;
        for (const std::int64_t d : c.doc_starts)
          if (d <= c.q_start + i) lo = d;
        key_lower.push_back(lo);
      }

    // Windows: random cut points between pages.
    std::vector<std::int32_t> cuts{0, npages};
    std::uniform_int_distribution<std::int32_t> cut(1, std::max(1, npages - 1));
    while (static_cast<std::int32_t>(cuts.size()) < c.windows + 1 && npages > c.windows) {
      const std::int32_t x = cut(rng);
      if (std::find(cuts.begin(), cuts.end(), x) == cuts.end()) cuts.push_back(x);
    }
    std::sort(cuts.begin(), cuts.end());
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) windows.push_back({cuts[i], cuts[i + 1] - cuts[i]});
  }

  /// The gradient page of each entry of window w (-1 where the page's id is -1: not read).
  std::vector<std::int32_t> entry_grads(const window_range& w) const {
    std::vector<std::int32_t> g(static_cast<std::size_t>(w.count));
    for (std::int32_t j = 0; j < w.count; ++j) {
      const std::int32_t id = seq_ids[static_cast<std::size_t>(w.first + j)];
      g[static_cast<std::size_t>(j)] = id < 0 ? -1 : grad_id[static_cast<std::size_t>(id)];
    }
    return g;
  }
  std::int32_t window_len(const window_range& w) const {
    return (w.count - 1) * c.page + (w.first + w.count == npages ? last_len : c.page);
  }

  template <class Rng>
  static void fill_normal(std::vector<oomb::bf16>& v, Rng& rng, double sd) {
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sd));
    for (auto& x : v) x = oomb::bf16(nd(rng));
  }
  static void fill_fast(std::vector<oomb::bf16>& v, std::uint64_t seed) {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& x : v) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      // uniform in [-1.7, 1.7], roughly unit variance
      x = oomb::bf16(static_cast<float>(static_cast<double>(s >> 11) * (3.4 / 9007199254740992.0) - 1.7));
    }
  }
};

/// The device copy of a problem and the views/args over it.
struct device_problem {
  const problem& h;
  dev<oomb::bf16> pool, q, d_o;
  dev<std::int32_t> seq_ids, tile_indptr, tile_pages;
  dev<std::int64_t> key_lower;
  std::vector<std::unique_ptr<dev<std::int32_t>>> window_tables;  // per window: indptr(2), last_len(1)
  std::vector<std::unique_ptr<dev<std::int32_t>>> window_grads;   // per window: each entry's gradient page

  explicit device_problem(const problem& p)
      : h(p), pool(p.pool), q(p.q), d_o(p.d_o), seq_ids(p.seq_ids),
        tile_indptr(p.tile_indptr.empty() ? std::vector<std::int32_t>{0} : p.tile_indptr),
        tile_pages(p.tile_pages.empty() ? std::vector<std::int32_t>{0} : p.tile_pages),
        key_lower(p.key_lower.empty() ? std::vector<std::int64_t>{0} : p.key_lower) {
    for (const auto& w : p.windows) {
      const std::int32_t last = w.first + w.count == p.npages ? p.last_len : p.c.page;
      window_tables.push_back(std::make_unique<dev<std::int32_t>>(std::vector<std::int32_t>{0, w.count, last}));
      window_grads.push_back(std::make_unique<dev<std::int32_t>>(p.entry_grads(w)));
    }
    // The single window holding every page comes last.
    window_tables.push_back(std::make_unique<dev<std::int32_t>>(std::vector<std::int32_t>{0, p.npages, p.last_len}));
    window_grads.push_back(std::make_unique<dev<std::int32_t>>(p.entry_grads({0, p.npages})));
  }

  /// Args for window `w` (index into h.windows), or the whole sequence when w < 0.
  oomb::attention::attention_args args(int w = -1) const {
    const window_range all{0, h.npages};
    const window_range r = w < 0 ? all : h.windows[static_cast<std::size_t>(w)];
    const dev<std::int32_t>& t = *window_tables[w < 0 ? window_tables.size() - 1 : static_cast<std::size_t>(w)];
    oomb::attention::attention_args a;
    a.q = q.p;
    a.q_start = h.c.q_start;
    a.sq = h.c.sq;
    a.hq = h.c.hq;
    a.hkv = h.c.hkv;
    a.d = h.c.d;
    a.scale = 1.0f / std::sqrt(static_cast<float>(h.c.d));
    a.kv.pool = oomb::page_pool_view<const oomb::bf16>::over(pool.p, h.shape);
    a.kv.table.indptr = t.p;
    a.kv.table.indices = seq_ids.p + r.first;
    a.kv.table.last_page_len = t.p + 2;
    a.kv.table.num_seqs = 1;
    a.kv.table.page_size = h.c.page;
    a.first_page = r.first;
    a.window_pages = r.count;
    if (h.c.sparse) {
      a.tile_indptr = tile_indptr.p;
      a.tile_pages = tile_pages.p;
      a.tile = h.c.tile;
    }
    if (h.c.documents) a.key_lower = key_lower.p;
    return a;
  }
  std::int32_t window_len(int w = -1) const {
    return w < 0 ? h.window_len({0, h.npages}) : h.window_len(h.windows[static_cast<std::size_t>(w)]);
  }
  /// The gradient pages of window `w` (as args(w)) in `grad_pool`.
  oomb::window_grad_view<float> grads(float* grad_pool, int w = -1) const {
    oomb::window_grad_view<float> g;
    g.pool = oomb::page_pool_view<float>::over(grad_pool, h.shape);
    g.grad_page = window_grads[w < 0 ? window_grads.size() - 1 : static_cast<std::size_t>(w)]->p;
    g.pages = w < 0 ? h.npages : h.windows[static_cast<std::size_t>(w)].count;
    return g;
  }
};

/// ||got - ref|| / ||ref|| over finite reference entries; infinite reference entries must match
/// exactly; a NaN anywhere in `got` gives +inf.
template <class A, class B>
double rel_err(const A& got, const B& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    if (std::isnan(g)) return INFINITY;
    if (!std::isfinite(r)) {
      if (g != r) return INFINITY;
      continue;
    }
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<double> to_double(const std::vector<oomb::bf16>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace attn_test
