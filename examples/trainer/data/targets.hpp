// oomb trainer — which next-token predictions count in the loss.
// SPDX-License-Identifier: Apache-2.0
//
// The loss of a sequence of N tokens is the sum of the cross-entropies of its counted targets
// divided by their number (docs/trainer.md, "The model"): position p (< N - 1) predicts token
// p + 1, and counts unless a mask says otherwise. mask[j] (j in [1, N)) says whether predicting
// token j counts; mask[0] is ignored; an empty mask counts all N - 1 targets.
//
// doc_starts: where each document of a packed sequence begins (--packing documents,
// data/token_sequences.hpp): 0 first, strictly increasing, below N; padding at the end of a
// sequence is a document of its own. Empty: the sequence is one stream. Positions restart at each
// document (RoPE rotates token j by j - its document's start) and attention stays within it (each
// query's lowest key is its document's start: oomb/attention/reference.hpp's key_lower); the loss
// leaves out every target that crosses a boundary (the mask is 0 there).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <oomb/core/error.hpp>

namespace oomb_trainer {

/// The start of the document holding each position [first, first + n) of a sequence whose
/// documents start at `doc_starts` (empty: one stream, every start 0), into out[0, n).
inline void document_starts_of(const std::vector<std::int32_t>& doc_starts, std::int64_t first, std::int64_t n,
                               std::int64_t* out) {
  auto next = std::upper_bound(doc_starts.begin(), doc_starts.end(), first);  // the first start after `first`
  std::int64_t start = next == doc_starts.begin() ? 0 : *(next - 1);
  for (std::int64_t t = 0; t < n; ++t) {
    for (; next != doc_starts.end() && *next <= first + t; ++next) start = *next;
    out[t] = start;
  }
}

/// A training sequence: tokens and an optional per-token loss mask (see the file comment).
struct sequence {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> doc_starts;  ///< documents of a packed sequence (see the file comment)

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  void validate() const {
    OOMB_EXPECTS(tokens.size() >= 2, "a training sequence needs at least 2 tokens, got ", tokens.size());
    OOMB_EXPECTS(mask.empty() || mask.size() == tokens.size(), "loss mask of ", mask.size(),
                 " entries for ", tokens.size(), " tokens");
    for (std::size_t d = 0; d < doc_starts.size(); ++d) {
      const std::int32_t s = doc_starts[d];
      OOMB_EXPECTS(d > 0 || s == 0, "document starts of a sequence: the first is ", s, ", expected 0");
      OOMB_EXPECTS(d == 0 || s > doc_starts[d - 1], "document starts of a sequence: document ", d, " starts at ", s,
                   ", not after document ", d - 1, "'s start ", d > 0 ? doc_starts[d - 1] : 0);
      OOMB_EXPECTS(s < size(), "document starts of a sequence: document ", d, " starts at ", s, ", past its ", size(),
                   " tokens");
    }
  }
  bool counts(std::int64_t j) const noexcept { return mask.empty() || mask[static_cast<std::size_t>(j)] != 0; }
  /// Tokens of the longest document (N without documents): the positions RoPE rotates by, as
  /// transformers' max(position_ids) + 1 (longrope picks its factors by it).
  std::int64_t longest_document() const noexcept {
    std::int64_t most = doc_starts.empty() ? size() : size() - doc_starts.back();
    for (std::size_t d = 1; d < doc_starts.size(); ++d) most = std::max<std::int64_t>(most, doc_starts[d] - doc_starts[d - 1]);
    return most;
  }
  /// Number of counted targets (the loss's divisor).
  std::int64_t counted_targets() const noexcept {
    std::int64_t n = 0;
    for (std::int64_t j = 1; j < size(); ++j) n += counts(j) ? 1 : 0;
    return n;
  }
  /// targets[t] for positions [first, first + n): the token predicted there, or -1 when none counts.
  void targets(std::int64_t first, std::int64_t n, std::int32_t* out) const {
    for (std::int64_t t = 0; t < n; ++t) {
      const std::int64_t j = first + t + 1;
      out[t] = j < size() && counts(j) ? tokens[static_cast<std::size_t>(j)] : -1;
    }
  }
};

}  // namespace oomb_trainer
