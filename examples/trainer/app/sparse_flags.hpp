// oomb trainer — what the command lines (oomb-train, bench_trainer) share of the page-sparse flags
// --sparse-budget B, --sink S, --local L, --tile Q, --scoring K: --scoring's names, the refusal of
// a shape flag without a budget, and when a budget covers every past page (dense attention), so
// both programs mean and refuse the same. The GPU's tile rule is check_gpu_sparse_tile
// (cuda/page_selector.cuh).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include <oomb/core/error.hpp>
#include <oomb/sparse/scoring.hpp>
#include <oomb/sparse/selection.hpp>

#include "trainer/algo/chunk_options.hpp"

namespace oomb_trainer {

/// The scoring kind --scoring names: "quest" (Quest's upper bound) or "mean" (the mean key).
inline oomb::score_kind parse_score_kind(const std::string& flag, const std::string& text) {
  if (text == oomb::to_string(oomb::score_kind::quest)) return oomb::score_kind::quest;
  if (text == oomb::to_string(oomb::score_kind::mean)) return oomb::score_kind::mean;
  OOMB_FAIL(oomb::invalid_argument, flag, ": '", text, "' is not quest or mean");
}

/// Throws unless a flag that shapes the selection (`shape_flag`: the last of --sink, --local,
/// --tile, --scoring given; empty: none) comes with --sparse-budget: alone it would change nothing.
inline void check_sparse_shape_flags(bool sparse, const std::string& shape_flag) {
  OOMB_EXPECTS(shape_flag.empty() || sparse, shape_flag, " shapes page-sparse attention: it needs --sparse-budget");
}

/// The most past pages a selection tile sees in a sequence of `tokens` tokens: those of every chunk
/// before the last (chunk and page as chunk_options has them).
inline std::int64_t max_past_pages(std::int64_t tokens, std::int32_t chunk, std::int32_t page) {
  return (tokens - 1) / chunk * (chunk / page);
}

/// The pages one tile may take at most (sink + local + budget), as the selectors count them.
inline std::int64_t max_selected_pages(const chunk_options& o) {
  return oomb::selection_config{o.budget, o.sink, o.local}.max_pages();
}

/// Whether a tile may take every past page of a `tokens`-token sequence: then every tile takes
/// every page (the selectors' rule, past <= max_pages), which is dense attention.
inline bool sparse_covers_past(const chunk_options& o, std::int64_t tokens) {
  return max_past_pages(tokens, o.chunk, o.page) <= max_selected_pages(o);
}

/// What is wrong with such a configuration, for the message of whoever refuses or replaces it.
inline std::string sparse_covers_past_reason(const chunk_options& o, std::int64_t tokens) {
  std::ostringstream os;
  os << "--sparse-budget " << o.budget << " + --sink " << o.sink << " + --local " << o.local << " = "
     << max_selected_pages(o) << " pages covers every past page (at most "
     << max_past_pages(tokens, o.chunk, o.page) << " at " << tokens << " tokens, chunk " << o.chunk << ", page " << o.page
     << "): that is dense attention";
  return os.str();
}

}  // namespace oomb_trainer
