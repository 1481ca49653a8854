// oomb trainer — the training sequences of a token file: consecutive windows, or whole documents
// packed (--packing documents).
// SPDX-License-Identifier: Apache-2.0
//
// Both make sequences of exactly seq_len tokens (the memory plan, the step's token count and the
// GPU trainer's buffers are sized for it) and carry the file's loss mask (io/tokens.hpp: mask[j]
// says whether predicting token j counts, as sequence::mask does). A sequence in which no target
// counts (a window inside a chat prompt) is skipped: chunk_recurrent refuses it and it would add
// nothing but a zero to the batch's mean; last_skipped() says how many the last next() passed.
//
// packing none (consecutive windows, the trainer's behaviour before version 2): window k starts at
// token k * seq_len; the mask is the file's for those tokens, as it is (a target at a document
// start counts unless the file says otherwise); documents run into each other; the window after
// the last whole one starts over at token 0. position() is the next window's first token.
//
// packing documents: the file's documents are cut into *units*: a document of at most seq_len
// tokens is one unit; a longer one is cut into windows of seq_len tokens (the last one shorter),
// each a unit. Every epoch takes all units in a seeded shuffled order (Fisher-Yates driven by
// std::mt19937_64, whose output the standard fixes, so the order is the same on every platform); a
// sequence takes units in that order while the next one fits, continuing into the next epoch's
// order, and the rest of the sequence is padding: id 0, mask 0, a document of its own. In a packed
// sequence the target at each unit's first token never counts (it would be predicted from another
// document, or from the window of a long document before the cut) and the padding's targets do not
// either; everything else follows the file's mask. position() is the number of units taken so far
// over all epochs: what a checkpoint stores (trainer_state's data_position), so a resumed run packs
// the same sequences.
//
// Why padding and not a cut: a unit is never split across sequences, so each document keeps its
// beginning in front of its end (a chat's prompt before its answer) — what packing by documents is
// for; a cut would make the second part a window without its start. The cost is the padding's
// compute; describe() gives the padding share of one epoch and the log each step's padding tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <oomb/core/error.hpp>

#include "trainer/data/targets.hpp"
#include "trainer/io/tokens.hpp"

namespace oomb_trainer {

/// --packing: consecutive windows (none) or whole documents packed (documents).
enum class packing_kind { none, documents };

inline const char* packing_name(packing_kind p) noexcept { return p == packing_kind::documents ? "documents" : "none"; }

inline packing_kind parse_packing(const std::string& flag, const std::string& v) {
  if (v == "none") return packing_kind::none;
  if (v == "documents") return packing_kind::documents;
  OOMB_FAIL(oomb::invalid_argument, flag, ": unknown packing '", v, "' (known: none, documents)");
}

/// A seeded permutation of [0, n): Fisher-Yates over std::mt19937_64 with an unbiased draw, so
/// the same seed gives the same order on every platform (std::shuffle's algorithm is the library's).
inline std::vector<std::uint64_t> seeded_permutation(std::uint64_t n, std::uint64_t seed) {
  std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  for (std::uint64_t i = n; i > 1; --i) {
    // uniform in [0, i): reject the top partial range of 2^64 values
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % i;
    std::uint64_t r;
    do r = rng();
    while (r >= limit);
    std::swap(v[static_cast<std::size_t>(i - 1)], v[static_cast<std::size_t>(r % i)]);
  }
  return v;
}

/// The training sequences of a token file (see the file comment).
class token_sequences {
 public:
  /// A piece of the file packed whole: a document, or a window of a long one.
  struct unit {
    std::uint64_t start = 0;
    std::uint32_t size = 0;
  };

  token_sequences(token_reader reader, std::int64_t seq_len, packing_kind packing, std::uint64_t seed,
                  std::uint64_t position = 0)
      : reader_(std::move(reader)), seq_len_(seq_len), packing_(packing), seed_(seed), position_(position) {
    OOMB_EXPECTS(seq_len >= 2, "token_sequences: seq_len must be at least 2, got ", seq_len);
    if (packing_ == packing_kind::none) {
      OOMB_EXPECTS(std::uint64_t(seq_len) <= reader_.size(), reader_.path(), ": holds ", reader_.size(),
                   " tokens, fewer than one sequence of --seq-len ", seq_len);
      OOMB_EXPECTS(position <= reader_.size(), reader_.path(), ": data position ", position, " is past the end (",
                   reader_.size(), " tokens): a checkpoint of another data file?");
      return;
    }
    OOMB_EXPECTS(reader_.has_documents(), "--packing documents needs to know where documents start: ", reader_.path(),
                 " is a version ", reader_.version(), " token file (tokens only); tools/prepare_data.py writes version 2, "
                 "or make-tokens --documents");
    OOMB_EXPECTS(seq_len <= std::numeric_limits<std::int32_t>::max(), "--packing documents: --seq-len ", seq_len,
                 " is past 2^31 - 1 tokens");
    for (std::uint64_t d = 0; d < reader_.document_count(); ++d) {
      const std::uint64_t s = reader_.document_starts()[static_cast<std::size_t>(d)], n = reader_.document_size(d);
      if (n > std::uint64_t(seq_len)) ++long_documents_;
      for (std::uint64_t off = 0; off < n; off += std::uint64_t(seq_len))
        units_.push_back({s + off, static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t(seq_len), n - off))});
    }
    OOMB_EXPECTS(!units_.empty(), reader_.path(), ": holds no document to pack");
  }

  const token_reader& reader() const noexcept { return reader_; }
  packing_kind packing() const noexcept { return packing_; }
  std::int64_t seq_len() const noexcept { return seq_len_; }
  /// The next window's first token (none), or the units taken over all epochs (documents).
  std::uint64_t position() const noexcept { return position_; }
  /// Units of an epoch (documents; 0 for none).
  std::uint64_t units() const noexcept { return units_.size(); }
  /// Documents longer than seq_len, cut into windows (documents).
  std::uint64_t long_documents() const noexcept { return long_documents_; }
  /// Sequences the last next() skipped because no target of theirs counts.
  std::int64_t last_skipped() const noexcept { return last_skipped_; }
  /// Padding tokens of the last sequence next() returned.
  std::int64_t last_padding() const noexcept { return last_padding_; }

  /// The next training sequence (seq_len tokens) with at least one counted target. Throws when a
  /// whole pass over the data holds none.
  sequence next() {
    last_skipped_ = 0;
    // Skipped in a row past this, a whole pass held no counted target: 2 epochs of units contain
    // one whole epoch; windows start over within a pass and one.
    const std::uint64_t pass = packing_ == packing_kind::documents ? 2 * units_.size()
                                                                   : reader_.size() / std::uint64_t(seq_len_) + 1;
    for (;;) {
      sequence s = packing_ == packing_kind::documents ? next_packed() : next_window();
      if (s.counted_targets() > 0) return s;
      ++last_skipped_;
      OOMB_CHECK(std::uint64_t(last_skipped_) <= pass, oomb::invalid_argument, reader_.path(),
                 ": no training sequence has a target that counts (the file's loss mask is 0 at every token a ",
                 packing_ == packing_kind::documents ? "packed sequence" : "window", " could predict)");
    }
  }

  /// One line for the banner: what the sequences are made of.
  std::string describe() const {
    std::string mask;
    if (reader_.has_mask()) {
      const auto ones = reader_.mask_ones();
      mask = ones ? fmt::format("; loss mask: {:.1f}% of the tokens count", 100.0 * double(*ones) / double(reader_.size()))
                  : std::string("; loss mask");
    }
    const std::string docs =
        reader_.has_documents() ? fmt::format("{} tokens in {} documents", reader_.size(), reader_.document_count())
                                : fmt::format("{} tokens (version {}: no document starts)", reader_.size(), reader_.version());
    if (packing_ == packing_kind::none)
      return fmt::format("{}{}; consecutive windows of {} tokens", docs, mask, seq_len_);
    const epoch_fill f = fill_of_epoch();
    return fmt::format("{}{}; packed by documents ({} longer than {} cut into windows: {} units), seeded shuffle, "
                       "attention and positions per document; an epoch is {} sequences, {:.1f}% of their tokens padding",
                       docs, mask, long_documents_, seq_len_, units_.size(), f.sequences,
                       100.0 * double(f.padding) / (double(f.sequences) * double(seq_len_)));
  }

 private:
  struct epoch_fill {
    std::uint64_t sequences = 0, padding = 0;
  };

  const unit& unit_at(std::uint64_t q) {
    const std::uint64_t e = q / units_.size();
    if (e != order_epoch_ || order_.empty()) {
      order_ = seeded_permutation(units_.size(), seed_ * 0x9E3779B97F4A7C15ull + e);
      order_epoch_ = e;
    }
    return units_[static_cast<std::size_t>(order_[static_cast<std::size_t>(q % units_.size())])];
  }

  sequence next_window() {
    const std::uint64_t start = position_ + std::uint64_t(seq_len_) > reader_.size() ? 0 : position_;
    sequence s;
    s.tokens = reader_.read(start, static_cast<std::size_t>(seq_len_));
    if (reader_.has_mask()) s.mask = reader_.read_mask(start, static_cast<std::size_t>(seq_len_));
    position_ = start + std::uint64_t(seq_len_);
    last_padding_ = 0;
    return s;
  }

  sequence next_packed() {
    sequence s;
    const auto n = static_cast<std::size_t>(seq_len_);
    s.tokens.assign(n, 0);
    s.mask.assign(n, 0);
    std::size_t fill = 0;
    for (;;) {
      const unit u = unit_at(position_);
      if (fill + u.size > n) break;
      reader_.read(u.start, u.size, s.tokens.data() + fill);
      reader_.read_mask(u.start, u.size, s.mask.data() + fill);
      s.mask[fill] = 0;  // predicted from another document (or before a long one's cut)
      s.doc_starts.push_back(static_cast<std::int32_t>(fill));
      fill += u.size;
      ++position_;
      if (fill == n) break;
    }
    if (fill < n) s.doc_starts.push_back(static_cast<std::int32_t>(fill));  // the padding: id 0, mask 0
    last_padding_ = static_cast<std::int64_t>(n - fill);
    return s;
  }

  /// Sequences and padding tokens of packing epoch 0's order on its own (the banner's estimate).
  epoch_fill fill_of_epoch() const {
    const std::vector<std::uint64_t> order = seeded_permutation(units_.size(), seed_ * 0x9E3779B97F4A7C15ull);
    epoch_fill f;
    std::uint64_t fill = 0;
    for (const std::uint64_t i : order) {
      const std::uint64_t k = units_[static_cast<std::size_t>(i)].size;
      if (fill + k > std::uint64_t(seq_len_)) {
        f.padding += std::uint64_t(seq_len_) - fill;
        ++f.sequences;
        fill = 0;
      }
      fill += k;
    }
    if (fill > 0) {
      f.padding += std::uint64_t(seq_len_) - fill;
      ++f.sequences;
    }
    return f;
  }

  token_reader reader_;
  std::int64_t seq_len_;
  packing_kind packing_;
  std::uint64_t seed_;
  std::uint64_t position_;
  std::vector<unit> units_;
  std::uint64_t long_documents_ = 0;
  std::vector<std::uint64_t> order_;
  std::uint64_t order_epoch_ = 0;
  std::int64_t last_skipped_ = 0, last_padding_ = 0;
};

}  // namespace oomb_trainer
