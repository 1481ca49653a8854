// oomb trainer — token files: a validating reader (versions 1 and 2), consecutive windows, writers.
// SPDX-License-Identifier: Apache-2.0
//
// Format (little-endian; docs/formats.md has the tables):
//   version 1: a 32-byte header (magic "OOMBTOKS", version 1, header size 32, token count N,
//              vocabulary size, reserved 0), then N uint32 ids; the file ends there.
//   version 2: a 64-byte header (magic, version 2, header size 64, N, vocabulary size, flags —
//              bit 0: a loss mask follows —, document count D, 24 reserved zero bytes), then
//              N uint32 ids, 4 zero bytes when N is odd (so what follows is 8-byte aligned),
//              D uint64 document starts (each document's first token index: the first 0,
//              strictly increasing, below N; D = 0 exactly when N = 0), and with flag bit 0 N
//              uint8 loss-mask bytes (1: predicting this token counts in the loss, 0: it does
//              not — sequence::mask's meaning, data/targets.hpp); the file ends there.
// The reader checks the header, that the file size is exactly what the header implies, every
// document start (at open, always), and (by default, once, in one pass at open) that every id is
// below the vocabulary size — the file's and the model's, where known — and fits an int32, and that
// every mask byte is 0 or 1; any failure is an oomb::format_error naming the file, the field and
// the position at fault.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "oomb/core/error.hpp"
#include "trainer/io/atomic_write.hpp"
#include "trainer/io/byte_source.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the trainer's file readers assume a little-endian host"
#endif

namespace oomb_trainer {

inline constexpr char token_file_magic[8] = {'O', 'O', 'M', 'B', 'T', 'O', 'K', 'S'};
inline constexpr std::uint32_t token_file_version = 1;  ///< version 1: tokens only
inline constexpr std::uint32_t token_file_header_size = 32;  ///< version 1's header
inline constexpr std::uint32_t token_file_v2 = 2;  ///< version 2: tokens, document starts, optional loss mask
inline constexpr std::uint32_t token_file_v2_header_size = 64;
inline constexpr std::uint32_t token_file_flag_mask = 1;  ///< version 2's flags: a loss mask follows

namespace detail {

inline std::uint32_t token_u32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
inline std::uint64_t token_u64(const unsigned char* p) {
  return static_cast<std::uint64_t>(token_u32(p)) | static_cast<std::uint64_t>(token_u32(p + 4)) << 32;
}

/// a + b and a * b, saturating at 2^64 - 1 (sizes a corrupt header implies).
inline std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
}
inline std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
  return b != 0 && a > std::numeric_limits<std::uint64_t>::max() / b ? std::numeric_limits<std::uint64_t>::max() : a * b;
}

/// Version 2's layout: where each section of a file of `n` tokens and `d` documents begins, and
/// the file's size (saturated: a corrupt count cannot wrap it).
struct token_file_v2_layout {
  std::uint64_t tokens = token_file_v2_header_size, padding = 0, documents = 0, mask = 0, end = 0;
  token_file_v2_layout(std::uint64_t n, std::uint64_t d, bool with_mask) {
    padding = sat_add(tokens, sat_mul(4, n));
    documents = sat_add(padding, n % 2 == 1 ? 4 : 0);
    mask = sat_add(documents, sat_mul(8, d));
    end = sat_add(mask, with_mask ? n : 0);
  }
};

}  // namespace detail

class token_reader {
 public:
  /// Opens and validates `path`. `model_vocab` (0 = no model bound) is checked as well as the
  /// file's own vocabulary size; `check_all_ids` scans every id (and mask byte) once now (reads
  /// check them anyway). Document starts are always read and checked at open.
  static token_reader open(const std::string& path, std::uint32_t model_vocab = 0,
                           bool check_all_ids = true) {
    return token_reader(byte_source::open_file(path), model_vocab, check_all_ids);
  }
  /// The same over `size` bytes at `data` (which must outlive the reader), called `name` in errors.
  static token_reader from_memory(std::string name, const void* data, std::size_t size,
                                  std::uint32_t model_vocab = 0, bool check_all_ids = true) {
    return token_reader(byte_source::from_memory(std::move(name), data, size), model_vocab, check_all_ids);
  }

  token_reader(byte_source source, std::uint32_t model_vocab, bool check_all_ids)
      : src_(std::move(source)), model_vocab_(model_vocab) {
    parse_header();
    if (version_ >= token_file_v2) read_document_starts();
    if (check_all_ids) {
      std::vector<std::int32_t> buf;
      std::vector<std::uint8_t> mask;
      for (std::uint64_t i = 0; i < count_; i += chunk_tokens) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_tokens, count_ - i));
        buf.resize(n);
        read(i, n, buf.data());
        if (has_mask_) {
          mask.resize(n);
          read_mask(i, n, mask.data());
          for (const std::uint8_t m : mask) mask_ones_ += m;
        }
      }
      scanned_ = true;
    }
  }

  const std::string& path() const noexcept { return src_.name(); }
  /// Number of tokens.
  std::uint64_t size() const noexcept { return count_; }
  /// The header's vocabulary size (0 = unknown).
  std::uint32_t vocab_size() const noexcept { return vocab_; }
  /// The file's format version: 1 (tokens only) or 2 (document starts, an optional loss mask).
  std::uint32_t version() const noexcept { return version_; }
  /// Whether the file says where its documents start (version 2).
  bool has_documents() const noexcept { return version_ >= token_file_v2; }
  /// Each document's first token index (version 2; empty for version 1): 0 first, strictly increasing.
  const std::vector<std::uint64_t>& document_starts() const noexcept { return starts_; }
  std::uint64_t document_count() const noexcept { return starts_.size(); }
  /// Tokens in document `d` (< document_count()).
  std::uint64_t document_size(std::uint64_t d) const {
    OOMB_EXPECTS(d < starts_.size(), path(), ": document ", d, " asked, the file holds ", starts_.size());
    return (d + 1 < starts_.size() ? starts_[static_cast<std::size_t>(d + 1)] : count_) - starts_[static_cast<std::size_t>(d)];
  }
  /// Whether the file carries a loss mask (version 2, flag bit 0).
  bool has_mask() const noexcept { return has_mask_; }
  /// How many mask bytes are 1 (size() without a mask); nullopt unless the file was scanned at open.
  std::optional<std::uint64_t> mask_ones() const noexcept {
    if (!scanned_) return std::nullopt;
    return has_mask_ ? mask_ones_ : count_;
  }

  /// Reads tokens [first, first + n) as int32 ids, each checked against the vocabulary bounds.
  void read(std::uint64_t first, std::size_t n, std::int32_t* out) const {
    check_range(first, n, out);
    src_.read(tokens_at_ + 4 * first, out, 4 * n);  // uint32 bits into int32 slots
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t id;
      std::memcpy(&id, out + i, 4);
      if (id > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()) ||
          (vocab_ != 0 && id >= vocab_) || (model_vocab_ != 0 && id >= model_vocab_))
        bad_id(first + i, id);
    }
  }
  std::vector<std::int32_t> read(std::uint64_t first, std::size_t n) const {
    std::vector<std::int32_t> v(n);
    read(first, n, v.data());
    return v;
  }

  /// The loss mask of tokens [first, first + n): 1 where predicting the token counts, 0 where it
  /// does not; all 1 for a file without a mask. Each byte is checked (0 or 1).
  void read_mask(std::uint64_t first, std::size_t n, std::uint8_t* out) const {
    check_range(first, n, out);
    if (!has_mask_) {
      std::fill(out, out + n, std::uint8_t{1});
      return;
    }
    src_.read(mask_at_ + first, out, n);
    for (std::size_t i = 0; i < n; ++i)
      OOMB_CHECK(out[i] <= 1, oomb::format_error, path(), ": loss mask at token position ", first + i, " is ",
                 +out[i], ", expected 0 or 1");
  }
  std::vector<std::uint8_t> read_mask(std::uint64_t first, std::size_t n) const {
    std::vector<std::uint8_t> v(n);
    read_mask(first, n, v.data());
    return v;
  }

 private:
  static constexpr std::size_t chunk_tokens = 1u << 18;

  template <class P>
  void check_range(std::uint64_t first, std::size_t n, const P* out) const {
    OOMB_EXPECTS(first <= count_ && n <= count_ - first, path(), ": tokens [", first, ", ", first + n,
                 ") asked, the file holds ", count_);
    OOMB_EXPECTS(out != nullptr || n == 0, "token_reader::read: null output");
  }

  [[noreturn]] void bad_id(std::uint64_t pos, std::uint32_t id) const {
    if (vocab_ != 0 && id >= vocab_)
      OOMB_FAIL(oomb::format_error, path(), ": token at position ", pos, " has id ", id,
                ", outside the file's vocabulary size ", vocab_);
    if (model_vocab_ != 0 && id >= model_vocab_)
      OOMB_FAIL(oomb::format_error, path(), ": token at position ", pos, " has id ", id,
                ", outside the model's vocabulary size ", model_vocab_);
    OOMB_FAIL(oomb::format_error, path(), ": token at position ", pos, " has id ", id,
              ", which does not fit an int32");
  }

  void parse_header() {
    const std::uint64_t file_size = src_.size();
    OOMB_CHECK(file_size >= token_file_header_size, oomb::format_error, path(), ": truncated: ",
               file_size, " bytes, shorter than the 32-byte header");
    unsigned char h[token_file_v2_header_size] = {};
    src_.read(0, h, token_file_header_size);
    OOMB_CHECK(std::memcmp(h, token_file_magic, 8) == 0, oomb::format_error, path(),
               ": bad magic: not an OOMBTOKS token file (docs/formats.md; make one from text with "
               "tools/prepare_data.py, or from raw little-endian uint32 ids with "
               "`make-tokens --input ids.u32 --output FILE --vocab V`)");
    version_ = detail::token_u32(h + 8);
    OOMB_CHECK(version_ == token_file_version || version_ == token_file_v2, oomb::format_error, path(),
               ": unsupported version ", version_, " (this reader knows versions 1 and 2)");
    const std::uint32_t want_header = version_ == 1 ? token_file_header_size : token_file_v2_header_size;
    const std::uint32_t header_size = detail::token_u32(h + 12);
    OOMB_CHECK(header_size == want_header, oomb::format_error, path(), ": header size ", header_size, ", expected ",
               want_header, " (version ", version_, ")");
    count_ = detail::token_u64(h + 16);
    vocab_ = detail::token_u32(h + 24);
    if (version_ == token_file_version) {
      const std::uint32_t reserved = detail::token_u32(h + 28);
      OOMB_CHECK(reserved == 0, oomb::format_error, path(), ": reserved header field is ", reserved,
                 ", expected 0");
      tokens_at_ = token_file_header_size;
      const std::uint64_t payload = file_size - token_file_header_size;
      OOMB_CHECK(count_ <= payload / 4 && payload == 4 * count_, oomb::format_error, path(),
                 ": header says ", count_, " tokens but the file holds ", payload, " bytes after the header (",
                 payload / 4, " tokens", (payload % 4 ? " and a partial one" : ""), ")");
      return;
    }
    OOMB_CHECK(file_size >= token_file_v2_header_size, oomb::format_error, path(), ": truncated: ", file_size,
               " bytes, shorter than version 2's 64-byte header");
    src_.read(0, h, token_file_v2_header_size);
    const std::uint32_t flags = detail::token_u32(h + 28);
    OOMB_CHECK((flags & ~token_file_flag_mask) == 0, oomb::format_error, path(), ": header flags ", flags,
               " set unknown bits (this reader knows bit 0: a loss mask follows)");
    has_mask_ = (flags & token_file_flag_mask) != 0;
    documents_ = detail::token_u64(h + 32);
    for (std::uint32_t b = 40; b < token_file_v2_header_size; ++b)
      OOMB_CHECK(h[b] == 0, oomb::format_error, path(), ": reserved header byte ", b, " is ", +h[b], ", expected 0");
    OOMB_CHECK((count_ == 0) == (documents_ == 0), oomb::format_error, path(), ": header says ", count_, " tokens in ",
               documents_, " documents (every token belongs to a document: 0 documents exactly when 0 tokens)");
    OOMB_CHECK(documents_ <= count_, oomb::format_error, path(), ": header says ", documents_, " documents of ", count_,
               " tokens (a document holds at least one token)");
    const detail::token_file_v2_layout at(count_, documents_, has_mask_);
    OOMB_CHECK(at.end == file_size, oomb::format_error, path(), ": header says ", count_, " tokens, ", documents_,
               " documents", has_mask_ ? " and a loss mask" : " and no loss mask", ": the file should be ",
               at.end == std::numeric_limits<std::uint64_t>::max() ? std::string("over 2^64") : std::to_string(at.end),
               " bytes (64 + 4 N", count_ % 2 ? " + 4 padding" : "", " + 8 D", has_mask_ ? " + N" : "",
               "), it holds ", file_size);
    tokens_at_ = at.tokens;
    starts_at_ = at.documents;
    mask_at_ = at.mask;
    if (at.documents != at.padding) {
      unsigned char pad[4];
      src_.read(at.padding, pad, 4);
      for (int b = 0; b < 4; ++b)
        OOMB_CHECK(pad[b] == 0, oomb::format_error, path(), ": padding byte ", b, " after the tokens (file offset ",
                   at.padding + std::uint64_t(b), ") is ", +pad[b], ", expected 0");
    }
  }

  void read_document_starts() {
    starts_.resize(static_cast<std::size_t>(documents_));
    std::vector<unsigned char> raw;
    constexpr std::size_t chunk = 1u << 16;
    for (std::uint64_t i = 0; i < documents_; i += chunk) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, documents_ - i));
      raw.resize(8 * n);
      src_.read(starts_at_ + 8 * i, raw.data(), raw.size());
      for (std::size_t k = 0; k < n; ++k) {
        const std::uint64_t d = i + k, s = detail::token_u64(raw.data() + 8 * k);
        if (d == 0)
          OOMB_CHECK(s == 0, oomb::format_error, path(), ": document starts: document 0 starts at token ", s,
                     ", expected 0");
        else
          OOMB_CHECK(s > starts_[static_cast<std::size_t>(d - 1)], oomb::format_error, path(),
                     ": document starts: document ", d, " starts at token ", s, ", not after document ", d - 1,
                     "'s start ", starts_[static_cast<std::size_t>(d - 1)], " (strictly increasing: no empty document)");
        OOMB_CHECK(s < count_, oomb::format_error, path(), ": document starts: document ", d, " starts at token ", s,
                   ", past the last token (the file holds ", count_, ")");
        starts_[static_cast<std::size_t>(d)] = s;
      }
    }
  }

  byte_source src_;
  std::uint32_t model_vocab_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t count_ = 0;
  std::uint32_t vocab_ = 0;
  bool has_mask_ = false;
  bool scanned_ = false;
  std::uint64_t mask_ones_ = 0;
  std::uint64_t documents_ = 0;
  std::uint64_t tokens_at_ = 0, starts_at_ = 0, mask_at_ = 0;  // file offsets of the sections
  std::vector<std::uint64_t> starts_;
};

/// Consecutive training windows over a token file: window k starts at token k * seq_len and holds
/// seq_len tokens, plus one more (the last token's label, which is also the next window's first
/// token) when `with_label`. When the next window would run past the end, it starts over at token 0.
/// position() is where the next window starts: save it to resume exactly.
class token_windows {
 public:
  token_windows(token_reader reader, std::size_t seq_len, bool with_label, std::uint64_t position = 0)
      : reader_(std::move(reader)), seq_len_(seq_len), extra_(with_label ? 1 : 0), position_(position) {
    OOMB_EXPECTS(seq_len > 0, "token_windows: seq_len must be positive");
    OOMB_EXPECTS(window() <= reader_.size(), reader_.path(), ": holds ", reader_.size(),
                 " tokens, fewer than one window of ", window());
    OOMB_EXPECTS(position <= reader_.size(), "token_windows: position ", position, " is past the end (",
                 reader_.size(), " tokens)");
  }

  std::size_t window() const noexcept { return seq_len_ + extra_; }
  std::uint64_t position() const noexcept { return position_; }
  const token_reader& reader() const noexcept { return reader_; }

  /// Where the next window starts (wrapping), without taking it.
  std::uint64_t next_start() const noexcept { return window() > reader_.size() - position_ ? 0 : position_; }

  /// The next window's tokens; advances by seq_len.
  std::vector<std::int32_t> next() {
    position_ = next_start();
    auto v = reader_.read(position_, window());
    position_ += seq_len_;
    return v;
  }

 private:
  token_reader reader_;
  std::size_t seq_len_;
  std::size_t extra_;
  std::uint64_t position_;
};

namespace detail {

inline void put_u32(unsigned char* h, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) h[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xffu);
}
inline void put_u64(unsigned char* h, std::uint64_t v) {
  put_u32(h, static_cast<std::uint32_t>(v & 0xffffffffu));
  put_u32(h + 4, static_cast<std::uint32_t>(v >> 32));
}

inline std::string token_file_header(std::uint64_t count, std::uint32_t vocab) {
  unsigned char h[token_file_header_size] = {};
  std::memcpy(h, token_file_magic, 8);
  put_u32(h + 8, token_file_version);
  put_u32(h + 12, token_file_header_size);
  put_u64(h + 16, count);
  put_u32(h + 24, vocab);
  return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

inline std::string token_file_v2_header(std::uint64_t count, std::uint32_t vocab, std::uint64_t documents, bool mask) {
  unsigned char h[token_file_v2_header_size] = {};
  std::memcpy(h, token_file_magic, 8);
  put_u32(h + 8, token_file_v2);
  put_u32(h + 12, token_file_v2_header_size);
  put_u64(h + 16, count);
  put_u32(h + 24, vocab);
  put_u32(h + 28, mask ? token_file_flag_mask : 0);
  put_u64(h + 32, documents);
  return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

// Checks ids [0, n) (at file positions first + i) against the vocabulary and packs them as uint32.
template <class Int>
void pack_tokens(const Int* tokens, std::size_t n, std::uint32_t vocab, std::uint64_t first,
                 std::vector<std::uint32_t>& out) {
  static_assert(std::is_integral_v<Int>, "token ids are integers");
  out.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const Int t = tokens[k];
    bool ok = true;
    if constexpr (std::is_signed_v<Int>) ok = t >= 0;
    ok = ok && static_cast<std::uint64_t>(t) <= std::numeric_limits<std::int32_t>::max() &&
         (vocab == 0 || static_cast<std::uint64_t>(t) < vocab);
    OOMB_EXPECTS(ok, "token file writer: token at position ", first + k, " has id ", +t, ", outside [0, ",
                 (vocab ? std::uint64_t{vocab} : std::uint64_t{1} << 31), ")");
    out[k] = static_cast<std::uint32_t>(t);
  }
}

/// Checks document starts [0, n) (their indices first + k) of a file of `tokens` tokens, the
/// previous start being `prev` (none for first = 0), and packs them as little-endian uint64.
inline void pack_document_starts(const std::uint64_t* starts, std::size_t n, std::uint64_t tokens, std::uint64_t first,
                                 std::uint64_t prev, std::vector<unsigned char>& out) {
  out.resize(8 * n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t d = first + k, s = starts[k];
    OOMB_EXPECTS(d == 0 ? s == 0 : s > prev, "token file writer: document ", d, " starts at token ", s,
                 d == 0 ? ", expected 0" : ", not after the previous document's start " + std::to_string(prev));
    OOMB_EXPECTS(s < tokens, "token file writer: document ", d, " starts at token ", s, ", past the last of ", tokens,
                 " tokens");
    put_u64(out.data() + 8 * k, s);
    prev = s;
  }
}

inline void check_mask(const std::uint8_t* mask, std::size_t n, std::uint64_t first) {
  for (std::size_t k = 0; k < n; ++k)
    OOMB_EXPECTS(mask[k] <= 1, "token file writer: loss mask at token position ", first + k, " is ", +mask[k],
                 ", expected 0 or 1");
}

/// The ids of either version's body, checked and packed a slice at a time.
template <class Int, class Sink>
void emit_token_ids(const Int* tokens, std::size_t n, std::uint32_t vocab, Sink& sink) {
  std::vector<std::uint32_t> buf;
  constexpr std::size_t chunk = 1u << 18;
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t m = std::min(chunk, n - i);
    pack_tokens(tokens + i, m, vocab, i, buf);
    sink(buf.data(), 4 * m);
  }
}

template <class Int, class Sink>
void emit_token_file(const Int* tokens, std::size_t n, std::uint32_t vocab, Sink&& sink) {
  OOMB_EXPECTS(tokens != nullptr || n == 0, "token file writer: null tokens");
  const std::string h = token_file_header(n, vocab);
  sink(h.data(), h.size());
  emit_token_ids(tokens, n, vocab, sink);
}

template <class Int, class Sink>
void emit_token_file_v2(const Int* tokens, std::size_t n, std::uint32_t vocab, const std::vector<std::uint64_t>& starts,
                        const std::uint8_t* mask, Sink&& sink) {
  OOMB_EXPECTS(tokens != nullptr || n == 0, "token file writer: null tokens");
  OOMB_EXPECTS(starts.empty() == (n == 0), "token file writer: ", starts.size(), " document starts for ", n,
               " tokens (0 documents exactly when 0 tokens)");
  std::vector<unsigned char> packed_starts;
  pack_document_starts(starts.data(), starts.size(), n, 0, 0, packed_starts);  // checked before anything is written
  if (mask) check_mask(mask, n, 0);
  const std::string h = token_file_v2_header(n, vocab, starts.size(), mask != nullptr);
  sink(h.data(), h.size());
  emit_token_ids(tokens, n, vocab, sink);
  const unsigned char zeros[4] = {0, 0, 0, 0};
  if (n % 2 == 1) sink(zeros, 4);
  if (!packed_starts.empty()) sink(packed_starts.data(), packed_starts.size());
  if (mask && n > 0) sink(mask, n);
}

}  // namespace detail

/// The bytes of a version 1 token file holding `tokens` (ids in [0, vocab), or any int32 id when vocab = 0).
template <class Int>
std::string token_file_bytes(const Int* tokens, std::size_t n, std::uint32_t vocab) {
  std::string out;
  detail::emit_token_file(tokens, n, vocab, [&](const void* p, std::size_t k) {
    out.append(static_cast<const char*>(p), k);
  });
  return out;
}

/// The bytes of a version 2 token file: `tokens`, the documents starting at `starts` (0 first,
/// strictly increasing, below n), and the loss mask `mask` (n bytes of 0 or 1; null: none).
template <class Int>
std::string token_file_bytes(const Int* tokens, std::size_t n, std::uint32_t vocab, const std::vector<std::uint64_t>& starts,
                             const std::uint8_t* mask) {
  std::string out;
  detail::emit_token_file_v2(tokens, n, vocab, starts, mask, [&](const void* p, std::size_t k) {
    out.append(static_cast<const char*>(p), k);
  });
  return out;
}

/// Writes a version 1 token file atomically (temporary file renamed into place). Throws
/// oomb::invalid_argument naming the position of an id out of range (nothing is written then).
template <class Int>
void write_token_file(const std::string& path, const Int* tokens, std::size_t n, std::uint32_t vocab) {
  atomic_file f(path);
  detail::emit_token_file(tokens, n, vocab, [&](const void* p, std::size_t k) { f.write(p, k); });
  f.commit();
}

/// Writes a version 2 token file atomically (see token_file_bytes). A bad id, document start or
/// mask byte is an oomb::invalid_argument naming its position; nothing is written then.
template <class Int>
void write_token_file(const std::string& path, const Int* tokens, std::size_t n, std::uint32_t vocab,
                      const std::vector<std::uint64_t>& starts, const std::uint8_t* mask) {
  atomic_file f(path);
  detail::emit_token_file_v2(tokens, n, vocab, starts, mask, [&](const void* p, std::size_t k) { f.write(p, k); });
  f.commit();
}

/// Converts a raw array of little-endian uint32 ids (e.g. numpy's `a.astype("<u4").tofile(path)`)
/// into a version 1 token file, streaming (any size), atomically. A raw size not a multiple of 4 is
/// a format_error; an id outside [0, vocab) an invalid_argument naming its position. Returns the
/// number of tokens.
inline std::uint64_t convert_raw_tokens(const std::string& raw_path, const std::string& out_path,
                                        std::uint32_t vocab) {
  const byte_source in = byte_source::open_file(raw_path);
  OOMB_CHECK(in.size() % 4 == 0, oomb::format_error, raw_path, ": ", in.size(),
             " bytes is not a whole number of uint32 tokens");
  const std::uint64_t count = in.size() / 4;
  atomic_file f(out_path);
  const std::string h = detail::token_file_header(count, vocab);
  f.write(h.data(), h.size());
  std::vector<std::uint32_t> raw, packed;
  constexpr std::size_t chunk = 1u << 18;
  for (std::uint64_t i = 0; i < count; i += chunk) {
    const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, count - i));
    raw.resize(m);
    in.read(4 * i, raw.data(), 4 * m);
    detail::pack_tokens(raw.data(), m, vocab, i, packed);
    f.write(packed.data(), 4 * m);
  }
  f.commit();
  return count;
}

/// Converts raw arrays into a version 2 token file, streaming, atomically: `raw_path` little-endian
/// uint32 ids, `starts_path` little-endian uint64 document starts (numpy: `s.astype("<u8")`; 0
/// first, strictly increasing, below the token count), `mask_path` (empty: none) one byte 0 or 1
/// per token. Sizes that are not whole arrays or disagree are format_errors naming the file; a bad
/// id, start or mask byte an invalid_argument naming its position. Returns the number of tokens.
inline std::uint64_t convert_raw_documents(const std::string& raw_path, const std::string& starts_path,
                                           const std::string& mask_path, const std::string& out_path,
                                           std::uint32_t vocab) {
  const byte_source in = byte_source::open_file(raw_path);
  OOMB_CHECK(in.size() % 4 == 0, oomb::format_error, raw_path, ": ", in.size(),
             " bytes is not a whole number of uint32 tokens");
  const std::uint64_t count = in.size() / 4;
  const byte_source starts = byte_source::open_file(starts_path);
  OOMB_CHECK(starts.size() % 8 == 0, oomb::format_error, starts_path, ": ", starts.size(),
             " bytes is not a whole number of uint64 document starts");
  const std::uint64_t documents = starts.size() / 8;
  OOMB_CHECK((documents == 0) == (count == 0), oomb::format_error, starts_path, ": ", documents,
             " document starts for ", count, " tokens (0 documents exactly when 0 tokens)");
  std::optional<byte_source> mask;
  if (!mask_path.empty()) {
    mask.emplace(byte_source::open_file(mask_path));
    OOMB_CHECK(mask->size() == count, oomb::format_error, mask_path, ": ", mask->size(), " mask bytes for ", count,
               " tokens (one byte per token)");
  }
  atomic_file f(out_path);
  const std::string h = detail::token_file_v2_header(count, vocab, documents, mask.has_value());
  f.write(h.data(), h.size());
  constexpr std::size_t chunk = 1u << 18;
  {
    std::vector<std::uint32_t> raw, packed;
    for (std::uint64_t i = 0; i < count; i += chunk) {
      const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, count - i));
      raw.resize(m);
      in.read(4 * i, raw.data(), 4 * m);
      detail::pack_tokens(raw.data(), m, vocab, i, packed);
      f.write(packed.data(), 4 * m);
    }
  }
  const unsigned char zeros[4] = {0, 0, 0, 0};
  if (count % 2 == 1) f.write(zeros, 4);
  {
    std::vector<std::uint64_t> raw;
    std::vector<unsigned char> packed;
    std::uint64_t prev = 0;
    for (std::uint64_t i = 0; i < documents; i += chunk) {
      const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, documents - i));
      raw.resize(m);
      starts.read(8 * i, raw.data(), 8 * m);
      detail::pack_document_starts(raw.data(), m, count, i, prev, packed);
      prev = raw[m - 1];
      f.write(packed.data(), packed.size());
    }
  }
  if (mask) {
    std::vector<std::uint8_t> raw;
    for (std::uint64_t i = 0; i < count; i += chunk) {
      const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, count - i));
      raw.resize(m);
      mask->read(i, raw.data(), m);
      detail::check_mask(raw.data(), m, i);
      f.write(raw.data(), m);
    }
  }
  f.commit();
  return count;
}

}  // namespace oomb_trainer
