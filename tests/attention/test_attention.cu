// oomb tests — the GPU attention kernels against the CPU reference (small shapes, every output and
// gradient) and against a plain fp32 GPU reference (the benchmark's large shapes).
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include <oomb/core/error.hpp>

#include <oomb/attention/reference.hpp>
#include "launch.cuh"

#include "problem.hpp"
#include "reference_gpu.cuh"

namespace {

using attn_test::config;
using attn_test::dev;
using attn_test::device_problem;
using attn_test::problem;
using attn_test::rel_err;
using attn_test::to_double;
using attn_test::window_range;
using oomb::bf16;
namespace gpu = oomb::attention;
namespace cpu = oomb::attention::reference;

constexpr double tolerance = 2e-2;  // norm-wise relative error, bf16 inputs

void sync() { attn_test::cuda_check(cudaDeviceSynchronize(), "sync"); }

/// The CPU reference of one problem, in double: forward over all pages, then backward fed with the
/// forward's o rounded to bf16 and lse rounded to fp32 (exactly what the GPU backward is given).
struct cpu_result {
  std::vector<double> o, lse, o_in, lse_in, dq, dk_own, dv_own, dgrad;
};

cpu_result run_cpu(const problem& p) {
  const auto& c = p.c;
  cpu_result r;
  std::vector<double> qd = to_double(p.q), dod = to_double(p.d_o);
  std::vector<std::int32_t> indptr{0, p.npages}, last{p.last_len};
  cpu::attention_args<double, bf16> a;
  a.q = qd.data();
  a.q_start = c.q_start;
  a.sq = c.sq;
  a.hq = c.hq;
  a.hkv = c.hkv;
  a.d = c.d;
  a.scale = 1.0 / std::sqrt(double(float(c.d)));
  a.scale = double(1.0f / std::sqrt(static_cast<float>(c.d)));  // the GPU's fp32 scale, exactly
  a.kv.pool = oomb::page_pool_view<const bf16>::over(p.pool.data(), p.shape);
  a.kv.table.indptr = indptr.data();
  a.kv.table.indices = p.seq_ids.data();
  a.kv.table.last_page_len = last.data();
  a.kv.table.num_seqs = 1;
  a.kv.table.page_size = c.page;
  a.first_page = 0;
  if (c.sparse) {
    a.tile_indptr = p.tile_indptr.data();
    a.tile_pages = p.tile_pages.data();
    a.tile = c.tile;
  }
  if (c.documents) a.key_lower = p.key_lower.data();
  const std::size_t qn = p.q.size();
  r.o.resize(qn);
  r.lse.resize(static_cast<std::size_t>(c.sq) * c.hq);
  cpu::attention_forward(a, r.o.data(), r.lse.data());
  r.o_in.resize(qn);
  r.lse_in.resize(r.lse.size());
  for (std::size_t i = 0; i < qn; ++i) r.o_in[i] = double(float(bf16(float(r.o[i]))));
  for (std::size_t i = 0; i < r.lse.size(); ++i) r.lse_in[i] = double(float(r.lse[i]));
  r.dq.assign(qn, 0.0);
  r.dk_own.assign(static_cast<std::size_t>(c.sq) * c.hkv * c.d, 0.0);
  r.dv_own.assign(r.dk_own.size(), 0.0);
  r.dgrad.assign(static_cast<std::size_t>(std::int64_t(p.n_grad) * p.shape.pair_elements()), 0.0);
  const std::vector<std::int32_t> entries = p.entry_grads({0, p.npages});
  oomb::window_grad_view<double> g;
  g.pool = oomb::page_pool_view<double>::over(r.dgrad.data(), p.shape);
  g.grad_page = entries.data();
  g.pages = p.npages;
  cpu::attention_backward(a, r.o_in.data(), r.lse_in.data(), dod.data(), r.dq.data(), r.dk_own.data(),
                          r.dv_own.data(), g);
  return r;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<double> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = double(a[i]) - double(b[i]);
  return r;
}

struct gpu_result {
  std::vector<float> lse;
  std::vector<double> o, dq, dk_own, dv_own, dgrad;  // gradients: what the call added
  bool untouched_ok = true;                          // pages with no reference gradient stayed bitwise
};

/// Runs the GPU kernels on problem p. merged: forward per window (fp32 partials) folded by
/// attention_merge and backward summed over windows; else one pass over all pages.
gpu_result run_gpu(const problem& p, const cpu_result& ref, bool merged, bool bf16_out) {
  const auto& c = p.c;
  device_problem dp(p);
  gpu_result r;
  const std::size_t qn = p.q.size(), ln = static_cast<std::size_t>(c.sq) * c.hq;
  dev<float> lse(ln);
  if (!merged) {
    lse.fill_bytes(0xff);  // NaN: every element must be written
    if (bf16_out) {
      dev<bf16> o(qn);
      o.fill_bytes(0xff);
      attn_test::forward(dp.args(), o.p, lse.p, nullptr);
      r.o = to_double(o.download());
    } else {
      dev<float> o(qn);
      o.fill_bytes(0xff);
      attn_test::forward(dp.args(), o.p, lse.p, nullptr);
      r.o = to_double(o.download());
    }
  } else {
    dev<float> o_acc(std::vector<float>(qn, 0.0f));
    lse.upload(std::vector<float>(ln, -INFINITY));
    dev<float> o_w(qn), lse_w(ln);
    for (int w = 0; w < int(p.windows.size()); ++w) {
      o_w.fill_bytes(0xff);
      lse_w.fill_bytes(0xff);
      attn_test::forward(dp.args(w), o_w.p, lse_w.p, nullptr);
      gpu::merge(c.sq, c.hq, c.d, o_acc.p, lse.p, o_w.p, lse_w.p, nullptr);
    }
    r.o = to_double(o_acc.download());
  }
  r.lse = lse.download();
  sync();

  // Backward, given the reference's o (bf16) and lse (fp32); outputs start random ("+=").
  std::vector<bf16> o_in(qn);
  for (std::size_t i = 0; i < qn; ++i) o_in[i] = bf16(float(ref.o_in[i]));
  std::vector<float> lse_in(ref.lse_in.begin(), ref.lse_in.end());
  dev<bf16> o_dev(o_in);
  dev<float> lse_dev(lse_in), delta(ln);
  delta.fill_bytes(0xff);
  gpu::backward_delta(c.sq, c.hq, c.d, o_dev.p, dp.d_o.p, delta.p, nullptr);
  const std::size_t kn = static_cast<std::size_t>(c.sq) * c.hkv * c.d;
  const std::size_t gn = static_cast<std::size_t>(std::int64_t(p.n_grad) * p.shape.pair_elements());
  const auto dq0 = random_floats(qn, c.seed + 11), dk0 = random_floats(kn, c.seed + 12),
             dv0 = random_floats(kn, c.seed + 13), g0 = random_floats(gn, c.seed + 14);
  dev<float> dq(dq0), dk(dk0), dv(dv0), gp(g0);
  if (!merged) {
    attn_test::backward(dp.args(), lse_dev.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p), nullptr);
  } else {
    for (int w = 0; w < int(p.windows.size()); ++w)
      attn_test::backward(dp.args(w), lse_dev.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p, w), nullptr);
  }
  sync();
  r.dq = minus(dq.download(), dq0);
  r.dk_own = minus(dk.download(), dk0);
  r.dv_own = minus(dv.download(), dv0);
  const auto g1 = gp.download();
  r.dgrad = minus(g1, g0);
  for (std::size_t i = 0; i < gn; ++i)
    if (ref.dgrad[i] == 0.0 && g1[i] != g0[i]) r.untouched_ok = false;
  return r;
}

struct errors {
  double o, lse, dq, dk_own, dv_own, dgrad;
};

errors compare(const gpu_result& g, const cpu_result& r) {
  return {rel_err(g.o, r.o), rel_err(g.lse, r.lse), rel_err(g.dq, r.dq), rel_err(g.dk_own, r.dk_own),
          rel_err(g.dv_own, r.dv_own), rel_err(g.dgrad, r.dgrad)};
}

void check_errors(const std::string& name, const errors& e, bool untouched_ok, double tol = tolerance) {
  std::printf("  %-34s o %.2e  lse %.2e  dq %.2e  dk_own %.2e  dv_own %.2e  dpast %.2e%s\n", name.c_str(), e.o,
              e.lse, e.dq, e.dk_own, e.dv_own, e.dgrad, untouched_ok ? "" : "  UNSELECTED PAGES CHANGED");
  std::fflush(stdout);
  INFO(name);
  CHECK(e.o <= tol);
  CHECK(e.lse <= tol);
  CHECK(e.dq <= tol);
  CHECK(e.dk_own <= tol);
  CHECK(e.dv_own <= tol);
  CHECK(e.dgrad <= tol);
  CHECK(untouched_ok);
}

config make(const char* name, std::int32_t sq, std::int64_t q_start, std::int32_t hq, std::int32_t hkv, std::int32_t d,
            std::int32_t page, oomb::kv_layout layout = oomb::kv_layout::head_major) {
  config c;
  c.name = name;
  c.sq = sq;
  c.q_start = q_start;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.page = page;
  c.layout = layout;
  c.seed = std::hash<std::string>{}(name);
  return c;
}

config sparse(config c, std::int32_t tile, std::int32_t windows = 1) {
  c.sparse = true;
  c.tile = tile;
  c.windows = windows;
  return c;
}
config windowed(config c, std::int32_t windows) {
  c.windows = windows;
  return c;
}

bool hopper_device() { return gpu::detail::current_device_is_sm90(); }
/// variant: 0 the configuration for calls whose group fits a step (Q/dO by TMA, whole-query steps;
/// dense and sparse calls), 1 the one for an 8- but not 16-byte aligned dq (red.add dQ, 64-row
/// steps), 2 the one for groups wider than a step (cp.async Q/dO); sparse calls only: 3 variant 0
/// with the KV heads interleaved in the launch order (order_hint 2), 4 variant 0 in hs1's launch
/// order, no walk cut into pieces (order_hint 3), 5 variant 0 with a workspace: past blocks by
/// selection count (hs2).
void check_backward_sm90(const problem& p, const cpu_result& ref, int split = 0, int variant = 0);
void check_backward_portable(const problem& p, const cpu_result& ref);

/// Runs every config: CPU references in parallel threads, GPU runs in order. On a Hopper device the
/// backward of every config with page_size >= 128 also runs through the Hopper kernel.
void run_all(const std::vector<config>& cfgs) {
  std::vector<std::unique_ptr<problem>> probs;
  for (const auto& c : cfgs) probs.push_back(std::make_unique<problem>(c));
  std::vector<std::future<cpu_result>> refs;
  for (const auto& p : probs) refs.push_back(std::async(std::launch::async, [&p] { return run_cpu(*p); }));
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const problem& p = *probs[i];
    const cpu_result ref = refs[i].get();
    const bool merged = p.c.windows > 1;
    const gpu_result g = run_gpu(p, ref, merged, !merged);
    check_errors(p.c.name + (merged ? " [" + std::to_string(p.windows.size()) + " windows]" : ""), compare(g, ref),
                 g.untouched_ok);
    if (hopper_device() && p.c.page >= 128) check_backward_portable(p, ref);  // the kernel the public entry did not pick
  }
}

}  // namespace

TEST_CASE("attention: the docs' example, plan then launch, matches the CPU reference") {
  // docs/attention.md quotes the region between the snippet markers.
  const problem p(sparse(make("docs example g4 d128", 256, 1024, 8, 2, 128, 128), 64));
  const cpu_result ref = run_cpu(p);
  device_problem dp(p);
  const auto& c = p.c;
  const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq, kn = std::size_t(c.sq) * c.hkv * c.d;
  dev<bf16> o_buf(qn);
  dev<float> lse_buf(ln), delta_buf(ln), dq_buf(std::vector<float>(qn, 0.0f)), dk_buf(std::vector<float>(kn, 0.0f)),
      dv_buf(std::vector<float>(kn, 0.0f)),
      pages(std::vector<float>(std::size_t(std::int64_t(p.n_grad) * p.shape.pair_elements()), 0.0f));
  const oomb::attention::attention_args args = dp.args();  // q, the window's pages, the sparse lists
  const oomb::bf16* d_o = dp.d_o.p;
  const oomb::window_grad_view<float> dpast = dp.grads(pages.p);  // the window's gradient pages
  bf16* o = o_buf.p;
  float *lse = lse_buf.p, *delta = delta_buf.p, *dq = dq_buf.p, *dk = dk_buf.p, *dv = dv_buf.p;
  cudaStream_t stream = nullptr;
  // snippet-begin: plan-launch
  namespace att = oomb::attention;
  const att::device_facts& facts = att::current_device_facts();  // queried once per device
  // The forward of one window: plan (host arithmetic), then launch (no allocation).
  const att::forward_plan fp = att::plan_forward(att::call_shape::of(args), facts);
  att::forward(fp, args, o, lse, stream);
  // The backward: delta = rowsum(dO * O) once, then each window adds into dq, dk/dv and dpast.
  att::backward_delta(args.sq, args.hq, args.d, o, d_o, delta, stream);
  const att::backward_plan bp = att::plan_backward(att::call_shape::of(args, dq), facts);
  dev<std::int32_t> workspace(std::size_t(bp.workspace_ints));  // device scratch: sparse launch order, dQ turns
  att::backward(bp, args, lse, delta, d_o, dq, dk, dv, dpast, {workspace.p, bp.workspace_ints}, stream);
  // snippet-end: plan-launch
  sync();
  // The GPU's o and lse feed its backward here, the reference's own its: compare o and lse tightly
  // and the gradients at the bf16 rounding of o.
  CHECK(rel_err(to_double(o_buf.download()), ref.o) <= tolerance);
  CHECK(rel_err(lse_buf.download(), ref.lse) <= tolerance);
  CHECK(rel_err(dq_buf.download(), ref.dq) <= 2 * tolerance);
  CHECK(rel_err(dk_buf.download(), ref.dk_own) <= 2 * tolerance);
  CHECK(rel_err(dv_buf.download(), ref.dv_own) <= 2 * tolerance);
  CHECK(rel_err(pages.download(), ref.dgrad) <= 2 * tolerance);
}

TEST_CASE("attention: reference fp32 GPU kernels match the CPU reference") {
  std::printf("fp32 GPU reference vs CPU reference (norm-wise relative error)\n");
  const std::vector<config> cfgs = {
      make("ref g7 d128 p64", 150, 200, 14, 2, 128, 64),
      sparse(make("ref sparse g2 d64 p16", 130, 300, 4, 2, 64, 16, oomb::kv_layout::token_major), 64),
  };
  for (const auto& c : cfgs) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    device_problem dp(p);
    const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq, kn = std::size_t(c.sq) * c.hkv * c.d;
    const std::size_t gn = std::size_t(std::int64_t(p.n_grad) * p.shape.pair_elements());
    dev<float> o(qn), lse(ln);
    attn_test::ref::forward(dp.args(), dp.window_len(), o.p, lse.p);
    std::vector<float> o_in(ref.o_in.begin(), ref.o_in.end()), lse_in(ref.lse_in.begin(), ref.lse_in.end());
    dev<float> o_dev(o_in), lse_dev(lse_in);
    dev<float> dq(std::vector<float>(qn, 0.0f)), dk(std::vector<float>(kn, 0.0f)), dv(std::vector<float>(kn, 0.0f)),
        gp(std::vector<float>(gn, 0.0f));
    attn_test::ref::backward(dp.args(), dp.window_len(), o_dev.p, lse_dev.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p));
    gpu_result g;
    g.o = to_double(o.download());
    g.lse = lse.download();
    g.dq = to_double(dq.download());
    g.dk_own = to_double(dk.download());
    g.dv_own = to_double(dv.download());
    g.dgrad = to_double(gp.download());
    check_errors(c.name, compare(g, ref), true, 1e-4);
  }
}

TEST_CASE("attention: dense, every group size, both head dims, ragged lengths, page sizes and layouts") {
  std::printf("dense kernels vs CPU reference (norm-wise relative error)\n");
  using oomb::kv_layout;
  run_all({
      make("g7 d128 p128 14:2", 200, 300, 14, 2, 128, 128),
      make("g7 d128 p128 28:4", 130, 384, 28, 4, 128, 128, kv_layout::token_major),
      make("g7 d64 p64 14:2 tm", 257, 129, 14, 2, 64, 64, kv_layout::token_major),
      make("g7 d64 no past", 140, 0, 7, 1, 64, 128),
      make("g5 d128 p16 40:8", 150, 77, 40, 8, 128, 16, kv_layout::token_major),
      make("g5 d64 p128", 300, 0, 5, 1, 64, 128),
      make("g1 d128 p32", 190, 500, 3, 3, 128, 32),
      make("g1 d64 p256", 129, 600, 2, 2, 64, 256),
      make("g2 d128 p64", 64, 64, 4, 2, 128, 64),
      make("g2 d64 p16", 333, 250, 8, 4, 64, 16),
      make("g2 d128 p128 tiny", 1, 5, 2, 1, 128, 128),
      make("g7 d64 p16 long past", 100, 1500, 7, 1, 64, 16),
  });
}

TEST_CASE("attention: page-sparse past, every group size, both head dims") {
  std::printf("sparse kernels vs CPU reference (norm-wise relative error)\n");
  using oomb::kv_layout;
  run_all({
      sparse(make("sparse g7 d128 p64", 300, 700, 14, 2, 128, 64), 128),
      sparse(make("sparse g1 d64 p16", 260, 400, 2, 2, 64, 16, kv_layout::token_major), 128),
      sparse(make("sparse g2 d128 p32", 200, 333, 4, 2, 128, 32), 64),
      sparse(make("sparse g5 d64 p128", 256, 1000, 10, 2, 64, 128), 128),
      sparse(make("sparse g7 d64 p128 28:4", 130, 640, 28, 4, 64, 128), 128),
  });
}

TEST_CASE("attention: several windows merged equal one pass") {
  std::printf("windows merged (forward by attention_merge, backward summed) vs CPU one pass\n");
  using oomb::kv_layout;
  run_all({
      windowed(make("win g7 d128 p64", 200, 500, 14, 2, 128, 64), 3),
      windowed(make("win g5 d64 p16", 150, 300, 10, 2, 64, 16, kv_layout::token_major), 4),
      windowed(make("win g1 d128 p128", 130, 700, 2, 2, 128, 128), 3),
      windowed(make("win g2 d64 p32", 100, 200, 4, 2, 64, 32), 2),
      sparse(make("win sparse g5 d64 p128", 256, 1000, 10, 2, 64, 128), 128, 3),
      sparse(make("win sparse g7 d128 p16", 150, 600, 14, 2, 128, 16), 128, 3),
  });
}

TEST_CASE("attention: forward split across a thread-block cluster (1..4 CTAs per row block) matches") {
  std::printf("forward with forced cluster splits vs CPU reference\n");
  using oomb::kv_layout;
  const std::vector<config> cfgs = {
      make("split g7 d128 p64", 200, 1300, 14, 2, 128, 64),
      sparse(make("split sparse g5 d64 p16", 150, 900, 10, 2, 64, 16, kv_layout::token_major), 128),
  };
  for (const auto& c : cfgs) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    device_problem dp(p);
    const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq;
    for (int split = 1; split <= 4; ++split) {
      dev<float> o(qn), lse(ln);
      o.fill_bytes(0xff);
      lse.fill_bytes(0xff);
      if (c.d == 128)
        attn_test::launch_forward<gpu::forward_config<128>::type>(dp.args(), o.p, lse.p, nullptr, split);
      else
        attn_test::launch_forward<gpu::forward_config<64>::type>(dp.args(), o.p, lse.p, nullptr, split);
      sync();
      const double eo = rel_err(to_double(o.download()), ref.o), el = rel_err(lse.download(), ref.lse);
      std::printf("  %-34s split %d: o %.2e  lse %.2e\n", c.name.c_str(), split, eo, el);
      CHECK(eo <= tolerance);
      CHECK(el <= tolerance);
    }
  }
}

namespace {

/// Backward of p (one pass) through `bwd`, outputs starting random; returns what was added.
template <class Bwd>
gpu_result run_backward(const problem& p, const cpu_result& ref, Bwd&& bwd, bool merged = false) {
  const auto& c = p.c;
  device_problem dp(p);
  gpu_result r;
  const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq, kn = std::size_t(c.sq) * c.hkv * c.d;
  const std::size_t gn = std::size_t(std::int64_t(p.n_grad) * p.shape.pair_elements());
  std::vector<bf16> o_in(qn);
  for (std::size_t i = 0; i < qn; ++i) o_in[i] = bf16(float(ref.o_in[i]));
  dev<bf16> o_dev(o_in);
  dev<float> lse_dev(std::vector<float>(ref.lse_in.begin(), ref.lse_in.end())), delta(ln);
  gpu::backward_delta(c.sq, c.hq, c.d, o_dev.p, dp.d_o.p, delta.p, nullptr);
  const auto dq0 = random_floats(qn, c.seed + 21), dk0 = random_floats(kn, c.seed + 22),
             dv0 = random_floats(kn, c.seed + 23), g0 = random_floats(gn, c.seed + 24);
  dev<float> dq(dq0), dk(dk0), dv(dv0), gp(g0);
  if (!merged)
    bwd(dp.args(), lse_dev.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p));
  else  // windows partition the keys: their backward passes sum to one
    for (int w = 0; w < int(p.windows.size()); ++w)
      bwd(dp.args(w), lse_dev.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p, w));
  sync();
  r.o = ref.o;
  r.lse.assign(ref.lse.begin(), ref.lse.end());
  r.dq = minus(dq.download(), dq0);
  r.dk_own = minus(dk.download(), dk0);
  r.dv_own = minus(dv.download(), dv0);
  const auto g1 = gp.download();
  r.dgrad = minus(g1, g0);
  for (std::size_t i = 0; i < gn; ++i)
    if (ref.dgrad[i] == 0.0 && g1[i] != g0[i]) r.untouched_ok = false;
  return r;
}

/// Backward of p through the Hopper kernel (all windows summed when p has several), outputs
/// starting random, checked against the CPU oracle. split: forced query split (0 = policy).
void check_backward_sm90(const problem& p, const cpu_result& ref, int split, int variant) {
  REQUIRE((variant >= 0 && variant <= 5));
  if (variant >= 3 && !p.c.sparse) return;
  const bool merged = p.c.windows > 1;
  const gpu_result g = run_backward(
      p, ref,
      [&](const gpu::attention_args& a, auto... rest) {
        const int order = variant == 3 ? 2 : variant == 4 ? 3 : 0;
        auto run = [&](auto cfg) {
          if (variant != 5) {
            attn_test::launch_backward_sm90<decltype(cfg)>(a, rest..., nullptr, split, order);
            return;
          }
          dev<std::int32_t> ws(static_cast<std::size_t>(attn_test::workspace_ints(a)));
          ws.fill_bytes(0xff);  // the order kernel must write every word it reads
          attn_test::launch_backward_sm90<decltype(cfg)>(a, rest..., nullptr, split, order,
                                                           {ws.p, static_cast<std::int64_t>(ws.n)});
          sync();  // ws is freed at the end of this scope
        };
        auto run_for = [&](auto configs) {
          using C = decltype(configs);
          if (variant == 1)
            run(typename C::unaligned{});
          else if (variant == 2)
            run(typename C::wide_group{});
          else
            run(typename C::type{});
        };
        if (p.c.d == 128)
          run_for(gpu::backward_sm90_config<128>{});
        else
          run_for(gpu::backward_sm90_config<64>{});
      },
      merged);
  static const char* const names[] = {" [sm90 backward",
                                      " [sm90 backward, unaligned dq (red.add dQ, 64-row steps)",
                                      " [sm90 backward, cp.async Q/dO (the configuration of groups wider than a step)",
                                      " [sm90 backward, KV heads interleaved in the launch order",
                                      " [sm90 backward, hs1's launch order (no walk in pieces)",
                                      " [sm90 backward, past blocks ordered by selection (workspace)"};
  std::string name = p.c.name + names[variant];
  if (merged) name += ", " + std::to_string(p.windows.size()) + " windows";
  if (split > 0) name += ", qsplit " + std::to_string(split);
  check_errors(name + "]", compare(g, ref), g.untouched_ok);
}

/// Backward of p through the portable kernel, whatever the public entry would pick.
void check_backward_portable(const problem& p, const cpu_result& ref) {
  const gpu_result g = run_backward(
      p, ref,
      [&](const gpu::attention_args& a, auto... rest) {
        if (p.c.d == 128)
          attn_test::launch_backward<gpu::backward_config<128>::type>(a, rest..., nullptr);
        else
          attn_test::launch_backward<gpu::backward_config<64>::type>(a, rest..., nullptr);
      },
      p.c.windows > 1);
  check_errors(p.c.name + (p.c.windows > 1 ? " [portable backward, windows]" : " [portable backward]"), compare(g, ref),
               g.untouched_ok);
}

}  // namespace

TEST_CASE("attention: backward query split (1..3 blocks per key block) matches") {
  std::printf("backward with forced query splits vs CPU reference\n");
  using oomb::kv_layout;
  const std::vector<config> cfgs = {
      make("qsplit g7 d128 p64", 200, 1300, 14, 2, 128, 64),
      sparse(make("qsplit sparse g5 d64 p16", 150, 900, 10, 2, 64, 16, kv_layout::token_major), 128),
  };
  for (const auto& c : cfgs) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    for (int order = 1; order <= 2; ++order)  // lockstep, staggered query walk
      for (int split = 1; split <= 3; ++split) {
        const gpu_result g = run_backward(p, ref, [&](const gpu::attention_args& a, auto... rest) {
          if (c.d == 128)
            attn_test::launch_backward<gpu::backward_config<128>::type>(a, rest..., nullptr, split, order);
          else
            attn_test::launch_backward<gpu::backward_config<64>::type>(a, rest..., nullptr, split, order);
        });
        check_errors(c.name + (order == 1 ? " lockstep" : " stagger") + " qsplit " + std::to_string(split),
                     compare(g, ref), g.untouched_ok);
      }
  }
}

TEST_CASE("attention: a sparse backward's workspace smaller than it needs is refused") {
  // backward_plan::workspace_ints: a count and an order slot per past 128-key block of the window,
  // one more, and per page a word of tile bits per 32 query tiles; a smaller workspace throws before
  // anything is enqueued, a call without workspace needs none.
  gpu::device_facts f;  // a Hopper device (the plan, not this machine's)
  f.sm_count = 132;
  for (int& n : f.blocks_per_sm) n = 1;
  gpu::call_shape s;
  s.hq = 2;
  s.hkv = 1;
  s.d = 128;
  s.page_size = 256;
  s.window_pages = 37;
  s.q_start = 37 * 256;  // the whole window is past
  s.sq = 2500;
  s.sparse = true;
  s.tile = 64;  // 40 tiles: two words per page
  const auto plan = gpu::plan_backward(s, f);
  REQUIRE(gpu::shape_of(plan.config).hopper);
  const std::int64_t need = plan.workspace_ints;
  CHECK(need == 2 * 37 * 2 + 1 + 37 * 2);
  std::int32_t ws[300] = {};
  CHECK_NOTHROW(gpu::detail::check_backward_workspace(plan, {ws, need}));
  CHECK_NOTHROW(gpu::detail::check_backward_workspace(plan, {nullptr, 0}));
  CHECK_THROWS_AS(gpu::detail::check_backward_workspace(plan, {ws, need - 1}), oomb::invalid_argument);
  s.tile = 0;  // a bad tile is refused, not divided by
  CHECK_THROWS_AS(gpu::plan_backward(s, f), oomb::invalid_argument);
  s.sparse = false;
  s.tile = 0;
  CHECK(gpu::plan_backward(s, f).workspace_ints == 0);
}

TEST_CASE("attention: sparse selecting every past page equals dense, bit for bit") {
  for (int d : {64, 128}) {
    config c = make("all", 300, 900, 14, 2, d, 64);
    c.sparse = true;
    c.keep = 1.0;
    problem p(c);
    // every tile selects every past page
    p.tile_pages.clear();
    p.tile_indptr.assign(1, 0);
    for (int t = 0; t < (c.sq + c.tile - 1) / c.tile; ++t) {
      for (int pg = 0; pg < c.q_start / c.page; ++pg) p.tile_pages.push_back(pg);
      p.tile_indptr.push_back(int(p.tile_pages.size()));
    }
    device_problem dp(p);
    const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq;
    dev<bf16> o1(qn), o2(qn);
    dev<float> l1(ln), l2(ln);
    auto a = dp.args();
    attn_test::forward(a, o1.p, l1.p, nullptr);
    a.tile_indptr = nullptr;
    a.tile_pages = nullptr;
    attn_test::forward(a, o2.p, l2.p, nullptr);
    sync();
    const auto x1 = o1.download(), x2 = o2.download();
    const auto y1 = l1.download(), y2 = l2.download();
    bool same = true;
    for (std::size_t i = 0; i < qn; ++i) same = same && x1[i] == x2[i];
    for (std::size_t i = 0; i < ln; ++i) same = same && std::memcmp(&y1[i], &y2[i], 4) == 0;
    CHECK(same);
  }
}

TEST_CASE("attention: launchers reject bad arguments with oomb exceptions") {
  config c = make("args", 64, 64, 4, 2, 128, 64);
  problem p(c);
  device_problem dp(p);
  dev<float> o(p.q.size()), lse(std::size_t(c.sq) * c.hq);
  auto bad = [&](auto mutate) {
    auto a = dp.args();
    mutate(a);
    CHECK_THROWS_AS(attn_test::forward(a, o.p, lse.p, nullptr), oomb::invalid_argument);
  };
  bad([](gpu::attention_args& a) { a.d = 96; });
  bad([](gpu::attention_args& a) { a.hkv = 3; });
  bad([](gpu::attention_args& a) { a.sq = 0; });
  bad([](gpu::attention_args& a) { a.kv.table.page_size = 32; });
  bad([](gpu::attention_args& a) { a.q = nullptr; });
  bad([](gpu::attention_args& a) { a.scale = -1.0f; });
  bad([&](gpu::attention_args& a) {  // sparse tile * group not a multiple of 128 rows
    a.tile_indptr = dp.tile_indptr.p;
    a.tile_pages = dp.tile_pages.p;
    a.tile = 16;
  });
  CHECK_THROWS_AS(attn_test::forward(dp.args(), o.p, static_cast<float*>(nullptr), nullptr), oomb::invalid_argument);
  CHECK_THROWS_AS(gpu::merge(0, 1, 1, o.p, lse.p, o.p, lse.p, nullptr), oomb::invalid_argument);
}

TEST_CASE("attention: sanitize (tiny shapes, for compute-sanitizer)") {
  using oomb::kv_layout;
  run_all({
      sparse(make("sanitize g2 d128 p16", 70, 100, 4, 2, 128, 16, kv_layout::token_major), 64, 2),
      windowed(make("sanitize g5 d64 p32", 40, 50, 5, 1, 64, 32), 2),
  });
}

namespace {

void large_vs_reference(config c) {
  problem p(c, false);
  device_problem dp(p);
  const auto a = dp.args();
  const std::int32_t len = dp.window_len();
  const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq, kn = std::size_t(c.sq) * c.hkv * c.d;
  const std::size_t gn = std::size_t(std::int64_t(p.n_grad) * p.shape.pair_elements());
  dev<float> ro(qn), rl(ln);
  attn_test::ref::forward(a, len, ro.p, rl.p);
  dev<bf16> o(qn);
  dev<float> l(ln);
  o.fill_bytes(0xff);
  l.fill_bytes(0xff);
  attn_test::forward(a, o.p, l.p, nullptr);
  sync();
  // Backward from the reference's fp32 o and lse.
  dev<float> rdq(std::vector<float>(qn, 0.0f)), rdk(std::vector<float>(kn, 0.0f)), rdv(std::vector<float>(kn, 0.0f)),
      rg(std::vector<float>(gn, 0.0f));
  attn_test::ref::backward(a, len, ro.p, rl.p, dp.d_o.p, rdq.p, rdk.p, rdv.p, dp.grads(rg.p));
  dev<float> delta(ln), dq(std::vector<float>(qn, 0.0f)), dk(std::vector<float>(kn, 0.0f)),
      dv(std::vector<float>(kn, 0.0f)), g(std::vector<float>(gn, 0.0f));
  gpu::backward_delta(c.sq, c.hq, c.d, ro.p, dp.d_o.p, delta.p, nullptr);
  attn_test::backward(a, rl.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(g.p), nullptr);
  sync();
  const errors e{rel_err(to_double(o.download()), to_double(ro.download())),
                 rel_err(l.download(), rl.download()),
                 rel_err(dq.download(), rdq.download()),
                 rel_err(dk.download(), rdk.download()),
                 rel_err(dv.download(), rdv.download()),
                 rel_err(g.download(), rg.download())};
  check_errors(c.name, e, true);
}

}  // namespace

TEST_CASE("attention: large shapes against the fp32 GPU reference") {
  std::printf("large shapes vs fp32 GPU reference (norm-wise relative error)\n");
  config c1 = make("large 28:4 d128 4096 x 16K past", 4096, 16384, 28, 4, 128, 128);
  config c2 = make("large 14:2 d64 4096 x 16K past", 4096, 16384, 14, 2, 64, 128);
  config c3 = sparse(make("large sparse 28:4 d128 2048 x 8K", 2048, 8192, 28, 4, 128, 128), 128);
  c3.keep = 0.25;
  // 40 query tiles: the Hopper backward's selection bits span two words
  config c4 = sparse(make("large sparse 14:2 d64 5000 x 4K", 5000, 4096, 14, 2, 64, 128), 128);
  c4.keep = 0.25;
  large_vs_reference(c1);
  large_vs_reference(c2);
  large_vs_reference(c3);
  large_vs_reference(c4);
}

// ---------------------------------------------------------------------------------------------
// Hopper forward (forward_sm90.cuh): the same CPU oracle, called through its own launcher so the
// kernel is proven whatever the public entry would pick; page_size >= 128 is its domain.

namespace {

/// Forward of p (one pass over all pages, or window w) through the Hopper kernel, outputs poisoned.
/// split: forced cluster split (0 = policy).
template <class O>
std::pair<std::vector<double>, std::vector<float>> forward_sm90(const problem& p, const device_problem& dp, int w = -1,
                                                                int split = 0) {
  const auto& c = p.c;
  dev<O> o(p.q.size());
  dev<float> lse(std::size_t(c.sq) * c.hq);
  o.fill_bytes(0xff);
  lse.fill_bytes(0xff);
  if (c.d == 128)
    attn_test::launch_forward_sm90<gpu::forward_sm90_config<128>::type>(dp.args(w), o.p, lse.p, nullptr, split);
  else
    attn_test::launch_forward_sm90<gpu::forward_sm90_config<64>::type>(dp.args(w), o.p, lse.p, nullptr, split);
  sync();
  return {to_double(o.download()), lse.download()};
}

void check_forward(const std::string& name, const std::vector<double>& o, const std::vector<float>& lse,
                   const cpu_result& ref) {
  const double eo = rel_err(o, ref.o), el = rel_err(lse, ref.lse);
  std::printf("  %-40s o %.2e  lse %.2e\n", name.c_str(), eo, el);
  std::fflush(stdout);
  INFO(name);
  CHECK(eo <= tolerance);
  CHECK(el <= tolerance);
}

}  // namespace

TEST_CASE("attention: Hopper forward (TMA + wgmma) matches the CPU reference") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper forward is not run");
    return;
  }
  REQUIRE(gpu::detail::sm90_forward_built<gpu::forward_sm90_config<128>::type, bf16>());
  std::printf("Hopper forward vs CPU reference (norm-wise relative error)\n");
  using oomb::kv_layout;
  const std::vector<config> cfgs = {
      make("sm90 g7 d128 p128 14:2", 200, 300, 14, 2, 128, 128),
      make("sm90 g7 d128 p128 28:4 tm", 130, 384, 28, 4, 128, 128, kv_layout::token_major),
      make("sm90 g5 d128 p256 40:8", 150, 77, 40, 8, 128, 256, kv_layout::token_major),
      make("sm90 g1 d128 p128", 190, 500, 3, 3, 128, 128),
      make("sm90 g2 d128 p128 tiny", 1, 5, 2, 1, 128, 128),
      make("sm90 g7 d64 p128 no past", 140, 0, 7, 1, 64, 128),
      make("sm90 g5 d64 p128", 300, 0, 5, 1, 64, 128),
      make("sm90 g1 d64 p256", 129, 600, 2, 2, 64, 256),
      make("sm90 g2 d64 p128 tm", 333, 250, 8, 4, 64, 128, kv_layout::token_major),
      make("sm90 g7 d64 p128 long past", 100, 1500, 7, 1, 64, 128),
      sparse(make("sm90 sparse g7 d128 p128", 300, 700, 14, 2, 128, 128), 128),
      sparse(make("sm90 sparse g5 d64 p128", 256, 1000, 10, 2, 64, 128), 128),
      sparse(make("sm90 sparse g7 d64 p128 28:4", 130, 640, 28, 4, 64, 128), 128),
      sparse(make("sm90 sparse g1 d128 p256 tm", 260, 900, 2, 2, 128, 256, kv_layout::token_major), 128),
      windowed(make("sm90 win g7 d128 p128", 200, 700, 14, 2, 128, 128), 3),
      sparse(make("sm90 win sparse g5 d64 p128", 256, 1000, 10, 2, 64, 128), 128, 3),
      // over 8 query tiles: the own blocks and the window's end blocks in pieces (hs2)
      sparse(make("sm90 sparse pieces g2 d128 p128", 1100, 1200, 4, 2, 128, 128), 64),
      sparse(make("sm90 sparse pieces g5 d64 p128", 1300, 2600, 10, 2, 64, 128), 128),
      // over 32 query tiles: the workspace's tile bits take two words per page (variant 5)
      sparse(make("sm90 sparse 35 tiles g2 d64 p128", 2200, 900, 4, 2, 64, 128), 64),
  };
  std::vector<std::unique_ptr<problem>> probs;
  for (const auto& c : cfgs) probs.push_back(std::make_unique<problem>(c));
  std::vector<std::future<cpu_result>> refs;
  for (const auto& p : probs) refs.push_back(std::async(std::launch::async, [&p] { return run_cpu(*p); }));
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const problem& p = *probs[i];
    const auto& c = p.c;
    const cpu_result ref = refs[i].get();
    for (int variant = 0; variant <= 5; ++variant) check_backward_sm90(p, ref, 0, variant);
    device_problem dp(p);
    if (c.windows == 1) {
      const auto b = forward_sm90<bf16>(p, dp);
      check_forward(c.name + " bf16 o", b.first, b.second, ref);
      const auto f = forward_sm90<float>(p, dp);
      check_forward(c.name + " fp32 o", f.first, f.second, ref);
    } else {  // windows folded by attention_merge equal one pass
      const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq;
      dev<float> o_acc(std::vector<float>(qn, 0.0f)), lse(std::vector<float>(ln, -INFINITY)), o_w(qn), l_w(ln);
      for (int w = 0; w < int(p.windows.size()); ++w) {
        const auto r = forward_sm90<float>(p, dp, w);
        o_w.upload(std::vector<float>(r.first.begin(), r.first.end()));
        l_w.upload(r.second);
        gpu::merge(c.sq, c.hq, c.d, o_acc.p, lse.p, o_w.p, l_w.p, nullptr);
      }
      sync();
      check_forward(c.name + " [" + std::to_string(p.windows.size()) + " windows]", to_double(o_acc.download()),
                    lse.download(), ref);
    }
  }
}

TEST_CASE("attention: Hopper forward split across a cluster (1..3 CTAs) matches") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper forward is not run");
    return;
  }
  std::printf("Hopper forward, forced cluster splits, vs CPU reference\n");
  using oomb::kv_layout;
  for (const config& c : {make("sm90 split g7 d128", 200, 1300, 14, 2, 128, 128),
                          sparse(make("sm90 split sparse g5 d64 tm", 150, 1900, 10, 2, 64, 128, kv_layout::token_major), 128),
                          make("sm90 split g2 d64 short", 70, 100, 4, 2, 64, 128)}) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    device_problem dp(p);
    for (int split = 1; split <= 3; ++split) {
      const auto r = forward_sm90<bf16>(p, dp, -1, split);
      check_forward(c.name + " split " + std::to_string(split), r.first, r.second, ref);
    }
  }
}

TEST_CASE("attention: Hopper forward and backward ignore non-finite data past the window's end") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper forward is not run");
    return;
  }
  for (int d : {64, 128}) {
    config c = make(d == 64 ? "sm90 NaN tail d64" : "sm90 NaN tail d128", 150, 270, 14, 2, d, 128);
    problem p(c);
    REQUIRE(p.last_len < c.page);
    const cpu_result ref = run_cpu(p);  // reads valid tokens only
    const std::int32_t last = p.seq_ids.back();
    const auto pool = oomb::page_pool_view<bf16>::over(p.pool.data(), p.shape);
    bf16 nan_bits;
    const std::uint16_t nan16 = 0x7fc0;
    std::memcpy(&nan_bits, &nan16, 2);
    for (int t = p.last_len; t < c.page; ++t)
      for (int h = 0; h < c.hkv; ++h)
        for (int k = 0; k < d; ++k) {
          pool.k(last, t, h)[k] = nan_bits;
          pool.v(last, t, h)[k] = nan_bits;
        }
    device_problem dp(p);
    const auto r = forward_sm90<bf16>(p, dp);
    check_forward(c.name, r.first, r.second, ref);
    // zero-filled keys: NaN in the tail must not reach dq, in any configuration or launch order
    for (int variant = 0; variant <= 5; ++variant) check_backward_sm90(p, ref, 0, variant);
  }
}

TEST_CASE("attention: Hopper sparse forward selecting every past page equals its dense forward, bit for bit") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper forward is not run");
    return;
  }
  for (int d : {64, 128}) {
    config c = make("sm90 all", 300, 900, 14, 2, d, 128);
    c.sparse = true;
    problem p(c);
    p.tile_pages.clear();
    p.tile_indptr.assign(1, 0);
    for (int t = 0; t < (c.sq + c.tile - 1) / c.tile; ++t) {
      for (int pg = 0; pg < c.q_start / c.page; ++pg) p.tile_pages.push_back(pg);
      p.tile_indptr.push_back(int(p.tile_pages.size()));
    }
    device_problem dp(p);
    const auto s = forward_sm90<bf16>(p, dp);
    p.c.sparse = false;
    const auto dns = forward_sm90<bf16>(p, dp);  // dp.args() reads h.c.sparse: now dense
    bool same = s.first == dns.first;
    for (std::size_t i = 0; i < s.second.size(); ++i) same = same && std::memcmp(&s.second[i], &dns.second[i], 4) == 0;
    CHECK(same);
  }
}

TEST_CASE("attention: the device facts and the plans the public entries take on this device") {
  config c = make("pick", 100, 300, 14, 2, 128, 128);
  problem p(c);
  device_problem dp(p);
  const auto a = dp.args();
  const gpu::device_facts& f = attn_test::facts();
  int sms = 0;
  attn_test::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sms");
  CHECK(f.sm_count == sms);
  using K = gpu::kernel_config;
  for (int i = 0; i < gpu::kernel_config_count; ++i) {
    const auto k = static_cast<K>(i);
    INFO("configuration ", i);
    if (!gpu::shape_of(k).hopper) CHECK(f.runs(k));  // the portable kernels run everywhere
    if (gpu::shape_of(k).hopper) CHECK(f.runs(k) == hopper_device());  // one CTA per SM (sm_90a builds)
    if (gpu::shape_of(k).hopper && f.runs(k)) CHECK(f.blocks_per_sm[i] == 1);
  }
  CHECK(&gpu::current_device_facts() == &f);  // cached
  const auto shape = gpu::call_shape::of(a);
  CHECK(gpu::plan_forward(shape, f).config == (hopper_device() ? K::forward_hopper_d128 : K::forward_portable_d128));
  CHECK(gpu::plan_forward(shape, f, {gpu::kernel_choice::portable}).config == K::forward_portable_d128);
  CHECK(gpu::plan_backward(shape, f).config == (hopper_device() ? K::backward_hopper_d128 : K::backward_portable_d128));
  auto small = a;
  small.kv.pool.page_size = 64;
  small.kv.table.page_size = 64;
  CHECK(gpu::plan_forward(gpu::call_shape::of(small), f).config == K::forward_portable_d128);
  // a launch refuses a plan made for another call, and the Hopper launchers pages shorter than their tile
  dev<bf16> o(p.q.size());
  dev<float> lse(std::size_t(c.sq) * c.hq);
  const auto plan = gpu::plan_forward(shape, f);
  auto other = a;
  other.q_start += 128;
  CHECK_THROWS_AS(gpu::forward(plan, other, o.p, lse.p, nullptr), oomb::invalid_argument);
  using H = gpu::forward_sm90_config<128>::type;
  CHECK_THROWS_AS(attn_test::launch_forward_sm90<H>(small, o.p, lse.p, nullptr), oomb::invalid_argument);
  dev<float> buf(std::size_t(c.sq) * c.hq * c.d);
  auto gs = dp.grads(buf.p);  // only checked, never written: the launcher throws first
  gs.pool.page_size = 64;
  using HB = gpu::backward_sm90_config<128>::type;
  CHECK_THROWS_AS(attn_test::launch_backward_sm90<HB>(small, buf.p, buf.p, dp.d_o.p, buf.p, buf.p, buf.p, gs, nullptr),
                  oomb::invalid_argument);
}

TEST_CASE("attention: sanitize Hopper forward (tiny shapes, for compute-sanitizer)") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper forward is not run");
    return;
  }
  using oomb::kv_layout;
  for (const config& c : {make("sanitize sm90 g7 d128", 40, 300, 14, 2, 128, 128),
                          sparse(make("sanitize sm90 sparse g5 d64 tm", 70, 500, 10, 2, 64, 128, kv_layout::token_major), 128)}) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    device_problem dp(p);
    const auto r = forward_sm90<bf16>(p, dp);
    check_forward(c.name, r.first, r.second, ref);
    const auto r2 = forward_sm90<bf16>(p, dp, -1, 2);
    check_forward(c.name + " split 2", r2.first, r2.second, ref);
  }
}

TEST_CASE("attention: the dense Hopper backward (TMA Q/dO) refuses a GQA group wider than its step, before any launch") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper backward is not run");
    return;
  }
  // hb6's steps hold whole queries: group 96 > 80 rows (d128) and > 128 rows (d64, group 160)
  for (const config& c : {make("tma wide group d128", 2, 0, 96, 1, 128, 128), make("tma wide group d64", 2, 0, 160, 1, 64, 128)}) {
    const problem p(c);
    device_problem dp(p);
    dev<float> buf(std::size_t(c.sq) * c.hq * c.d);
    auto launch = [&](auto cfg) {
      attn_test::launch_backward_sm90<decltype(cfg)>(dp.args(), buf.p, buf.p, dp.d_o.p, buf.p, buf.p, buf.p,
                                                       dp.grads(buf.p), nullptr);
    };
    if (c.d == 128)
      CHECK_THROWS_AS(launch(gpu::backward_sm90_config<128>::type{}), oomb::invalid_argument);
    else
      CHECK_THROWS_AS(launch(gpu::backward_sm90_config<64>::type{}), oomb::invalid_argument);
  }
}

TEST_CASE("attention: Hopper backward with forced query splits (1..3 blocks per key block) matches") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper backward is not run");
    return;
  }
  REQUIRE(gpu::detail::sm90_backward_built<gpu::backward_sm90_config<128>::type>());
  std::printf("Hopper backward, forced query splits, vs CPU reference\n");
  using oomb::kv_layout;
  for (const config& c : {make("sm90 qsplit g7 d128", 200, 1300, 14, 2, 128, 128),
                          sparse(make("sm90 qsplit sparse g5 d64 tm", 150, 900, 10, 2, 64, 128, kv_layout::token_major), 128),
                          sparse(make("sm90 qsplit sparse g7 d128", 400, 1000, 14, 2, 128, 128), 128),
                          sparse(make("sm90 qsplit sparse pieces g2 d64", 1200, 700, 4, 2, 64, 128), 64),
                          make("sm90 qsplit g2 d64 short", 70, 100, 4, 2, 64, 128)}) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    for (int split = 1; split <= 3; ++split)
      for (int variant = 0; variant <= 5; ++variant) check_backward_sm90(p, ref, split, variant);
  }
}

TEST_CASE("attention: public backward, dense and sparse, into 16- and 8-byte aligned dq, dK and dV, matches") {
  // On Hopper the public entry takes a configuration per call (choose_backward_sm90): dense and
  // sparse calls Q/dO by TMA in whole-query steps, or cp.async where the group is wider than a step
  // (g96 d128, g160 d64); red.add for a dq that is 8 but not 16 mod 16 (the writer
  // warp's bulk reductions need 16), with dK/dV 8 mod 16 as well (the API's 8-byte promise);
  // elsewhere the portable kernel. All must give the CPU oracle's gradients (a configuration that
  // refused its call would throw here).
  using oomb::kv_layout;
  for (const config& c : {make("public g7 d128", 90, 300, 14, 2, 128, 128), make("public g7 d64", 90, 300, 14, 2, 64, 128),
                          make("public wide group g96 d128", 9, 200, 96, 1, 128, 128),
                          make("public wide group g160 d64", 7, 200, 160, 1, 64, 128, kv_layout::token_major),
                          sparse(make("public sparse g7 d128", 200, 700, 14, 2, 128, 128), 128),
                          sparse(make("public sparse g5 d64 tm", 70, 500, 10, 2, 64, 128, kv_layout::token_major), 128)}) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    const std::size_t qn = p.q.size();
    for (const bool aligned : {true, false}) {
      const gpu_result g = run_backward(p, ref, [&](const gpu::attention_args& a, const float* lse, const float* delta,
                                                    const bf16* d_o, float* dq, float* dk, float* dv, auto grads) {
        if (aligned) {
          attn_test::backward(a, lse, delta, d_o, dq, dk, dv, grads, nullptr);
          return;
        }
        const std::size_t kn = std::size_t(c.sq) * c.hkv * c.d;
        dev<float> shifted(qn + 2), shifted_k(kn + 2), shifted_v(kn + 2);
        float* const dq8 = shifted.p + 2;  // cudaMalloc is 256-byte aligned: these are 8 mod 16
        float* const dk8 = shifted_k.p + 2;
        float* const dv8 = shifted_v.p + 2;
        REQUIRE((reinterpret_cast<std::uintptr_t>(dq8) & 15u) == 8u);
        auto copy = [](float* to, const float* from, std::size_t n) {
          attn_test::cuda_check(cudaMemcpy(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice), "copy");
        };
        copy(dq8, dq, qn);
        copy(dk8, dk, kn);
        copy(dv8, dv, kn);
        attn_test::backward(a, lse, delta, d_o, dq8, dk8, dv8, grads, nullptr);
        copy(dq, dq8, qn);
        copy(dk, dk8, kn);
        copy(dv, dv8, kn);
      });
      check_errors(c.name + (aligned ? " [public backward]" : " [public backward, dq, dK, dV 8 mod 16]"), compare(g, ref),
                   g.untouched_ok);
    }
  }
}

TEST_CASE("attention: sanitize Hopper backward (tiny shapes, for compute-sanitizer)") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the Hopper backward is not run");
    return;
  }
  using oomb::kv_layout;
  for (const config& c : {make("sanitize sm90 bwd g7 d128", 40, 300, 14, 2, 128, 128),
                          make("sanitize sm90 bwd g7 d64", 40, 300, 14, 2, 64, 128),
                          sparse(make("sanitize sm90 bwd sparse g5 d64 tm", 70, 500, 10, 2, 64, 128, kv_layout::token_major), 128),
                          sparse(make("sanitize sm90 bwd sparse g7 d128", 200, 300, 14, 2, 128, 128), 128),
                          // 9 query tiles: own and end blocks in two pieces each (hs2)
                          sparse(make("sanitize sm90 bwd sparse pieces g2 d128", 560, 300, 4, 2, 128, 128), 64)}) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    for (int split : {0, 2})
      for (int variant = 0; variant <= 5; ++variant) check_backward_sm90(p, ref, split, variant);
  }
}

namespace {

/// Runs the kernels of one problem over a K/V pool whose page -1 is a NaN guard page (a kernel
/// reading an id -1 poisons its outputs) and a gradient pool whose page -1 is a guard page that must
/// stay bitwise (writing to a gradient id -1 is caught): forwards merged over the windows, backwards
/// summed over them (outputs starting random), each checked against the CPU reference, and the
/// gradient pages the reference leaves untouched checked bitwise.
struct guarded_runs {
  const problem& p;
  const cpu_result& ref;
  std::string name;
  std::int64_t pair;
  device_problem dp;
  dev<bf16> pool;  // the guard page, then the problem's pool
  dev<bf16> o_in;
  dev<float> lse_in, delta;
  bool merged;

  guarded_runs(const problem& pr, const cpu_result& r, std::string n)
      : p(pr), ref(r), name(std::move(n)), pair(pr.shape.pair_elements()), dp(pr), pool(guarded(pr)),
        o_in(rounded(r.o_in)), lse_in(std::vector<float>(r.lse_in.begin(), r.lse_in.end())),
        delta(std::size_t(pr.c.sq) * pr.c.hq), merged(pr.windows.size() > 1) {
    gpu::backward_delta(p.c.sq, p.c.hq, p.c.d, o_in.p, dp.d_o.p, delta.p, nullptr);
  }
  static std::vector<bf16> guarded(const problem& pr) {
    bf16 nan_bits;
    const std::uint16_t nan16 = 0x7fc0;
    std::memcpy(&nan_bits, &nan16, 2);
    std::vector<bf16> v(static_cast<std::size_t>(pr.shape.pair_elements()), nan_bits);
    v.insert(v.end(), pr.pool.begin(), pr.pool.end());
    return v;
  }
  static std::vector<bf16> rounded(const std::vector<double>& o) {
    std::vector<bf16> v(o.size());
    for (std::size_t i = 0; i < o.size(); ++i) v[i] = bf16(float(o[i]));
    return v;
  }
  /// The args of window w (-1: all pages) over the guarded pool.
  gpu::attention_args args(int w) const {
    auto a = dp.args(w);
    a.kv.pool = oomb::page_pool_view<const bf16>::over(pool.p + pair, p.shape);
    return a;
  }
  int w_begin() const { return merged ? 0 : -1; }
  int w_end() const { return merged ? int(p.windows.size()) : 0; }

  /// fwd(args, o, lse) per window into fp32 outputs, merged.
  template <class F>
  void forward(const std::string& kernel, F&& fwd) const {
    const std::size_t qn = p.q.size(), ln = std::size_t(p.c.sq) * p.c.hq;
    dev<float> o_acc(std::vector<float>(qn, 0.0f)), lse_acc(std::vector<float>(ln, -INFINITY)), o_w(qn), lse_w(ln);
    for (int w = w_begin(); w < w_end(); ++w) {
      o_w.fill_bytes(0xff);
      lse_w.fill_bytes(0xff);
      fwd(args(w), o_w.p, lse_w.p);
      gpu::merge(p.c.sq, p.c.hq, p.c.d, o_acc.p, lse_acc.p, o_w.p, lse_w.p, nullptr);
    }
    sync();
    check_forward(name + ", " + kernel + " forward]", to_double(o_acc.download()), lse_acc.download(), ref);
  }

  /// bwd(args, lse, delta, d_o, dq, dk, dv, grads) per window, summed.
  template <class B>
  void backward(const std::string& kernel, B&& bwd) const {
    const auto& c = p.c;
    const std::size_t qn = p.q.size(), kn = std::size_t(c.sq) * c.hkv * c.d;
    const std::size_t gn = std::size_t(std::int64_t(p.n_grad) * pair);
    const auto dq0 = random_floats(qn, c.seed + 41), dk0 = random_floats(kn, c.seed + 42),
               dv0 = random_floats(kn, c.seed + 43), g0 = random_floats(gn + std::size_t(pair), c.seed + 44);
    dev<float> dq(dq0), dk(dk0), dv(dv0), gp(g0);  // gp: the guard page, then the gradient pool
    for (int w = w_begin(); w < w_end(); ++w)
      bwd(args(w), lse_in.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p + pair, w));
    sync();
    gpu_result r;
    r.o = ref.o;
    r.lse.assign(ref.lse.begin(), ref.lse.end());
    r.dq = minus(dq.download(), dq0);
    r.dk_own = minus(dk.download(), dk0);
    r.dv_own = minus(dv.download(), dv0);
    const auto g1 = gp.download();
    const bool guard_ok = std::memcmp(g1.data(), g0.data(), std::size_t(pair) * sizeof(float)) == 0;
    const std::vector<float> g1p(g1.begin() + pair, g1.end()), g0p(g0.begin() + pair, g0.end());
    r.dgrad = minus(g1p, g0p);
    for (std::size_t i = 0; i < gn; ++i)
      if (ref.dgrad[i] == 0.0 && std::memcmp(&g1p[i], &g0p[i], sizeof(float)) != 0) r.untouched_ok = false;
    check_errors(name + ", " + kernel + " backward]", compare(r, ref), r.untouched_ok);
    CHECK_MESSAGE(guard_ok, name << ", " << kernel << ": a gradient page id -1 was written");
  }
};

/// Backward through the public entry with a sparse workspace (none needed: one int).
template <class... Rest>
void public_backward(const gpu::attention_args& a, Rest... rest) {
  dev<std::int32_t> ws(static_cast<std::size_t>(std::max<std::int64_t>(1, attn_test::workspace_ints(a))));
  attn_test::backward(a, rest..., nullptr, {ws.p, static_cast<std::int64_t>(ws.n)});
  sync();
}

/// The trainer's sparse window tables (algo/paged_attention.hpp, plan_windows): a past page that no
/// query tile selected lies inside a window's range with id -1 and grad id -1, and its K/V are not
/// in memory. Here every byte the kernels must not read is NaN: the unselected pages' old memory,
/// the spare ids and the guard page id -1 points at (guarded_runs); a gradient written through an
/// entry -1 lands in the gradient guard page, which must stay bitwise (as must every unselected
/// page's own gradient page).
void check_unselected_pages_unread(const config& c, double keep) {
  problem p(c);
  // A fresh selection that leaves every third past page unselected by all tiles (the generator's
  // tile 1 takes all), so 128-key blocks of 16-token pages mix selected and unselected pages.
  const std::int32_t past = static_cast<std::int32_t>(c.q_start / c.page);
  const std::int32_t ntiles = (c.sq + c.tile - 1) / c.tile;
  std::mt19937_64 rng(c.seed + 5);
  std::bernoulli_distribution on(keep);
  std::vector<char> needed(static_cast<std::size_t>(p.npages), 0);
  for (std::int32_t pg = past; pg < p.npages; ++pg) needed[static_cast<std::size_t>(pg)] = 1;  // own
  p.tile_indptr.assign(1, 0);
  p.tile_pages.clear();
  for (std::int32_t t = 0; t < ntiles; ++t) {
    for (std::int32_t pg = 0; pg < past; ++pg)
      if (t > 0 && pg % 3 != 1 && on(rng)) {  // tile 0 selects nothing
        p.tile_pages.push_back(pg);
        needed[static_cast<std::size_t>(pg)] = 1;
      }
    p.tile_indptr.push_back(static_cast<std::int32_t>(p.tile_pages.size()));
  }
  if (p.tile_pages.empty()) p.tile_pages.push_back(0);
  const auto unselected = std::count(needed.begin(), needed.end(), 0);
  REQUIRE(unselected < past);
  const cpu_result ref = run_cpu(p);  // the ids still valid: unselected pages contribute nothing

  // The unselected pages as the trainer lists them: id -1, and their memory NaN.
  bf16 nan_bits;
  const std::uint16_t nan16 = 0x7fc0;
  std::memcpy(&nan_bits, &nan16, 2);
  std::vector<char> live(static_cast<std::size_t>(p.n_ids), 0);
  for (std::int32_t pg = 0; pg < p.npages; ++pg) {
    const std::int32_t id = p.seq_ids[static_cast<std::size_t>(pg)];
    if (needed[static_cast<std::size_t>(pg)])
      live[static_cast<std::size_t>(id)] = 1;
    else
      p.seq_ids[static_cast<std::size_t>(pg)] = -1;
  }
  const std::int64_t pair = p.shape.pair_elements();
  for (std::int32_t id = 0; id < p.n_ids; ++id)
    if (!live[static_cast<std::size_t>(id)]) std::fill_n(p.pool.begin() + id * pair, pair, nan_bits);
  const guarded_runs run(p, ref,
                         c.name + " [" + std::to_string(unselected) + " of " + std::to_string(past) +
                             " past pages unselected, " + std::to_string(p.windows.size()) + " windows");

  run.forward("public", [&](const gpu::attention_args& a, float* o, float* l) { attn_test::forward(a, o, l, nullptr); });
  run.backward("portable", [&](const gpu::attention_args& a, auto... rest) {
    if (c.d == 128)
      attn_test::launch_backward<gpu::backward_config<128>::type>(a, rest..., nullptr);
    else
      attn_test::launch_backward<gpu::backward_config<64>::type>(a, rest..., nullptr);
  });
  if (hopper_device() && c.page >= 128) {
    run.backward("sm90", [&](const gpu::attention_args& a, auto... rest) {
      if (c.d == 128)
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<128>::type>(a, rest..., nullptr, 0);
      else
        attn_test::launch_backward_sm90<gpu::backward_sm90_config<64>::type>(a, rest..., nullptr, 0);
    });
    // the trainer's call: the public entry with a workspace, past blocks by selection count (hs2)
    run.backward("public with workspace", [&](const gpu::attention_args& a, auto... rest) { public_backward(a, rest...); });
  }
}

}  // namespace

TEST_CASE("attention: sparse windows as the trainer builds them (unselected pages id -1, NaN memory) match") {
  std::printf("sparse, unselected in-range pages id -1 and NaN-poisoned, vs CPU reference\n");
  // page 16: the portable backward (8 pages per 128-key block, selected and unselected mixed);
  // page 128: the Hopper backward (on sm90) and the portable one. Group 2 with tile 64, group 1 with 128.
  for (int d : {64, 128}) {
    const std::string dn = d == 64 ? " d64" : " d128";
    check_unselected_pages_unread(windowed(sparse(make(("p16 g2" + dn).c_str(), 200, 16 * 37 + 5, 4, 2, d, 16), 64), 3), 0.4);
    check_unselected_pages_unread(sparse(make(("p16 g1 one window" + dn).c_str(), 256, 16 * 40, 2, 2, d, 16), 128), 0.5);
    check_unselected_pages_unread(windowed(sparse(make(("p128 g2" + dn).c_str(), 300, 128 * 9 + 40, 4, 2, d, 128), 64), 2), 0.5);
  }
}

namespace {

/// Packed documents (attention_args::key_lower) through every kernel the public entry can choose,
/// forward and backward, against the CPU reference with a block-diagonal causal mask. holes: the
/// pages wholly below the first query's bound are listed as -1 (the kernels may not read them) and
/// the pool and gradient pool each start with a guard page that such a read or write would hit:
/// NaN for K/V, random values that must stay bitwise for the gradients.
std::unique_ptr<problem> documents_problem(const config& c, bool holes) {
  auto p = std::make_unique<problem>(c);
  REQUIRE(p->key_lower.size() == std::size_t(c.sq));
  if (holes)
    for (std::int32_t pg = 0; pg < p->npages; ++pg)
      if (std::int64_t(pg + 1) * c.page <= p->key_lower[0]) p->seq_ids[static_cast<std::size_t>(pg)] = -1;
  return p;
}

void check_documents(const problem& p, const cpu_result& ref) {
  const config& c = p.c;
  const auto dropped = std::count(p.seq_ids.begin(), p.seq_ids.end(), -1);
  std::string name = c.name + " [" + std::to_string(c.doc_starts.size() + 1) + " documents";
  if (dropped > 0) name += ", " + std::to_string(dropped) + " pages below every bound id -1";
  if (p.windows.size() > 1) name += ", " + std::to_string(p.windows.size()) + " windows";
  const guarded_runs run(p, ref, name);

  run.forward("public", [&](const gpu::attention_args& a, float* o, float* l) { attn_test::forward(a, o, l, nullptr); });
  for (int split = 1; split <= 4; ++split)
    run.forward("portable split " + std::to_string(split), [&](const gpu::attention_args& a, float* o, float* l) {
      if (c.d == 128)
        attn_test::launch_forward<gpu::forward_config<128>::type>(a, o, l, nullptr, split);
      else
        attn_test::launch_forward<gpu::forward_config<64>::type>(a, o, l, nullptr, split);
    });
  const bool sm90 = hopper_device() && c.page >= 128;
  if (sm90)
    for (int split = 1; split <= 3; ++split)
      run.forward("sm90 split " + std::to_string(split), [&](const gpu::attention_args& a, float* o, float* l) {
        if (c.d == 128)
          attn_test::launch_forward_sm90<gpu::forward_sm90_config<128>::type>(a, o, l, nullptr, split);
        else
          attn_test::launch_forward_sm90<gpu::forward_sm90_config<64>::type>(a, o, l, nullptr, split);
      });

  run.backward("public", [&](const gpu::attention_args& a, auto... rest) { public_backward(a, rest...); });
  for (int split = 1; split <= 2; ++split)
    run.backward("portable qsplit " + std::to_string(split) + (split == 2 ? " stagger" : ""),
                 [&](const gpu::attention_args& a, auto... rest) {
                   if (c.d == 128)
                     attn_test::launch_backward<gpu::backward_config<128>::type>(a, rest..., nullptr, split, split);
                   else
                     attn_test::launch_backward<gpu::backward_config<64>::type>(a, rest..., nullptr, split, split);
                 });
  if (!sm90) return;
  auto sm90_backward = [&](const std::string& what, auto cfg, int split, int order, bool workspace) {
    using Cfg = decltype(cfg);
    run.backward(what, [&](const gpu::attention_args& a, auto... rest) {
      if (!workspace) {
        attn_test::launch_backward_sm90<Cfg>(a, rest..., nullptr, split, order);
        return;
      }
      dev<std::int32_t> ws(static_cast<std::size_t>(attn_test::workspace_ints(a)));
      ws.fill_bytes(0xff);
      attn_test::launch_backward_sm90<Cfg>(a, rest..., nullptr, split, order, {ws.p, static_cast<std::int64_t>(ws.n)});
      sync();
    });
  };
  auto sm90_all = [&](auto configs) {
    using C = decltype(configs);
    sm90_backward("sm90", typename C::type{}, 0, 0, false);
    sm90_backward("sm90 qsplit 2", typename C::type{}, 2, 0, false);
    sm90_backward("sm90 qsplit 4", typename C::type{}, 4, 0, false);  // the plan's split for bounded dense calls
    sm90_backward("sm90 unaligned-dq configuration", typename C::unaligned{}, 0, 0, false);
    sm90_backward("sm90 wide-group configuration", typename C::wide_group{}, 0, 0, false);
    if (c.sparse) {
      sm90_backward("sm90 heads interleaved", typename C::type{}, 0, 2, false);
      sm90_backward("sm90 hs1 order", typename C::type{}, 0, 3, false);
      sm90_backward("sm90 workspace order", typename C::type{}, 0, 0, true);
    }
  };
  if (c.d == 128)
    sm90_all(gpu::backward_sm90_config<128>{});
  else
    sm90_all(gpu::backward_sm90_config<64>{});
  // dQ in key block order: dense, each step's run of blocks from its first bound's block; sparse, the
  // tile's virtual sequence in window order, each tile in steps of its own (sparse_dq_order)
  run.backward("sm90 deterministic", [&](const gpu::attention_args& a, auto... rest) {
    attn_test::deterministic_backward(a, rest..., nullptr);
  });
}

config documents(config c, std::vector<std::int64_t> starts) {
  c.documents = true;
  c.doc_starts = std::move(starts);
  return c;
}

}  // namespace

TEST_CASE("attention: packed documents (per-document bounds) in every kernel, dense and sparse, match") {
  std::printf("per-document bounds vs CPU reference (block-diagonal causal)\n");
  using oomb::kv_layout;
  // Documents start mid-page in the past, at and mid-chunk, mid-tile and on tile boundaries.
  const std::vector<std::pair<config, bool>> cases = {
      {documents(make("docs g7 d128 p128", 300, 700, 14, 2, 128, 128), {389, 700, 750, 901, 950}), false},
      {documents(make("docs g1 d64 p128 tm", 260, 600, 2, 2, 64, 128, kv_layout::token_major), {128, 640, 768, 801}), false},
      {documents(make("docs g7 28:4 d128 p256 tm", 130, 640, 28, 4, 128, 256, kv_layout::token_major), {641, 700}), false},
      {documents(make("docs g1 d128 p16", 190, 500, 3, 3, 128, 16), {37, 250, 501, 600}), false},
      {documents(windowed(make("docs g2 d64 p32 3 windows", 200, 333, 4, 2, 64, 32), 3), {100, 333, 420}), false},
      {documents(windowed(make("docs g5 d128 p128 3 windows", 256, 1000, 10, 2, 128, 128), 3), {130, 700, 1003, 1129}), false},
      {documents(sparse(make("docs sparse g5 d64 p128", 256, 1000, 10, 2, 64, 128), 128), {130, 700, 1003, 1129, 1200}), false},
      {documents(sparse(make("docs sparse g2 d128 p128 tile 64", 300, 900, 4, 2, 128, 128), 64), {200, 901, 1000, 1100}), false},
      {documents(sparse(make("docs sparse g7 d128 p16", 150, 600, 14, 2, 128, 16), 128, 3), {90, 333, 640}), false},
      // over 8 query tiles: the sparse Hopper backward's own and end blocks in pieces
      {documents(sparse(make("docs sparse pieces g2 d128 p128", 1100, 1200, 4, 2, 128, 128), 64), {500, 1300, 1800, 2000}), false},
      // pages below every bound listed as -1
      {documents(make("docs holes g7 d64 p128", 260, 900, 14, 2, 64, 128), {600, 1000, 1030}), true},
      {documents(make("docs holes g2 d128 p16", 200, 597, 4, 2, 128, 16), {300, 610, 700}), true},
      {documents(sparse(make("docs holes sparse g7 d128 p128", 300, 1200, 14, 2, 128, 128), 128), {700, 1250, 1400}), true},
      {documents(sparse(make("docs holes sparse g2 d64 p16", 200, 597, 4, 2, 64, 16), 64, 2), {300, 610, 700}), true},
  };
  std::vector<std::unique_ptr<problem>> probs;
  for (const auto& [c, holes] : cases) {
    probs.push_back(documents_problem(c, holes));
    REQUIRE(holes == (std::count(probs.back()->seq_ids.begin(), probs.back()->seq_ids.end(), -1) > 0));
  }
  std::vector<std::future<cpu_result>> refs;
  for (const auto& p : probs) refs.push_back(std::async(std::launch::async, [&p] { return run_cpu(*p); }));
  for (std::size_t i = 0; i < probs.size(); ++i) check_documents(*probs[i], refs[i].get());
}

TEST_CASE("attention: one document (every bound 0) is the forward without bounds, bit for bit") {
  for (int d : {64, 128}) {
    config c = documents(make(d == 64 ? "one doc d64" : "one doc d128", 300, 700, 14, 2, d, 128), {});
    problem p(c);
    device_problem dp(p);
    const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq;
    auto run = [&](bool bounded, bool portable) {
      auto a = dp.args();
      if (!bounded) a.key_lower = nullptr;
      dev<float> o(qn), lse(ln);
      attn_test::forward(a, o.p, lse.p, nullptr, portable ? gpu::kernel_choice::portable : gpu::kernel_choice::automatic);
      sync();
      auto r = o.download();
      const auto l = lse.download();
      r.insert(r.end(), l.begin(), l.end());
      return r;
    };
    for (bool portable : {true, false}) {
      const auto with = run(true, portable), without = run(false, portable);
      INFO(c.name << (portable ? " portable" : " automatic"));
      CHECK(std::memcmp(with.data(), without.data(), with.size() * sizeof(float)) == 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The deterministic backward (plan_options::deterministic): dQ added step by step in key block
// order, no query split. It must match the CPU oracle like every kernel, and give the same bits on
// every run, where the default adds dQ in arrival order.

namespace {

/// What one backward pass over every window of p adds to dq, dK, dV and the gradient pages (fp32
/// bits), from fixed random starting values.
std::vector<float> added_bits(const problem& p, const device_problem& dp, const dev<bf16>& o, const dev<float>& lse,
                              bool deterministic) {
  const auto& c = p.c;
  const std::size_t qn = p.q.size(), ln = std::size_t(c.sq) * c.hq, kn = std::size_t(c.sq) * c.hkv * c.d;
  const std::size_t gn = std::size_t(std::int64_t(p.n_grad) * p.shape.pair_elements());
  dev<float> delta(ln);
  gpu::backward_delta(c.sq, c.hq, c.d, o.p, dp.d_o.p, delta.p, nullptr);
  dev<float> dq(random_floats(qn, c.seed + 51)), dk(random_floats(kn, c.seed + 52)), dv(random_floats(kn, c.seed + 53)),
      gp(random_floats(gn, c.seed + 54));
  const bool merged = p.windows.size() > 1;
  for (int w = merged ? 0 : -1; w < (merged ? int(p.windows.size()) : 0); ++w) {
    if (deterministic)
      attn_test::deterministic_backward(dp.args(w), lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p, w), nullptr);
    else
      attn_test::backward(dp.args(w), lse.p, delta.p, dp.d_o.p, dq.p, dk.p, dv.p, dp.grads(gp.p, w), nullptr);
  }
  sync();
  std::vector<float> all = dq.download();
  for (const auto& v : {dk.download(), dv.download(), gp.download()}) all.insert(all.end(), v.begin(), v.end());
  return all;
}

std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

}  // namespace

TEST_CASE("attention: the deterministic Hopper backward matches the CPU reference and repeats bit for bit, dense and sparse") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the deterministic backward is not run");
    return;
  }
  std::printf("deterministic Hopper backward vs CPU reference, then repeated\n");
  using oomb::kv_layout;
  // Groups 1-7, both head sizes, partial steps, pages and tiles, several windows, documents.
  const std::vector<config> cases = {
      make("det g7 d128", 300, 1300, 14, 2, 128, 128),
      make("det g1 d64 tm", 333, 1000, 2, 2, 64, 128, kv_layout::token_major),
      make("det g5 d64", 200, 700, 10, 2, 64, 256),
      make("det g2 d128 short", 70, 100, 4, 2, 128, 128),
      windowed(make("det g4 d128 3 windows", 256, 1500, 8, 2, 128, 128), 3),
      documents(make("det docs g7 d128", 300, 700, 14, 2, 128, 128), {389, 700, 750, 901, 950}),
      documents(windowed(make("det docs g3 d64 2 windows", 290, 1000, 6, 2, 64, 128), 2), {130, 700, 1003, 1129}),
      // page-sparse: whole-query steps that do not divide a tile (126 of 896 rows at group 7), two
      // blocks per page, several windows, documents whose first bound lies mid-page
      sparse(make("det sparse g7 d128", 300, 1300, 14, 2, 128, 128), 128),
      sparse(make("det sparse g2 d64 p256 tile 64", 333, 1500, 4, 2, 64, 256), 64),
      sparse(make("det sparse g1 d128 3 windows", 260, 1700, 2, 2, 128, 128), 128, 3),
      documents(sparse(make("det sparse docs g5 d64", 256, 1000, 10, 2, 64, 128), 128), {130, 700, 1003, 1129, 1200}),
      documents(sparse(make("det sparse docs g7 d128 p256 2 windows", 300, 1200, 14, 2, 128, 256), 128, 2),
                {200, 700, 1250, 1400}),
  };
  for (const config& c : cases) {
    const problem p(c);
    const cpu_result ref = run_cpu(p);
    const bool merged = p.windows.size() > 1;
    for (const int order : {0, 2}) {  // KV heads one after another, or in turn
      auto det = [order](const gpu::attention_args& a, auto... rest) {
        attn_test::deterministic_backward(a, rest..., nullptr, order);
      };
      const gpu_result g1 = run_backward(p, ref, det, merged), g2 = run_backward(p, ref, det, merged);
      check_errors(c.name + (order == 2 ? " [deterministic, heads in turn]" : " [deterministic]"), compare(g1, ref),
                   g1.untouched_ok);
      INFO(c.name << " order " << order);
      CHECK(g1.dq == g2.dq);
      CHECK(g1.dk_own == g2.dk_own);
      CHECK(g1.dv_own == g2.dv_own);
      CHECK(g1.dgrad == g2.dgrad);
    }
  }
  // Chunk-sized calls, where hundreds of blocks add into each step: the same bits three times, and
  // the default's sums (checked against the oracle by the other cases) to fp32 rounding. Left out
  // under OOMB_GPU_TEST_QUICK (compute-sanitizer runs), where they would take many minutes.
  if (std::getenv("OOMB_GPU_TEST_QUICK") != nullptr) return;
  config large_sparse = sparse(make("det large sparse 28:4 d128 4096 x 32K", 4096, 32768, 28, 4, 128, 128), 128);
  large_sparse.keep = 0.25;  // ~64 of 256 past pages per tile
  for (const config& c : {make("det large 28:4 d128 4096 x 16K", 4096, 16384, 28, 4, 128, 128),
                          documents(make("det large docs 14:2 d64 4096 x 8K", 4096, 8192, 14, 2, 64, 128),
                                    {3000, 8192, 9000, 11000}),
                          large_sparse}) {
    const problem p(c);
    device_problem dp(p);
    dev<bf16> o(p.q.size());
    dev<float> lse(std::size_t(c.sq) * c.hq);
    attn_test::forward(dp.args(), o.p, lse.p, nullptr);
    const auto a = added_bits(p, dp, o, lse, true), b = added_bits(p, dp, o, lse, true), e = added_bits(p, dp, o, lse, true);
    const auto x = added_bits(p, dp, o, lse, false), y = added_bits(p, dp, o, lse, false);
    std::printf("  %-40s deterministic runs differ in %zu and %zu of %zu values; the default's two runs in %zu; "
                "deterministic vs default rel %.2e\n",
                c.name.c_str(), differing(a, b), differing(a, e), a.size(), differing(x, y), rel_err(a, x));
    INFO(c.name);
    CHECK(differing(a, b) == 0);
    CHECK(differing(a, e) == 0);
    CHECK(rel_err(a, x) <= 1e-5);
  }
}

TEST_CASE("attention: a deterministic backward refuses what it cannot order, before any launch") {
  if (!hopper_device()) {
    MESSAGE("not a compute-capability 9.0 device: the deterministic backward is not run");
    return;
  }
  const config c = make("det refusals", 100, 300, 14, 2, 128, 128);
  const problem p(c);
  device_problem dp(p);
  dev<float> buf(std::size_t(c.sq) * c.hq * c.d);
  gpu::plan_options o;
  o.deterministic = true;
  const auto plan = gpu::plan_backward(gpu::call_shape::of(dp.args(), buf.p), attn_test::facts(), o);
  CHECK(plan.deterministic);
  CHECK(plan.query_split == 1);
  // no workspace, or one too small
  CHECK_THROWS_AS(gpu::backward(plan, dp.args(), buf.p, buf.p, dp.d_o.p, buf.p, buf.p, buf.p, dp.grads(buf.p), {}, nullptr),
                  oomb::invalid_argument);
  dev<std::int32_t> ws(static_cast<std::size_t>(plan.workspace_ints));
  CHECK_THROWS_AS(gpu::backward(plan, dp.args(), buf.p, buf.p, dp.d_o.p, buf.p, buf.p, buf.p, dp.grads(buf.p),
                                {ws.p, plan.workspace_ints - 1}, nullptr),
                  oomb::invalid_argument);
  // the portable kernels
  o.kernels = gpu::kernel_choice::portable;
  CHECK_THROWS_AS(gpu::plan_backward(gpu::call_shape::of(dp.args(), buf.p), attn_test::facts(), o), oomb::invalid_argument);
  sync();
}
