// oomb bench — TFLOP/s of the paged attention kernels on the issue's shapes: a 4096-token chunk
// against 16K / 64K / 256K tokens of past (non-causal) plus itself (causal), forward and backward,
// KV read through a shuffled page table (paged) and through ids in logical order (contiguous).
// Forward FLOPs 4 Sq Sk D Hq with the causal square halved; backward 2.5x forward.
// Plain program (no Google Benchmark) so the binary runs on the GPU machine as is. Options: --quick
// (16K only), --past N, --reps N (default 5, every past), --no-extras, --sm90-variants (the Hopper
// forward at cluster splits 1 and 2), --no-sparse (skip the page-sparse run at 256K: 64 pages + sink + local
// per 128-query tile, TFLOP/s over the attended keys), --lean (the public entries on paged ids only: no
// contiguous run, no forced kernels; with --past 262144 the sparse-vs-dense call of hs1), --head-dim D
// (only the shape of head size D: 128 or 64, e.g. one profiler run each), --json FILE (one
// line per shape and past: TFLOP/s median, min, max), --trace FILE (with the sparse run: one traced
// launch of the sparse backward per shape, selection and launch order, every CTA's timeline as CSV
// lines for tools/analysis/sparse_trace.py), --documents L[,L...] (instead of the table: packed
// documents of about L tokens each, the public entries with per-document bounds over the whole and
// the trimmed window against the same calls without, time per attended key pair, and the trimmed
// backward at query splits 1-4). On Hopper every shape also times the public backward planned
// deterministic (plan_options::deterministic) beside the default, dense and (the 256K sparse run)
// page-sparse.
// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "launch.cuh"

#include "problem.hpp"

namespace {

using attn_test::config;
using attn_test::cuda_check;
using attn_test::dev;
using attn_test::device_problem;
using attn_test::problem;
namespace gpu = oomb::attention;

/// The public entries' kernel choice: OOMB_ATTENTION_FORWARD / OOMB_ATTENTION_BACKWARD = portable or
/// automatic (the default). The benchmark's only environment variables: the library reads none.
gpu::kernel_choice kernels_from_env(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, "portable") == 0 ? gpu::kernel_choice::portable : gpu::kernel_choice::automatic;
}
const gpu::kernel_choice forward_kernels = kernels_from_env("OOMB_ATTENTION_FORWARD");
const gpu::kernel_choice backward_kernels = kernels_from_env("OOMB_ATTENTION_BACKWARD");

/// Median, fastest and slowest of `reps` timed calls (ms), and the calls in the order they ran
/// (hb6's spread: is the fast call always the first?).
struct timing {
  double median = 0, lo = 0, hi = 0;
  std::vector<float> in_order;
};

/// Median, fastest and slowest of calls timed in the order given.
timing summarize(std::vector<float> t) {
  std::vector<float> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  return {sorted[sorted.size() / 2], sorted.front(), sorted.back(), std::move(t)};
}

template <class F>
timing time_ms(int warmup, int reps, F&& f) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventRecord(a), "record");
    f();
    cuda_check(cudaEventRecord(b), "record");
    cuda_check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return summarize(std::move(t));
}

template <class F>
double median_ms(int warmup, int reps, F&& f) {
  return time_ms(warmup, reps, std::forward<F>(f)).median;
}

/// Copies the window's K/V pages (one KV head layout, all heads) into a contiguous buffer: the
/// "gather first" alternative to reading pages through the table.
__global__ void gather_pages(const uint4* pool, const std::int32_t* ids, std::int64_t pair_vec, std::int32_t npages,
                             uint4* out) {
  const std::int64_t n = std::int64_t(npages) * pair_vec;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t pg = e / pair_vec, off = e % pair_vec;
    out[e] = pool[std::int64_t(ids[pg]) * pair_vec + off];
  }
}

struct result {
  timing fwd, bwd;         // the public entry (Hopper forward where it applies; backward per backward_kernels)
  double fwd_portable_ms;  // the mma.sync forward forced
  timing bwd_sm90;         // the Hopper backward's dense configuration forced (hb6: Q/dO by TMA; 0: not a Hopper device / no sm_90a code)
  timing bwd_other;        // the unaligned-dq configuration forced (hb2: dQ by red.add from the consumers, 64-row steps)
  timing bwd_wide;         // forced: the wide-group dense configuration, Q/dO by cp.async (the dense default before hb6)
  timing bwd_det;          // the public backward planned deterministic (dQ in key block order, no query split; Hopper only)
  timing bwd_det_interleaved;  // the same, the KV heads taken in turn (plan order 2)
  timing bwd_split1;       // the public backward at query split 1 (what the deterministic plan gives up of the split)
  double bwd_sm90_err;     // largest norm-wise difference Hopper (both) vs portable backward (dq, dk, dv, dpast), 16K only
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Times one forward tile shape with a forced cluster split (0: the launcher's choice).
template <class Cfg>
double time_fwd(const device_problem& dp, int split, int reps) {
  const auto a = dp.args();
  dev<oomb::bf16> o(dp.h.q.size());
  dev<float> lse(std::size_t(dp.h.c.sq) * dp.h.c.hq);
  return median_ms(1, reps, [&] { attn_test::launch_forward<Cfg>(a, o.p, lse.p, nullptr, split); });
}

/// What a timed backward reads and writes: the forward's output and LSE, delta, and the
/// gradients (zeroed), the past's gradient pages seen through `grads` (for a window that leaves out
/// the sequence's first `skipped` pages: its entries from there on).
struct backward_buffers {
  dev<oomb::bf16> o;
  dev<float> lse, delta, dq, dk, dv, g;
  oomb::window_grad_view<float> grads;
  explicit backward_buffers(const device_problem& dp, std::int32_t skipped = 0)
      : o(dp.h.q.size()),
        lse(std::size_t(dp.h.c.sq) * dp.h.c.hq),
        delta(lse.n),
        dq(dp.h.q.size()),
        dk(std::size_t(dp.h.c.sq) * dp.h.c.hkv * dp.h.c.d),
        dv(dk.n),
        g(std::size_t(std::int64_t(dp.h.n_grad) * dp.h.shape.pair_elements())),
        grads(dp.grads(g.p)) {
    grads.grad_page += skipped;
    grads.pages -= skipped;
    dq.fill_bytes(0);
    dk.fill_bytes(0);
    dv.fill_bytes(0);
    g.fill_bytes(0);
  }
};

/// Times one backward tile shape (delta included) with a forced query split and walk order (0: the
/// launcher's choice).
template <class Cfg>
double time_bwd(const device_problem& dp, int split, int reps, int order = 0) {
  const auto a = dp.args();
  const auto& c = dp.h.c;
  backward_buffers buf(dp);
  auto& o = buf.o;
  auto &lse = buf.lse, &delta = buf.delta, &dq = buf.dq, &dk = buf.dk, &dv = buf.dv;
  const auto& grads = buf.grads;
  attn_test::forward(a, o.p, lse.p, nullptr);
  return median_ms(1, reps, [&] {
    gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
    attn_test::launch_backward<Cfg>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads, nullptr, split, order);
  });
}

/// Times one Hopper forward configuration with a forced cluster split (0: the launcher's choice).
template <class Cfg>
double time_fwd_sm90(const device_problem& dp, int split, int reps) {
  const auto a = dp.args();
  dev<oomb::bf16> o(dp.h.q.size());
  dev<float> lse(std::size_t(dp.h.c.sq) * dp.h.c.hq);
  return median_ms(1, reps, [&] { attn_test::launch_forward_sm90<Cfg>(a, o.p, lse.p, nullptr, split); });
}

/// lean: the public forward and backward only (the forced kernels' fields stay 0).
result time_one(const problem& p, int reps, bool lean = false) {
  device_problem dp(p);
  const auto a = dp.args();
  const auto& c = p.c;
  backward_buffers buf(dp);
  auto& o = buf.o;
  auto &lse = buf.lse, &delta = buf.delta, &dq = buf.dq, &dk = buf.dk, &dv = buf.dv, &g = buf.g;
  const auto& grads = buf.grads;
  result r{};
  if (!lean)
    r.fwd_portable_ms =
        median_ms(1, reps, [&] { attn_test::forward(a, o.p, lse.p, nullptr, gpu::kernel_choice::portable); });
  r.fwd = time_ms(1, reps, [&] { attn_test::forward(a, o.p, lse.p, nullptr, forward_kernels); });
  // sanity: a forward output must be finite
  const auto l = lse.download();
  for (float x : l)
    if (!std::isfinite(x)) {
      std::fprintf(stderr, "non-finite lse in %s\n", c.name.c_str());
      std::exit(1);
    }
  r.bwd = time_ms(1, reps, [&] {
    gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
    attn_test::backward(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads, nullptr, {}, backward_kernels);
  });
  if (gpu::detail::current_device_is_sm90()) {
    // The public backward planned with options opts (and the workspace its plan wants), delta included.
    auto time_planned = [&](const gpu::plan_options& opts) {
      const auto plan = gpu::plan_backward(gpu::call_shape::of(a, dq.p), attn_test::facts(), opts);
      dev<std::int32_t> ws(static_cast<std::size_t>(plan.workspace_ints));
      return time_ms(1, reps, [&] {
        gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
        gpu::backward(plan, a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads, {ws.p, plan.workspace_ints}, nullptr);
      });
    };
    gpu::plan_options one;
    one.split = 1;
    r.bwd_split1 = time_planned(one);
    gpu::plan_options det;
    det.deterministic = true;
    r.bwd_det = time_planned(det);
    det.order = 2;
    r.bwd_det_interleaved = time_planned(det);
  }
  if (gpu::detail::current_device_is_sm90() && !lean) {
    auto hopper = [&] {
      if (c.d == 128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p,
                                                                                 dv.p, grads, nullptr);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p,
                                                                                dv.p, grads, nullptr);
    };
    auto other = [&] {
      if (c.d == 128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::unaligned>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                      dk.p, dv.p, grads, nullptr);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::unaligned>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                     dk.p, dv.p, grads, nullptr);
    };
    r.bwd_sm90 = time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
      hopper();
    });
    r.bwd_other = time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
      other();
    });
    const bool d128 = c.d == 128;
    auto wide = [&] {
      if (d128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::wide_group>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                       dk.p, dv.p, grads, nullptr);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::wide_group>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                      dk.p, dv.p, grads, nullptr);
    };
    r.bwd_wide = time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
      wide();
    });
    if (c.q_start <= 16384) {  // the same gradients as the portable kernel at benchmark scale
      auto run = [&](auto&& bwd) {
        dq.fill_bytes(0);
        dk.fill_bytes(0);
        dv.fill_bytes(0);
        g.fill_bytes(0);
        gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
        bwd();
        return std::vector<std::vector<float>>{dq.download(), dk.download(), dv.download(), g.download()};
      };
      const auto ref = run([&] {
        if (c.d == 128)
          attn_test::launch_backward<gpu::backward_config<128>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p,
                                                                        grads, nullptr);
        else
          attn_test::launch_backward<gpu::backward_config<64>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p,
                                                                       grads, nullptr);
      });
      const auto hop = run(hopper);
      const auto oth = run(other);
      for (int k = 0; k < 4; ++k)
        r.bwd_sm90_err = std::max({r.bwd_sm90_err, rel_diff(hop[k], ref[k]), rel_diff(oth[k], ref[k])});
      const auto hw = run(wide);
      for (int k = 0; k < 4; ++k) r.bwd_sm90_err = std::max(r.bwd_sm90_err, rel_diff(hw[k], ref[k]));
    }
  }
  return r;
}

/// Gives p a page-sparse past: every tile of 128 queries attends the first `sink` past pages, the
/// last `local` past pages before the chunk and `budget` other past pages drawn at random (sorted),
/// plus the chunk's own pages. pool = 0: drawn from every other past page (at 256K each is then
/// attended by ~1 of the 32 tiles: the backward's shortest walks); pool > 0: drawn from one random set
/// of `pool` pages shared by all tiles (pool 256: ~8 tiles per page, as the trainer's Quest selection
/// at 7B 128K, 7.6). Returns the past keys each query attends.
std::int64_t select_sparse_budget(problem& p, std::int32_t budget, std::int32_t sink, std::int32_t local,
                                  std::int32_t pool = 0) {
  const std::int32_t past_pages = static_cast<std::int32_t>(p.c.q_start / p.c.page);
  if (past_pages < sink + local + budget || (pool > 0 && (pool < budget || pool > past_pages - sink - local))) {
    std::fprintf(stderr, "sparse budget: %d past pages, %d + %d + %d from a pool of %d cannot be drawn\n", past_pages,
                 sink, local, budget, pool);
    std::exit(1);
  }
  p.c.sparse = true;
  p.c.tile = 128;
  const std::int32_t ntiles = (p.c.sq + p.c.tile - 1) / p.c.tile;
  std::mt19937_64 rng(p.c.seed + 11);
  std::uniform_int_distribution<std::int32_t> mid(sink, past_pages - local - 1);
  std::vector<std::int32_t> shared;  // pool > 0: the pages every tile draws from
  {
    std::vector<char> in(static_cast<std::size_t>(past_pages), 0);
    while (static_cast<std::int32_t>(shared.size()) < pool) {
      const std::int32_t pg = mid(rng);
      if (in[static_cast<std::size_t>(pg)] == 0) {
        in[static_cast<std::size_t>(pg)] = 1;
        shared.push_back(pg);
      }
    }
  }
  std::uniform_int_distribution<std::int32_t> from_pool(0, pool > 0 ? pool - 1 : 0);
  p.tile_indptr.assign(1, 0);
  p.tile_pages.clear();
  for (std::int32_t t = 0; t < ntiles; ++t) {
    std::vector<std::int32_t> pick;
    for (std::int32_t pg = 0; pg < sink; ++pg) pick.push_back(pg);
    for (std::int32_t pg = past_pages - local; pg < past_pages; ++pg) pick.push_back(pg);
    std::vector<char> taken(static_cast<std::size_t>(past_pages), 0);
    for (std::int32_t pg : pick) taken[static_cast<std::size_t>(pg)] = 1;
    for (std::int32_t k = 0; k < budget;) {
      const std::int32_t pg = pool > 0 ? shared[static_cast<std::size_t>(from_pool(rng))] : mid(rng);
      if (taken[static_cast<std::size_t>(pg)] == 0) {
        taken[static_cast<std::size_t>(pg)] = 1;
        pick.push_back(pg);
        ++k;
      }
    }
    std::sort(pick.begin(), pick.end());
    p.tile_pages.insert(p.tile_pages.end(), pick.begin(), pick.end());
    p.tile_indptr.push_back(static_cast<std::int32_t>(p.tile_pages.size()));
  }
  return std::int64_t(sink + local + budget) * p.c.page;
}

struct sparse_timing {
  timing fwd, bwd;  // the public entries
  timing bwd_hs1;  // the public entry's kernel in hs1's launch order: no walk cut into pieces (order_hint 3)
  timing bwd_no_ws;  // the public entry without a workspace: past blocks in the window-ends-first order (hs1's), long walks in pieces
  timing bwd_packed;  // the wide-group configuration (steps of BM packed rows that straddle queries) with the workspace
  timing bwd_det;     // the public backward planned deterministic (window order, each tile in steps of its own)
  timing bwd_det_one_head;  // the same with one KV head after another (plan order 1; the plan takes them in turn)
};

/// One launch of the sparse backward's public configuration in launch order `order` (0: the default with a
/// workspace, 3: hs1's, -1: the deterministic plan (KV heads in turn), -2: the same, one KV head after another),
/// every CTA's timeline appended to `out` as CSV lines
/// "label,order,begin,selected,walk,first,last,synced,staged,end,sm,kvh,piece,steps,kb,dq_wait,piece_wait"
/// (backward_trace_record; times in ns from the first CTA's begin, -1: not reached; waits in ns).
void trace_sparse(const problem& p, int order, const std::string& label, std::FILE* out) {
  device_problem dp(p);
  const auto a = dp.args();
  const auto& c = p.c;
  backward_buffers buf(dp);
  attn_test::forward(a, buf.o.p, buf.lse.p, nullptr);
  gpu::backward_delta(c.sq, c.hq, c.d, buf.o.p, dp.d_o.p, buf.delta.p, nullptr);
  using record = gpu::detail::backward_trace_record;
  dev<std::uint64_t> tr(std::size_t(record::WORDS) << 20);  // up to 2^20 CTAs
  tr.fill_bytes(0);
  gpu::plan_options o;
  o.deterministic = order < 0;
  o.order = order == -2 ? 1 : order < 0 ? 0 : order;
  const auto plan = gpu::plan_backward(gpu::call_shape::of(a, buf.dq.p), attn_test::facts(), o);
  dev<std::int32_t> ws(static_cast<std::size_t>(plan.workspace_ints));
  const gpu::backward_workspace w{ws.p, static_cast<std::int64_t>(ws.n)};
  auto run = [&](auto traced, std::uint64_t* t) {
    constexpr bool Trace = decltype(traced)::value;
    if (c.d == 128)
      gpu::detail::launch_backward_sm90<gpu::backward_sm90_config<128>::type, Trace>(
          plan, a, buf.lse.p, buf.delta.p, dp.d_o.p, buf.dq.p, buf.dk.p, buf.dv.p, buf.grads, nullptr, w, t);
    else
      gpu::detail::launch_backward_sm90<gpu::backward_sm90_config<64>::type, Trace>(
          plan, a, buf.lse.p, buf.delta.p, dp.d_o.p, buf.dq.p, buf.dk.p, buf.dv.p, buf.grads, nullptr, w, t);
  };
  run(std::false_type{}, nullptr);  // warm
  run(std::true_type{}, tr.p);
  cuda_check(cudaDeviceSynchronize(), "trace");
  const auto h = tr.download();
  std::uint64_t t0 = ~0ull;
  for (std::size_t i = 0; i < h.size(); i += record::WORDS)
    if (h[i] != 0) t0 = std::min(t0, h[i]);
  for (std::size_t i = 0; i < h.size(); i += record::WORDS) {
    if (h[i] == 0) continue;
    const auto f = record::fields(h[i + record::INFO]);
    auto rel = [&](int slot) { return h[i + slot] == 0 ? -1ll : static_cast<long long>(h[i + slot] - t0); };
    std::fprintf(out, "%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d,%d,%d,%d,%d,%llu,%llu\n", label.c_str(), order,
                 rel(record::BEGIN), rel(record::SELECTED), rel(record::WALK), rel(record::FIRST), rel(record::LAST),
                 rel(record::SYNCED), rel(record::STAGED), rel(record::END), f.sm, f.kvh, f.piece, f.steps, f.kb,
                 static_cast<unsigned long long>(h[i + record::DQ_WAIT]),
                 static_cast<unsigned long long>(h[i + record::PIECE_WAIT]));
  }
}

/// The public sparse forward and backward (delta included) of p, and its kernel in two other launch orders.
sparse_timing time_sparse(const problem& p, int reps) {
  device_problem dp(p);
  const auto a = dp.args();
  const auto& c = p.c;
  backward_buffers buf(dp);
  auto& o = buf.o;
  auto &lse = buf.lse, &delta = buf.delta, &dq = buf.dq, &dk = buf.dk, &dv = buf.dv;
  const auto& grads = buf.grads;
  sparse_timing t;
  t.fwd = time_ms(1, reps, [&] { attn_test::forward(a, o.p, lse.p, nullptr); });
  dev<std::int32_t> ws(static_cast<std::size_t>(attn_test::workspace_ints(a)));
  t.bwd = time_ms(1, reps, [&] {
    gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
    attn_test::backward(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads, nullptr,
                            {ws.p, static_cast<std::int64_t>(ws.n)});
  });
  t.bwd_no_ws = time_ms(1, reps, [&] {
    gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
    attn_test::backward(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads, nullptr, {}, backward_kernels);
  });
  if (gpu::detail::current_device_is_sm90()) {
    gpu::plan_options det;
    det.deterministic = true;
    for (const int order : {0, 1}) {
      det.order = order;
      const auto det_plan = gpu::plan_backward(gpu::call_shape::of(a, dq.p), attn_test::facts(), det);
      dev<std::int32_t> det_ws(static_cast<std::size_t>(det_plan.workspace_ints));
      (order == 0 ? t.bwd_det : t.bwd_det_one_head) = time_ms(1, reps, [&] {
        gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
        gpu::backward(det_plan, a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, grads,
                      {det_ws.p, det_plan.workspace_ints}, nullptr);
      });
    }
    t.bwd_hs1 = time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
      if (c.d == 128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p,
                                                                                 dv.p, grads, nullptr, 0, 3);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::type>(a, lse.p, delta.p, dp.d_o.p, dq.p, dk.p,
                                                                                dv.p, grads, nullptr, 0, 3);
    });
    // An isolated 128-query tile at group 7 is 896 rows: 7 packed steps of 128 at d64, 8 whole-query steps of 126.
    t.bwd_packed = time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
      const gpu::backward_workspace w{ws.p, static_cast<std::int64_t>(ws.n)};
      if (c.d == 128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::wide_group>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                       dk.p, dv.p, grads, nullptr, 0, 0, w);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::wide_group>(a, lse.p, delta.p, dp.d_o.p, dq.p,
                                                                                      dk.p, dv.p, grads, nullptr, 0, 0, w);
    });
  }
  return t;
}

/// Packed documents: the public forward and backward (delta included) with per-document bounds and the
/// same calls without them, and the query-key pairs each attends (per query head). Each runs over the
/// whole window and over the window a caller launches (the trainer's paged_attention, the package's
/// driver): from the page of the first query's document start, since no query reads a page below it.
/// The trimmed calls without bounds are the baseline of the same grid: each query sees every key of
/// that window up to itself.
struct documents_timing {
  struct side {
    timing fwd, bwd;
    double pairs = 0;
  };
  side bounded, trimmed, plain, plain_trimmed;
  std::int32_t trimmed_pages = 0;  // pages left out of the trimmed window
  int split = 0;                   // the plan's query split for the trimmed backward
  timing bwd_split[4];             // the trimmed backward at forced query splits 1..4
};

documents_timing time_documents(const problem& p, int reps) {
  device_problem dp(p);
  const auto& c = p.c;
  const auto whole = dp.args();
  // The trimmed window: its table lists pages [first, npages) of the sequence, its gradient view
  // the same entries of the whole window's.
  const std::int32_t first = static_cast<std::int32_t>(p.key_lower.front() / c.page);
  const dev<std::int32_t> trimmed_table(std::vector<std::int32_t>{0, p.npages - first, p.last_len});
  auto trim = [&](gpu::attention_args a) {
    a.kv.table.indptr = trimmed_table.p;
    a.kv.table.last_page_len = trimmed_table.p + 2;
    a.kv.table.indices = dp.seq_ids.p + first;
    a.first_page = first;
    a.window_pages = p.npages - first;
    return a;
  };
  auto unbounded = [](gpu::attention_args a) {
    a.key_lower = nullptr;
    return a;
  };
  documents_timing t;
  t.trimmed_pages = first;
  for (std::int32_t i = 0; i < c.sq; ++i) {
    const std::int64_t pos = c.q_start + i;
    t.bounded.pairs += double(pos - p.key_lower[std::size_t(i)] + 1);
    t.plain.pairs += double(pos + 1);
    t.plain_trimmed.pairs += double(pos - std::int64_t(first) * c.page + 1);
  }
  t.trimmed.pairs = t.bounded.pairs;
  auto time_backward = [&](const gpu::attention_args& a, backward_buffers& buf, const gpu::plan_options& o) {
    const auto plan = gpu::plan_backward(gpu::call_shape::of(a, buf.dq.p), attn_test::facts(), o);
    return time_ms(1, reps, [&] {
      gpu::backward_delta(c.sq, c.hq, c.d, buf.o.p, dp.d_o.p, buf.delta.p, nullptr);
      gpu::backward(plan, a, buf.lse.p, buf.delta.p, dp.d_o.p, buf.dq.p, buf.dk.p, buf.dv.p, buf.grads, {}, nullptr);
    });
  };
  auto run = [&](const gpu::attention_args& a, std::int32_t skipped, documents_timing::side& out) {
    backward_buffers buf(dp, skipped);
    out.fwd = time_ms(1, reps, [&] { attn_test::forward(a, buf.o.p, buf.lse.p, nullptr); });
    out.bwd = time_backward(a, buf, {});
  };
  // in turn, so that neither side always runs on a warmer device
  run(unbounded(whole), 0, t.plain);
  run(whole, 0, t.bounded);
  const auto trimmed = trim(whole);
  run(unbounded(trimmed), first, t.plain_trimmed);
  run(trimmed, first, t.trimmed);
  // The wave rule's split assumes equal walks per key block; with documents they are not.
  backward_buffers buf(dp, first);
  t.split = gpu::plan_backward(gpu::call_shape::of(trimmed, buf.dq.p), attn_test::facts()).query_split;
  for (int split = 1; split <= 4; ++split) {
    gpu::plan_options o;
    o.split = split;
    t.bwd_split[split - 1] = time_backward(trimmed, buf, o);
  }
  return t;
}

/// Document starts for a sequence of `total` tokens: lengths drawn uniformly from [L/2, 3L/2], so
/// documents start mid-page and mid-tile.
std::vector<std::int64_t> document_starts(std::int64_t total, std::int64_t length, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> len(length / 2, length + length / 2);
  std::vector<std::int64_t> starts;
  for (std::int64_t at = len(rng); at < total; at += len(rng)) starts.push_back(at);
  return starts;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> pasts{16384, 65536, 262144};
  int reps = 5;
  int head_dim = 0;  // --head-dim: only this shape (0: both)
  bool extras = true;
  bool sm90_variants = false;  // time the Hopper forward's cluster splits at every past
  bool lean = false;           // the public entries on paged ids only
  bool sparse_budget = true;   // at 256K: the page-sparse forward/backward at a 64-page budget (--no-sparse: off)
  const char* json = nullptr;  // one JSON line per shape and past, every timed kernel
  const char* trace = nullptr;  // CTA timelines of the sparse backward (CSV)
  std::vector<std::int64_t> doc_lengths;  // --documents: packed documents of these lengths instead of the table
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--documents") == 0 && i + 1 < argc)
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr; tok = std::strtok(nullptr, ","))
        doc_lengths.push_back(std::atoll(tok));
    if (std::strcmp(argv[i], "--no-sparse") == 0) sparse_budget = false;
    if (std::strcmp(argv[i], "--lean") == 0) {
      lean = true;
      extras = false;
    }
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
    if (std::strcmp(argv[i], "--trace") == 0 && i + 1 < argc) trace = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) pasts = {16384};
    if (std::strcmp(argv[i], "--no-extras") == 0) extras = false;
    if (std::strcmp(argv[i], "--sm90-variants") == 0) sm90_variants = true;
    if (std::strcmp(argv[i], "--past") == 0 && i + 1 < argc) pasts = {std::atoll(argv[++i])};
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc) head_dim = std::atoi(argv[++i]);
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  struct shape {
    const char* name;
    std::int32_t hq, hkv, d;
  };
  const shape shapes[] = {{"28/4 d128", 28, 4, 128}, {"14/2 d64", 14, 2, 64}};
  const std::int32_t sq = 4096;
  // A chunk of sq queries of shape s after `past` tokens, pages of 128.
  auto config_of = [&](const shape& s, std::int64_t past) {
    config c;
    c.name = s.name;
    c.sq = sq;
    c.q_start = past;
    c.hq = s.hq;
    c.hkv = s.hkv;
    c.d = s.d;
    c.page = 128;
    c.seed = 7;
    return c;
  };
  std::printf("forward kernels: %s (fwd columns: the public entry; 'mma.sync' = portable kernel forced)\n",
              forward_kernels == gpu::kernel_choice::portable ? "portable" : "automatic");
  std::printf("backward kernels: %s (bwd columns: the public entry; 'sm90 bwd' = Hopper backward forced)\n",
              backward_kernels == gpu::kernel_choice::portable ? "portable" : "automatic");
  std::printf("%-10s %7s | %9s %9s %6s %9s | %9s %9s %6s | %9s %9s %9s %9s %8s | %8s %8s\n", "heads", "past",
              "fwd paged", "fwd contig", "ratio", "mma.sync", "bwd paged", "bwd contig", "ratio", "sm90 bwd", "sm90 ctg",
              "hb2", "hb2 ctg", "vs port", "fwd ms", "bwd ms");
  std::FILE* jf = json != nullptr ? std::fopen(json, "w") : nullptr;
  std::FILE* tf = trace != nullptr ? std::fopen(trace, "w") : nullptr;
  if (tf != nullptr)
    std::fprintf(tf, "label,order,begin,selected,walk,first,last,synced,staged,end,sm,kvh,piece,steps,kb,dq_wait,piece_wait\n");
  if (json != nullptr && jf == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", json);
    return 1;
  }
  if (trace != nullptr && tf == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", trace);
    return 1;
  }
  if (head_dim != 0 && head_dim != 128 && head_dim != 64) {
    std::fprintf(stderr, "--head-dim %d: the shapes have head size 128 or 64\n", head_dim);
    return 2;
  }
  if (!doc_lengths.empty()) {
    std::printf("packed documents: the public entries with per-document bounds vs the same calls without; "
                "time per attended pair, medians of %d\n", reps);
    for (const auto& s : shapes)
      for (std::int64_t past : pasts)
        for (std::int64_t length : doc_lengths) {
          if (head_dim != 0 && s.d != head_dim) continue;
          config c = config_of(s, past);
          c.documents = true;
          c.doc_starts = document_starts(past + sq, length, 11);
          const problem p(c, false);
          const documents_timing t = time_documents(p, reps);
          // time per attended pair of x over that of y: 1.0 = as fast per pair
          auto per_pair = [](const timing& x, double px, const timing& y, double py) {
            return (x.median / px) / (y.median / py);
          };
          const double rf = per_pair(t.bounded.fwd, t.bounded.pairs, t.plain.fwd, t.plain.pairs);
          const double rb = per_pair(t.bounded.bwd, t.bounded.pairs, t.plain.bwd, t.plain.pairs);
          const double tfw = per_pair(t.trimmed.fwd, t.trimmed.pairs, t.plain.fwd, t.plain.pairs);
          const double tbw = per_pair(t.trimmed.bwd, t.trimmed.pairs, t.plain.bwd, t.plain.pairs);
          const double gfw = per_pair(t.trimmed.fwd, t.trimmed.pairs, t.plain_trimmed.fwd, t.plain_trimmed.pairs);
          const double gbw = per_pair(t.trimmed.bwd, t.trimmed.pairs, t.plain_trimmed.bwd, t.plain_trimmed.pairs);
          std::printf("  %-10s past %4lldK, documents ~%lld (%zu starts), pairs %.3g of %.3g; per pair vs without bounds: "
                      "whole window fwd %.3fx bwd %.3fx | trimmed (%d pages fewer) fwd %.3fx bwd %.3fx | "
                      "trimmed vs trimmed without bounds fwd %.3fx bwd %.3fx; ms fwd %.3f/%.3f/%.3f bwd %.3f/%.3f/%.3f "
                      "(plain/whole/trimmed)\n",
                      s.name, (long long)(past / 1024), (long long)length, c.doc_starts.size(), t.bounded.pairs,
                      t.plain.pairs, rf, rb, t.trimmed_pages, tfw, tbw, gfw, gbw, t.plain.fwd.median,
                      t.bounded.fwd.median, t.trimmed.fwd.median, t.plain.bwd.median, t.bounded.bwd.median,
                      t.trimmed.bwd.median);
          std::printf("    trimmed bwd ms at query split 1/2/3/4: %.3f/%.3f/%.3f/%.3f (the plan's: %d)\n",
                      t.bwd_split[0].median, t.bwd_split[1].median, t.bwd_split[2].median, t.bwd_split[3].median,
                      t.split);
          std::fflush(stdout);
          if (jf != nullptr) {
            std::fprintf(jf,
                         "{\"heads\": \"%s\", \"past\": %lld, \"sq\": %d, \"reps\": %d, \"device\": \"%s\", "
                         "\"documents\": %lld, \"document_starts\": %zu, \"trimmed_pages\": %d, \"pairs\": %.0f, "
                         "\"pairs_plain\": %.0f, \"pairs_plain_trimmed\": %.0f, \"ms_median_min_max\": {",
                         s.name, (long long)past, sq, reps, prop.name, (long long)length, c.doc_starts.size(),
                         t.trimmed_pages, t.bounded.pairs, t.plain.pairs, t.plain_trimmed.pairs);
            const std::pair<const char*, const documents_timing::side*> sides[] = {
                {"", &t.bounded}, {"_trimmed", &t.trimmed}, {"_plain", &t.plain}, {"_plain_trimmed", &t.plain_trimmed}};
            const char* sep = "";
            for (const auto& [suffix, d] : sides) {
              std::fprintf(jf, "%s\"fwd%s\": [%f, %f, %f], \"bwd%s\": [%f, %f, %f]", sep, suffix, d->fwd.median,
                           d->fwd.lo, d->fwd.hi, suffix, d->bwd.median, d->bwd.lo, d->bwd.hi);
              sep = ", ";
            }
            std::fprintf(jf,
                         "}, \"per_pair_ratio\": {\"fwd\": %f, \"bwd\": %f, \"fwd_trimmed\": %f, \"bwd_trimmed\": %f, "
                         "\"fwd_trimmed_vs_plain_trimmed\": %f, \"bwd_trimmed_vs_plain_trimmed\": %f}, "
                         "\"trimmed_bwd_split\": %d, \"trimmed_bwd_ms_at_split_1_to_4\": [%f, %f, %f, %f]}\n",
                         rf, rb, tfw, tbw, gfw, gbw, t.split, t.bwd_split[0].median, t.bwd_split[1].median,
                         t.bwd_split[2].median, t.bwd_split[3].median);
          }
        }
    if (jf != nullptr) std::fclose(jf);
    if (tf != nullptr) std::fclose(tf);
    return 0;
  }
  for (const auto& s : shapes)
    for (std::int64_t past : pasts) {
      if (head_dim != 0 && s.d != head_dim) continue;
      config c = config_of(s, past);
      const double flops_fwd = 4.0 * sq * double(past) * s.d * s.hq + 2.0 * sq * double(sq) * s.d * s.hq;
      const double flops_bwd = 2.5 * flops_fwd;
      const int r = reps;
      result paged, contig;
      {
        c.shuffle_ids = true;
        problem p(c, false);
        paged = time_one(p, r, lean);
        if (sparse_budget && past == 262144)
          for (const std::int32_t pool : {0, 256}) {  // ~1 and ~8 tiles per selected middle page
            // FLOPs over the keys each query attends: the selected past pages plus its causal own keys
            const std::int64_t keys = select_sparse_budget(p, 64, 1, 8, pool);
            const double fl_f = 4.0 * sq * double(keys) * s.d * s.hq + 2.0 * sq * double(sq) * s.d * s.hq;
            const sparse_timing st = time_sparse(p, r);
            if (tf != nullptr && gpu::detail::current_device_is_sm90())
              for (int order : {0, 3, -1, -2})
                trace_sparse(p, order, std::string(s.name) + (pool > 0 ? " pool" : " random"), tf);
            const double tf_f = fl_f / st.fwd.median / 1e9, tf_b = 2.5 * fl_f / st.bwd.median / 1e9;
            auto tf = [&](double ms) { return ms > 0 ? 2.5 * fl_f / ms / 1e9 : 0.0; };
            const double tf_b0 = tf(st.bwd_hs1.median), tf_bi = tf(st.bwd_no_ws.median), tf_bp = tf(st.bwd_packed.median),
                         tf_bd = tf(st.bwd_det.median);
            const double dense_f = flops_fwd / paged.fwd.median / 1e9, dense_b = flops_bwd / paged.bwd.median / 1e9;
            const std::string sel = "64 pages + sink 1 + local 8 per 128-query tile, drawn from " +
                                    (pool > 0 ? "a shared pool of " + std::to_string(pool) + " pages" : std::string("every past page"));
            std::printf("  [sparse %s 256K past, %s (%lld past keys), TFLOP/s over attended keys: fwd %.1f (%.3fx dense %.1f) | "
                        "bwd %.1f (%.3fx dense %.1f) | no workspace (ends first) %.1f (%.3fx) | hs1's order, no walk in "
                        "pieces %.1f (%.3fx) | packed-row steps %.1f (%.3fx) | deterministic %.1f (%.3fx the default's time; "
                        "one KV head after another %.3fx)]\n",
                        s.name, sel.c_str(), (long long)keys, tf_f, tf_f / dense_f, dense_f, tf_b, tf_b / dense_b, dense_b,
                        tf_bi, tf_bi / dense_b, tf_b0, tf_b0 / dense_b, tf_bp, tf_bp / dense_b, tf_bd,
                        st.bwd_det.median / st.bwd.median, st.bwd_det_one_head.median / st.bwd.median);
            if (jf != nullptr)
              std::fprintf(jf,
                           "{\"heads\": \"%s\", \"past\": %lld, \"sq\": %d, \"reps\": %d, \"sparse\": \"%s\", "
                           "\"pool\": %d, \"attended_past_keys\": %lld, \"tflops_median_min_max\": "
                           "{\"fwd_sparse\": [%f, %f, %f], \"bwd_sparse\": [%f, %f, %f], \"bwd_sparse_no_workspace\": [%f, %f, %f], "
                           "\"bwd_sparse_hs1_order\": [%f, %f, %f], \"bwd_sparse_packed_rows\": [%f, %f, %f], "
                           "\"bwd_sparse_deterministic\": [%f, %f, %f], \"bwd_sparse_deterministic_one_head_at_a_time\": [%f, %f, %f]}, "
                           "\"fwd_dense_paged_median\": %f, \"bwd_dense_paged_median\": %f}\n",
                           s.name, (long long)past, sq, r, sel.c_str(), pool, (long long)keys, tf_f, fl_f / st.fwd.hi / 1e9,
                           fl_f / st.fwd.lo / 1e9, tf_b, tf(st.bwd.hi), tf(st.bwd.lo), tf_bi, tf(st.bwd_no_ws.hi),
                           tf(st.bwd_no_ws.lo), tf_b0, tf(st.bwd_hs1.hi), tf(st.bwd_hs1.lo), tf_bp, tf(st.bwd_packed.hi),
                           tf(st.bwd_packed.lo), tf_bd, tf(st.bwd_det.hi), tf(st.bwd_det.lo), tf(st.bwd_det_one_head.median),
                           tf(st.bwd_det_one_head.hi), tf(st.bwd_det_one_head.lo), dense_f, dense_b);
            std::fflush(stdout);
            p.c.sparse = false;
            p.tile_indptr.clear();
            p.tile_pages.clear();
          }
        if (sm90_variants) {
          device_problem dp(p);
          const double tf = flops_fwd / 1e9;
          auto splits = [&](auto cfg) {
            using H = decltype(cfg);
            std::printf("  [sm90 fwd %s %lldK: split 1 %.1f | 2 %.1f TFLOP/s]\n", s.name, (long long)(past / 1024),
                        tf / time_fwd_sm90<H>(dp, 1, r), tf / time_fwd_sm90<H>(dp, 2, r));
          };
          if (s.d == 128)
            splits(gpu::forward_sm90_config<128>::type{});
          else
            splits(gpu::forward_sm90_config<64>::type{});
          std::fflush(stdout);
        }
        if (extras && past == 65536) {  // what gathering the window into contiguous memory first would cost
          device_problem dp(p);
          // the same work with other tile shapes / splits (variants.cuh lists them)
          const double tf = flops_fwd / 1e9, tb = flops_bwd / 1e9;
          if (s.d == 128) {
            using F = gpu::forward_config<128>::type;
            using B = gpu::backward_config<128>::type;
            for (int sp = 1; sp <= 4; ++sp)
              std::printf("  [fwd d128 split %d: %.1f TFLOP/s]\n", sp, tf / time_fwd<F>(dp, sp, r));
            std::printf("  [bwd d128 query split 1: %.1f | 2: %.1f | auto: %.1f TFLOP/s]\n", tb / time_bwd<B>(dp, 1, r),
                        tb / time_bwd<B>(dp, 2, r), tb / time_bwd<B>(dp, 0, r));
          } else {
            using F = gpu::forward_config<64>::type;
            using B = gpu::backward_config<64>::type;
            for (int sp = 1; sp <= 4; ++sp)
              std::printf("  [fwd d64 split %d: %.1f TFLOP/s]\n", sp, tf / time_fwd<F>(dp, sp, r));
            std::printf("  [bwd d64 query split 1: %.1f | 2: %.1f | auto: %.1f TFLOP/s]\n", tb / time_bwd<B>(dp, 1, r),
                        tb / time_bwd<B>(dp, 2, r), tb / time_bwd<B>(dp, 0, r));
          }
          const std::int64_t pair_vec = p.shape.pair_elements() * 2 / 16;
          dev<uint4> out(std::size_t(p.npages) * pair_vec);
          const double ms = median_ms(1, r, [&] {
            gather_pages<<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const uint4*>(dp.pool.p), dp.seq_ids.p,
                                                                 pair_vec, p.npages, out.p);
          });
          std::printf("  [gather %s, %lld keys: %.3f ms = %.1f GB/s moved, %.2f%% of the paged forward]\n", s.name,
                      (long long)p.total, ms, 2.0 * p.npages * pair_vec * 16 / ms / 1e6, 100.0 * ms / paged.fwd.median);
        }
      }
      if (!lean) {
        c.shuffle_ids = false;
        const problem p(c, false);
        contig = time_one(p, r);
        if (extras) {
          device_problem dp(p);  // the backward with every block walking the query tiles in lockstep
          const double ms = s.d == 128 ? time_bwd<gpu::backward_config<128>::type>(dp, 0, r, 1)
                                       : time_bwd<gpu::backward_config<64>::type>(dp, 0, r, 1);
          std::printf("  [bwd %s %lldK contiguous, lockstep query walk: %.1f TFLOP/s (default staggered: %.1f)]\n",
                      s.name, (long long)(past / 1024), flops_bwd / ms / 1e9, flops_bwd / contig.bwd.median / 1e9);
        }
      }
      auto tfs = [](double flops, double ms) { return ms > 0 ? flops / ms / 1e9 : 0.0; };
      std::printf("%-10s %6lldK | %9.1f %9.1f %6.3f %9.1f | %9.1f %9.1f %6.3f | %9.1f %9.1f %9.1f %9.1f %8.1e | %8.3f %8.3f\n",
                  s.name, (long long)(past / 1024), tfs(flops_fwd, paged.fwd.median), tfs(flops_fwd, contig.fwd.median),
                  contig.fwd.median / paged.fwd.median, tfs(flops_fwd, paged.fwd_portable_ms),
                  tfs(flops_bwd, paged.bwd.median), tfs(flops_bwd, contig.bwd.median), contig.bwd.median / paged.bwd.median,
                  tfs(flops_bwd, paged.bwd_sm90.median), tfs(flops_bwd, contig.bwd_sm90.median),
                  tfs(flops_bwd, paged.bwd_other.median), tfs(flops_bwd, contig.bwd_other.median),
                  std::max(paged.bwd_sm90_err, contig.bwd_sm90_err), paged.fwd.median, paged.bwd.median);
      std::printf("  [sm90 bwd %s %lldK: dense default (hb6, Q/dO by TMA, whole-query steps) %.1f (contig %.1f) | "
                  "cp.async Q/dO (wide groups; the dense default before hb6) %.1f (contig %.1f) TFLOP/s]\n",
                  s.name, (long long)(past / 1024), tfs(flops_bwd, paged.bwd_sm90.median),
                  tfs(flops_bwd, contig.bwd_sm90.median), tfs(flops_bwd, paged.bwd_wide.median),
                  tfs(flops_bwd, contig.bwd_wide.median));
      if (paged.bwd_det.median > 0)
        std::printf("  [deterministic bwd %s %lldK: %.1f TFLOP/s, %.3fx the public backward's time; KV heads in turn "
                    "%.1f TFLOP/s, %.3fx; the default at query split 1: %.3fx]\n",
                    s.name, (long long)(past / 1024), tfs(flops_bwd, paged.bwd_det.median),
                    paged.bwd_det.median / paged.bwd.median, tfs(flops_bwd, paged.bwd_det_interleaved.median),
                    paged.bwd_det_interleaved.median / paged.bwd.median, paged.bwd_split1.median / paged.bwd.median);
      if (jf != nullptr) {  // TFLOP/s of the median, slowest and fastest call
        auto tri = [&](double flops, const timing& t) {
          return std::to_string(tfs(flops, t.median)) + ", " + std::to_string(tfs(flops, t.hi)) + ", " +
                 std::to_string(tfs(flops, t.lo));
        };
        auto in_order = [](const timing& t) {
          std::string list;
          for (float ms : t.in_order) list += (list.empty() ? "" : ", ") + std::to_string(ms);
          return list;
        };
        std::fprintf(jf,
                     "{\"heads\": \"%s\", \"past\": %lld, \"sq\": %d, \"reps\": %d, \"device\": \"%s\", "
                     "\"tflops_median_min_max\": {\"fwd_paged\": [%s], \"fwd_contig\": [%s], \"fwd_portable\": %f, "
                     "\"bwd_public_paged\": [%s], \"bwd_public_contig\": [%s], \"bwd_sm90_config_paged\": [%s], "
                     "\"bwd_sm90_config_contig\": [%s], \"bwd_hb2_paged\": [%s], \"bwd_hb2_contig\": [%s], "
                     "\"bwd_sm90_wide_group_paged\": [%s], \"bwd_sm90_wide_group_contig\": [%s], "
                     "\"bwd_deterministic_paged\": [%s], \"bwd_deterministic_heads_in_turn_paged\": [%s], "
                     "\"bwd_public_split1_paged\": [%s]}, "
                     "\"bwd_sm90_config_ms_in_order\": {\"paged\": [%s], \"contig\": [%s]}, "
                     "\"bwd_vs_portable_err\": %g, \"backward_kernels\": \"%s\"}\n",
                     s.name, (long long)past, sq, r, prop.name, tri(flops_fwd, paged.fwd).c_str(),
                     tri(flops_fwd, contig.fwd).c_str(), tfs(flops_fwd, paged.fwd_portable_ms),
                     tri(flops_bwd, paged.bwd).c_str(), tri(flops_bwd, contig.bwd).c_str(),
                     tri(flops_bwd, paged.bwd_sm90).c_str(), tri(flops_bwd, contig.bwd_sm90).c_str(),
                     tri(flops_bwd, paged.bwd_other).c_str(), tri(flops_bwd, contig.bwd_other).c_str(),
                     tri(flops_bwd, paged.bwd_wide).c_str(), tri(flops_bwd, contig.bwd_wide).c_str(),
                     tri(flops_bwd, paged.bwd_det).c_str(), tri(flops_bwd, paged.bwd_det_interleaved).c_str(),
                     tri(flops_bwd, paged.bwd_split1).c_str(),
                     in_order(paged.bwd_sm90).c_str(), in_order(contig.bwd_sm90).c_str(),
                     std::max(paged.bwd_sm90_err, contig.bwd_sm90_err),
                     backward_kernels == gpu::kernel_choice::portable ? "portable" : "automatic");
        std::fflush(jf);
      }
      std::fflush(stdout);
    }
  std::printf("TFLOP/s (medians of %d calls); ratio = contiguous time / paged time (1.0 = paging is free); hb2 = the "
              "Hopper backward's unaligned-dq configuration (red.add dQ, 64-row steps)\n", reps);
  if (jf != nullptr) std::fclose(jf);
  if (tf != nullptr) std::fclose(tf);
  return 0;
}
