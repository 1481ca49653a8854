// Host <-> device page transfers on the GPU: copy engines (cudaMemcpyBatchAsync), the gather/scatter
// kernel, and one cudaMemcpyAsync per page, against one large cudaMemcpyAsync of the same bytes;
// then a cuBLAS bf16 GEMM running beside the kernel path. A plain program printing tables.
// SPDX-License-Identifier: Apache-2.0
//
//   page_transfer_bench [--quick] [--tier-gib N] [--out FILE.md]
//
// Pages sit at random places in both tiers (distinct random ids of an N-GiB pinned pool and an
// N-GiB device pool, fresh for every measurement). Bandwidth = bytes moved / time between CUDA
// events around R back-to-back batches (host planning of batch k+1 overlaps the GPU's batch k),
// after one warm-up batch; the median of 3 trials. "both" runs an H2D and a D2H batch of the same
// size at once on two streams and counts the bytes of both.
// cuBLAS is loaded with dlopen (libcublas.so.13), so the program needs no cuBLAS to build and the
// GEMM part is skipped, said so, when it is missing.
#include <cuda_runtime.h>
#include <cublas_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/memory/block_pool.hpp"

namespace {

using oomb::transfer_path;

// Hands out one preallocated slab (once): pools of every page size share the same two big buffers.
template <oomb::memory_kind K>
struct slab_resource {
  static constexpr oomb::memory_kind kind = K;
  void* base = nullptr;
  std::size_t bytes = 0;
  void* allocate(std::size_t n, std::size_t /*alignment*/) {
    OOMB_CHECK(n <= bytes, oomb::out_of_memory, "bench slab: asked ", n, " of ", bytes);
    return base;
  }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
};
using pinned_slab = slab_resource<oomb::memory_kind::pinned>;
using device_slab = slab_resource<oomb::memory_kind::device>;
using dev_pool = oomb::block_pool<device_slab>;
using host_pool = oomb::block_pool<pinned_slab>;
using up_t = oomb::cuda_page_transfer<device_slab, pinned_slab>;
using down_t = oomb::cuda_page_transfer<pinned_slab, device_slab>;

enum class dir { h2d, d2h, both };
const char* name(dir d) { return d == dir::h2d ? "H2D" : d == dir::d2h ? "D2H" : "both"; }

struct ctx {
  pinned_slab pinned;
  device_slab device;
  oomb::cuda_stream s1{oomb::cuda_stream::greatest_priority()};
  oomb::cuda_stream s2{oomb::cuda_stream::greatest_priority()};
  std::mt19937 rng{20261129};
  bool quick = false;
};

// `n` distinct random ids below `capacity` (n much smaller than capacity), none of `avoid`.
std::vector<std::int32_t> random_ids(std::mt19937& rng, std::int32_t capacity, std::size_t n,
                                     const std::vector<std::int32_t>* avoid = nullptr) {
  static std::vector<char> mark;
  mark.assign(static_cast<std::size_t>(capacity), 0);
  if (avoid)
    for (auto id : *avoid) mark[static_cast<std::size_t>(id)] = 1;
  std::uniform_int_distribution<std::int32_t> pick(0, capacity - 1);
  std::vector<std::int32_t> out;
  out.reserve(n);
  while (out.size() < n) {
    const std::int32_t id = pick(rng);
    if (mark[static_cast<std::size_t>(id)]) continue;
    mark[static_cast<std::size_t>(id)] = 1;
    out.push_back(id);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct result {
  double gbps = 0;       // device-side throughput, steady state
  double host_us = 0;    // host time to enqueue one round (both directions: the pair)
  transfer_path path = transfer_path::memcpy_batch;
};

int reps_for(std::size_t bytes, bool quick) {
  const double target = quick ? 0.3e9 : 1.0e9;
  return static_cast<int>(std::clamp(target / double(bytes), 8.0, 400.0));
}

// One measurement: `reps` rounds back to back (H2D on s1 by `up_path`, D2H on s2 by `down_path`;
// `large`: one cudaMemcpyAsync of the same bytes instead). Throughput counts rounds 2..reps between
// the event after round 1 and the last event, so start-up and the first host submission stay out;
// when the host cannot enqueue as fast as the copies run, the number shows it (host-bound).
result measure(ctx& c, dev_pool& dp, host_pool& hp, up_t& up, down_t& down, std::size_t batch, dir d,
               transfer_path up_path, transfer_path down_path, bool large) {
  const std::size_t pb = dp.block_bytes();
  const std::size_t bytes = batch * pb;
  const int streams = d == dir::both ? 2 : 1;
  const int reps = reps_for(bytes * std::size_t(streams), c.quick);
  std::vector<double> trials, host;
  result res;
  for (int t = 0; t < 3; ++t) {
    auto slots_a = random_ids(c.rng, dp.capacity(), batch);
    auto slots_b = random_ids(c.rng, dp.capacity(), batch, &slots_a);
    auto homes_a = random_ids(c.rng, hp.capacity(), batch);
    auto homes_b = random_ids(c.rng, hp.capacity(), batch, &homes_a);
    auto one = [&] {
      if (large) {
        if (d != dir::d2h) c.s1.enqueue_copy(dp.base(), hp.base(), bytes);
        if (d != dir::h2d) c.s2.enqueue_copy(hp.base() + bytes, dp.base() + bytes, bytes);
        return;
      }
      if (d != dir::d2h) res.path = up.enqueue(c.s1, slots_a, homes_a, up_path).path;
      if (d != dir::h2d) {
        const auto p = down.enqueue(c.s2, homes_b, slots_b, down_path).path;
        if (d == dir::d2h) res.path = p;
      }
    };
    one();  // warm-up (first launch, staging)
    c.s1.synchronize();
    c.s2.synchronize();
    oomb::cuda_event a0(oomb::cuda_event::timing), b0(oomb::cuda_event::timing);
    oomb::cuda_event a1(oomb::cuda_event::timing), b1(oomb::cuda_event::timing);
    const auto h0 = std::chrono::steady_clock::now();
    one();
    c.s1.record(a0);
    c.s2.record(b0);
    for (int r = 1; r < reps; ++r) one();
    const auto h1 = std::chrono::steady_clock::now();
    c.s1.record(a1);
    c.s2.record(b1);
    a1.wait();
    b1.wait();
    // start: the later of the first-round events of the streams used; end: the later last event
    const oomb::cuda_event* start = d == dir::d2h ? &b0 : &a0;
    if (d == dir::both && oomb::elapsed_ms(a0, b0) > 0) start = &b0;
    double end_ms = 0;
    if (d != dir::d2h) end_ms = std::max(end_ms, double(oomb::elapsed_ms(*start, a1)));
    if (d != dir::h2d) end_ms = std::max(end_ms, double(oomb::elapsed_ms(*start, b1)));
    trials.push_back(double(bytes) * streams * (reps - 1) / (end_ms * 1e-3) / 1e9);
    host.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() / reps);
  }
  res.gbps = median(trials);
  res.host_us = median(host);
  return res;
}

result measure(ctx& c, dev_pool& dp, host_pool& hp, up_t& up, down_t& down, std::size_t batch, dir d,
               transfer_path path, bool large) {
  return measure(c, dp, hp, up, down, batch, d, path, path, large);
}

// ---- cuBLAS through dlopen ----------------------------------------------------------------------
struct cublas_api {
  void* lib = nullptr;
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  std::string where;
  bool load() {
    const char* env = std::getenv("OOMB_CUBLAS");  // a path, when it is not on the loader's path
    const char* names[] = {env != nullptr ? env : "libcublas.so.13", "libcublas.so.13",
                           "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so"};
    for (const char* n : names) {
      lib = dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        where = n;
        break;
      }
    }
    if (!lib) return false;
    create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(lib, "cublasDestroy_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    gemm_ex = reinterpret_cast<decltype(gemm_ex)>(dlsym(lib, "cublasGemmEx"));
    return create && destroy && set_stream && gemm_ex;
  }
};

template <int = 0>
__global__ void fill_bf16(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float f = (float(h & 0xffff) / 65536.0f - 0.5f);  // uniform in [-0.5, 0.5): never all zero
    std::uint32_t bits;
    memcpy(&bits, &f, 4);
    p[i] = static_cast<std::uint16_t>(bits >> 16);
  }
}

void gemm_section(ctx& c, dev_pool& dp, host_pool& hp, std::ostringstream& md) {
  cublas_api cb;
  if (!cb.load()) {
    std::printf("\ncuBLAS not found (dlopen libcublas.so.13 failed): GEMM section skipped\n");
    md << "\ncuBLAS not found: GEMM section skipped.\n";
    return;
  }
  const int n = 8192;
  const std::size_t elems = std::size_t(n) * n;
  std::uint16_t *a = nullptr, *b = nullptr, *cc = nullptr;
  OOMB_CUDA_CHECK(cudaMalloc(&a, elems * 2), "gemm A");
  OOMB_CUDA_CHECK(cudaMalloc(&b, elems * 2), "gemm B");
  OOMB_CUDA_CHECK(cudaMalloc(&cc, elems * 2), "gemm C");
  fill_bf16<><<<1024, 256>>>(a, elems, 1);
  fill_bf16<><<<1024, 256>>>(b, elems, 2);
  OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "gemm init");
  oomb::cuda_stream compute;  // default priority, below the copy streams
  cublasHandle_t h = nullptr;
  if (cb.create(&h) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasCreate failed: GEMM section skipped\n");
    return;
  }
  cb.set_stream(h, compute.get());
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    const cublasStatus_t st = cb.gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                         &beta, cc, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    OOMB_CHECK(st == CUBLAS_STATUS_SUCCESS, oomb::cuda_error, "cublasGemmEx failed: status ", int(st));
  };
  const int gemms = c.quick ? 10 : 20;
  auto time_gemms = [&] {
    oomb::cuda_event t0(oomb::cuda_event::timing), t1(oomb::cuda_event::timing);
    compute.record(t0);
    for (int i = 0; i < gemms; ++i) gemm();
    compute.record(t1);
    t1.wait();
    return double(oomb::elapsed_ms(t0, t1)) / gemms;
  };
  for (int i = 0; i < 150; ++i) gemm();  // ~0.2 s: clocks and power settle before any timing
  compute.synchronize();
  std::vector<double> first;
  for (int t = 0; t < 3; ++t) first.push_back(time_gemms());
  const double alone0 = median(first);
  const double tflops = 2.0 * n * double(n) * n / (alone0 * 1e-3) / 1e12;
  std::printf("\ncuBLAS bf16 GEMM %dx%dx%d alone: %.3f ms (%.0f TFLOP/s) [%s]\n", n, n, n, alone0, tflops, cb.where.c_str());
  md << "\ncuBLAS bf16 GEMM " << n << "^3 alone: " << alone0 << " ms (" << int(tflops) << " TFLOP/s)\n\n";

  // Copies in both directions (64 KiB pages, batches of 1024 scattered pages) keep running while
  // the GEMMs run; GEMM time per product and copy bandwidth are each measured over their own span.
  // Each trial times the GEMMs alone right before timing them beside the copies, so clock drift
  // cancels; the slowdown is median(with) / median(alone) - 1 over 3 trials.
  std::printf("%-26s %7s %9s %9s %9s %14s\n", "copy path (in / out)", "blocks", "alone ms", "with ms", "slowdown",
              "copy GB/s both");
  md << "| copy path (in / out) | kernel blocks per direction | GEMM ms alone | GEMM ms with copies | slowdown | copy GB/s during (both directions) |\n|---|---|---|---|---|---|\n";
  struct cfg {
    transfer_path in, out;
    int blocks;
  };
  std::vector<cfg> cfgs = {{transfer_path::memcpy_batch, transfer_path::memcpy_batch, 0}};
  for (int bl : {1, 2, 4, 8, 16, 32}) cfgs.push_back({transfer_path::kernel, transfer_path::kernel, bl});
  cfgs.push_back({transfer_path::kernel, transfer_path::memcpy_batch, 8});
  cfgs.push_back({transfer_path::memcpy_batch, transfer_path::kernel, 8});
  const std::size_t batch = 1024;
  for (const cfg& k : cfgs) {
    oomb::cuda_transfer_options o;
    o.kernel_blocks = k.blocks > 0 ? k.blocks : 8;
    up_t up(dp, hp, o);
    down_t down(hp, dp, o);
    const std::size_t bytes = batch * dp.block_bytes();
    // enough copy rounds to outlast the GEMMs at the bandwidth seen alone (~50 GB/s per direction)
    const int rounds = static_cast<int>(std::max(4.0, gemms * alone0 * 1e-3 * 55e9 / double(bytes) * 1.5));
    std::vector<double> g, a, bw;
    for (int t = 0; t < 3; ++t) {
      a.push_back(time_gemms());
      auto sa = random_ids(c.rng, dp.capacity(), batch);
      auto sb = random_ids(c.rng, dp.capacity(), batch, &sa);
      auto ha = random_ids(c.rng, hp.capacity(), batch);
      auto hb = random_ids(c.rng, hp.capacity(), batch, &ha);
      oomb::cuda_event c0(oomb::cuda_event::timing), c1(oomb::cuda_event::timing), c2(oomb::cuda_event::timing);
      c.s1.record(c0);
      c.s2.wait(c0);
      for (int r = 0; r < rounds; ++r) {
        up.enqueue(c.s1, sa, ha, k.in);
        down.enqueue(c.s2, hb, sb, k.out);
      }
      c.s1.record(c1);
      c.s2.record(c2);
      compute.wait(c0);
      g.push_back(time_gemms());
      c1.wait();
      c2.wait();
      const double sec = std::max(oomb::elapsed_ms(c0, c1), oomb::elapsed_ms(c0, c2)) * 1e-3;
      bw.push_back(2.0 * double(bytes) * rounds / sec / 1e9);
    }
    const double gm = median(g), am = median(a);
    const double slow = (gm / am - 1) * 100;
    char label[64];
    std::snprintf(label, sizeof label, "%s / %s", oomb::to_string(k.in), oomb::to_string(k.out));
    std::printf("%-26s %7d %9.3f %9.3f %8.1f%% %14.1f\n", label, k.blocks, am, gm, slow, median(bw));
    md << "| " << label << " | " << (k.blocks > 0 ? std::to_string(k.blocks) : std::string("-")) << " | " << am
       << " | " << gm << " | " << slow << "% | " << median(bw) << " |\n";
  }
  cb.destroy(h);
  (void)cudaFree(a);
  (void)cudaFree(b);
  (void)cudaFree(cc);
}

}  // namespace

int main(int argc, char** argv) try {
  ctx c;
  double tier_gib = 8;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") c.quick = true;
    else if (a == "--tier-gib" && i + 1 < argc) tier_gib = std::atof(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--tier-gib N] [--out FILE.md]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  OOMB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("device: %s, %d SMs; tiers: %.1f GiB pinned + %.1f GiB device\n", prop.name,
              prop.multiProcessorCount, tier_gib, tier_gib);
  const std::size_t tier = static_cast<std::size_t>(tier_gib * double(1ull << 30));
  oomb::pinned_resource pr;
  oomb::device_resource dr;
  c.pinned.base = pr.allocate(tier, 4096);
  c.pinned.bytes = tier;
  c.device.base = dr.allocate(tier, 256);
  c.device.bytes = tier;
  std::memset(c.pinned.base, 0x3c, tier);  // touch every page (no first-touch cost in timings)
  OOMB_CUDA_CHECK(cudaMemset(c.device.base, 0x5a, tier), "device init");

  std::ostringstream md;
  md << "Device: " << prop.name << ". Pages at random places in " << tier_gib
     << " GiB pinned and device tiers; GB/s = 1e9 bytes/s, median of 3 trials.\n\n";
  const std::vector<std::size_t> pages_kib = {32, 64, 128, 256};
  const std::vector<std::size_t> batches = c.quick ? std::vector<std::size_t>{1, 64, 1024, 8192}
                                                   : std::vector<std::size_t>{1, 8, 64, 256, 1024, 8192};
  std::printf("\nGB/s (device side, steady state); host = microseconds to enqueue one batch (both: the pair)\n");
  std::printf("%-5s %4s %5s %6s %8s %7s %8s %17s %8s %8s | %6s %6s %6s\n", "dir", "KiB", "batch", "large", "memcpy_b",
              "kernel", "per_page", "auto", "kIn_mOut", "mIn_kOut", "host_m", "host_k", "host_p");
  md << "| dir | page KiB | batch | one large copy | memcpy-batch | kernel (8 blocks) | per-page memcpy | automatic "
        "| kernel in + memcpy out | memcpy in + kernel out | host us/batch: memcpy-batch / kernel / per-page |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (std::size_t kib : pages_kib) {
    const std::size_t pb = kib << 10;
    const auto cap = static_cast<std::int32_t>(tier / pb);
    auto dp = dev_pool::contiguous(c.device, pb, cap);
    auto hp = host_pool::contiguous(c.pinned, pb, cap);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(cap));
    dp.acquire(cap, ids.data());
    hp.acquire(cap, ids.data());
    up_t up(dp, hp);
    down_t down(hp, dp);
    for (std::size_t batch : batches) {
      if (batch * 2 > std::size_t(cap)) continue;
      for (dir d : {dir::h2d, dir::d2h, dir::both}) {
        const result large = measure(c, dp, hp, up, down, batch, d, transfer_path::per_page, true);
        const result mb = measure(c, dp, hp, up, down, batch, d, transfer_path::memcpy_batch, false);
        const result kn = measure(c, dp, hp, up, down, batch, d, transfer_path::kernel, false);
        const result pp = measure(c, dp, hp, up, down, batch, d, transfer_path::per_page, false);
        const result au = measure(c, dp, hp, up, down, batch, d, transfer_path::automatic, false);
        result km, mk;
        if (d == dir::both) {
          km = measure(c, dp, hp, up, down, batch, d, transfer_path::kernel, transfer_path::memcpy_batch, false);
          mk = measure(c, dp, hp, up, down, batch, d, transfer_path::memcpy_batch, transfer_path::kernel, false);
        }
        char auto_s[48], km_s[16], mk_s[16];
        std::snprintf(auto_s, sizeof auto_s, "%.1f %s", au.gbps, d == dir::both ? "" : oomb::to_string(au.path));
        std::snprintf(km_s, sizeof km_s, "%.1f", km.gbps);
        std::snprintf(mk_s, sizeof mk_s, "%.1f", mk.gbps);
        if (d != dir::both) km_s[0] = mk_s[0] = '-', km_s[1] = mk_s[1] = '\0';
        std::printf("%-5s %4zu %5zu %6.1f %8.1f %7.1f %8.1f %17s %8s %8s | %6.0f %6.0f %6.0f\n", name(d), kib, batch,
                    large.gbps, mb.gbps, kn.gbps, pp.gbps, auto_s, km_s, mk_s, mb.host_us, kn.host_us, pp.host_us);
        std::fflush(stdout);
        char line[320];
        std::snprintf(line, sizeof line, "| %s | %zu | %zu | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %.0f / %.0f / %.0f |\n",
                      name(d), kib, batch, large.gbps, mb.gbps, kn.gbps, pp.gbps, auto_s, km_s, mk_s, mb.host_us,
                      kn.host_us, pp.host_us);
        md << line;
      }
    }
  }

  // How many blocks the kernel path needs (64 KiB pages, batches of 1024).
  {
    const std::size_t pb = 64 << 10;
    const auto cap = static_cast<std::int32_t>(tier / pb);
    auto dp = dev_pool::contiguous(c.device, pb, cap);
    auto hp = host_pool::contiguous(c.pinned, pb, cap);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(cap));
    dp.acquire(cap, ids.data());
    hp.acquire(cap, ids.data());
    std::printf("\nkernel path vs blocks (64 KiB pages, batch 1024): GB/s\n%7s %8s %8s %8s\n", "blocks", "H2D", "D2H", "both");
    md << "\nKernel path against its number of blocks (64 KiB pages, batches of 1024), GB/s:\n\n"
          "| blocks | H2D | D2H | both |\n|---|---|---|---|\n";
    for (int bl : {1, 2, 4, 8, 16, 32, 132}) {
      oomb::cuda_transfer_options o;
      o.kernel_blocks = bl;
      up_t up(dp, hp, o);
      down_t down(hp, dp, o);
      double v[3];
      int i = 0;
      for (dir d : {dir::h2d, dir::d2h, dir::both}) v[i++] = measure(c, dp, hp, up, down, 1024, d, transfer_path::kernel, false).gbps;
      std::printf("%7d %8.1f %8.1f %8.1f\n", bl, v[0], v[1], v[2]);
      md << "| " << bl << " | " << v[0] << " | " << v[1] << " | " << v[2] << " |\n";
    }
    gemm_section(c, dp, hp, md);
  }

  if (!out.empty()) {
    std::ofstream f(out);
    f << md.str();
    std::printf("\nmarkdown tables written to %s\n", out.c_str());
  }
  dr.deallocate(c.device.base, tier, 256);
  pr.deallocate(c.pinned.base, tier, 4096);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "page_transfer_bench: %s\n", e.what());
  return 1;
}
