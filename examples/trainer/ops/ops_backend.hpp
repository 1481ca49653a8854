// oomb trainer — the ops backend concept: what the training algorithm needs from a device.
// SPDX-License-Identifier: Apache-2.0
//
// algo/chunk_recurrent.hpp (stages 1 and 2) and model/block.hpp are written once, against a
// backend B; cpu_ops<T, E, G> (cpu/cpu_ops.hpp) runs them on the host, a CUDA backend
// on the GPU. B provides (T = value_type; "compute memory" is host memory for the CPU backend,
// device memory for a CUDA one; every op is enqueued on B's compute stream, in call order):
//
// B is default-constructible and not copyable: one per trainer, holding its streams, memory
// resources and scratch.
// precision
//   value_type                  activations (x, dx, block_acts and block_scratch buffers)
//   stat_type                   the statistics among the activations: rstd of the norms, the
//                               attention's lse (fp32 where activations are bf16), and the scalars
//                               eps and scale (a bf16 scale = 1/targets would be off by up to 0.4%)
//   kv_type, grad_type          element of a K/V page and of a gradient page
// buffers and parameters
//   buffer<X>                   owning array in compute memory: data(), size(), resize(n) (keeps
//                               its storage when large enough; contents unspecified after growth)
//   params_type, grads_type     the model's compute weights and its parameter gradients in
//                               compute memory (element types may differ: bf16 weights, fp32
//                               gradients on a GPU), each with model_params's accessors (config,
//                               embed, lm_head, final_norm, layer(l) -> layer_params<X>)
//   rope_type                   cos/sin of `count` rows, made by rope(positions, count, freqs):
//                               row t at positions[t] (a host array: consecutive, or restarting
//                               at each packed document; freqs: model/rope_frequencies.hpp)
// residency (algo/page_tier.hpp streams pages with them)
//   residency_backend           an oomb residency backend (is_residency_backend_v)
//   far_memory(), near_memory() the resources of the homes and of the near slots
//   copy_in(), copy_out()       the scheduler's copy streams; compute(): the compute stream view
//   selector_type               page-sparse selection, built as selector_type(B&, page, hq, hkv,
//                               d, capacity, tile_selection_config):
//     summarize(ids, n, k)      page ids[i] holds rows [i * page, ...) of k [n][hkv*d]
//     select(q, n, ids, past, tile_first, out)  the first `past` of the layer's page `ids` each
//                               query tile of q [n][hq*d] attends, into the host sparse_page_table
//                               `out`; tile_first (host, per tile, or null: 0) the first page a
//                               tile may select (its document's: oomb::tile_selector)
//     forget(id)                page id holds no keys any more
// dense ops (pointers into compute memory; W, b, w, table: elements of params_type; dW, db, dw,
// dtable: of grads_type; the rest value_type; `tokens` and `targets` are host arrays the backend
// stages itself)
//   embedding_forward(n, H, vocab, tokens, table, x)    embedding_backward(n, H, tokens, dx, dtable)
//   rmsnorm_forward(n, H, x, w, eps, y, rstd)           rmsnorm_backward(n, H, x, w, rstd, dy, dx, dw)
//       (rows of H; also q/k norms: n * heads rows of head_dim)
//   linear_forward(n, in, out, x, W, b, y)              linear_backward(n, in, out, x, W, dy, dx, dW, db)
//   rope_forward(n, heads, d, x, rope)                  rope_backward(n, heads, d, dx, rope)
//   swiglu_forward(n, g, u, h)                          swiglu_backward(n, g, u, dh, dg, du)
//   copy(n, src, dst)   add(n, src, dst): dst += src   fill(n, value, dst)   (fill: of value_type
//       and of stat_type elements; rstd and lse arguments are stat_type)
//   copy_block(n, src, dst)   copy of value_type or stat_type elements into or out of memory an
//       acquire just handed out (algo/attention_outputs.hpp's blocks): ordered after its copies
//   head_loss_and_grad(p, grads, n, x, targets, scale, dx): final norm, LM head and cross-entropy;
//       adds the SUM of the counted rows' losses to the step's loss; with grads != nullptr adds
//       scale * its gradient into grads and writes dx. take_loss() -> double: the loss added since
//       the last take (a GPU keeps it on the device and synchronises here, once per step).
//   head_row_losses(p, n, x, targets, out): forward only (evaluation): each row's loss into the
//       host array out [n] (0 where targets[t] < 0), the step's loss unchanged (a GPU synchronises)
//   Backward ops ADD into dx, dW, db, dw, dtable.
// page ops (a page_pool_view is a POD view of compute memory: the algorithm never dereferences it)
//   write_pages(pool, where, n, k, v)      rows t < n of k, v [n][hkv*d] into page where[t / P],
//                                          token t % P (the run starts on a page boundary)
//   add_from_pages(pool, where, n, dk, dv) dk, dv rows of page i += gradient page where[i] (-1: none)
//   zero_page(pool, id)                    zeroes the page pair `id`
// attention over one window (window_table below: host arrays, valid during the call only; the
// backend builds whatever tables its kernels read from them — on a GPU through a ring of pinned
// buffers guarded by events, never a table a kernel still reads)
//   attention_forward(chunk, kv, table, o_acc, lse_acc)   folds the window into o_acc [sq][hq][d],
//       lse_acc [hq][sq] (stat_type) by log-sum-exp (they start as 0 and -inf)
//   attention_backward_begin(chunk, o, d_o)                once per layer and chunk, before its windows
//       (a GPU computes rowsum(dO * O) here; the CPU needs nothing)
//   attention_backward(chunk, kv, table, grads, o, lse, d_o, dq, dk, dv)   given the GLOBAL o, lse:
//       dq, dk, dv (the chunk's own keys) += ...; past pages' dK/dV added into gradient page
//       table.grad_ids[i] of `grads` (every past page the window reads needs one)
// A page op or an attention call may address slots the scheduler just acquired: the backend orders
// it after the acquire's copies (stream order on a GPU; the CPU waits for its compute stream).
// optional: exposed transfer time (has_transfer_wait_probe_v; the CUDA backends have it)
//   transfer_wait_begin(), transfer_wait_end()  bracket the waits for copies an acquire enqueues on
//                               the compute stream (page_tier calls them when streamed)
//   take_transfer_wait_seconds() -> double: the time the compute stream stood still in them since
//                               the last take (synchronises: called at a step's edges)
// optional: scratch allocated up front (has_reserve_v; every backend here has it)
//   reserve(chunk_shape)        allocates, before the first step, the scratch a chunk of that shape
//                               needs, at the sizes the backend states for the memory plan (each
//                               backend's scratch_for(shape)), so no op grows a buffer later
// optional: GPU time per kind of op (has_op_clock_v; the CUDA backends have it)
//   time_ops(bool)              on: every op's time on the compute stream is summed by op_kind
//                               (two tiny timer launches per op; off, the default, costs nothing)
//   take_op_seconds() -> op_seconds: the sums since the last take (synchronises: a step's edges)
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <oomb/attention/plan.hpp>
#include <oomb/core/id_span.hpp>
#include <oomb/offload/residency_backend.hpp>
#include <oomb/paging/views.hpp>
#include <oomb/sparse/sparse_page_table.hpp>

#include "trainer/model/block.hpp"
#include "trainer/ops/op_kind.hpp"

namespace oomb_trainer {

/// The largest chunk a run asks of a backend, known before its first step (algo/chunk_options.hpp's
/// chunk_shape_of): what reserve() allocates for, and what the memory plan sizes scratch by.
struct chunk_shape {
  block_dims dims;
  std::int32_t vocab = 0;          ///< the model's vocabulary (the LM head's rows)
  std::int64_t rows = 0;           ///< tokens of a chunk
  std::int64_t window_pages = 0;   ///< entries of the largest window table
};

/// The queries of one chunk in one layer, as every window of its attention sees them.
template <class T>
struct attention_chunk {
  const T* q = nullptr;    ///< [sq][hq][d] in compute memory, RoPE applied
  std::int64_t q_start = 0;  ///< absolute position of query 0
  std::int32_t sq = 0, hq = 0, hkv = 0, d = 0;
  /// Page-sparse past (host): per tile of `tile` queries, the logical past pages it attends; null
  /// for dense. The same for every window of the layer, so a GPU stages it once per chunk and layer.
  const oomb::sparse_page_table* selection = nullptr;
  std::int32_t tile = 128;
  /// Packed documents (host, [sq], or null): the start of each query's document, its lowest key
  /// (oomb::attention's key_lower: non-decreasing, at most the query's position).
  const std::int64_t* key_lower = nullptr;
};

/// One attention window, as the algorithm describes it (host arrays, valid during the call).
struct window_table {
  std::int32_t first_page = 0;     ///< logical page of entry 0
  std::int32_t pages = 0;          ///< entries: the logical pages first_page .. first_page + pages - 1
  std::int32_t last_page_len = 0;  ///< tokens of the last entry
  const std::int32_t* ids = nullptr;  ///< [pages] id of each page in the K/V pool view, -1: never read
  /// Backward only: [pages] gradient page (in the gradient pool view) of each past entry, -1 for the
  /// chunk's own pages and pages never read.
  const std::int32_t* grad_ids = nullptr;
};

namespace detail {
template <class B, class = void>
struct is_attention_backend : std::false_type {};
template <class B>
struct is_attention_backend<
    B, std::void_t<typename B::value_type, typename B::stat_type, typename B::kv_type, typename B::grad_type,
                   typename B::residency_backend::compute_stream_type, typename B::selector_type,
                   decltype(std::declval<B&>().compute()), decltype(std::declval<B&>().copy_in()),
                   decltype(std::declval<B&>().copy_out()), decltype(std::declval<B&>().far_memory()),
                   decltype(std::declval<B&>().near_memory()),
                   decltype(std::declval<B&>().attention_forward(
                       std::declval<const attention_chunk<typename B::value_type>&>(),
                       std::declval<const oomb::page_pool_view<const typename B::kv_type>&>(),
                       std::declval<const window_table&>(), static_cast<typename B::value_type*>(nullptr),
                       static_cast<typename B::stat_type*>(nullptr))),
                   decltype(std::declval<B&>().attention_backward(
                       std::declval<const attention_chunk<typename B::value_type>&>(),
                       std::declval<const oomb::page_pool_view<const typename B::kv_type>&>(),
                       std::declval<const window_table&>(),
                       std::declval<const oomb::page_pool_view<typename B::grad_type>&>(),
                       static_cast<const typename B::value_type*>(nullptr),
                       static_cast<const typename B::stat_type*>(nullptr),
                       static_cast<const typename B::value_type*>(nullptr),
                       static_cast<typename B::value_type*>(nullptr), static_cast<typename B::value_type*>(nullptr),
                       static_cast<typename B::value_type*>(nullptr))),
                   decltype(std::declval<B&>().write_pages(std::declval<const oomb::page_pool_view<typename B::kv_type>&>(),
                                                           oomb::id_span{}, std::int64_t{},
                                                           static_cast<const typename B::value_type*>(nullptr),
                                                           static_cast<const typename B::value_type*>(nullptr))),
                   decltype(std::declval<B&>().add_from_pages(
                       std::declval<const oomb::page_pool_view<const typename B::grad_type>&>(), oomb::id_span{},
                       std::int64_t{}, static_cast<typename B::value_type*>(nullptr),
                       static_cast<typename B::value_type*>(nullptr))),
                   decltype(std::declval<B&>().zero_page(std::declval<const oomb::page_pool_view<typename B::grad_type>&>(),
                                                         std::int32_t{}))>>
    : std::bool_constant<oomb::is_residency_backend_v<typename B::residency_backend> &&
                         std::is_same_v<decltype(std::declval<B&>().compute()),
                                        typename B::residency_backend::compute_stream_type>> {};

template <class B, class = void>
struct has_dense_types : std::false_type {};
template <class B>
struct has_dense_types<B, std::void_t<typename B::template buffer<typename B::value_type>, typename B::params_type,
                                      typename B::grads_type, typename B::rope_type>> : std::true_type {};
}  // namespace detail

/// True when B is an attention backend: the types, the residency, the page ops and the attention
/// over windows of the file comment, what algo/page_tier.hpp and algo/paged_attention.hpp use (the
/// Python package's GPU path runs them over one, cuda/cuda_attention_ops.cuh).
template <class B>
inline constexpr bool is_attention_backend_v = detail::is_attention_backend<B>::value;

/// True when B is an ops backend (see the file comment): an attention backend with the model's
/// buffer, parameter and RoPE types. Checks the types and the page and attention ops (the part of
/// the seam a new backend most easily gets wrong); the dense ops are checked where the model calls them.
template <class B>
inline constexpr bool is_ops_backend_v = is_attention_backend_v<B> && detail::has_dense_types<B>::value;

namespace detail {
template <class B, class = void>
struct has_transfer_wait_probe : std::false_type {};
template <class B>
struct has_transfer_wait_probe<B, std::void_t<decltype(std::declval<B&>().transfer_wait_begin()),
                                              decltype(std::declval<B&>().transfer_wait_end()),
                                              decltype(double(std::declval<B&>().take_transfer_wait_seconds()))>>
    : std::true_type {};
}  // namespace detail

/// True when B measures how long its compute stream waits for transfers (see the file comment).
template <class B>
inline constexpr bool has_transfer_wait_probe_v = detail::has_transfer_wait_probe<B>::value;

namespace detail {
template <class B, class = void>
struct has_op_clock : std::false_type {};
template <class B>
struct has_op_clock<B, std::void_t<decltype(std::declval<B&>().time_ops(true)),
                                   decltype(op_seconds(std::declval<B&>().take_op_seconds()))>> : std::true_type {};
}  // namespace detail

/// True when B can time its ops by op_kind (see the file comment).
template <class B>
inline constexpr bool has_op_clock_v = detail::has_op_clock<B>::value;

namespace detail {
template <class B, class = void>
struct has_reserve : std::false_type {};
template <class B>
struct has_reserve<B, std::void_t<decltype(std::declval<B&>().reserve(std::declval<const chunk_shape&>()))>>
    : std::true_type {};
}  // namespace detail

/// True when B allocates its scratch up front (see the file comment).
template <class B>
inline constexpr bool has_reserve_v = detail::has_reserve<B>::value;

namespace detail {
template <class B, class = void>
struct has_attention_plan : std::false_type {};
template <class B>
struct has_attention_plan<B, std::void_t<decltype(std::declval<B&>().attention_plan(oomb::attention::plan_options{}))>>
    : std::true_type {};
}  // namespace detail

/// True when B plans its attention calls (chunk_options::attention_kernels and ::deterministic).
template <class B>
inline constexpr bool has_attention_plan_v = detail::has_attention_plan<B>::value;

}  // namespace oomb_trainer
