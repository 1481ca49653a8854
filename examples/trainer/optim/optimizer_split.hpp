// oomb trainer — where AdamW's state (fp32 master weights and two moments, 12 bytes a parameter)
// lives with --device cuda: the first tensors of the layout, in its order, in device memory, the
// rest in pinned host memory, streamed through a small device ring when the optimizer updates
// them. Host arithmetic shared by the memory plan (trainers/memory_plan.hpp), which decides the split
// before anything is allocated, and the state itself (cuda/adamw_state.cuh).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <oomb/core/error.hpp>

#include "trainer/model/params.hpp"

namespace oomb_trainer {

/// Bytes of optimizer state per element of the layout: fp32 master, exp_avg, exp_avg_sq.
inline constexpr std::uint64_t optimizer_bytes_per_element = 3 * sizeof(float);
/// Device slots of the ring the host part streams through, each holding one piece (master and
/// both moments): three, so piece i+1 can come up while piece i is updated and piece i-1 goes down.
inline constexpr std::size_t optimizer_ring_slots = 3;
/// Elements of a piece: 16 MiB per array, 48 MiB a slot, 144 MiB the ring.
inline constexpr std::size_t optimizer_piece_elements = std::size_t(1) << 22;

/// The state cut at a tensor boundary: the GPU holds layout elements [0, host_offset), pinned host
/// memory [host_offset, total) (padding between tensors included on both sides, as laid out).
struct optimizer_split {
  std::size_t tensors = 0;      ///< tensors of the layout
  std::size_t gpu_tensors = 0;  ///< the first gpu_tensors of them are on the GPU
  std::size_t host_offset = 0;  ///< layout offset of the first tensor on the host (total: none)
  std::size_t total = 0;        ///< elements of the layout

  bool all_on_gpu() const noexcept { return host_offset == total; }
  std::size_t host_elements() const noexcept { return total - host_offset; }
  std::uint64_t gpu_bytes() const noexcept { return host_offset * optimizer_bytes_per_element; }
  std::uint64_t host_bytes() const noexcept { return host_elements() * optimizer_bytes_per_element; }
  /// Elements of a ring piece: `piece`, or the whole host part when that is smaller (0: no ring).
  std::size_t piece_elements(std::size_t piece = optimizer_piece_elements) const noexcept {
    return std::min(piece, host_elements());
  }
  std::uint64_t ring_bytes(std::size_t piece = optimizer_piece_elements) const noexcept {
    return optimizer_ring_slots * piece_elements(piece) * optimizer_bytes_per_element;
  }
};

/// The split with the first `gpu_tensors` tensors of `layout` on the GPU.
inline optimizer_split split_after(const param_layout& layout, std::size_t gpu_tensors) {
  const auto& entries = layout.entries();
  OOMB_EXPECTS(gpu_tensors <= entries.size(), "optimizer split: ", gpu_tensors, " tensors on the GPU, the model has ",
               entries.size());
  optimizer_split s;
  s.tensors = entries.size();
  s.gpu_tensors = gpu_tensors;
  s.total = layout.total();
  s.host_offset = gpu_tensors == entries.size() ? s.total : entries[gpu_tensors].offset;
  return s;
}

/// The most tensors, in layout order, whose state takes at most `cap` bytes and, with the ring
/// the rest then streams through, at most `room` bytes of the GPU: all of them (and no ring) when
/// they fit both. The fit is checked for every split point, not only up to the first that fails:
/// near the end a smaller host part shrinks the ring.
inline optimizer_split split_fitting(const param_layout& layout, std::uint64_t room, std::uint64_t cap) {
  const std::size_t n = layout.entries().size();
  const optimizer_split all = split_after(layout, n);
  if (all.gpu_bytes() <= std::min(room, cap)) return all;
  optimizer_split best = split_after(layout, 0);
  for (std::size_t k = 1; k < n; ++k) {
    const optimizer_split s = split_after(layout, k);
    if (s.gpu_bytes() <= cap && s.gpu_bytes() + s.ring_bytes() <= room) best = s;
  }
  return best;
}

}  // namespace oomb_trainer
