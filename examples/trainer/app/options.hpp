// oomb trainer — the command line of oomb-train: options, parsing, --help.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/algo/chunk_options.hpp"
#include "trainer/app/sparse_flags.hpp"
#include "trainer/data/token_sequences.hpp"
#include "trainer/io/hf_export.hpp"
#include "trainer/optim/schedule.hpp"
#include "trainer/trainers/memory_plan.hpp"

namespace oomb_trainer {

/// Everything oomb-train takes (see help_text()).
struct train_options {
  std::string config, data, synthetic, init, resume, out, dump_grads;
  packing_kind packing = packing_kind::none;  ///< --packing: consecutive windows of --data, or its documents packed
  std::int64_t seq_len = 0;
  double rope_theta = 0.0;   ///< --rope-theta: overrides the config's; 0: the config's
  std::string rope_scaling;  ///< --rope-scaling: a JSON object as HF's rope_scaling, or "none"; empty: the config's
  std::int32_t batch = 1;  ///< sequences per optimizer step (gradient accumulation)
  std::int32_t chunk = 0;
  std::int32_t page = 16;
  bool sparse = false;
  std::int32_t budget = 0, sink = 1, local = 1, tile = 128;
  oomb::score_kind scoring = oomb::score_kind::quest;  ///< how a tile scores its past pages
  bool offload = false;
  std::int32_t near_pages = 0;    ///< 0 with --offload: default_near_pages (chunk_options.hpp)
  std::int32_t window_pages = 0;  ///< 0: near_pages / 2 with offload, one window without
  page_home_format grad_homes = page_home_format::same;  ///< --grad-homes: the gradient pages' homes (offload)
  home_memory homes = home_memory::pinned;  ///< --home-memory: where the homes live (offload, cuda)
  oomb::attention::kernel_choice attention_kernels = oomb::attention::kernel_choice::automatic;  ///< --attention-kernels
  bool deterministic = false;  ///< --deterministic: the same bits on every run (chunk_options::deterministic)
  std::int64_t steps = 0;
  std::string eval_data;             ///< --eval-data: held-out token file (empty: none; synthetic runs hold out their own)
  std::int64_t eval_every = 0;       ///< --eval-every: evaluate after every N steps (0: at the end only)
  std::int32_t eval_sequences = 1;   ///< --eval-sequences: held-out sequences of --seq-len per evaluation
  double lr = 1e-3, min_lr = -1.0;  ///< min_lr < 0: lr / 10
  std::int64_t warmup = 0;
  double weight_decay = 0.0, clip = 1.0;
  lr_schedule_kind schedule = lr_schedule_kind::cosine;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;  ///< adamw_options' defaults
  std::uint64_t seed = 1234;
  std::int64_t save_every = 0;  ///< 0: only at the end
  checkpoint_layout save_format = checkpoint_layout::oomb;  ///< --save-format: the checkpoint-<step> folders' layout
  std::string save_dtype;         ///< --save-dtype of HF folders: "bfloat16" or "float32"; empty: bfloat16
  std::uint64_t save_shard_size = 0;  ///< --save-shard-size of HF folders; 0: hf_default_max_shard_bytes
  std::string export_dir;         ///< --export: an HF model folder written when the run reaches --steps
  std::int64_t stop_after = 0;  ///< stop (and save) after this many steps of this run; 0: run to --steps
  std::int32_t kv_keys = 8, kv_values = 6, kv_queries = 8;  ///< --synthetic kv-recall's shape
  bool keep_attention_outputs = false;  ///< stage 2 reads stage 1's attention outputs instead of attending again
  bool prefetch_last_selection = true;  ///< sparse with offload (--no-prefetch-last-selection: off)
  bool full_backprop = false;
  std::string device = "cpu";  ///< where the training state lives and the step runs: "cpu" or "cuda"
  std::uint64_t host_memory = 0;  ///< bytes the run may take on the host; 0: host_memory_default()
  std::uint64_t gpu_memory = 0;   ///< bytes the run may take on the GPU; 0: free memory less a margin (cuda)
  std::int64_t optimizer_gpu_memory = -1;  ///< most bytes of optimizer state on the GPU (cuda); -1: all that fits
  std::int32_t keep_last = 2;     ///< checkpoint-<step> folders kept
  bool plan = false;              ///< print the memory plan and exit
  bool quiet = false;
  bool debug = false;             ///< errors keep the source locations the library's messages carry
  bool help = false;

  double effective_min_lr() const noexcept { return min_lr >= 0 ? min_lr : lr / 10; }
  /// True when the run evaluates: --eval-data, or --eval-every on a --synthetic task.
  bool evaluates() const noexcept { return !eval_data.empty() || (eval_every > 0 && !synthetic.empty()); }
  /// The weights' dtype in HF folders (--save-dtype, bfloat16 by default).
  dtype hf_dtype() const { return save_dtype.empty() ? dtype::bf16 : parse_save_dtype(save_dtype); }
  std::uint64_t hf_shard_bytes() const noexcept { return save_shard_size > 0 ? save_shard_size : hf_default_max_shard_bytes; }
};

inline const char* help_text() {
  return R"(oomb-train — chunk-recurrent training of an HF decoder (qwen2, llama, mistral, qwen3) on the CPU (or a GPU:
--device), with oomb's paged KV cache, gradient mirror, offload (far tier: host pool, near tier: fixed slots) and
page-sparse attention.

usage: oomb-train --config model.json (--data tokens.bin [--packing P] | --synthetic NAME) --seq-len N
                  [--batch B] --chunk C --page P [--sparse-budget B --sink S --local L --tile Q --scoring K]
                  [--offload --near-pages K] [--no-prefetch-last-selection]
                  --steps S [--lr LR --warmup W --weight-decay WD --clip G] [--init CKPT]
                  [--rope-theta T] [--rope-scaling JSON]
                  [--resume DIR] --out DIR [--dump-grads FILE] [--full-backprop] [--device cpu|cuda]
                  [--keep-attention-outputs] [--plan] [--host-memory BYTES] [--gpu-memory BYTES]
                  [--optimizer-gpu-memory BYTES] [--save-format oomb|hf] [--save-dtype bfloat16|float32]
                  [--save-shard-size S] [--export DIR]

model and data
  --config FILE         HF config.json of a qwen2, llama, mistral or qwen3 model (configs/tiny.json,
                        configs/qwen2.5-7b.json, configs/llama-3.1-8b.json, configs/qwen3-8b.json, ...)
  --data FILE           token file (OOMBTOKS, docs/formats.md; tools/prepare_data.py makes one from JSONL text
                        or chat): version 1 (ids) or 2 (ids, document starts, an optional loss mask: only
                        the targets it marks count, e.g. a chat's assistant tokens). Without --packing,
                        samples are consecutive windows of N tokens; a window with no counted target is
                        skipped
  --packing P           how --data becomes sequences: none (default: consecutive windows) or documents
                        (version 2 files): whole documents in a seeded shuffled order (--seed), packed
                        while the next fits, the rest of the sequence padding (masked out); a document
                        longer than N is cut into windows of N. No target across a document boundary
                        counts; each document attends only its own keys and its positions start at 0
                        (per-document attention, both devices)
  --synthetic NAME      built-in task instead of --data: kv-recall (records in the first chunk, queried
                        in later ones; the loss counts answer tokens only)
  --kv-keys K, --kv-values M, --kv-queries Q
                        kv-recall's shape: K keys with values among M, Q queries per later chunk
                        (defaults 8, 6, 8)
  --init CKPT           initial weights: an HF folder (sharded or not) or a .safetensors file
                        (default: HF's initialisation, N(0, 0.02) matrices, seeded by --seed)
  --resume DIR          continue from a checkpoint folder written by --out (weights, AdamW moments,
                        step, data position); reproduces the uninterrupted losses bit for bit
  --seed N              initialisation, synthetic data and --packing order seed (default 1234)

sequence and memory
  --seq-len N           tokens per sequence. Beyond the config's max_position_embeddings with plain
                        RoPE a note says the positions are extrapolated; every saved config.json says
                        max_position_embeddings = N
  --rope-theta T        RoPE's base, overriding the config's (ABF: a larger base for a longer context)
  --rope-scaling JSON   RoPE scaling, overriding the config's, as HF writes rope_scaling, e.g.
                        '{"rope_type":"yarn","factor":4,"original_max_position_embeddings":32768}';
                        types linear, yarn, llama3, longrope (long factors when --seq-len exceeds
                        original_max_position_embeddings, short ones otherwise); "none": plain RoPE.
                        Both overrides go into every saved config.json
  --batch B             sequences per optimizer step (default 1): their gradients are accumulated and
                        the step's loss is the mean of the sequences' mean losses
  --chunk C             tokens per chunk: a multiple of the page size
  --page P              tokens per KV page: a power of two >= 16 (default 16)
  --sparse-budget B     page-sparse attention: each tile of --tile queries attends B scored past pages
                        (B + S + L must be fewer than the last chunk's past pages: else it is dense)
  --sink S              ... plus the first S pages (default 1; needs --sparse-budget)
  --local L             ... plus the L most recent past pages (default 1; needs --sparse-budget)
  --tile Q              queries per selection tile (default 128; needs --sparse-budget; with --device
                        cuda, Q times the GQA group must be a multiple of 128)
  --scoring K           how a tile scores a page: quest (Quest's upper bound from the page's per-channel
                        key min/max; default) or mean (against the page's mean key); needs --sparse-budget
  --offload             stream K/V and gradient pages through a fixed near tier; homes in the far tier
  --near-pages K        near-tier slots for K/V pages, and as many for gradient pages
                        (default: max(4 x a chunk's pages, 256); sparse: 2 x (a chunk's pages
                        + 16 (B + S + L)); at least a chunk's pages)
  --window-pages W      pages per attention window (default: K/2 with --offload, all without)
  --no-prefetch-last-selection
                        with --sparse-budget and --offload: do not prefetch, in stage 1, the pages
                        the last chunk selected in a layer before the layer's own selection is
                        known (on by default: docs/sparse.md)
  --grad-homes F        what the gradient pages' homes hold with --offload: fp32 (default), bf16 (half
                        the host bytes; the near slots still add in fp32, each write-back rounds to
                        nearest even) or bf16-stochastic (rounds up with the probability of the
                        dropped bits: unbiased); on --device cuda the GPU converts (the same
                        bits as the CPU's rounding)
  --home-memory M       where every home lives with --offload on --device cuda: pinned (default: the copy
                        engines reach it directly, but the driver keeps 8 bytes of GPU memory per
                        pinned 4 KiB, so GPU memory grows with the context) or pageable (moved
                        through a fixed pinned staging ring by host threads: nothing on the GPU grows
                        with the homes; the host copies bound the transfer rate)
  --attention-kernels K  the attention kernels of --device cuda: automatic (default: the Hopper ones on an
                        H100/H200 with pages of >= 128 tokens, the portable ones elsewhere) or portable
  --deterministic       the same bits on every run and on resume: on --device cuda the attention
                        backward adds dQ in a fixed order (the Hopper kernels: --page >= 128;
                        dense and page-sparse; measured cost in docs/trainer.md); the CPU always is
  --keep-attention-outputs
                        keep every layer's attention output and lse from stage 1 (in compute memory,
                        or pinned homes through 4 device slots with --offload) and read them in
                        stage 2 instead of attending again: less work, memory growing with the context
  --full-backprop       plain full-sequence backprop instead (the baseline; no oomb)
  --plan                print the memory plan (GPU and host bytes, what goes where) and exit: 0 when the
                        run fits, 1 (and the largest --seq-len that fits) when it does not
  --host-memory BYTES   host memory the run may take (e.g. 120G; default: MemAvailable, never MemTotal)
  --gpu-memory BYTES    GPU memory the run may take (cuda; default: cudaMemGetInfo's free less 1 GiB);
                        a run whose plan does not fit is refused before anything large is allocated
  --optimizer-gpu-memory BYTES
                        most of the optimizer state (fp32 masters + 2 moments, 12 B a parameter) kept on
                        the GPU (cuda; default: all that fits beside the rest); the tensors past it, in
                        model order, live in pinned host memory and stream through the GPU each step

device
  --device D            cpu (default) or cuda: where the training state lives and the step runs. cuda
                        keeps weights, gradients and the AdamW state on the GPU (the state's part that
                        does not fit in pinned host memory; clip and AdamW on the GPU) and needs a CUDA build, a GPU and head_dim 64 or 128 (no --full-backprop);
                        --offload and --sparse-budget run there too; checkpoints are the same files
                        on both devices

optimisation
  --steps S             optimizer steps in all (the schedule's length; a resumed run continues to S)
  --lr LR               peak learning rate (default 1e-3), reached after the warm-up
  --schedule K          after the warm-up: cosine or linear decay to --min-lr (default LR/10), or
                        constant at LR (default cosine)
  --warmup W            linear warm-up steps (default 0)
  --weight-decay WD     AdamW decoupled weight decay of matrices (default 0)
  --adam-beta1 B1, --adam-beta2 B2, --adam-epsilon E
                        AdamW's moment decays, each in [0, 1), and epsilon > 0 (defaults 0.9, 0.999, 1e-8)
  --clip G              clip the global gradient norm to G; 0 disables (default 1)

evaluation (forward only: stage 1 with the loss, no backward, no gradient pages)
  --eval-data FILE      held-out token file: its first --eval-sequences windows of --seq-len tokens.
                        Logged as eval_loss and the loss by the predicted token's position (0-4K,
                        4K-32K, 32K-128K, 128K-1M, 1M+) in log.jsonl and an "eval" line
  --eval-every N        evaluate after every N steps (default: after the last step only); with
                        --synthetic, held-out sequences of the task (never trained on), and the
                        kv-recall answer accuracy (answers given p > 1/2)
  --eval-sequences K    sequences per evaluation (default 1)
  --steps 0             with an evaluation: evaluate the --init (or --resume) weights and stop

output
  --out DIR             options.json (the effective options), log.jsonl (one JSON object per step) and
                        checkpoint-<step>/ folders (config.json, model.safetensors,
                        optimizer.safetensors, trainer_state.json) with checkpoint -> the latest; an
                        --out holding another run's log is refused unless --resume continues it
  --save-every N        write a checkpoint every N steps (default: at the end only)
  --save-format F       the checkpoint folders' layout: oomb (default; the weights in F32, resumable bit
                        for bit) or hf: an HF model folder that transformers' from_pretrained loads as it
                        is (--save-dtype weights, sharded past --save-shard-size with
                        model.safetensors.index.json, "dtype" set in config.json), with
                        optimizer.safetensors and trainer_state.json beside it. --resume takes an hf
                        folder only with float32 weights (bfloat16 ones are the masters rounded)
  --save-dtype D        the weights' dtype in HF folders (--save-format hf, --export): bfloat16 (default;
                        rounded to nearest even) or float32 (the master weights)
  --save-shard-size S   most bytes of one safetensors shard in HF folders (default 50GB, save_pretrained's;
                        5GB = 5e9 bytes, 4GiB = 4 x 2^30); a model that fits in one is one model.safetensors
  --export DIR          when the run reaches --steps, also write the model as an HF folder at DIR: config,
                        --save-dtype weights, tokenizer files (no optimizer or trainer state); DIR must be
                        new or hold an earlier export. Every checkpoint and export carries the tokenizer
                        files and generation_config.json of the --init (or --resume) folder
  --keep-last K         checkpoint-<step> folders kept, the newest (default 2)
  --stop-after N        stop after N steps of this run (a checkpoint is written): an interruption;
                        SIGINT / SIGTERM do the same at the next step boundary (exit 130 / 143)
  --dump-grads FILE     write the first step's gradients (F32 safetensors, HF names)
  --quiet               no progress lines within steps
  --debug               errors name the source file and line they were raised at
  --help                this text
)";
}

namespace detail {

inline std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  OOMB_EXPECTS(!v.empty() && end && *end == '\0' && errno == 0, flag, " needs an integer, got '", v, "'");
  OOMB_EXPECTS(x >= lo && x <= hi, flag, " must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

inline double parse_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  OOMB_EXPECTS(!v.empty() && end && *end == '\0' && std::isfinite(x), flag, " needs a number, got '", v, "'");
  return x;
}

}  // namespace detail

/// --grad-homes fp32|bf16|bf16-stochastic.
inline page_home_format parse_grad_homes(const std::string& flag, const std::string& v) {
  if (v == "fp32") return page_home_format::same;
  if (v == "bf16") return page_home_format::bf16;
  if (v == "bf16-stochastic") return page_home_format::bf16_stochastic;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown format '", v, "' (known: fp32, bf16, bf16-stochastic)");
}

/// The --grad-homes name of a format (options.json, the banner).
inline const char* grad_homes_name(page_home_format f) noexcept {
  return f == page_home_format::same ? "fp32" : f == page_home_format::bf16 ? "bf16" : "bf16-stochastic";
}

/// --home-memory pinned|pageable.
inline home_memory parse_home_memory(const std::string& flag, const std::string& v) {
  if (v == "pinned") return home_memory::pinned;
  if (v == "pageable") return home_memory::pageable;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown memory '", v, "' (known: pinned, pageable)");
}

/// The --home-memory name (options.json, the banner).
inline const char* home_memory_name(home_memory m) noexcept { return m == home_memory::pinned ? "pinned" : "pageable"; }

/// --attention-kernels automatic|portable.
inline oomb::attention::kernel_choice parse_attention_kernels(const std::string& flag, const std::string& v) {
  if (v == "automatic") return oomb::attention::kernel_choice::automatic;
  if (v == "portable") return oomb::attention::kernel_choice::portable;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown kernels '", v, "' (known: automatic, portable)");
}

/// The --attention-kernels name (options.json).
inline const char* attention_kernels_name(oomb::attention::kernel_choice k) noexcept {
  return k == oomb::attention::kernel_choice::portable ? "portable" : "automatic";
}

/// --save-format oomb|hf.
inline checkpoint_layout parse_save_format(const std::string& flag, const std::string& v) {
  if (v == "oomb") return checkpoint_layout::oomb;
  if (v == "hf") return checkpoint_layout::hf;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown format '", v, "' (known: oomb, hf)");
}

/// The --save-format name (options.json, the banner).
inline const char* save_format_name(checkpoint_layout l) noexcept { return l == checkpoint_layout::hf ? "hf" : "oomb"; }

/// The chunk-recurrent options the flags ask for (what training_run gives the device trainer).
inline chunk_options chunk_options_of(const train_options& o) {
  chunk_options co;
  co.chunk = o.chunk;
  co.page = o.page;
  co.offload = o.offload;
  co.near_pages = o.near_pages;
  co.window_pages = o.window_pages;
  co.grad_homes = o.grad_homes;
  co.homes = o.homes;
  co.attention_kernels = o.attention_kernels;
  co.deterministic = o.deterministic;
  co.sparse = o.sparse;
  co.budget = o.budget;
  co.sink = o.sink;
  co.local = o.local;
  co.tile = o.tile;
  co.score = o.scoring;
  co.keep_attention_outputs = o.keep_attention_outputs;
  co.prefetch_last_selection = o.prefetch_last_selection;
  return co;
}

/// Parses argv; throws oomb::invalid_argument naming the flag for anything wrong or missing.
inline train_options parse_train_options(const std::vector<std::string>& args) {
  bool has_steps = false;  // --steps 0 (evaluation only) must be said
  train_options o;
  std::string sparse_only;  // the last of --sink / --local / --tile / --scoring given
  constexpr std::int64_t i32max = std::numeric_limits<std::int32_t>::max();
  constexpr std::int64_t i64max = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& f = args[i];
    auto value = [&]() -> const std::string& {
      OOMB_EXPECTS(i + 1 < args.size(), f, " needs a value");
      return args[++i];
    };
    auto i32 = [&](std::int64_t lo) { return static_cast<std::int32_t>(detail::parse_int(f, value(), lo, i32max)); };
    auto i64 = [&](std::int64_t lo) { return detail::parse_int(f, value(), lo, i64max); };
    auto bytes = [&] {
      const std::uint64_t b = parse_bytes(value(), f);
      OOMB_EXPECTS(b > 0, f, " must be more than 0 bytes");
      return b;
    };
    if (f == "--help" || f == "-h") o.help = true;
    else if (f == "--config") o.config = value();
    else if (f == "--data") o.data = value();
    else if (f == "--packing") o.packing = parse_packing(f, value());
    else if (f == "--synthetic") o.synthetic = value();
    else if (f == "--init") o.init = value();
    else if (f == "--resume") o.resume = value();
    else if (f == "--out") o.out = value();
    else if (f == "--dump-grads") o.dump_grads = value();
    else if (f == "--seq-len") o.seq_len = i64(2);
    else if (f == "--rope-theta") {
      o.rope_theta = detail::parse_double(f, value());
      OOMB_EXPECTS(std::isfinite(o.rope_theta) && o.rope_theta > 0, "--rope-theta must be positive, got ", o.rope_theta);
    }
    else if (f == "--rope-scaling") o.rope_scaling = value();
    else if (f == "--batch") o.batch = i32(1);
    else if (f == "--chunk") o.chunk = i32(1);
    else if (f == "--page") o.page = i32(1);
    else if (f == "--sparse-budget") { o.sparse = true; o.budget = i32(0); }
    else if (f == "--sink") { o.sink = i32(0); sparse_only = f; }
    else if (f == "--local") { o.local = i32(0); sparse_only = f; }
    else if (f == "--tile") { o.tile = i32(1); sparse_only = f; }
    else if (f == "--scoring") { o.scoring = parse_score_kind(f, value()); sparse_only = f; }
    else if (f == "--offload") o.offload = true;
    else if (f == "--near-pages") o.near_pages = i32(1);
    else if (f == "--window-pages") o.window_pages = i32(1);
    else if (f == "--grad-homes") o.grad_homes = parse_grad_homes(f, value());
    else if (f == "--home-memory") o.homes = parse_home_memory(f, value());
    else if (f == "--attention-kernels") o.attention_kernels = parse_attention_kernels(f, value());
    else if (f == "--steps") { o.steps = i64(0); has_steps = true; }
    else if (f == "--eval-data") o.eval_data = value();
    else if (f == "--eval-every") o.eval_every = i64(1);
    else if (f == "--eval-sequences") o.eval_sequences = i32(1);
    else if (f == "--lr") o.lr = detail::parse_double(f, value());
    else if (f == "--min-lr") o.min_lr = detail::parse_double(f, value());
    else if (f == "--warmup") o.warmup = i64(0);
    else if (f == "--weight-decay") o.weight_decay = detail::parse_double(f, value());
    else if (f == "--schedule") o.schedule = parse_lr_schedule(value(), f);
    else if (f == "--adam-beta1") o.adam_beta1 = detail::parse_double(f, value());
    else if (f == "--adam-beta2") o.adam_beta2 = detail::parse_double(f, value());
    else if (f == "--adam-epsilon") o.adam_epsilon = detail::parse_double(f, value());
    else if (f == "--clip") o.clip = detail::parse_double(f, value());
    else if (f == "--seed") o.seed = static_cast<std::uint64_t>(i64(0));
    else if (f == "--save-every") o.save_every = i64(0);
    else if (f == "--save-format") o.save_format = parse_save_format(f, value());
    else if (f == "--save-dtype") o.save_dtype = hf_dtype_name(parse_save_dtype(value(), f));
    else if (f == "--save-shard-size") o.save_shard_size = parse_shard_size(value(), f);
    else if (f == "--export") o.export_dir = value();
    else if (f == "--stop-after") o.stop_after = i64(0);
    else if (f == "--kv-keys") o.kv_keys = i32(1);
    else if (f == "--kv-values") o.kv_values = i32(2);
    else if (f == "--kv-queries") o.kv_queries = i32(1);
    else if (f == "--full-backprop") o.full_backprop = true;
    else if (f == "--keep-attention-outputs") o.keep_attention_outputs = true;
    else if (f == "--no-prefetch-last-selection") o.prefetch_last_selection = false;
    else if (f == "--deterministic") o.deterministic = true;
    else if (f == "--plan") o.plan = true;
    else if (f == "--debug") o.debug = true;
    else if (f == "--host-memory") o.host_memory = bytes();
    else if (f == "--gpu-memory") o.gpu_memory = bytes();
    else if (f == "--optimizer-gpu-memory") {
      const std::uint64_t b = parse_bytes(value(), f);  // 0: all of it on the host
      OOMB_EXPECTS(b <= std::uint64_t(i64max), f, " ", b, " bytes is too large");
      o.optimizer_gpu_memory = static_cast<std::int64_t>(b);
    }
    else if (f == "--keep-last") o.keep_last = i32(1);
    else if (f == "--device") o.device = value();
    else if (f == "--quiet") o.quiet = true;
    else OOMB_FAIL(oomb::invalid_argument, "unknown option '", f, "' (see --help)");
  }
  if (o.help) return o;
  OOMB_EXPECTS(!o.config.empty(), "--config is required (see --help)");
  OOMB_EXPECTS(o.data.empty() != o.synthetic.empty(), "give exactly one of --data and --synthetic");
  OOMB_EXPECTS(o.packing == packing_kind::none || !o.data.empty(), "--packing ", packing_name(o.packing),
               " packs the documents of a --data token file (--synthetic makes its own sequences)");
  OOMB_EXPECTS(o.synthetic.empty() || o.synthetic == "kv-recall", "--synthetic: unknown task '", o.synthetic,
               "' (known: kv-recall)");
  OOMB_EXPECTS(o.seq_len >= 2, "--seq-len is required (>= 2)");
  OOMB_EXPECTS(o.chunk > 0 || o.full_backprop, "--chunk is required");
  const bool eval = o.evaluates();
  OOMB_EXPECTS(o.steps > 0 || (eval && has_steps), "--steps is required (> 0; 0 with --eval-data or --eval-every: ",
               "evaluate the --init or --resume weights and stop)");
  OOMB_EXPECTS(eval || o.eval_sequences == 1, "--eval-sequences needs an evaluation (--eval-data FILE, or --eval-every N ",
               "with --synthetic)");
  OOMB_EXPECTS(!eval || !o.full_backprop, "evaluation runs chunk-recurrent stage 1: not with --full-backprop");
  OOMB_EXPECTS(o.eval_data.empty() || !o.data.empty(), "--eval-data is a token file held out from --data; a --synthetic ",
               "run holds out its own sequences (give --eval-every N)");
  OOMB_EXPECTS(!o.out.empty(), "--out is required");
  OOMB_EXPECTS(o.lr >= 0, "--lr must be >= 0, got ", o.lr);
  OOMB_EXPECTS(o.warmup <= o.steps, "--warmup ", o.warmup, " is longer than --steps ", o.steps);
  OOMB_EXPECTS(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "--adam-beta1 must be in [0, 1), got ", o.adam_beta1);
  OOMB_EXPECTS(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "--adam-beta2 must be in [0, 1), got ", o.adam_beta2);
  OOMB_EXPECTS(o.adam_epsilon > 0 && std::isfinite(o.adam_epsilon), "--adam-epsilon must be positive, got ", o.adam_epsilon);
  OOMB_EXPECTS(!o.full_backprop || (!o.sparse && !o.offload), "--full-backprop runs neither sparse attention nor offload");
  OOMB_EXPECTS(!bf16_homes(o.grad_homes) || o.offload, "--grad-homes bf16 needs --offload: in place the kernels add ",
               "into the gradient pages themselves, which stay fp32");
  OOMB_EXPECTS(o.homes == home_memory::pinned || (o.offload && o.device == "cuda"), "--home-memory pageable needs --offload ",
               "and --device cuda (on the CPU every home is pageable host memory already)");
  OOMB_EXPECTS(o.device == "cpu" || o.device == "cuda", "--device: unknown device '", o.device, "' (known: cpu, cuda)");
  OOMB_EXPECTS(o.device == "cpu" || !o.full_backprop, "--device cuda runs chunk-recurrent training only (--full-backprop ",
               "is the CPU's baseline)");
  check_sparse_shape_flags(o.sparse, sparse_only);
  OOMB_EXPECTS(o.prefetch_last_selection || (o.sparse && o.offload), "--no-prefetch-last-selection turns off stage 1's ",
               "prefetch of page-sparse selections into the near tier: it needs --sparse-budget and --offload");
  if (o.deterministic && o.device == "cuda")
    OOMB_EXPECTS(o.attention_kernels == oomb::attention::kernel_choice::automatic && o.page >= 128,
                 "--deterministic on --device cuda needs the Hopper attention kernels: --page >= 128 (got ", o.page,
                 ") and --attention-kernels automatic; the portable ones add dQ in arbitrary order");
  OOMB_EXPECTS(!o.keep_attention_outputs || !o.full_backprop, "--keep-attention-outputs is chunk-recurrent's (not --full-backprop)");
  OOMB_EXPECTS(o.optimizer_gpu_memory < 0 || o.device == "cuda", "--optimizer-gpu-memory places the optimizer state on a GPU: "
               "it needs --device cuda");
  const bool hf_folders = o.save_format == checkpoint_layout::hf || !o.export_dir.empty();
  OOMB_EXPECTS(hf_folders || o.save_dtype.empty(), "--save-dtype sets the weights' dtype of HF folders (--save-format hf or ",
               "--export); oomb checkpoints keep the float32 master weights");
  OOMB_EXPECTS(hf_folders || o.save_shard_size == 0, "--save-shard-size shards HF folders (--save-format hf or --export)");
  if (o.sparse && o.chunk > 0 && o.page > 0) {
    const chunk_options co = chunk_options_of(o);
    OOMB_EXPECTS(!sparse_covers_past(co, o.seq_len), sparse_covers_past_reason(co, o.seq_len), "; leave out --sparse-budget");
  }
  if (o.offload && o.near_pages == 0 && o.chunk > 0 && o.page > 0) o.near_pages = default_near_pages(chunk_options_of(o));
  return o;
}

}  // namespace oomb_trainer
