// oomb — the Hopper attention backward's walk over a KV head's query rows (backward_sm90.cuh): which
// steps of packed query rows one CTA takes, dense and page-sparse. Host and device: the kernel's
// producer, dQ writer and consumers each walk it, and the CPU tests check what it covers.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include "oomb/core/config.hpp"

#include "oomb/attention/fast_divmod.hpp"

OOMB_NAMESPACE_BEGIN
namespace attention::detail {

/// One CTA's walk over the packed query rows (query * group + head) of its KV head, in steps.
/// Dense: one run, rows [0, rows). Sparse: the runs of consecutive query tiles (tile t: rows
/// [t * tile_rows, (t + 1) * tile_rows)) whose bit in `sel` is set. Each run is cut into steps of `rs`
/// rows counted from the run's first tile, the last step clipped at the run's end, so a step never
/// holds rows of a tile that does not attend the keys, whatever rs is: hb6's steps of whole queries
/// (rs = floor(BM / group) * group, which does not divide a tile) take sparse calls too (hs1).
/// tile_steps (deterministic calls): every tile is a run of its own, so that all blocks cut a tile
/// into the same steps (sparse_dq_order). Steps before the one holding `first_row` (the first row
/// that sees the block's keys) are skipped; with a query split, CTA z takes steps z, z + split, ... of
/// the walk. Producer, dq writer and consumers each walk the same sequence. Host code too: the CPU
/// tests check its coverage (tests/attention/test_plan.cpp).
struct query_walk {
  const std::uint32_t* sel;  // nullptr: dense
  int ntiles, tile_rows, rows, rs, split;
  fast_divmod tile_div;  // row -> tile
  bool tile_steps;       // sparse: each tile a run of its own
  int r0 = 0;            // the current step: rows [r0, r1()); r0 >= rows: done
  int run_end = 0;       // where the current run ends (a tile boundary, or rows)

  OOMB_HOST_DEVICE query_walk(const std::uint32_t* sel_, int ntiles_, int tile_rows_, fast_divmod tile_div_, int rows_, int rs_,
                        int first_row, int z, int split_, bool tile_steps_ = false)
      : sel(sel_), ntiles(ntiles_), tile_rows(tile_rows_), rows(rows_), rs(rs_), split(split_), tile_div(tile_div_),
        tile_steps(tile_steps_) {
    if (sel == nullptr) {
      run_end = rows;
      r0 = first_row < rows ? first_row / rs * rs : rows;
    } else {
      const int t = static_cast<int>(tile_div.div(static_cast<std::uint32_t>(first_row)));
      const int a = next_tile(t, true);
      enter_run(a);
      if (a == t && r0 < rows) r0 += (first_row - r0) / rs * rs;  // first_row inside this run's first tile
    }
    for (int k = 0; k < z && !done(); ++k) advance();
  }
  OOMB_HOST_DEVICE OOMB_FORCEINLINE bool done() const { return r0 >= rows; }
  OOMB_HOST_DEVICE OOMB_FORCEINLINE int r1() const { return r0 + rs < run_end ? r0 + rs : run_end; }
  /// The step split steps later in the walk (this CTA's next step).
  OOMB_HOST_DEVICE OOMB_FORCEINLINE void next() {
    for (int k = 0; k < split && !done(); ++k) advance();
  }

 private:
  /// First tile >= t whose bit is `set`, or ntiles (bits past ntiles are 0).
  OOMB_HOST_DEVICE int next_tile(int t, bool set) const {
    while (t < ntiles) {
      std::uint32_t word = sel[t >> 5];
      if (!set) word = ~word;
      word &= ~0u << (t & 31);
      if (word != 0) {
#ifdef __CUDA_ARCH__
        const int r = (t & ~31) + __ffs(static_cast<int>(word)) - 1;
#else
        const int r = (t & ~31) + __builtin_ctz(word);
#endif
        return r < ntiles ? r : ntiles;
      }
      t = (t & ~31) + 32;
    }
    return ntiles;
  }
  OOMB_HOST_DEVICE void enter_run(int a) {  // the run that starts at tile a (a == ntiles: done)
    if (a >= ntiles) {
      r0 = rows;
      return;
    }
    r0 = a * tile_rows;
    const int e = tile_steps ? a + 1 : next_tile(a + 1, false);
    run_end = e * tile_rows < rows ? e * tile_rows : rows;
  }
  OOMB_HOST_DEVICE void advance() {
    r0 += rs;
    if (r0 < run_end) return;
    if (sel == nullptr || run_end >= rows) {
      r0 = rows;
      return;
    }
    enter_run(next_tile(static_cast<int>(tile_div.div(static_cast<std::uint32_t>(run_end))), true));
  }
};

}  // namespace attention::detail
OOMB_NAMESPACE_END
