// oomb trainer — the memory a run needs, computed before anything large is allocated: GPU bytes
// (weights, gradients, optimizer, one chunk of activations, scratch, pages, rings, tables) and host
// bytes (page homes, optimizer state, staging, tables), checked against the limits, with the
// largest sequence that would fit when it does not.
// SPDX-License-Identifier: Apache-2.0
//
// Every size is that of what the trainer allocates, from the same dims: the activations through
// block_acts itself (over buffers that only count), the pages as paged_attention lays out its pools
// (in place: one contiguous range of every page for K/V and as many gradient pages; with offload:
// homes that grow by slabs, near slots of fixed count), the backends' scratch, workspaces and
// upload ring as the backends state them (cpu_ops::scratch_for, cuda/cuda_ops_memory.hpp) and
// allocate them before the first step; kept attention outputs as algo/attention_outputs.hpp's blocks; on cuda
// the sparse selector's summaries (device_page_summaries::bytes) and an estimate of its
// workspace. tests/trainer/test_memory_plan.cpp checks the K/V and gradient pages, the
// pools' reserved bytes, the near slots and the activations against what the CPU trainer measures.
//
// Gradient pages at their peak (dense attention): stage 2 runs chunks c = n-1 .. 0; the backward of
// chunk c gives a gradient page to every page of chunks < c in every layer, and chunk c's own
// gradient pages are released when it is done. So while the last chunk runs, the pages of all
// chunks before it have gradient pages (L · (n-1) · C/P of them), and from then on the count only
// falls. Page-sparse attention touches at most as many: the plan is dense, an upper bound.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>

#include <oomb/core/bf16.hpp>
#include <oomb/core/error.hpp>
#include <oomb/offload/residency_table.hpp>
#include <oomb/sparse/tile_selector.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/cpu/cpu_ops.hpp"
#include "trainer/cuda/cuda_ops_memory.hpp"
#include "trainer/io/config.hpp"
#include "trainer/model/block.hpp"
#include "trainer/model/params.hpp"
#include "trainer/optim/optimizer_split.hpp"

namespace oomb_trainer {

/// Host memory a run may take, and where that number came from (for the plan's output).
struct host_limit {
  std::uint64_t bytes = 0;
  std::string source;
};

/// The default host limit: MemAvailable from `meminfo` (the kernel's estimate of what it can hand
/// out without swapping: free memory plus the page cache and slabs it can reclaim). Never MemTotal:
/// these VMs report less than they have until it is used, and MemTotal counts memory others hold.
/// Fallbacks: MemFree + Buffers + Cached (kernels before 3.14), then sysconf's available pages,
/// then 0 bytes with a source that asks for --host-memory.
inline host_limit host_memory_default(const std::string& meminfo = "/proc/meminfo") {
  std::ifstream in(meminfo);
  std::uint64_t available = 0, mem_free = 0, buffers = 0, cached = 0, total = 0;
  bool have_available = false, have_free = false;
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);  // " kB" (every size field of meminfo is in KiB)
    const std::uint64_t b = kib * 1024;
    if (key == "MemAvailable:") {
      available = b;
      have_available = true;
    } else if (key == "MemFree:") {
      mem_free = b;
      have_free = true;
    } else if (key == "Buffers:") {
      buffers = b;
    } else if (key == "Cached:") {
      cached = b;
    } else if (key == "MemTotal:") {
      total = b;
    }
  }
  const std::string total_note =
      total > 0 ? fmt::format("; MemTotal {:.1f} GiB is not used", double(total) / double(1ull << 30)) : "";
  if (have_available)
    return {available, fmt::format("MemAvailable in {}{}; --host-memory to set it", meminfo, total_note)};
  if (have_free)
    return {mem_free + buffers + cached,
            fmt::format("MemFree + Buffers + Cached in {} (no MemAvailable){}; --host-memory to set it", meminfo, total_note)};
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    return {std::uint64_t(pages) * std::uint64_t(page),
            fmt::format("available pages from sysconf ({} unreadable); --host-memory to set it", meminfo)};
  return {0, fmt::format("unknown ({} unreadable, sysconf silent): pass --host-memory", meminfo)};
}

/// "137438953472", "128G", "128GiB", "512M", "64k" (binary units, case-insensitive) -> bytes.
/// Throws oomb::invalid_argument naming the text (after `what` and a colon, e.g. the flag).
inline std::uint64_t parse_bytes(const std::string& text, const std::string& what = {}) {
  const std::string of = what.empty() ? std::string() : what + ": ";
  std::size_t used = 0;
  unsigned long long n = 0;
  OOMB_EXPECTS(!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])), of, "'", text,
               "' is not a byte count (e.g. 128G, 512MiB, 1073741824)");
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    OOMB_FAIL(oomb::invalid_argument, of, "'", text, "' is not a byte count (e.g. 128G, 512MiB, 1073741824)");
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kib") shift = 10;
  else if (unit == "m" || unit == "mib") shift = 20;
  else if (unit == "g" || unit == "gib") shift = 30;
  else if (unit == "t" || unit == "tib") shift = 40;
  OOMB_EXPECTS(shift >= 0, of, "'", text, "' is not a byte count (e.g. 128G, 512MiB, 1073741824)");
  OOMB_EXPECTS(n <= (std::numeric_limits<std::uint64_t>::max() >> shift), of, "'", text, "' is too large");
  return std::uint64_t(n) << shift;
}

/// Where the optimizer state (fp32 master weights and AdamW's two moments) lives with --device cuda:
/// cut at a tensor boundary, the layout's first tensors on the GPU, the rest in pinned host memory
/// streamed through a device ring by the update (optim/optimizer_split.hpp).
enum class optimizer_placement {
  split,  ///< as many tensors as fit on the GPU beside the rest of the plan (all when they do), in layout order
  gpu,    ///< all on the GPU
  host,   ///< all in pinned host memory
};

/// Margin left free on the GPU when --gpu-memory is not given: the CUDA context is already counted
/// in cudaMemGetInfo's used bytes, this covers what the plan does not itemise (allocator rounding,
/// cuBLASLt's handles, other libraries).
inline constexpr std::uint64_t gpu_memory_margin = std::uint64_t(1) << 30;

/// What the plan is for and the limits it is checked against.
struct plan_target {
  std::string device = "cpu";  ///< "cpu" (everything in host memory) or "cuda"
  optimizer_placement optimizer = optimizer_placement::split;  ///< cuda only
  /// split: at most this many bytes of optimizer state on the GPU (--optimizer-gpu-memory).
  std::uint64_t optimizer_gpu_cap = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t gpu_bytes = 0;  ///< device memory the run may take (cuda; e.g. cudaMemGetInfo's free)
  host_limit host;              ///< host memory the run may take (pinned with cuda)
  /// cuda: count the host staging a checkpoint takes while it is written or read (one tensor at a
  /// time, the largest as fp32: trainers/cuda_trainer.cuh's save / load); off for runs that never
  /// save (the benchmarks' fwd_bwd steps).
  bool checkpoint_staging = true;
};

/// The parts of a plan, each on the GPU or the host.
enum class plan_part {
  weights,            ///< the parameters the kernels read (bf16 on the GPU, float on the CPU)
  gradients,          ///< parameter gradients (fp32)
  optimizer,          ///< AdamW state: fp32 master + 2 moments (GPU), 2 moments (CPU: the weights are fp32)
  optimizer_staging,  ///< the device ring the host part of the optimizer state streams through
  checkpoint_staging, ///< host copies of the weights and moments while a checkpoint is written
  activations,        ///< block_acts of one chunk, every layer
  chunk_buffers,      ///< the chunk's hidden state and its gradient (x, dx)
  layer_scratch,      ///< block_scratch: one layer's backward
  backend_scratch,    ///< the backend's own buffers for one chunk
  head_workspace,     ///< the LM head's logits tiles
  gemm_workspace,     ///< cuBLASLt
  upload_ring,        ///< host tables on their way to the device (pinned, with a device twin)
  kv_pages,           ///< K/V pages of the whole sequence: in place, or their homes with offload
  grad_pages,         ///< gradient pages at the stage-2 peak (in place: reserved for every page)
  kv_near,            ///< offload: the K/V near slots
  grad_near,          ///< offload: the gradient near slots
  page_tables,        ///< host bookkeeping per page: ids, gradient map, pool and residency records
  attention_outputs,  ///< keep_attention_outputs: every (layer but the last, chunk)'s o and lse (homes with offload)
  attention_outputs_near,  ///< keep_attention_outputs with offload: the blocks' device slots
  sparse_summaries,   ///< cuda sparse: the page summaries' pinned home, one per page id (cuda_page_selector)
  sparse_workspace,   ///< cuda sparse: the selection's scoring workspace and tables at their largest
  sparse_gathered,    ///< cuda sparse: a slice of one layer's past summaries, gathered on the device for scoring
  home_staging,       ///< cuda, pageable homes: the pinned staging rings their pages move through
  copy_staging,       ///< cuda, pinned homes: the page copy kernel's descriptor slots (device, with a pinned twin)
  pinned_mapping,     ///< cuda: the driver's device memory for pinned host memory (8 B per pinned 4 KiB)
  sequence,           ///< the sequence's tokens
};

/// One line of the plan.
struct plan_item {
  plan_part part;
  std::uint64_t bytes = 0;
  std::string what;  ///< human-readable: what it is and how it is sized
};

/// The plan of one run: what goes where, the totals against the limits.
struct memory_plan {
  std::int64_t tokens = 0;
  std::string device;
  chunk_options options;
  std::int32_t optimizer_groups = 0;         ///< update groups (cuda): the layout's tensors
  std::int32_t optimizer_groups_on_gpu = 0;  ///< the first of them, on the GPU (cuda); the rest in pinned host memory
  std::string optimizer_first_on_host;       ///< the first tensor whose state is on the host (cuda; empty: none)
  std::string optimizer_why;                 ///< why it is where it is (cuda)
  std::int64_t kv_pages = 0;      ///< K/V page pairs of the sequence, all layers (the stage-1 high water)
  std::int64_t grad_pages = 0;    ///< gradient page pairs in use at the stage-2 peak, all layers
  std::vector<plan_item> gpu, host;
  std::uint64_t gpu_limit = 0;
  host_limit host_allowed;
  double gpu_growth_per_10k = 0, host_growth_per_10k = 0;  ///< bytes per 10,000 more tokens

  static std::uint64_t total(const std::vector<plan_item>& items) {
    std::uint64_t s = 0;
    for (const auto& i : items) s += i.bytes;
    return s;
  }
  static std::uint64_t bytes_of(const std::vector<plan_item>& items, plan_part p) {
    for (const auto& i : items)
      if (i.part == p) return i.bytes;
    return 0;
  }
  std::uint64_t gpu_total() const { return total(gpu); }
  std::uint64_t host_total() const { return total(host); }
  std::uint64_t on_gpu(plan_part p) const { return bytes_of(gpu, p); }
  std::uint64_t on_host(plan_part p) const { return bytes_of(host, p); }
  bool gpu_fits() const { return gpu_total() <= gpu_limit; }
  bool host_fits() const { return host_total() <= host_allowed.bytes; }
  bool fits() const { return gpu_fits() && host_fits(); }

  /// The plan, one line per item, totals against the limits and where the host limit came from.
  std::string describe() const;
  /// cuda: where the optimizer state is and why (one line, no newline).
  std::string optimizer_summary() const;
};

namespace detail {

inline std::string plan_bytes(double b) {
  constexpr double mib = double(1 << 20), gib = double(1u << 30);
  return b >= gib ? fmt::format("{:.2f} GiB", b / gib) : fmt::format("{:.1f} MiB", b / mib);
}

/// The element types of an ops backend without its memory: block_acts<plan_sizes<T, S>> sizes
/// its buffers exactly as the trainer's own block_acts<B> does, and bytes() adds them up.
template <class T, class S>
struct plan_sizes {
  using value_type = T;
  using stat_type = S;
  template <class X>
  class buffer {
   public:
    void resize(std::size_t n) noexcept { n_ = n; }
    std::size_t size() const noexcept { return n_; }
    X* data() noexcept { return nullptr; }

   private:
    std::size_t n_ = 0;
  };
};

template <class T, class S>
std::uint64_t activation_bytes(const model_config& c, std::int64_t chunk) {
  block_acts<plan_sizes<T, S>> a;
  a.resize(chunk, block_dims(c));
  return std::uint64_t(c.num_hidden_layers) * a.bytes();
}

/// Pages of a pool that grows by slabs (paged_attention's growing pools: homes with offload)
/// holding `peak` pages at most: whole slabs, the last one cut at the capacity.
inline std::int64_t slab_reserved(std::int64_t peak, std::int64_t slab, std::int64_t capacity) {
  return std::min(capacity, (peak + slab - 1) / slab * slab);
}

constexpr std::uint64_t kept_output_slots = 4;                      // attention_outputs::near_slots
// cuda_transfer_options{}.pageable: 4 chunks of 8 MiB per staged transfer (checked in cuda_trainer.cuh).
constexpr std::uint64_t pageable_staging_bytes = std::uint64_t(32) << 20;
// cuda_transfer_options{}: 8 slots of 8,192 page_copy_desc (16 B) per kernel-path transfer, on the
// device and pinned (checked in cuda_trainer.cuh).
constexpr std::uint64_t page_copy_staging_bytes = std::uint64_t(1) << 20;
// The driver keeps 8 bytes of device memory per pinned 4 KiB page, however it is pinned
// (bench/cuda/pinned_mapping_bench.cu on the H200: 16 GiB pinned took exactly 32 MiB).
constexpr std::uint64_t pinned_bytes_per_mapping_byte = 4096 / 8;

struct plan_inputs {
  const model_config& c;
  const chunk_options& o;
  std::int64_t tokens;
  bool cuda;
  const optimizer_split& optimizer;  ///< cuda: where the optimizer state is
  bool checkpoint_staging;
};

/// The items of the plan (see the file comment for how each is sized).
inline void plan_items(const plan_inputs& in, memory_plan& p) {
  const model_config& c = in.c;
  const chunk_options& o = in.o;
  const bool cuda = in.cuda;
  const block_dims D(c);
  const std::int64_t L = c.num_hidden_layers, n = o.chunk, P = o.page;
  const std::int64_t H = D.H, I = D.I, qd = D.qdim(), kvd = D.kvdim(), hq = D.hq;
  const param_layout layout(c);
  const auto elements = std::uint64_t(layout.total());  // with the alignment padding, as allocated
  const std::uint64_t params = parameter_count(layout);
  // Element sizes: the CPU trainer runs chunk_recurrent<cpu_ops<float>> (float everywhere);
  // cuda_ops: bf16 activations and K/V pages, fp32 statistics and gradient pages.
  const std::uint64_t t = cuda ? sizeof(oomb::bf16) : sizeof(float), e = t, g = sizeof(float), f = sizeof(float);

  const std::int64_t pages_per_layer = (in.tokens + P - 1) / P;
  const std::int64_t capacity = pages_per_layer * L;
  const std::int64_t chunks = (in.tokens + n - 1) / n;
  p.kv_pages = capacity;
  p.grad_pages = L * (chunks - 1) * (n / P);
  const std::uint64_t kv_pair = 2 * std::uint64_t(P) * std::uint64_t(kvd) * e;
  const std::uint64_t grad_pair = 2 * std::uint64_t(P) * std::uint64_t(kvd) * g;
  // --grad-homes bf16: the homes hold 2 bytes an element, the near slots still g.
  const bool bf16_home = bf16_homes(o.grad_homes);
  const std::uint64_t grad_home_pair = bf16_home ? 2 * std::uint64_t(P) * std::uint64_t(kvd) * sizeof(oomb::bf16) : grad_pair;
  // paged_attention: with offload the far pools grow by slabs of four chunks' pages (all layers).
  const std::int64_t slab = std::max<std::int64_t>(1, std::min<std::int64_t>(capacity, 4 * (n / P) * L));
  const std::int64_t kv_reserved = o.offload ? slab_reserved(capacity, slab, capacity) : capacity;
  const std::int64_t grad_reserved = o.offload ? slab_reserved(p.grad_pages, slab, capacity) : capacity;

  auto& dev = cuda ? p.gpu : p.host;  // where compute memory lives
  auto& home = p.host;                // where the page homes and host-side state live
  const std::string tt = cuda ? "bf16" : "fp32";

  dev.push_back({plan_part::weights, elements * t, fmt::format("weights ({}, {:.1f}M parameters)", tt, double(params) / 1e6)});
  dev.push_back({plan_part::gradients, elements * f, "parameter gradients (fp32)"});
  if (!cuda) {
    dev.push_back({plan_part::optimizer, 2 * params * f, "AdamW moments (2 x fp32; the fp32 weights are the master)"});
  } else {
    const optimizer_split& s = in.optimizer;
    const auto of = [&](std::size_t k) { return k == s.tensors ? std::string() : fmt::format(", {} of {} tensors", k, s.tensors); };
    if (s.gpu_tensors > 0)
      dev.push_back({plan_part::optimizer, s.gpu_bytes(), "optimizer: fp32 master weights + 2 AdamW moments" + of(s.gpu_tensors)});
    if (!s.all_on_gpu()) {
      home.push_back({plan_part::optimizer, s.host_bytes(),
                      "optimizer: fp32 master weights + 2 AdamW moments (pinned" + of(s.tensors - s.gpu_tensors) + ")"});
      // cuda/adamw_state.cuh: the host part goes up and down through these slots every step.
      dev.push_back({plan_part::optimizer_staging, s.ring_bytes(),
                     fmt::format("optimizer ring: {} slots of {} elements x (master + 2 moments), the host part streams through",
                                 optimizer_ring_slots, s.piece_elements())});
    }
    // A checkpoint streams the state through a host buffer of one tensor (adamw_checkpoint_view,
    // io/checkpoint.hpp): the largest tensor's, while one is written or read.
    if (in.checkpoint_staging) {
      const param_entry* largest = &layout.entries().front();
      for (const param_entry& entry : layout.entries())
        if (entry.numel > largest->numel) largest = &entry;
      home.push_back({plan_part::checkpoint_staging, std::uint64_t(largest->numel) * f,
                      fmt::format("checkpoint staging while one is written or read (one tensor at a time: the largest, {}, "
                                  "as fp32; pageable)", largest->name)});
    }
  }

  dev.push_back({plan_part::activations, cuda ? activation_bytes<oomb::bf16, float>(c, n) : activation_bytes<float, float>(c, n),
                 fmt::format("activations of one chunk ({} tokens), {} layers", n, L)});
  dev.push_back({plan_part::chunk_buffers, 2 * std::uint64_t(n * H) * t, "chunk hidden state and its gradient (x, dx)"});
  // block_backward's buffers: dx1, dxn [n][H]; dh, dg, du [n][I]; d_o, dq [n][qd]; dk, dv [n][kvd].
  dev.push_back({plan_part::layer_scratch, std::uint64_t(n * (2 * H + 3 * I + 2 * qd + 2 * kvd)) * t,
                 "one layer's backward scratch"});
  // The backends' scratch, as each states it (cuda/cuda_ops_memory.hpp, cpu_ops::scratch_for) and
  // allocates it up front (reserve) for the run's largest chunk.
  const chunk_shape shape = chunk_shape_of(c, o, in.tokens);
  if (cuda) {
    dev.push_back({plan_part::backend_scratch, cuda_ops_memory::scratch_for(shape).bytes(),
                   "backend scratch: fp32 copies of dx/o/dq/dk/dv, window output, lse, delta, head rows"});
    dev.push_back({plan_part::head_workspace, cuda_ops_memory::head_budget, "fused LM head workspace (its budget)"});
    dev.push_back({plan_part::gemm_workspace, cuda_ops_memory::gemm_workspace, "cuBLASLt workspace"});
    const std::uint64_t ring = cuda_ops_memory::upload_ring_bytes(shape);
    const std::string ring_what =
        fmt::format("upload ring: RoPE table, tokens and a window table of {} pages (ids and gradient pages), twice over",
                    shape.window_pages);
    dev.push_back({plan_part::upload_ring, ring, ring_what + " (device twin)"});
    home.push_back({plan_part::upload_ring, ring, ring_what + " (pinned)"});
  } else {
    const auto scratch = cpu_ops<float>::scratch_for(shape);
    dev.push_back({plan_part::backend_scratch, scratch.attention, "backend scratch: window output and lse, the gradient-page map"});
    dev.push_back({plan_part::head_workspace, scratch.head,
                   "LM head scratch (normed rows, their gradient, one row of logits and its gradient)"});
  }

  const std::string kvt = cuda ? "bf16" : "fp32";
  if (!o.offload) {
    dev.push_back({plan_part::kv_pages, std::uint64_t(kv_reserved) * kv_pair,
                   fmt::format("K/V pages, whole sequence, in place ({} pairs of {} B, {})", capacity, kv_pair, kvt)});
    dev.push_back({plan_part::grad_pages, std::uint64_t(grad_reserved) * grad_pair,
                   fmt::format("gradient pages, in place: reserved for all {} pages, at most {} in use (fp32)", capacity,
                               p.grad_pages)});
  } else {
    const std::string pinned = !cuda ? "" : o.homes == home_memory::pinned ? ", pinned" : ", pageable";
    home.push_back({plan_part::kv_pages, std::uint64_t(kv_reserved) * kv_pair,
                    fmt::format("K/V homes, whole sequence ({} pairs of {} B, {}{})", capacity, kv_pair, kvt, pinned)});
    home.push_back({plan_part::grad_pages, std::uint64_t(grad_reserved) * grad_home_pair,
                    fmt::format("gradient homes at the stage-2 peak ({} pairs in use, slabs of {}; {}{})", p.grad_pages,
                                slab, bf16_home ? "bf16" : "fp32", pinned)});
    dev.push_back({plan_part::kv_near, std::uint64_t(o.near_pages) * kv_pair, fmt::format("K/V near slots ({})", o.near_pages)});
    // bf16 homes on the GPU: the conversion stages each direction's pages in device memory, a
    // home's bytes per slot (cuda_converting_backend).
    const std::uint64_t grad_staging = cuda && bf16_home ? 2 * std::uint64_t(o.near_pages) * grad_home_pair : 0;
    dev.push_back({plan_part::grad_near, std::uint64_t(o.near_pages) * grad_pair + grad_staging,
                   grad_staging > 0 ? fmt::format("gradient near slots ({}) and their bf16 conversion staging (2 x {})",
                                                  o.near_pages, o.near_pages)
                                    : fmt::format("gradient near slots ({})", o.near_pages)});
  }
  if (o.keep_attention_outputs) {
    // attention_outputs: one block per (layer but the last, chunk), all held at the end of stage 1;
    // o [n][hq*d] values then lse [hq][n] stats, each rounded up to 256 bytes (block_bytes).
    const auto round_up = [](std::uint64_t b) { return (b + 255) / 256 * 256; };
    const std::uint64_t block = round_up(std::uint64_t(n) * std::uint64_t(qd) * t) + round_up(std::uint64_t(n) * std::uint64_t(hq) * f);
    const std::int64_t blocks = (L - 1) * chunks;
    const std::string what = fmt::format("attention outputs kept for stage 2 ({} blocks of {} B: {} layers x {} chunks, o + lse)",
                                         blocks, block, L - 1, chunks);
    if (!o.offload) {
      dev.push_back({plan_part::attention_outputs, std::uint64_t(blocks) * block, what + ", in place"});
    } else {
      home.push_back({plan_part::attention_outputs, std::uint64_t(blocks) * block,
                      what + (!cuda ? ", homes" : o.homes == home_memory::pinned ? ", pinned homes" : ", pageable homes")});
      dev.push_back({plan_part::attention_outputs_near, kept_output_slots * block,
                     fmt::format("attention output slots ({})", kept_output_slots)});
    }
  }
  if (cuda && o.sparse) {
    // cuda_page_selector: Quest keeps min and max, mean-key the mean ([ids][hkv][d] fp32 each) plus
    // an int32 token count per id (device_page_summaries::bytes), for every page id in place or not,
    // at home in pinned memory (the far tier: they grow with the context).
    const std::uint64_t stats = o.score == oomb::score_kind::quest ? 2 : 1;
    const std::uint64_t per_id = stats * std::uint64_t(kvd) * f + sizeof(std::int32_t);
    home.push_back({plan_part::sparse_summaries, std::uint64_t(capacity) * per_id,
                    fmt::format("sparse page summaries ({} ids of {} B, fp32, pinned)", capacity, per_id)});
    // Its workspace (plan_tile_selection) grows by doubling the past it plans for (at most twice
    // the last chunk's past pages) until the past is longer than one slice of
    // oomb::default_selection_slice_pages: the slice's summaries gathered for scoring, query-tile
    // summaries, two copies of a pass's keys (the slice's and the best `budget`, 8 B each), CUB's
    // sort storage (counted as another copy and 1 MiB), the picks, the selected pages (device and
    // pinned).
    const std::int64_t tiles = (n + o.tile - 1) / o.tile;
    const std::int64_t past = 2 * ((in.tokens - 1) / n) * (n / P);
    const std::int64_t scored = std::max<std::int64_t>(0, past - o.sink - o.local);
    const std::int64_t slice = std::min<std::int64_t>(scored, oomb::default_selection_slice_pages);
    dev.push_back({plan_part::sparse_gathered, std::uint64_t(slice) * per_id,
                   fmt::format("sparse summaries gathered for scoring (a slice of the past: {} pages at most)", slice)});
    const std::uint64_t keys = std::uint64_t(tiles) * std::uint64_t(slice + o.budget) * 8;
    const std::uint64_t picks = 2 * std::uint64_t(tiles) * std::uint64_t(o.budget) * 4;
    const std::uint64_t selected = std::uint64_t(tiles) * std::uint64_t(std::min<std::int64_t>(past, std::int64_t(o.budget) + o.sink + o.local)) * 4;
    dev.push_back({plan_part::sparse_workspace,
                   2 * std::uint64_t(tiles) * std::uint64_t(kvd) * f + 3 * keys + picks + (std::uint64_t(1) << 20) + selected,
                   fmt::format("sparse scoring workspace ({} tiles x {} keys per pass at most, an estimate)", tiles,
                               slice + o.budget)});
    home.push_back({plan_part::sparse_workspace, selected, "sparse selections read back (pinned)"});
  }
  // A transfer per direction of each streamed tier: K/V, gradients, kept outputs.
  const std::uint64_t transfers = 2 * (2 + (o.keep_attention_outputs ? 1 : 0));
  if (cuda && o.offload && o.homes == home_memory::pageable) {
    home.push_back({plan_part::home_staging, transfers * pageable_staging_bytes,
                    fmt::format("pinned staging of the pageable homes ({} transfers x {})", transfers,
                                plan_bytes(double(pageable_staging_bytes)))});
  }
  if (cuda && o.offload && o.homes == home_memory::pinned) {
    const std::string what = fmt::format("page copy kernel descriptors ({} transfers x {})", transfers,
                                         plan_bytes(double(page_copy_staging_bytes)));
    dev.push_back({plan_part::copy_staging, transfers * page_copy_staging_bytes, what});
    home.push_back({plan_part::copy_staging, transfers * page_copy_staging_bytes, what + " (pinned)"});
  }
  if (cuda) {
    std::uint64_t pinned = 0;
    const bool homes_pinned = o.homes == home_memory::pinned;
    for (const plan_item& i : home)
      switch (i.part) {
        case plan_part::kv_pages:
        case plan_part::grad_pages:
        case plan_part::attention_outputs: pinned += homes_pinned ? i.bytes : 0; break;
        case plan_part::optimizer:
        case plan_part::upload_ring:
        case plan_part::sparse_summaries:
        case plan_part::sparse_workspace:
        case plan_part::home_staging:
        case plan_part::copy_staging: pinned += i.bytes; break;
        default: break;  // pageable: checkpoint staging, page tables, the sequence
      }
    dev.push_back({plan_part::pinned_mapping, pinned / pinned_bytes_per_mapping_byte,
                   fmt::format("the driver's mapping of {} of pinned host memory (8 B per 4 KiB)", plan_bytes(double(pinned)))});
  }
  // Host records per page: the page table's id (4 B) and the gradient map's entry (4 B) of every
  // K/V page; per reserved id of both pools the free list, in-use flag and generation (9 B); with
  // offload, per reserved far page of both tiers a residency record and a copy-event handle.
  const std::uint64_t pool_id = sizeof(std::int32_t) + sizeof(std::uint8_t) + sizeof(std::uint32_t);
  const std::uint64_t residency = o.offload ? sizeof(oomb::residency_table::page_entry) + sizeof(std::shared_ptr<const void>) : 0;
  home.push_back({plan_part::page_tables,
                  std::uint64_t(capacity) * 8 + std::uint64_t(kv_reserved + grad_reserved) * (pool_id + residency),
                  "page tables and records (host: ids, gradient map, pool and residency records)"});
  home.push_back({plan_part::sequence, std::uint64_t(in.tokens) * (sizeof(std::int32_t) + 1),
                  "the sequence (int32 tokens and a loss mask)"});
}

inline void check_plan_inputs(const model_config& c, const chunk_options& o, std::int64_t tokens, const plan_target& target) {
  o.validate();
  OOMB_EXPECTS(target.device == "cpu" || target.device == "cuda", "memory plan: --device ", target.device,
               " is not cpu or cuda");
  OOMB_EXPECTS(tokens >= 2, "memory plan: a sequence of ", tokens, " tokens (at least 2)");
  OOMB_EXPECTS(target.device != "cuda" || target.gpu_bytes > 0, "memory plan: --device cuda needs the GPU bytes available");
  const std::int64_t ids = (tokens + o.page - 1) / o.page * c.num_hidden_layers;
  OOMB_EXPECTS(ids < std::numeric_limits<std::int32_t>::max(), "memory plan: ", tokens, " tokens need ", ids,
               " page ids, more than int32 holds");
}

inline memory_plan plan_at(const model_config& c, const chunk_options& o, std::int64_t tokens, const plan_target& target,
                           const optimizer_split& optimizer) {
  memory_plan p;
  p.tokens = tokens;
  p.device = target.device;
  p.options = o;
  if (target.device == "cuda") {
    p.optimizer_groups = static_cast<std::int32_t>(optimizer.tensors);
    p.optimizer_groups_on_gpu = static_cast<std::int32_t>(optimizer.gpu_tensors);
    if (!optimizer.all_on_gpu()) p.optimizer_first_on_host = param_layout(c).entries()[optimizer.gpu_tensors].name;
  }
  p.gpu_limit = target.device == "cuda" ? target.gpu_bytes : 0;
  p.host_allowed = target.host;
  plan_items({c, o, tokens, target.device == "cuda", optimizer, target.checkpoint_staging}, p);
  return p;
}

}  // namespace detail

/// The memory a run of `tokens` tokens needs with `opt` on `target` (see the file comment and
/// optimizer_placement for where the optimizer state goes). Throws oomb::invalid_argument for
/// inputs no run could have; allocates nothing large.
inline memory_plan plan_memory(const model_config& c, const chunk_options& opt, std::int64_t tokens, const plan_target& target) {
  using detail::plan_bytes;
  detail::check_plan_inputs(c, opt, tokens, target);
  const param_layout layout(c);
  const std::size_t tensors = layout.entries().size();
  const auto placement = target.device == "cuda" ? target.optimizer : optimizer_placement::gpu;
  optimizer_split on_gpu = split_after(layout, placement == optimizer_placement::host ? 0 : tensors);
  memory_plan p = detail::plan_at(c, opt, tokens, target, on_gpu);
  std::string why = "as asked";
  if (placement == optimizer_placement::split) {
    // The rest: everything but the optimizer state, which fills what the rest leaves (and the cap
    // allows), with the ring its host part then needs.
    const std::uint64_t state = p.on_gpu(plan_part::optimizer), rest = p.gpu_total() - state;
    const std::uint64_t room = target.gpu_bytes > rest ? target.gpu_bytes - rest : 0;
    on_gpu = split_fitting(layout, room, target.optimizer_gpu_cap);
    // The host part costs the GPU too (the driver's mapping of its pinned bytes): while the split
    // plan overshoots, one tensor fewer stays on the GPU (a tensor outweighs the mapping's change).
    while (!on_gpu.all_on_gpu() && on_gpu.gpu_bytes() > 0 &&
           !detail::plan_at(c, opt, tokens, target, on_gpu).gpu_fits())
      on_gpu = split_fitting(layout, on_gpu.gpu_bytes() - 1, target.optimizer_gpu_cap);
    const bool capped = target.optimizer_gpu_cap < room;
    if (on_gpu.all_on_gpu()) {
      why = "it fits beside the rest";
    } else {
      const std::string limit = capped ? fmt::format("--optimizer-gpu-memory caps it at {}", plan_bytes(double(target.optimizer_gpu_cap)))
                                       : fmt::format("{} of it do not fit beside the rest's {} in {}", plan_bytes(double(state)),
                                                     plan_bytes(double(rest)), plan_bytes(double(target.gpu_bytes)));
      why = fmt::format("{}: the first tensors' {} stay on the GPU, the other {} stream through the {} ring each step", limit,
                        plan_bytes(double(on_gpu.gpu_bytes())), plan_bytes(double(on_gpu.host_bytes())),
                        plan_bytes(double(on_gpu.ring_bytes())));
      p = detail::plan_at(c, opt, tokens, target, on_gpu);
    }
  }
  p.optimizer_why = target.device == "cuda" ? why : "";
  // Growth: the slope over a stretch long enough that the host pools' slabs average out.
  const std::int64_t stretch = std::max<std::int64_t>(10000, 64 * std::int64_t(opt.chunk));
  const std::int64_t ids_left = std::int64_t((std::numeric_limits<std::int32_t>::max() - 1) / c.num_hidden_layers) * opt.page;
  const std::int64_t a = tokens + stretch <= ids_left ? tokens : std::max<std::int64_t>(2, tokens - stretch);
  const memory_plan lo = detail::plan_at(c, opt, a, target, on_gpu), hi = detail::plan_at(c, opt, a + stretch, target, on_gpu);
  p.gpu_growth_per_10k = (double(hi.gpu_total()) - double(lo.gpu_total())) * 1e4 / double(stretch);
  p.host_growth_per_10k = (double(hi.host_total()) - double(lo.host_total())) * 1e4 / double(stretch);
  return p;
}

/// The most tokens (a whole number of pages) whose plan fits `target`; 0 when not even one page
/// does (the parts that do not grow with the context are too large).
inline std::int64_t largest_fitting_tokens(const model_config& c, const chunk_options& opt, const plan_target& target) {
  const std::int64_t P = opt.page;
  const std::int64_t max_pages = (std::numeric_limits<std::int32_t>::max() - 1) / c.num_hidden_layers;  // int32 page ids
  auto fits = [&](std::int64_t pages) { return plan_memory(c, opt, pages * P, target).fits(); };
  if (!fits(1)) return 0;
  if (fits(max_pages)) return max_pages * P;
  std::int64_t lo = 1, hi = max_pages;  // fits(lo), !fits(hi): every part grows with the tokens
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * P;
}

/// plan_memory, or oomb::invalid_argument naming what is needed against what is available on the
/// GPU and on the host, and the largest sequence that would fit.
inline memory_plan checked_memory_plan(const model_config& c, const chunk_options& opt, std::int64_t tokens,
                                       const plan_target& target) {
  memory_plan p = plan_memory(c, opt, tokens, target);
  if (p.fits()) return p;
  using detail::plan_bytes;
  const std::int64_t largest = largest_fitting_tokens(c, opt, target);
  const std::string gpu = p.device == "cuda" ? fmt::format("{} of GPU memory, {} available; ", plan_bytes(double(p.gpu_total())),
                                                           plan_bytes(double(p.gpu_limit)))
                                             : std::string();
  const char* binds = !p.host_fits() && !p.gpu_fits() ? "GPU and host memory" : p.gpu_fits() ? "host memory" : "GPU memory";
  const std::string state = p.device == "cuda" ? fmt::format(" (optimizer state: {})", p.optimizer_summary()) : std::string();
  const std::string fit = largest > 0 ? fmt::format("the largest sequence that fits is {} tokens", largest)
                                      : std::string("no sequence fits: the parts that do not grow with the context are too large");
  // Where host memory binds, what would change it: bf16 gradient homes (half their bytes), and
  // for page-sparse runs that their gradient homes are planned at the dense bound.
  std::string instead;
  if (!p.host_fits() && opt.offload && opt.grad_homes == page_home_format::same) {
    chunk_options bf16 = opt;
    bf16.grad_homes = page_home_format::bf16;
    const std::int64_t with_bf16 = largest_fitting_tokens(c, bf16, target);
    if (with_bf16 > largest)
      instead += with_bf16 >= tokens ? std::string("; with --grad-homes bf16 (half the gradient homes' bytes) this one fits")
                                     : fmt::format("; with --grad-homes bf16 (half the gradient homes' bytes) {} tokens fit", with_bf16);
  }
  if (!p.host_fits() && opt.sparse)
    instead += "; the gradient homes are planned at the dense bound: page-sparse attention allocates them only for pages "
               "some chunk selects, which no plan knows ahead (docs/benchmarks.md measures the live ones)";
  OOMB_FAIL(oomb::invalid_argument, "memory plan: ", tokens, " tokens need ", gpu, plan_bytes(double(p.host_total())),
            " of host memory, ", plan_bytes(double(p.host_allowed.bytes)), " allowed (", p.host_allowed.source,
            "): not enough ", binds, state, "; ", fit, instead, " (--plan prints the plan)");
}

inline std::string memory_plan::describe() const {
  using detail::plan_bytes;
  std::string s = fmt::format("memory plan: {} tokens on {}, chunk {}, page {}, {}\n", tokens, device, options.chunk,
                              options.page,
                              options.offload ? fmt::format("offload ({} + {} near slots{})", options.near_pages, options.near_pages,
                                                            device == "cuda" && options.homes == home_memory::pageable
                                                                ? ", pageable homes"
                                                                : "")
                                              : std::string("pages in place"));
  auto block = [&](const char* place, const std::vector<plan_item>& items, std::uint64_t limit, const std::string& whence,
                   double growth) {
    s += fmt::format("{}:\n", place);
    for (const auto& i : items) s += fmt::format("  {:>11}  {}\n", plan_bytes(double(i.bytes)), i.what);
    const std::uint64_t sum = total(items);
    s += fmt::format("  {:>11}  total, {} {}{}; grows {} per 10K tokens\n", plan_bytes(double(sum)), plan_bytes(double(limit)),
                     whence, sum <= limit ? "" : " -- DOES NOT FIT", plan_bytes(growth));
  };
  if (device == "cuda") block("GPU", gpu, gpu_limit, "available", gpu_growth_per_10k);
  block("host", host, host_allowed.bytes,
        fmt::format("allowed ({})", host_allowed.source), host_growth_per_10k);
  if (device == "cuda") s += fmt::format("optimizer state: {}\n", optimizer_summary());
  return s;
}

inline std::string memory_plan::optimizer_summary() const {
  using detail::plan_bytes;
  const std::string pinned = plan_bytes(double(on_host(plan_part::optimizer)));
  const std::string where =
      optimizer_groups_on_gpu == optimizer_groups ? std::string("on the GPU")
      : optimizer_groups_on_gpu == 0
          ? fmt::format("all {} in pinned host memory, which the page homes cannot use", pinned)
          : fmt::format("the first {} of {} tensors on the GPU ({}), from {} on {} in pinned host memory, which the page "
                        "homes cannot use",
                        optimizer_groups_on_gpu, optimizer_groups, plan_bytes(double(on_gpu(plan_part::optimizer))),
                        optimizer_first_on_host, pinned);
  return fmt::format("{} ({})", where, optimizer_why);
}

}  // namespace oomb_trainer
