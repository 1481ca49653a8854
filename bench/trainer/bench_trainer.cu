// oomb benchmarks — the GPU trainer's step at long context, phase fwd_bwd (chunk_recurrent on the
// CUDA backend: one sequence's forward, loss and backward, no optimizer update, as the PyTorch
// competitor strong_baseline.py measures it) or phase step (cuda_trainer: the same plus the
// gradient norm, clipping and AdamW, the whole training state on the GPU). Random weights
// initialised on the GPU, random tokens; per length a fresh trainer, one warm-up step, then N
// timed steps (medians). Attention dense, or page-sparse (--sparse-budget: the selection on the
// GPU, page_selector.cuh; a budget that covers every past page at a length runs that length
// dense, and says so). One JSON line per measured point (the results format of issues 11 and 13,
// docs/benchmarks.md "Trainer step against PyTorch"), progress on stderr.
// SPDX-License-Identifier: Apache-2.0
//
// Memory: peak_gpu_bytes is the device memory the process holds above a baseline taken once the
// CUDA context and cuBLASLt are up and before the weights are allocated (cudaMemGetInfo's used
// bytes), sampled after every chunk of both stages and at the end of each step. Every allocation
// on this path is a cudaMalloc held until freed (no caching allocator), so the samples at the
// chunk edges see the high-water mark (see the doc for what they can miss).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <oomb/core/error.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/page_transfer.cuh>
#include <oomb/cuda/stream.hpp>
#include <oomb/offload/belady_eviction.hpp>
#include <oomb/offload/parallel_copier.hpp>

#include "trainer/algo/chunk_recurrent.hpp"
#include "trainer/app/options.hpp"
#include "trainer/app/sparse_flags.hpp"
#include "trainer/cuda/cuda_ops.cuh"
#include "trainer/cuda/device_init.cuh"
#include "trainer/cuda/device_params.cuh"
#include "trainer/cuda/ops/gemm.cuh"
#include "trainer/io/config.hpp"
#include "trainer/trainers/cuda_trainer.cuh"
#include "trainer/trainers/memory_plan.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using oomb_trainer::chunk_options;
using oomb_trainer::model_config;
using json = nlohmann::json;

constexpr double gib = double(1u << 30);

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

const char* usage =
    "usage: bench_trainer --config MODEL.json --lengths N[,N...] [options]\n"
    "  --phase fwd_bwd|step fwd_bwd: loss and gradients only; step: with norm, clip and AdamW (state split as the plan says) [fwd_bwd]\n"
    "  --chunk C[,C...]     tokens per chunk (a multiple of --page; several: one row per chunk)   [8192]\n"
    "  --page P             tokens per K/V page (the Hopper attention kernels need >= 128)        [128]\n"
    "  --window-pages W     pages per attention window (0: one window per layer in place, near/2 with offload) [0]\n"
    "  --offload            K/V and gradient pages at home in pinned host memory, streamed through device slots\n"
    "  --near-pages K       device slots per tier with --offload (0: default_near_pages, as oomb-train)  [0]\n"
    "  --grad-homes F       gradient homes with --offload: fp32, bf16 or bf16-stochastic (half the pinned bytes,\n"
    "                       converted on the GPU)                                                [fp32]\n"
    "  --attention-kernels K  automatic (the Hopper kernels where they apply) or portable\n"
    "  --home-memory M      where the homes live with --offload: pinned, or pageable (through pinned staging:\n"
    "                       no GPU memory for the driver's mapping of pinned pages)             [pinned]\n"
    "  --keep-attention-outputs  keep stage 1's attention outputs for stage 2 (no attention recompute)\n"
    "  --no-prefetch-last-selection  sparse with offload: stage 1 does not prefetch the last chunk's selection\n"
    "  --deterministic           the attention backward adds dQ in key block order (the same bits every run)\n"
    "  --sparse-budget B    page-sparse attention: each tile of --tile queries attends B scored past pages (a\n"
    "                       length where B + S + L covers every past page runs dense, and its row says why)\n"
    "  --sink S             ... plus the first S pages (needs --sparse-budget)                    [1]\n"
    "  --local L            ... plus the L most recent past pages (needs --sparse-budget)         [1]\n"
    "  --tile Q             queries per selection tile, times the GQA group a multiple of 128 (needs --sparse-budget) [128]\n"
    "  --scoring K          quest (Quest's upper bound) or mean (mean key) (needs --sparse-budget) [quest]\n"
    "  --split              time the backend's ops by kind on the device (two tiny launches per op) and\n"
    "                       write the last timed step's split_s (seconds per kind) into the row, and\n"
    "                       for sparse attention scoring_s (its selection kind)\n"
    "  --reps N             timed steps per point after the warm-up (0: 3 if the first took < 10 s, else 1) [0]\n"
    "  --warmup-tokens T    the warm-up step's length, on the point's own trainer (0: the point's length)  [0]\n"
    "  --deadline-s S       skip the points that would end later than S s after the start (0: none) [0]\n"
    "  --jsonl FILE         append the rows to FILE (they are printed on stdout either way)\n"
    "  --seed N             weights and tokens                                                     [1]\n"
    "  --commit SHA         recorded in each row                                             [unknown]\n"
    "  --model NAME         the row's model name                        [the config's file name, no .json]\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "bench_trainer: %s (--help lists the options)\n", what.c_str());
  std::exit(2);
}

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t lo, std::int64_t hi) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) usage_error(flag + ": '" + text + "' is not an integer");
  if (v < lo || v > hi)
    usage_error(flag + ": " + text + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string::npos ? text.size() : comma;
    out.push_back(parse_int(flag, text.substr(start, end - start), lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

struct bench_options {
  std::string config_path, model, jsonl, commit = "unknown", phase = "fwd_bwd";
  std::vector<std::int64_t> lengths, chunks{8192};
  std::int32_t page = 128, window_pages = 0, near_pages = 0;
  bool offload = false;
  oomb_trainer::page_home_format grad_homes = oomb_trainer::page_home_format::same;  ///< --grad-homes
  oomb_trainer::home_memory homes = oomb_trainer::home_memory::pinned;               ///< --home-memory
  oomb::attention::kernel_choice kernels = oomb::attention::kernel_choice::automatic;  ///< --attention-kernels
  bool keep = false;  ///< keep_attention_outputs
  bool prefetch_last_selection = true;  ///< chunk_options::prefetch_last_selection
  bool deterministic = false;  ///< chunk_options::deterministic
  bool split = false;  ///< chunk_options::time_ops: the row's split_s
  bool sparse = false;  ///< --sparse-budget given
  std::int32_t budget = 0, sink = 1, local = 1, tile = 128;
  oomb::score_kind score = oomb::score_kind::quest;
  std::string shape_flag;  ///< the last of --sink / --local / --tile / --scoring given
  int reps = 0;
  std::int64_t warmup_tokens = 0;
  double deadline_s = 0;
  std::uint64_t seed = 1;

  /// The trainer's options for one chunk size (near slots resolved).
  chunk_options trainer_options(std::int64_t chunk) const {
    chunk_options o;
    o.chunk = static_cast<std::int32_t>(chunk);
    o.page = page;
    o.window_pages = window_pages;
    o.offload = offload;
    o.grad_homes = grad_homes;
    o.homes = homes;
    o.attention_kernels = kernels;
    o.keep_attention_outputs = keep;
    o.prefetch_last_selection = prefetch_last_selection;
    o.deterministic = deterministic;
    o.time_ops = split;
    o.sparse = sparse;
    o.budget = budget;
    o.sink = sink;
    o.local = local;
    o.tile = tile;
    o.score = score;
    if (offload) o.near_pages = near_pages > 0 ? near_pages : oomb_trainer::default_near_pages(o);
    return o;
  }
};

bench_options parse(int argc, char** argv) {
  bench_options o;
  constexpr std::int64_t i32 = std::numeric_limits<std::int32_t>::max();
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else if (flag == "--config") {
      o.config_path = value();
    } else if (flag == "--lengths") {
      o.lengths = parse_list(flag, value(), 2, i32);
    } else if (flag == "--phase") {
      o.phase = value();
      if (o.phase != "fwd_bwd" && o.phase != "step") usage_error("--phase: '" + o.phase + "' is not fwd_bwd or step");
    } else if (flag == "--chunk") {
      o.chunks = parse_list(flag, value(), 1, std::int64_t(1) << 20);
    } else if (flag == "--page") {
      o.page = static_cast<std::int32_t>(parse_int(flag, value(), 1, i32));
    } else if (flag == "--window-pages") {
      o.window_pages = static_cast<std::int32_t>(parse_int(flag, value(), 0, i32));
    } else if (flag == "--offload") {
      o.offload = true;
    } else if (flag == "--grad-homes") {
      try {
        o.grad_homes = oomb_trainer::parse_grad_homes(flag, value());
      } catch (const oomb::invalid_argument& e) {
        usage_error(e.what());
      }
    } else if (flag == "--home-memory") {
      try {
        o.homes = oomb_trainer::parse_home_memory(flag, value());
      } catch (const oomb::invalid_argument& e) {
        usage_error(e.what());
      }
    } else if (flag == "--attention-kernels") {
      try {
        o.kernels = oomb_trainer::parse_attention_kernels(flag, value());
      } catch (const oomb::invalid_argument& e) {
        usage_error(e.what());
      }
    } else if (flag == "--keep-attention-outputs") {
      o.keep = true;
    } else if (flag == "--no-prefetch-last-selection") {
      o.prefetch_last_selection = false;
    } else if (flag == "--deterministic") {
      o.deterministic = true;
    } else if (flag == "--split") {
      o.split = true;
    } else if (flag == "--sparse-budget") {
      o.sparse = true;
      o.budget = static_cast<std::int32_t>(parse_int(flag, value(), 0, i32));
    } else if (flag == "--sink") {
      o.sink = static_cast<std::int32_t>(parse_int(flag, value(), 0, i32));
      o.shape_flag = flag;
    } else if (flag == "--local") {
      o.local = static_cast<std::int32_t>(parse_int(flag, value(), 0, i32));
      o.shape_flag = flag;
    } else if (flag == "--tile") {
      o.tile = static_cast<std::int32_t>(parse_int(flag, value(), 1, i32));
      o.shape_flag = flag;
    } else if (flag == "--scoring") {
      const std::string kind = value();
      try {
        o.score = oomb_trainer::parse_score_kind(flag, kind);
      } catch (const oomb::invalid_argument& e) {
        usage_error(e.what());
      }
      o.shape_flag = flag;
    } else if (flag == "--near-pages") {
      o.near_pages = static_cast<std::int32_t>(parse_int(flag, value(), 0, i32));
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(parse_int(flag, value(), 0, 1000));
    } else if (flag == "--warmup-tokens") {
      o.warmup_tokens = parse_int(flag, value(), 0, i32);
    } else if (flag == "--deadline-s") {
      o.deadline_s = static_cast<double>(parse_int(flag, value(), 0, 1 << 30));
    } else if (flag == "--jsonl") {
      o.jsonl = value();
    } else if (flag == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_int(flag, value(), 0, std::numeric_limits<std::int64_t>::max()));
    } else if (flag == "--commit") {
      o.commit = value();
    } else if (flag == "--model") {
      o.model = value();
    } else {
      usage_error("unknown argument '" + flag + "'");
    }
  }
  if (o.config_path.empty()) usage_error("--config is required");
  if (o.lengths.empty()) usage_error("--lengths is required");
  if (o.near_pages > 0 && !o.offload) usage_error("--near-pages needs --offload");
  if (oomb_trainer::bf16_homes(o.grad_homes) && !o.offload) usage_error("--grad-homes bf16 needs --offload");
  if (o.homes == oomb_trainer::home_memory::pageable && !o.offload) usage_error("--home-memory pageable needs --offload");
  if (!o.prefetch_last_selection && !(o.sparse && o.offload))
    usage_error("--no-prefetch-last-selection needs --sparse-budget and --offload");
  if (o.warmup_tokens == 1) usage_error("--warmup-tokens: a sequence needs at least 2 tokens");
  try {
    oomb_trainer::check_sparse_shape_flags(o.sparse, o.shape_flag);
  } catch (const oomb::invalid_argument& e) {
    usage_error(e.what());
  }
  if (o.model.empty()) {
    const std::size_t slash = o.config_path.find_last_of('/');
    o.model = o.config_path.substr(slash == std::string::npos ? 0 : slash + 1);
    if (o.model.size() > 5 && o.model.compare(o.model.size() - 5, 5, ".json") == 0) o.model.resize(o.model.size() - 5);
  }
  return o;
}

/// Device memory the process holds above a baseline, and its high-water mark since reset().
class device_memory_probe {
 public:
  device_memory_probe() : baseline_(used()) {}
  static std::size_t used() {
    std::size_t free = 0, total = 0;
    OOMB_CUDA_CHECK(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return total - free;
  }
  std::size_t baseline() const noexcept { return baseline_; }
  std::size_t sample() {
    const std::size_t u = used();
    const std::size_t above = u > baseline_ ? u - baseline_ : 0;
    peak_ = std::max(peak_, above);
    return above;
  }
  std::size_t peak() const noexcept { return peak_; }
  void reset() { peak_ = 0; }

 private:
  std::size_t baseline_;
  std::size_t peak_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Parameters whose products the step computes: every one but the input embedding's lookup (a
/// tied model's embedding is its LM head, so it counts once).
double matmul_parameters(const model_config& c) {
  const oomb_trainer::param_layout layout(c);
  const double all = static_cast<double>(oomb_trainer::parameter_count(layout));
  return c.tie_word_embeddings ? all : all - double(c.vocab_size) * c.hidden_size;
}

/// The (query, key) pairs one layer and query head attends: dense, the causal half N(N+1)/2;
/// sparse, each chunk's own causal pairs plus, per tile, its selected past pages' keys for each of
/// its queries (`selected`: past pages summed over the step's tiles and layers; a partial last
/// tile counted whole, so at most a tile's worth high).
double attention_pairs(const chunk_options& opt, std::int64_t tokens, std::int64_t selected, std::int32_t layers) {
  const double n = static_cast<double>(tokens);
  if (!opt.sparse) return n * (n + 1) / 2;
  double own = 0;
  for (std::int64_t first = 0; first < tokens; first += opt.chunk) {
    const double c = static_cast<double>(std::min<std::int64_t>(opt.chunk, tokens - first));
    own += c * (c + 1) / 2;
  }
  return own + double(selected) * opt.page * opt.tile / layers;
}

/// The fwd_bwd step's work without recomputation: 6 multiply-adds' FLOPs per matrix parameter and
/// token, plus per layer, query head and attended (query, key) pair, 4d FLOPs forward (q.k and
/// p.v) and 8d backward (dp, dv, dq, dk).
double step_flops(const model_config& c, std::int64_t tokens, double pairs) {
  return 6.0 * matmul_parameters(c) * double(tokens) +
         12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * pairs;
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// The current GPU's name, as nvidia-smi prints it (rows before 2026-12-07 have none: plot.py says how
// it tells their machines apart).
std::string device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

// The process's peak resident set in bytes (getrusage reports KiB on Linux).
std::uint64_t peak_rss_bytes() {
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? std::uint64_t(u.ru_maxrss) * 1024 : 0;
}

void emit(const json& row, const bench_options& o) {
  const std::string line = row.dump();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (!o.jsonl.empty()) {
    std::ofstream f(o.jsonl, std::ios::app);
    f << line << '\n';
    if (!f) std::fprintf(stderr, "bench_trainer: could not append to %s\n", o.jsonl.c_str());
  }
}

/// What the tiles of a step's (chunk, layer) selections took, over those with a past.
struct selection_counts {
  double per_chunk_mean = 0;       ///< distinct past pages a chunk-layer's tiles select
  std::int64_t per_chunk_max = 0;
  double per_tile_mean = 0;        ///< past pages one tile selects
};

selection_counts count_selected(const std::vector<oomb::sparse_page_table>& tables) {
  selection_counts c;
  std::int64_t with_past = 0, distinct = 0, tiles = 0, entries = 0;
  std::vector<std::int32_t> pages;
  for (const oomb::sparse_page_table& t : tables) {
    if (t.num_entries() == 0) continue;  // the first chunk: no past
    pages = t.indices();
    std::sort(pages.begin(), pages.end());
    const auto n = static_cast<std::int64_t>(std::unique(pages.begin(), pages.end()) - pages.begin());
    ++with_past;
    distinct += n;
    c.per_chunk_max = std::max(c.per_chunk_max, n);
    tiles += t.num_tiles();
    entries += t.num_entries();
  }
  if (with_past > 0) {
    c.per_chunk_mean = double(distinct) / double(with_past);
    c.per_tile_mean = double(entries) / double(tiles);
  }
  return c;
}

/// The model's weights (bf16) and gradients (fp32) on the device, for every fwd_bwd point.
struct device_model {
  oomb_trainer::gpu::device_params<oomb::bf16> weights;
  oomb_trainer::gpu::device_params<float> grads;

  device_model(const model_config& c, std::uint64_t seed) : weights(c), grads(c) {
    // The fp32 draw goes into the gradients' memory, which the steps zero anyway: no master copy
    // is held while the steps are timed (a fwd_bwd step has no optimizer).
    oomb::cuda_stream stream;
    oomb_trainer::gpu::init_hf(grads, weights, seed, stream.view());
    OOMB_CUDA_CHECK(cudaStreamSynchronize(stream.get()), "initialising the weights");
    grads.zero();
  }
};

/// Phase fwd_bwd: chunk_recurrent over the run's device_model (Belady eviction of K/V slots, as
/// oomb-train; in place nothing is evicted).
template <class B>
class fwd_bwd_runner {
 public:
  static constexpr const char* phase = "fwd_bwd";
  static constexpr auto optimizer = oomb_trainer::optimizer_placement::host;  // for the plan: there is none

  fwd_bwd_runner(const model_config& c, const chunk_options& opt, std::int64_t tokens, std::uint64_t, device_model* m,
                 const oomb_trainer::memory_plan&)
      : m_(m), trainer_(c, opt, tokens) {}
  /// Untimed: the gradients are zeroed.
  void prepare(const oomb_trainer::sequence& s) {
    m_->grads.zero();
    seq_ = &s;
  }
  double run(const std::function<void(const oomb_trainer::chunk_progress&)>& progress) {
    return trainer_.loss_and_grad(m_->weights, m_->grads, *seq_, progress);
  }
  oomb_trainer::chunk_step_stats last_stats() const { return trainer_.last_stats(); }
  oomb_trainer::tier_memory memory() const { return trainer_.memory(); }
  /// Sparse: the last step's selections, [chunk][layer].
  const std::vector<oomb::sparse_page_table>* selections() const { return &trainer_.selections(); }

 private:
  device_model* m_;
  oomb_trainer::chunk_recurrent<B, oomb::belady_eviction> trainer_;
  const oomb_trainer::sequence* seq_ = nullptr;
};

/// Phase step: cuda_trainer's optimizer step over one sequence (its own weights, initialised on
/// the GPU; AdamW at a small constant rate, clipping at norm 1, as a real run would), its state
/// split between the GPU and pinned host memory where the plan puts it (as oomb-train does).
template <class B>
class step_runner {
 public:
  static constexpr const char* phase = "step";
  static constexpr auto optimizer = oomb_trainer::optimizer_placement::split;

  step_runner(const model_config& c, const chunk_options& opt, std::int64_t tokens, std::uint64_t seed, device_model*,
              const oomb_trainer::memory_plan& plan)
      : trainer_(setup(c, opt, tokens, plan)) {
    trainer_.init(seed);
  }
  void prepare(const oomb_trainer::sequence& s) { batch_.assign(1, s); }
  double run(const std::function<void(const oomb_trainer::chunk_progress&)>& progress) {
    oomb_trainer::step_settings st;
    st.step = steps_++;
    st.lr = 1e-5;
    st.clip = 1.0;
    return trainer_.step(batch_, st, progress).loss;
  }
  oomb_trainer::chunk_step_stats last_stats() const { return trainer_.last_stats(); }
  oomb_trainer::tier_memory memory() const { return trainer_.memory(); }
  /// cuda_trainer does not show its selections (the row then has the stats' counts only).
  const std::vector<oomb::sparse_page_table>* selections() const { return nullptr; }

 private:
  static oomb_trainer::trainer_setup setup(const model_config& c, const chunk_options& opt, std::int64_t tokens,
                                           const oomb_trainer::memory_plan& plan) {
    oomb_trainer::trainer_setup s;
    s.config = c;
    s.chunk = opt;
    s.max_tokens = tokens;
    s.optimizer_gpu_tensors = plan.optimizer_groups_on_gpu;
    return s;
  }
  oomb_trainer::cuda_trainer<B> trainer_;
  std::vector<oomb_trainer::sequence> batch_;
  std::int64_t steps_ = 0;
};

/// Measures one (length, chunk) point with Runner; returns its median step time (for the
/// deadline's forecast of the next point). `dense_because`: why a sparse request runs dense here.
template <class Runner>
double measure(const bench_options& o, const model_config& cfg, const chunk_options& opt, std::int64_t tokens,
               const std::string& dense_because, device_model* m, device_memory_probe& mem,
               const clock_type::time_point start) {
  // What trainers/memory_plan.hpp expects this point to take on the GPU (fwd_bwd: the optimizer
  // state planned on the host, since there is none; step: split where the free memory less
  // oomb-train's margin ends), beside what is measured.
  oomb_trainer::plan_target target;
  target.device = "cuda";
  target.optimizer = Runner::optimizer;
  target.gpu_bytes = std::numeric_limits<std::uint64_t>::max();
  if (Runner::optimizer == oomb_trainer::optimizer_placement::split) {
    std::size_t free = 0, total = 0;
    OOMB_CUDA_CHECK(cudaMemGetInfo(&free, &total), "bench_trainer: cudaMemGetInfo");
    target.gpu_bytes = free > oomb_trainer::gpu_memory_margin ? free - oomb_trainer::gpu_memory_margin : 0;
  }
  target.host = {std::numeric_limits<std::uint64_t>::max(), "not limited (bench_trainer)"};
  target.checkpoint_staging = false;  // the benchmark writes no checkpoint
  const oomb_trainer::memory_plan plan = oomb_trainer::plan_memory(cfg, opt, tokens, target);
  mem.reset();
  const auto t_build = clock_type::now();
  Runner trainer(cfg, opt, tokens, o.seed, m, plan);
  mem.sample();
  const double build_s = seconds_since(t_build);

  oomb_trainer::sequence seq, warm_seq;
  seq.tokens.resize(static_cast<std::size_t>(tokens));
  std::mt19937_64 rng(o.seed * 1000003u + static_cast<std::uint64_t>(tokens));
  std::uniform_int_distribution<std::int32_t> token(0, cfg.vocab_size - 1);
  for (auto& t : seq.tokens) t = token(rng);
  const std::int64_t warm_tokens = o.warmup_tokens > 0 ? std::min(o.warmup_tokens, tokens) : tokens;
  warm_seq.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + warm_tokens);

  // Per step: stage 1 ends at a device synchronisation in the callback of its last chunk (the
  // host runs ahead of the GPU otherwise), so stage1_s is the GPU's time for it.
  clock_type::time_point step_start, stage1_end;
  auto last_line = clock_type::now();
  auto progress = [&](const oomb_trainer::chunk_progress& p) {
    const std::size_t now = mem.sample();
    if (p.stage == 1 && p.chunk + 1 == p.chunks) {
      OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "end of stage 1");
      stage1_end = clock_type::now();
    }
    if (seconds_since(last_line) >= 2.0) {  // long steps: a line every 2 s
      last_line = clock_type::now();
      const std::int32_t done = p.stage == 1 ? p.chunk + 1 : p.chunks + (p.chunks - p.chunk);
      std::fprintf(stderr, "  %s %lld tokens: stage %d, chunk %d of %d (%d of %d), %.1f s (host clock), GPU %.2f GiB, peak %.2f GiB\n",
                   o.model.c_str(), static_cast<long long>(tokens), p.stage, p.chunk, p.chunks, done, 2 * p.chunks,
                   seconds_since(step_start), double(now) / gib, double(mem.peak()) / gib);
    }
  };
  struct step_result {
    double step_s, stage1_s, stage2_s, loss;
  };
  // stage2_s: from there to the end of the gradients (for phase step, the optimizer's time is
  // step_s - stage1_s - stage2_s).
  auto step = [&](const oomb_trainer::sequence& s) -> step_result {
    trainer.prepare(s);
    last_line = step_start = stage1_end = clock_type::now();
    const double loss = trainer.run(progress);
    const double t = seconds_since(step_start);
    mem.sample();
    const double t1 = std::chrono::duration<double>(stage1_end - step_start).count();
    const auto& st = trainer.last_stats();
    return {t, t1, st.stage1_seconds + st.stage2_seconds - t1, loss};
  };

  const std::string attention =
      opt.sparse ? ", sparse (budget " + std::to_string(opt.budget) + " + sink " + std::to_string(opt.sink) + " + local " +
                       std::to_string(opt.local) + ", tile " + std::to_string(opt.tile) + ", " +
                       oomb::to_string(opt.score) + ")"
                 : "";
  std::fprintf(stderr, "%s %lld tokens, chunk %d, page %d%s%s: warm-up step of %lld tokens\n", o.model.c_str(),
               static_cast<long long>(tokens), opt.chunk, opt.page, opt.offload ? ", offload" : "", attention.c_str(),
               static_cast<long long>(warm_tokens));
  const step_result warm = step(warm_seq);
  // Timed steps: --reps, or 3 when the first takes < 10 s and 1 otherwise; never one that the
  // deadline would cut (the first always runs).
  std::vector<double> step_s, stage1_s, stage2_s, exposed_s;
  oomb_trainer::op_seconds split_last{};
  std::uint64_t h2d = 0, d2h = 0;
  double loss = 0;
  // Only the timed steps are profiled under `nsys --capture-range=cudaProfilerApi` (split.sh).
  OOMB_CUDA_CHECK(cudaProfilerStart(), "bench_trainer: cudaProfilerStart");
  for (int reps = o.reps;;) {
    const step_result s = step(seq);
    step_s.push_back(s.step_s);
    stage1_s.push_back(s.stage1_s);
    stage2_s.push_back(s.stage2_s);
    exposed_s.push_back(trainer.last_stats().exposed_transfer_seconds);
    split_last = trainer.last_stats().op_time;
    h2d = trainer.last_stats().bytes_to_near;  // the last timed step's
    d2h = trainer.last_stats().bytes_to_far;
    loss = s.loss;
    if (reps == 0) reps = s.step_s < 10.0 ? 3 : 1;
    std::fprintf(stderr, "  step %zu of %d: %.3f s (stage 1 %.3f s, stage 2 %.3f s, exposed transfers %.3f s), loss %.4f\n",
                 step_s.size(), reps, s.step_s, s.stage1_s, s.stage2_s, exposed_s.back(), s.loss);
    if (static_cast<int>(step_s.size()) >= reps) break;
    if (o.deadline_s > 0 && seconds_since(start) + s.step_s > o.deadline_s) break;
  }
  OOMB_CUDA_CHECK(cudaProfilerStop(), "bench_trainer: cudaProfilerStop");
  const int reps = static_cast<int>(step_s.size());
  const auto tiers = trainer.memory();
  const double t = median(step_s);

  json row;
  row["system"] = "oomb";
  row["model"] = o.model;
  row["tokens"] = tokens;
  row["attention"] = opt.sparse ? "sparse" : "dense";
  row["phase"] = Runner::phase;
  row["step_s"] = t;
  row["tok_per_s"] = double(tokens) / t;
  row["peak_gpu_bytes"] = mem.peak();
  // Pinned host memory: the far pools' slabs with pinned homes (their staging rings with pageable
  // ones), and (sparse) the page summaries' home, as planned (the backend's upload ring, >= 1 MiB
  // pinned, is not visible from here and is left out). Pageable homes: pageable_host_bytes.
  const bool pageable = opt.offload && opt.homes == oomb_trainer::home_memory::pageable;
  const std::uint64_t homes = opt.offload ? tiers.far_kv_reserved + tiers.far_grad_reserved + tiers.far_outputs_reserved : 0;
  row["host_bytes"] = (pageable ? plan.on_host(oomb_trainer::plan_part::home_staging) : homes) +
                      (opt.sparse ? plan.on_host(oomb_trainer::plan_part::sparse_summaries) : std::uint64_t(0));
  row["pageable_host_bytes"] = pageable ? homes : 0;
  row["home_memory"] = oomb_trainer::home_memory_name(opt.homes);
  row["attention_kernels"] = oomb_trainer::attention_kernels_name(opt.attention_kernels);
  // The threads copying pageable homes: one shared copier for every staged transfer since 2026-12-06
  // (before: 8 per transfer; rows then said 8).
  if (pageable) {
    row["home_copy_threads"] = oomb::parallel_copier::shared().threads();
    row["home_copier"] = "shared";
  }
  row["h2d_bytes"] = h2d;
  row["d2h_bytes"] = d2h;
  // The compute stream's waits for page copies, timed on the device (0 in place: nothing moves).
  row["exposed_transfer_s"] = median(exposed_s);
  row["commit"] = o.commit;
  row["date"] = utc_date();
  row["device"] = device_name();
  row["chunk"] = opt.chunk;
  row["page"] = opt.page;
  row["window_pages"] = opt.window_pages;
  row["offload"] = opt.offload;
  row["grad_homes"] = oomb_trainer::grad_homes_name(opt.grad_homes);
  row["near_pages"] = opt.near_pages;
  row["keep_attention_outputs"] = opt.keep_attention_outputs;
  if (opt.sparse && opt.offload) row["prefetch_last_selection"] = opt.prefetch_last_selection;
  row["deterministic"] = opt.deterministic;
  const oomb_trainer::chunk_step_stats last = trainer.last_stats();  // the last timed step's
  if (opt.sparse) {
    row["budget"] = opt.budget;
    row["sink"] = opt.sink;
    row["local"] = opt.local;
    row["tile"] = opt.tile;
    row["scoring"] = oomb::to_string(opt.score);
    // The page summaries' pinned home (every page id of the context, page_selector.cuh) and the
    // device store one layer's past is gathered into for scoring, as planned.
    row["summary_bytes"] = plan.on_host(oomb_trainer::plan_part::sparse_summaries);
    row["summary_gathered_bytes"] = plan.on_gpu(oomb_trainer::plan_part::sparse_gathered);
    // The selector's device work (summaries, scoring, top-k) by the op clock; needs --split.
    if (opt.time_ops) row["scoring_s"] = split_last[static_cast<std::size_t>(oomb_trainer::op_kind::selection)];
    if (last.sparse_pages_candidate > 0)
      row["pages_selected_fraction"] = double(last.sparse_pages_selected) / double(last.sparse_pages_candidate);
    if (last.sparse_pages_predicted > 0) {  // offload: stage 1's prefetch on the last chunk's selection
      row["pages_predicted"] = last.sparse_pages_predicted;
      row["pages_predicted_used_fraction"] = double(last.sparse_pages_predicted_used) / double(last.sparse_pages_predicted);
    }
    if (const auto* tables = trainer.selections()) {
      const selection_counts c = count_selected(*tables);
      row["pages_selected_per_chunk"] = c.per_chunk_mean;
      row["pages_selected_per_chunk_max"] = c.per_chunk_max;
      row["pages_selected_per_tile"] = c.per_tile_mean;
    }
  } else if (!dense_because.empty()) {
    row["dense_because"] = dense_because;
  }
  // Gradient page pairs alive at once in the far tier (stage 2's peak: they are released as they complete).
  row["live_grad_pages_peak"] = last.grad_pages_high_water;
  // The host's time in the last timed step's attention work (paged_attention's calls, by part):
  // next to split_outside_ops_s it says whether the GPU waited for the host.
  const oomb_trainer::attention_host_seconds& h = last.attention_host;
  row["attention_host_s"] = {{"residency", h.residency}, {"kernels", h.kernels}, {"selection", h.selection},
                             {"selection_wait", h.selection_wait}, {"total", h.total}};
  if (opt.time_ops) {
    // The last timed step's GPU time per kind of op, and what no op accounts for (host work,
    // transfer waits between ops, the optimizer with --phase step).
    json split = json::object();
    double in_ops = 0;
    for (int k = 0; k < oomb_trainer::op_kinds; ++k) {
      const double t = split_last[static_cast<std::size_t>(k)];
      split[oomb_trainer::op_kind_name(static_cast<oomb_trainer::op_kind>(k))] = t;
      in_ops += t;
    }
    row["split_s"] = split;
    row["split_outside_ops_s"] = step_s.back() - in_ops;
  }
  row["tflops"] =
      step_flops(cfg, tokens, attention_pairs(opt, tokens, last.sparse_pages_selected, cfg.num_hidden_layers)) / t / 1e12;
  row["stage1_s"] = median(stage1_s);
  row["stage2_s"] = median(stage2_s);
  row["step_s_all"] = step_s;
  row["reps"] = reps;
  row["warmup_s"] = warm.step_s;
  row["warmup_tokens"] = warm_tokens;
  row["build_s"] = build_s;
  row["loss"] = loss;
  row["baseline_gpu_bytes"] = mem.baseline();
  row["planned_gpu_bytes"] = plan.gpu_total();
  row["planned_gpu_growth_per_10k"] = plan.gpu_growth_per_10k;
  // Host memory: what the plan says this point holds (homes, staging, and for phase step the
  // optimizer state the plan puts on the host: fwd_bwd allocates none, so its lines are left out),
  // and the process's peak resident set so far (Linux ru_maxrss: it only grows, so in a sweep it is
  // the largest point's, model and tokens included).
  const bool has_optimizer = std::string(Runner::phase) == "step";
  row["planned_host_bytes"] = plan.host_total() - (has_optimizer ? 0
                                                   : plan.on_host(oomb_trainer::plan_part::optimizer) +
                                                         plan.on_host(oomb_trainer::plan_part::checkpoint_staging));
  row["peak_host_rss_bytes"] = peak_rss_bytes();
  const std::size_t elements = oomb_trainer::param_layout(cfg).total();  // as allocated, with the padding
  row["weights_bytes"] = elements * sizeof(oomb::bf16);
  row["grads_bytes"] = elements * sizeof(float);
  row["activation_bytes"] = tiers.activation_bytes;
  row["near_bytes"] = tiers.near_bytes;
  row["far_kv_reserved_bytes"] = tiers.far_kv_reserved;
  row["far_grad_reserved_bytes"] = tiers.far_grad_reserved;
  emit(row, o);
  return t;
}

template <class Runner>
void run_all(const bench_options& o, const model_config& cfg, device_model* m, device_memory_probe& mem,
             const clock_type::time_point start) {
  for (const std::int64_t chunk : o.chunks) {
    const chunk_options opt = o.trainer_options(chunk);
    double last_s = 0;
    std::int64_t last_tokens = 0;
    for (const std::int64_t tokens : o.lengths) {
      json status{{"system", "oomb"}, {"model", o.model}, {"tokens", tokens}, {"chunk", chunk}, {"phase", Runner::phase}};
      // A budget that covers every past page at this length is dense attention: said once, run dense.
      chunk_options point = opt;
      std::string dense_because;
      if (point.sparse && oomb_trainer::sparse_covers_past(point, tokens)) {
        dense_because = oomb_trainer::sparse_covers_past_reason(point, tokens);
        std::fprintf(stderr, "bench_trainer: %s; running %lld tokens dense\n", dense_because.c_str(),
                     static_cast<long long>(tokens));
        point.sparse = false;
      }
      if (o.deadline_s > 0 && last_tokens > 0) {
        // Forecast: a dense step grows at most quadratically with the length, a sparse one about
        // linearly (attention bounded per tile) plus its scoring's small quadratic term: ratio^1.5.
        // The warm-up and one step.
        const double ratio = double(tokens) / double(last_tokens);
        const double growth = point.sparse ? ratio * std::sqrt(ratio) : ratio * ratio;
        const double warm = o.warmup_tokens > 0 ? double(std::min(o.warmup_tokens, tokens)) / double(tokens) : 1.0;
        const double forecast = (1.0 + (point.sparse ? warm : warm * warm)) * last_s * growth;
        if (seconds_since(start) + forecast > o.deadline_s) {
          status["skipped"] = "deadline";
          status["forecast_s"] = forecast;
          std::fprintf(stderr, "%s\n", status.dump().c_str());
          continue;
        }
      }
      try {
        last_s = measure<Runner>(o, cfg, point, tokens, dense_because, m, mem, start);
        last_tokens = tokens;
      } catch (const oomb::out_of_memory& e) {
        status["oom"] = true;
        status["error"] = e.what();
        std::fprintf(stderr, "%s\n", status.dump().c_str());
        break;  // longer sequences need more
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench_options o = parse(argc, argv);
  try {
    const auto start = clock_type::now();
    const model_config cfg = oomb_trainer::load_model_config(o.config_path);
    for (const std::int64_t chunk : o.chunks) o.trainer_options(chunk).validate();  // before any allocation
    if (o.sparse) oomb_trainer::check_gpu_sparse_tile(o.tile, cfg.num_attention_heads, cfg.num_key_value_heads);
    OOMB_CUDA_CHECK(cudaSetDevice(0), "bench_trainer needs a CUDA GPU");
    OOMB_CUDA_CHECK(cudaFree(nullptr), "creating the CUDA context");
    const oomb_trainer::gpu::ops::gemm_context cublas_up(0);  // cuBLASLt loaded and initialised before the baseline
    device_memory_probe mem;
    std::fprintf(stderr, "bench_trainer: %s, baseline %.2f GiB of device memory in use (context, cuBLASLt)\n",
                 o.model.c_str(), double(mem.baseline()) / gib);
    if (o.phase == "step") {  // each point's cuda_trainer holds and initialises its own weights
      if (o.offload && o.homes == oomb_trainer::home_memory::pageable)
        run_all<step_runner<oomb_trainer::cuda_pageable_offload_ops>>(o, cfg, nullptr, mem, start);
      else if (o.offload)
        run_all<step_runner<oomb_trainer::cuda_offload_ops>>(o, cfg, nullptr, mem, start);
      else
        run_all<step_runner<oomb_trainer::cuda_ops>>(o, cfg, nullptr, mem, start);
      return 0;
    }
    const auto t_init = clock_type::now();
    device_model m(cfg, o.seed);
    std::fprintf(stderr, "bench_trainer: weights initialised on the GPU in %.2f s\n", seconds_since(t_init));
    if (o.offload && o.homes == oomb_trainer::home_memory::pageable)
      run_all<fwd_bwd_runner<oomb_trainer::cuda_pageable_offload_ops>>(o, cfg, &m, mem, start);
    else if (o.offload)
      run_all<fwd_bwd_runner<oomb_trainer::cuda_offload_ops>>(o, cfg, &m, mem, start);
    else
      run_all<fwd_bwd_runner<oomb_trainer::cuda_ops>>(o, cfg, &m, mem, start);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
