// oomb trainer — token files: a validating reader, consecutive training windows, a writer.
// SPDX-License-Identifier: Apache-2.0
//
// Format (little-endian):
//   offset  0  8 bytes  magic "OOMBTOKS"
//   offset  8  uint32   version = 1
//   offset 12  uint32   header size = 32
//   offset 16  uint64   token count N
//   offset 24  uint32   vocabulary size (0 = unknown)
//   offset 28  uint32   reserved = 0
//   offset 32  N x uint32 token ids; the file ends exactly there
// The reader checks the header, that the file size is exactly 32 + 4 N, and (by default, once, in
// one pass at open) that every id is below the vocabulary size — the file's and the model's, where
// known — and fits an int32; any failure is an oomb::format_error naming the file (and the
// position of the offending token).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
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
inline constexpr std::uint32_t token_file_version = 1;
inline constexpr std::uint32_t token_file_header_size = 32;

class token_reader {
 public:
  /// Opens and validates `path`. `model_vocab` (0 = no model bound) is checked as well as the
  /// file's own vocabulary size; `check_all_ids` scans every id once now (reads check them anyway).
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
    if (check_all_ids) {
      std::vector<std::int32_t> buf;
      for (std::uint64_t i = 0; i < count_; i += chunk_tokens) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_tokens, count_ - i));
        buf.resize(n);
        read(i, n, buf.data());
      }
    }
  }

  const std::string& path() const noexcept { return src_.name(); }
  /// Number of tokens.
  std::uint64_t size() const noexcept { return count_; }
  /// The header's vocabulary size (0 = unknown).
  std::uint32_t vocab_size() const noexcept { return vocab_; }

  /// Reads tokens [first, first + n) as int32 ids, each checked against the vocabulary bounds.
  void read(std::uint64_t first, std::size_t n, std::int32_t* out) const {
    OOMB_EXPECTS(first <= count_ && n <= count_ - first, path(), ": tokens [", first, ", ", first + n,
                 ") asked, the file holds ", count_);
    OOMB_EXPECTS(out != nullptr || n == 0, "token_reader::read: null output");
    src_.read(token_file_header_size + 4 * first, out, 4 * n);  // uint32 bits into int32 slots
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

 private:
  static constexpr std::size_t chunk_tokens = 1u << 18;

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

  static std::uint32_t u32(const unsigned char* p) {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
           static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
  }

  void parse_header() {
    const std::uint64_t file_size = src_.size();
    OOMB_CHECK(file_size >= token_file_header_size, oomb::format_error, path(), ": truncated: ",
               file_size, " bytes, shorter than the 32-byte header");
    unsigned char h[token_file_header_size];
    src_.read(0, h, sizeof h);
    OOMB_CHECK(std::memcmp(h, token_file_magic, 8) == 0, oomb::format_error, path(),
               ": bad magic: not an OOMBTOKS token file (docs/formats.md; make one from raw little-endian "
               "uint32 ids with `make-tokens --input ids.u32 --output FILE --vocab V`)");
    const std::uint32_t version = u32(h + 8);
    OOMB_CHECK(version == token_file_version, oomb::format_error, path(), ": unsupported version ",
               version, " (this reader knows version 1)");
    const std::uint32_t header_size = u32(h + 12);
    OOMB_CHECK(header_size == token_file_header_size, oomb::format_error, path(), ": header size ",
               header_size, ", expected 32");
    count_ = static_cast<std::uint64_t>(u32(h + 16)) | static_cast<std::uint64_t>(u32(h + 20)) << 32;
    vocab_ = u32(h + 24);
    const std::uint32_t reserved = u32(h + 28);
    OOMB_CHECK(reserved == 0, oomb::format_error, path(), ": reserved header field is ", reserved,
               ", expected 0");
    const std::uint64_t payload = file_size - token_file_header_size;
    OOMB_CHECK(count_ <= payload / 4 && payload == 4 * count_, oomb::format_error, path(),
               ": header says ", count_, " tokens but the file holds ", payload, " bytes after the header (",
               payload / 4, " tokens", (payload % 4 ? " and a partial one" : ""), ")");
  }

  byte_source src_;
  std::uint32_t model_vocab_ = 0;
  std::uint64_t count_ = 0;
  std::uint32_t vocab_ = 0;
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

  /// The next window's tokens; advances by seq_len.
  std::vector<std::int32_t> next() {
    if (window() > reader_.size() - position_) position_ = 0;
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

inline std::string token_file_header(std::uint64_t count, std::uint32_t vocab) {
  unsigned char h[token_file_header_size] = {};
  std::memcpy(h, token_file_magic, 8);
  auto put32 = [&](int at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) h[at + i] = static_cast<unsigned char>((v >> (8 * i)) & 0xffu);
  };
  put32(8, token_file_version);
  put32(12, token_file_header_size);
  put32(16, static_cast<std::uint32_t>(count & 0xffffffffu));
  put32(20, static_cast<std::uint32_t>(count >> 32));
  put32(24, vocab);
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

template <class Int, class Sink>
void emit_token_file(const Int* tokens, std::size_t n, std::uint32_t vocab, Sink&& sink) {
  OOMB_EXPECTS(tokens != nullptr || n == 0, "token file writer: null tokens");
  const std::string h = token_file_header(n, vocab);
  sink(h.data(), h.size());
  std::vector<std::uint32_t> buf;
  constexpr std::size_t chunk = 1u << 18;
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t m = std::min(chunk, n - i);
    pack_tokens(tokens + i, m, vocab, i, buf);
    sink(buf.data(), 4 * m);
  }
}

}  // namespace detail

/// The bytes of a token file holding `tokens` (ids in [0, vocab), or any int32 id when vocab = 0).
template <class Int>
std::string token_file_bytes(const Int* tokens, std::size_t n, std::uint32_t vocab) {
  std::string out;
  detail::emit_token_file(tokens, n, vocab, [&](const void* p, std::size_t k) {
    out.append(static_cast<const char*>(p), k);
  });
  return out;
}

/// Writes a token file atomically (temporary file renamed into place). Throws
/// oomb::invalid_argument naming the position of an id out of range (nothing is written then).
template <class Int>
void write_token_file(const std::string& path, const Int* tokens, std::size_t n, std::uint32_t vocab) {
  atomic_file f(path);
  detail::emit_token_file(tokens, n, vocab, [&](const void* p, std::size_t k) { f.write(p, k); });
  f.commit();
}

/// Converts a raw array of little-endian uint32 ids (e.g. numpy's `a.astype("<u4").tofile(path)`)
/// into a token file, streaming (any size), atomically. A raw size not a multiple of 4 is a
/// format_error; an id outside [0, vocab) an invalid_argument naming its position. Returns the
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

}  // namespace oomb_trainer
