// oomb trainer — the kinds of backend ops a step's time is split into: what the CUDA backend's NVTX
// range names start with, and the slots of its op clock (ops_backend.hpp's optional probe).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>

namespace oomb_trainer {

/// The parts of a step, by the seam op that does them.
enum class op_kind : int {
  gemm,                ///< linear_forward / linear_backward (the projections)
  attention_forward,   ///< attention_forward
  attention_backward,  ///< attention_backward_begin, attention_backward
  head,                ///< head_loss_and_grad (final norm, LM head, cross-entropy)
  elementwise,         ///< RMSNorm, RoPE, SwiGLU, residual adds
  embedding,           ///< embedding_forward / embedding_backward
  pages,               ///< write_pages, add_from_pages
  selection,           ///< page-sparse: the selector's summaries, page scoring and top-k (page_selector.cuh)
};
inline constexpr int op_kinds = 8;

/// Seconds per op_kind (index: int(kind)).
using op_seconds = std::array<double, op_kinds>;

/// The NVTX prefix and JSON name of a kind.
inline constexpr const char* op_kind_name(op_kind k) noexcept {
  constexpr const char* names[op_kinds] = {"gemm",        "attention_forward", "attention_backward", "head",
                                           "elementwise", "embedding",         "pages",              "selection"};
  return names[static_cast<int>(k)];
}

}  // namespace oomb_trainer
