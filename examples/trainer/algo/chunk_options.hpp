// oomb trainer — the chunk-recurrent path's options, and what a step reports.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <oomb/attention/plan.hpp>
#include <oomb/core/error.hpp>
#include <oomb/paging/page_shape.hpp>
#include <oomb/sparse/scoring.hpp>

#include "trainer/io/config.hpp"
#include "trainer/model/block.hpp"
#include "trainer/ops/op_kind.hpp"
#include "trainer/ops/ops_backend.hpp"

namespace oomb_trainer {

/// What a streamed tier's homes hold: the slots' own elements, or bf16 (converted on the way).
enum class page_home_format {
  same,  ///< as computed: fp32 gradient pages on the GPU, the backend's G on the CPU (--grad-homes fp32)
  bf16,  ///< bf16, rounded to nearest even on write-back, exact on bring-near (--grad-homes bf16)
  bf16_stochastic,  ///< bf16, rounded stochastically on write-back (--grad-homes bf16-stochastic)
};

/// True for the formats whose homes hold bf16.
inline bool bf16_homes(page_home_format f) noexcept { return f != page_home_format::same; }

/// Where a streamed tier's homes live on a GPU (the CPU's homes are host memory either way).
enum class home_memory {
  pinned,    ///< page-locked: the copy engines reach them directly; the driver keeps 8 bytes of device
             ///< memory per pinned 4 KiB, so the GPU's memory grows with the context (--home-memory pinned)
  pageable,  ///< ordinary host memory, moved through a fixed pinned staging ring by host threads: nothing
             ///< on the GPU grows with the homes (--home-memory pageable; oomb/cuda/staged_page_transfer.cuh)
};

/// How the chunk-recurrent path runs.
struct chunk_options {
  std::int32_t chunk = 256;        ///< tokens per chunk: a multiple of `page`
  std::int32_t page = 16;          ///< tokens per page: a power of two >= 16
  oomb::kv_layout layout = oomb::kv_layout::head_major;
  /// Needed pages per attention window; 0 = one window per layer (no offload), or near_pages / 2
  /// with offload (one window computing while the next one streams in).
  std::int32_t window_pages = 0;
  bool offload = false;            ///< stream pages through near-tier slots (else read them in place)
  std::int32_t near_pages = 0;     ///< near-tier slots for K/V pages, and as many for gradient pages
  /// The gradient pages' homes (offload only): bf16 halves their host bytes (fp32 on the GPU);
  /// the near slots still accumulate in the gradient type, each write-back rounds once.
  page_home_format grad_homes = page_home_format::same;
  /// Where the homes of every streamed tier live (offload on a GPU): K/V, gradients, kept outputs.
  home_memory homes = home_memory::pinned;
  bool sparse = false;             ///< page-sparse attention over the past (oomb's selection)
  std::int32_t budget = 0, sink = 1, local = 1;
  std::int32_t tile = 128;         ///< queries per selection tile
  oomb::score_kind score = oomb::score_kind::quest;
  /// Keep each layer's attention output and lse from stage 1 (in the far tier: pinned host memory
  /// with offload, compute memory in place) and read them back in stage 2 instead of attending
  /// again: one block of chunk * hq * d values + hq * chunk stats per (layer but the last, chunk).
  /// Saves the recomputation's attention forward, which costs O(context) per chunk, for memory
  /// that grows linearly with the context. The results are the same bits (the forward is
  /// deterministic and its inputs are the same in both stages).
  bool keep_attention_outputs = false;
  /// Sparse with offload, stage 1: before a layer's selection is known, prefetch the pages the
  /// previous chunk selected in that layer (paged_attention::predict); no effect otherwise. On an
  /// H100 (the 7B, budget 64, pageable homes) it took the step at 128K from 22.74 to 21.04 s and at
  /// 256K from 50.28 to 44.96 s, 79-84% of the guessed pages then selected (docs/sparse.md).
  bool prefetch_last_selection = true;
  /// Time the backend's ops by kind (backends with an op clock, ops_backend.hpp): each op costs
  /// two tiny timer launches, so it is for measuring (bench_trainer --split), off by default.
  bool time_ops = false;
  /// Which attention kernels the CUDA backend plans with (--attention-kernels): the Hopper ones where
  /// they apply, or always the portable ones. The CPU backend has one (the reference).
  oomb::attention::kernel_choice attention_kernels = oomb::attention::kernel_choice::automatic;
  /// The same bits on every run (--deterministic): the CUDA backend plans its attention backward
  /// deterministic (plan_options::deterministic: dQ in key block order, no query split); every other
  /// GPU sum and the CPU backend are in a fixed order already.
  bool deterministic = false;

  void validate() const {
    oomb::page_shape{page, 1, 2, layout}.validate();
    OOMB_EXPECTS(chunk > 0 && chunk % page == 0, "chunk size ", chunk, " must be a positive multiple of the page size ", page);
    OOMB_EXPECTS(window_pages >= 0, "window_pages must not be negative, got ", window_pages);
    OOMB_EXPECTS(offload || grad_homes == page_home_format::same,
                 "--grad-homes bf16 needs --offload (either rounding): in place the kernels add into the gradient pages themselves, which "
                 "stay in the gradient type");
    OOMB_EXPECTS(offload || homes == home_memory::pinned,
                 "--home-memory pageable needs --offload: without it the pages live in the GPU's memory, not in homes");
    if (offload) {
      OOMB_EXPECTS(near_pages >= chunk / page, "--near-pages ", near_pages, " is too small: the near tier must hold a chunk's ",
                   chunk / page, " pages of one layer (chunk ", chunk, " / page ", page, ")");
      OOMB_EXPECTS(window_pages == 0 || 2 * window_pages <= near_pages, "window of ", window_pages,
                   " pages needs ", 2 * window_pages, " near slots (one window computing, the next streaming), the near tier has ",
                   near_pages);
      OOMB_EXPECTS(near_pages >= 2, "the near tier needs at least 2 slots, got ", near_pages);
    }
    if (sparse) {
      OOMB_EXPECTS(budget >= 0 && sink >= 0 && local >= 0, "sparse budget/sink/local must not be negative (", budget, "/", sink,
                   "/", local, ")");
      OOMB_EXPECTS(tile > 0, "selection tile must be positive, got ", tile);
    }
  }
  std::int32_t effective_window() const noexcept {
    return window_pages > 0 ? window_pages : offload ? near_pages / 2 : std::numeric_limits<std::int32_t>::max();
  }
};

/// The near tier's slots per pool when offload is on and near_pages is 0: two windows, one
/// computing while the next streams in, each window as many needed pages as near_pages / 2.
/// Dense: twice a chunk's pages per window, at least 128 (a window's fixed costs, its launches and
/// its merge, amortised over more keys). Sparse: a window holds the chunk's own pages and 16
/// (B + S + L) selected past ones. A (chunk, layer) of Qwen2.5-0.5B selected 12-14 (B + S + L)
/// distinct past pages on average and 19 at most (2M-4M tokens, 128 tiles a chunk), so most
/// (chunk, layer)s run as one window: on the H200 that took the 2M-token sparse step from 111.8 s
/// (512 slots, ~7 windows) to 88.5 s (2,304 slots), since each window's kernels launch over its
/// whole range of pages and merge the chunk's whole output (docs/benchmarks.md).
inline std::int32_t default_near_pages(const chunk_options& o) {
  const std::int32_t own = o.chunk / o.page;
  const std::int32_t window = o.sparse ? own + 16 * (o.budget + o.sink + o.local) : std::max(2 * own, 128);
  return 2 * window;
}

/// The largest chunk a run of `max_tokens` tokens asks of its backend: a chunk's rows, and window
/// tables of at most min(pages of a layer, the window) entries (paged_attention's windows).
inline chunk_shape chunk_shape_of(const model_config& c, const chunk_options& o, std::int64_t max_tokens) {
  const std::int64_t pages_per_layer = (max_tokens + o.page - 1) / o.page;
  return chunk_shape{block_dims(c), c.vocab_size, std::min<std::int64_t>(o.chunk, max_tokens),
                     std::min<std::int64_t>(pages_per_layer, o.effective_window())};
}

/// Where a step is, for progress reports within long steps.
struct chunk_progress {
  int stage = 1;              ///< 1 or 2
  std::int32_t chunk = 0;     ///< the chunk just finished
  std::int32_t chunks = 0;
};

/// The host's time in a step's attention work, by part (seconds of the host thread's wall clock).
/// On a GPU the calls enqueue work, so these are the host's costs of driving it (and the one wait
/// per (chunk, layer) of sparse selection); on the CPU backend the calls compute, so `kernels` is
/// the attention itself.
struct attention_host_seconds {
  double residency = 0;       ///< the page tiers' prefetch, acquire, release, write_back, discard, expect, drain
  double kernels = 0;         ///< the backend's attention_*, write_pages and add_from_pages calls
  double selection = 0;       ///< the selector's summarize and select, its wait included
  double selection_wait = 0;  ///< of selection: blocked in that wait (selectors that report it; else 0)
  double total = 0;           ///< every paged_attention call: the above and its own bookkeeping
};

/// What one step did.
struct chunk_step_stats {
  double loss = 0;
  std::int64_t tokens = 0;
  double stage1_seconds = 0, stage2_seconds = 0;
  std::uint64_t bytes_to_near = 0, bytes_to_far = 0;  ///< K/V and gradient pages, both directions
  /// Time the compute stream waited for page transfers (backends with a transfer-wait probe,
  /// streamed tiers only; 0 otherwise).
  double exposed_transfer_seconds = 0;
  std::int32_t kv_pages_high_water = 0;    ///< far tier: K/V page pairs in use at most
  std::int32_t grad_pages_high_water = 0;  ///< far tier: gradient page pairs in use at most
  std::int64_t sparse_pages_selected = 0;  ///< sum over tiles of selected past pages
  std::int64_t sparse_pages_candidate = 0; ///< sum over tiles of past pages
  /// Offload, stage 1: distinct pages prefetched on the last chunk's selection before a selection
  /// was known, and of them the pages then selected (paged_attention::predict).
  std::int64_t sparse_pages_predicted = 0;
  std::int64_t sparse_pages_predicted_used = 0;
  /// GPU time per op_kind (chunk_options::time_ops with a backend that has an op clock; else 0).
  op_seconds op_time{};
  /// Host time in the attention work (always measured: a few clock reads per call).
  attention_host_seconds attention_host{};
};

/// Bytes each tier holds.
struct tier_memory {
  std::size_t kv_pair_bytes = 0, grad_pair_bytes = 0;
  std::size_t far_kv_reserved = 0, far_grad_reserved = 0;  ///< host memory taken by the far pools
  std::int32_t far_kv_in_use = 0, far_grad_in_use = 0;     ///< page pairs now
  std::int32_t near_kv_slots = 0, near_grad_slots = 0;
  std::size_t near_bytes = 0;                              ///< both near pools (fixed)
  std::size_t activation_bytes = 0;                        ///< one chunk's activations, all layers
  std::size_t far_outputs_reserved = 0;  ///< keep_attention_outputs: the far tier's blocks (near slots in near_bytes)
};

}  // namespace oomb_trainer
