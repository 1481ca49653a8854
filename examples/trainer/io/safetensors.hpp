// oomb trainer — safetensors: a validating reader (file or memory) and an atomic writer.
// SPDX-License-Identifier: Apache-2.0
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data buffer; offsets are relative to its start, data row-major little-endian.
// The reader checks everything before any tensor is read (header length, JSON, dtypes, shapes,
// offsets in range and not overlapping, byte counts that match dtype x shape), so a bad file is an
// oomb::format_error naming the file and the tensor, never a crash. Floating tensors (F64, F32,
// BF16, F16) are read into float or double buffers, converting; other dtypes are listed and
// validated but cannot be read as floats.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "trainer/io/atomic_write.hpp"
#include "trainer/io/byte_source.hpp"
#include "trainer/io/json_util.hpp"
#include "trainer/io/named_tensor.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the trainer's file readers assume a little-endian host"
#endif

namespace oomb_trainer {

/// Element types of the safetensors format.
enum class dtype { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, boolean, f8_e4m3, f8_e5m2 };

namespace detail {

struct dtype_desc {
  const char* name;
  dtype type;
  std::size_t size;
  bool floating;  // readable as float/double
};

inline constexpr dtype_desc dtype_table[] = {
    {"F64", dtype::f64, 8, true},      {"F32", dtype::f32, 4, true},
    {"F16", dtype::f16, 2, true},      {"BF16", dtype::bf16, 2, true},
    {"I64", dtype::i64, 8, false},     {"I32", dtype::i32, 4, false},
    {"I16", dtype::i16, 2, false},     {"I8", dtype::i8, 1, false},
    {"U64", dtype::u64, 8, false},     {"U32", dtype::u32, 4, false},
    {"U16", dtype::u16, 2, false},     {"U8", dtype::u8, 1, false},
    {"BOOL", dtype::boolean, 1, false}, {"F8_E4M3", dtype::f8_e4m3, 1, false},
    {"F8_E5M2", dtype::f8_e5m2, 1, false},
};

inline const dtype_desc& describe(dtype t) {
  for (const auto& d : dtype_table)
    if (d.type == t) return d;
  OOMB_FAIL(oomb::invalid_argument, "unknown dtype value ", static_cast<int>(t));
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// double -> bf16 rounded once (to nearest, ties to even). Going through float would round twice;
/// rounding to float *to odd* first keeps the final rounding correct (float has 16 spare bits).
inline oomb::bf16 double_to_bf16(double d) {
  if (std::isnan(d)) return oomb::bf16(static_cast<float>(d));
  float f = static_cast<float>(d);
  if (static_cast<double>(f) != d) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(d))
      f = std::nextafter(f, 0.0f);  // truncate toward zero (inf -> max finite)
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u |= 1u;  // sticky bit: inexact
    std::memcpy(&f, &u, sizeof f);
  }
  return oomb::bf16(f);
}

template <class T>
void convert_from(dtype t, const unsigned char* src, std::size_t n, T* out) {
  switch (t) {
    case dtype::f64:
      for (std::size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = static_cast<T>(v);
      }
      return;
    case dtype::f32:
      for (std::size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, src + 4 * i, 4);
        out[i] = static_cast<T>(v);
      }
      return;
    case dtype::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = static_cast<T>(static_cast<float>(oomb::bf16::from_bits(b)));
      }
      return;
    case dtype::f16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = static_cast<T>(half_to_float(b));
      }
      return;
    default:
      OOMB_FAIL(oomb::invalid_argument, "convert_from: not a floating dtype");
  }
}

template <class T>
void convert_to(dtype t, const T* src, std::size_t n, unsigned char* out) {
  switch (t) {
    case dtype::f64:
      for (std::size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(src[i]);
        std::memcpy(out + 8 * i, &v, 8);
      }
      return;
    case dtype::f32:
      for (std::size_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(src[i]);
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case dtype::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        oomb::bf16 b;
        if constexpr (std::is_same_v<T, double>)
          b = double_to_bf16(src[i]);
        else
          b = oomb::bf16(static_cast<float>(src[i]));
        std::memcpy(out + 2 * i, &b.bits, 2);
      }
      return;
    default:
      OOMB_FAIL(oomb::invalid_argument, "safetensors_writer: output dtype ", describe(t).name,
                " is not supported (F32, BF16, F64)");
  }
}

inline constexpr std::uint64_t safetensors_max_header = 100ull << 20;  // as the reference reader
inline constexpr std::size_t conversion_chunk_bytes = 1u << 20;

}  // namespace detail

inline const char* dtype_name(dtype t) { return detail::describe(t).name; }
inline std::size_t dtype_size(dtype t) { return detail::describe(t).size; }

/// One tensor of a safetensors file. begin/end are byte offsets into the data buffer.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// A validated safetensors file (or memory buffer). Cheap to copy (shares the open file).
class safetensors_file {
 public:
  /// Opens and validates `path` (reads only the header).
  static safetensors_file open(const std::string& path) {
    return safetensors_file(byte_source::open_file(path));
  }
  /// Validates `size` bytes at `data`, called `name` in errors; the bytes must outlive the reader.
  static safetensors_file from_memory(std::string name, const void* data, std::size_t size) {
    return safetensors_file(byte_source::from_memory(std::move(name), data, size));
  }

  explicit safetensors_file(byte_source source) : src_(std::move(source)) { parse_header(); }

  const std::string& path() const noexcept { return src_.name(); }
  /// Every tensor, in the order of its data in the file.
  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  /// The tensor called `name`; a format_error naming the file and the tensor when it is missing.
  const tensor_info& info(const std::string& name) const {
    auto it = index_.find(name);
    OOMB_CHECK(it != index_.end(), oomb::format_error, path(), ": tensor '", name, "' is missing");
    return tensors_[it->second];
  }

  /// Reads tensor `name` into `out` (numel elements of float or double), converting from its
  /// dtype; its shape must equal `expected_shape` (a format_error naming both otherwise).
  template <class T>
  void read(const std::string& name, const std::vector<std::int64_t>& expected_shape, T* out) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "tensors are read into float or double buffers");
    const tensor_info& t = info(name);
    OOMB_CHECK(t.shape == expected_shape, oomb::format_error, path(), ": tensor '", name,
               "' has shape ", shape_string(t.shape), ", expected ", shape_string(expected_shape));
    const auto& d = detail::describe(t.type);
    OOMB_CHECK(d.floating, oomb::format_error, path(), ": tensor '", name, "' has dtype ", d.name,
               ", which cannot be read as floating point (F64, F32, BF16, F16)");
    OOMB_EXPECTS(out != nullptr || t.numel == 0, path(), ": tensor '", name, "': null output buffer");
    const std::uint64_t base = data_start_ + t.begin;
    if (sizeof(T) == d.size && ((std::is_same_v<T, float> && t.type == dtype::f32) ||
                                (std::is_same_v<T, double> && t.type == dtype::f64))) {
      src_.read(base, out, static_cast<std::size_t>(t.end - t.begin));  // same type: no copy
      return;
    }
    const std::size_t per_chunk = detail::conversion_chunk_bytes / d.size;
    std::vector<unsigned char> buf(std::min<std::uint64_t>(t.numel, per_chunk) * d.size);
    for (std::uint64_t i = 0; i < t.numel; i += per_chunk) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, t.numel - i));
      src_.read(base + i * d.size, buf.data(), n * d.size);
      detail::convert_from(t.type, buf.data(), n, out + i);
    }
  }

  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& expected_shape) const {
    std::vector<T> v(static_cast<std::size_t>(info(name).numel));
    read(name, expected_shape, v.data());
    return v;
  }

  /// The tensor's raw little-endian bytes (end - begin of them) into dst.
  void read_raw(const std::string& name, void* dst) const {
    const tensor_info& t = info(name);
    src_.read(data_start_ + t.begin, dst, static_cast<std::size_t>(t.end - t.begin));
  }

 private:
  [[noreturn]] void bad(const std::string& tensor, const std::string& what) const {
    if (tensor.empty()) OOMB_FAIL(oomb::format_error, path(), ": ", what);
    OOMB_FAIL(oomb::format_error, path(), ": tensor '", tensor, "': ", what);
  }

  static bool as_u64(const nlohmann::json& v, std::uint64_t& out) {
    if (!v.is_number_unsigned()) return false;  // negative and fractional numbers are refused
    out = v.get<std::uint64_t>();
    return true;
  }

  void parse_header() {
    const std::uint64_t file_size = src_.size();
    if (file_size < 8)
      bad("", "truncated: " + std::to_string(file_size) +
                  " bytes, shorter than the 8-byte header length");
    unsigned char len_bytes[8];
    src_.read(0, len_bytes, 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > file_size - 8)
      bad("", "header length " + std::to_string(n) + " runs past the end of the file (" +
                  std::to_string(file_size) + " bytes)");
    if (n > detail::safetensors_max_header)
      bad("", "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
    if (n < 2) bad("", "header length " + std::to_string(n) + " is too small for a JSON object");
    std::string text(static_cast<std::size_t>(n), '\0');
    src_.read(8, text.data(), text.size());
    data_start_ = 8 + n;
    const std::uint64_t data_size = file_size - data_start_;

    // The longest legitimate path is root -> tensor -> shape array: depth 3.
    const nlohmann::json header =
        detail::parse_json_bounded(text.data(), text.data() + text.size(), 4, path(), "header");
    if (!header.is_object()) bad("", "the header must be a JSON object, got " + detail::json_brief(header));

    for (const auto& item : header.items()) {
      const std::string& name = item.key();
      const nlohmann::json& v = item.value();
      if (name == "__metadata__") {
        if (!v.is_object()) bad("", "'__metadata__' must be an object of strings");
        for (const auto& m : v.items()) {
          if (!m.value().is_string())
            bad("", "'__metadata__' entry '" + m.key() + "' must be a string, got " +
                        detail::json_brief(m.value()));
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      if (!v.is_object()) bad(name, "entry must be an object, got " + detail::json_brief(v));
      tensor_info t;
      t.name = name;

      auto dt = v.find("dtype");
      if (dt == v.end()) bad(name, "field 'dtype' is missing");
      if (!dt->is_string()) bad(name, "field 'dtype' must be a string, got " + detail::json_brief(*dt));
      const std::string dname = dt->get<std::string>();
      const detail::dtype_desc* desc = nullptr;
      for (const auto& d : detail::dtype_table)
        if (dname == d.name) desc = &d;
      if (desc == nullptr) bad(name, "unknown dtype " + detail::json_brief(*dt));
      t.type = desc->type;

      auto sh = v.find("shape");
      if (sh == v.end()) bad(name, "field 'shape' is missing");
      if (!sh->is_array()) bad(name, "field 'shape' must be an array, got " + detail::json_brief(*sh));
      t.numel = 1;
      bool overflow = false, zero = false;
      for (const auto& dim : *sh) {
        std::uint64_t d = 0;
        if (!as_u64(dim, d) || d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          bad(name, "shape dimension " + detail::json_brief(dim) + " is not a non-negative integer");
        t.shape.push_back(static_cast<std::int64_t>(d));
        if (d == 0) zero = true;
        else if (t.numel > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
        t.numel *= d;  // wraps only when overflow is set
      }
      if (zero) {  // a zero dimension makes the product exactly zero, whatever the others
        overflow = false;
        t.numel = 0;
      }
      if (overflow || t.numel > std::numeric_limits<std::uint64_t>::max() / desc->size)
        bad(name, "shape " + shape_string(t.shape) + " has too many elements");

      auto off = v.find("data_offsets");
      if (off == v.end()) bad(name, "field 'data_offsets' is missing");
      if (!off->is_array() || off->size() != 2)
        bad(name, "field 'data_offsets' must be an array [begin, end], got " + detail::json_brief(*off));
      if (!as_u64((*off)[0], t.begin) || !as_u64((*off)[1], t.end))
        bad(name, "data_offsets must be non-negative integers");
      if (t.begin > t.end)
        bad(name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] end before they begin");
      if (t.end > data_size)
        bad(name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] run past the data buffer (" + std::to_string(data_size) +
                      " bytes): file truncated or offsets out of range");
      const std::uint64_t expected = t.numel * desc->size;
      if (t.end - t.begin != expected)
        bad(name, "data_offsets span " + std::to_string(t.end - t.begin) + " bytes but dtype " +
                      desc->name + " x shape " + shape_string(t.shape) + " needs " +
                      std::to_string(expected));
      tensors_.push_back(std::move(t));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    const tensor_info* prev = nullptr;  // last non-empty tensor
    for (const auto& t : tensors_) {
      if (t.begin == t.end) continue;
      if (prev != nullptr && t.begin < prev->end)
        bad(t.name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                        ") overlap tensor '" + prev->name + "' [" + std::to_string(prev->begin) +
                        ", " + std::to_string(prev->end) + ")");
      prev = &t;
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  }

  byte_source src_;
  std::uint64_t data_start_ = 0;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Collects named tensors (not copied: the data must stay alive until write()) and writes them as
/// one safetensors file, converting to the output dtype (F32, BF16 or F64; BF16 rounds to nearest
/// even, once, from float or double). A streamed_tensor is copied out when write() reaches it,
/// through a buffer of that one tensor.
class safetensors_writer {
 public:
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, const T* data, dtype out) {
    OOMB_EXPECTS(data != nullptr || shape_numel(shape) == 0, "safetensors_writer: tensor '", name, "': null data");
    push<T>(std::move(name), std::move(shape), data, {}, out);
  }
  template <class T>
  void add(const named_tensor<T>& t, dtype out) {
    add(t.name, t.shape, static_cast<const std::remove_const_t<T>*>(t.data), out);
  }
  template <class T>
  void add(const streamed_tensor<T>& t, dtype out) {
    OOMB_EXPECTS(static_cast<bool>(t.copy_out), "safetensors_writer: tensor '", t.name, "' has no copy_out");
    push<T>(t.name, t.shape, nullptr, [f = t.copy_out](void* host) { f(static_cast<T*>(host)); }, out);
  }

  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  /// The file's bytes in memory (tests, fuzz seeds).
  std::string to_bytes() const {
    std::string out;
    emit([&](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); });
    return out;
  }

  /// Writes to `path` through a temporary file renamed into place: `path` is never half written.
  void write(const std::string& path) const {
    atomic_file f(path);
    emit([&](const void* p, std::size_t n) { f.write(p, n); });
    f.commit();
  }

 private:
  struct entry {
    std::string name;
    std::vector<std::int64_t> shape;
    const void* data;                       // host values, or null and:
    std::function<void(void*)> copy_out;    // fills a host buffer of numel values
    bool is_double;
    dtype out;
    std::uint64_t numel;
  };

  template <class T>
  void push(std::string name, std::vector<std::int64_t> shape, const T* data, std::function<void(void*)> copy_out,
            dtype out) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "tensors are written from float or double buffers");
    OOMB_EXPECTS(!name.empty(), "safetensors_writer: empty tensor name");
    OOMB_EXPECTS(name != "__metadata__", "safetensors_writer: '__metadata__' is reserved");
    OOMB_EXPECTS(out == dtype::f32 || out == dtype::bf16 || out == dtype::f64, "safetensors_writer: tensor '",
                 name, "': output dtype ", dtype_name(out), " is not supported (F32, BF16, F64)");
    for (const auto& e : entries_)
      OOMB_EXPECTS(e.name != name, "safetensors_writer: tensor '", name, "' added twice");
    const std::uint64_t numel = shape_numel(shape);
    entries_.push_back(entry{std::move(name), std::move(shape), data, std::move(copy_out), std::is_same_v<T, double>, out, numel});
  }

  template <class Sink>
  void emit(Sink&& sink) const {
    nlohmann::json header = nlohmann::json::object();
    std::uint64_t offset = 0;
    for (const auto& e : entries_) {
      const std::uint64_t bytes = e.numel * dtype_size(e.out);
      header[e.name] = {{"dtype", dtype_name(e.out)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::string text = header.dump();
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xffu);
    sink(len, 8);
    sink(text.data(), text.size());
    std::vector<unsigned char> buf, streamed;
    for (const auto& e : entries_) {
      const void* data = e.data;
      if (e.copy_out) {
        streamed.resize(static_cast<std::size_t>(e.numel) * (e.is_double ? sizeof(double) : sizeof(float)));
        e.copy_out(streamed.data());
        data = streamed.data();
      }
      const std::size_t esize = dtype_size(e.out);
      const std::size_t per_chunk = detail::conversion_chunk_bytes / esize;
      for (std::uint64_t i = 0; i < e.numel; i += per_chunk) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, e.numel - i));
        buf.resize(n * esize);
        if (e.is_double)
          detail::convert_to(e.out, static_cast<const double*>(data) + i, n, buf.data());
        else
          detail::convert_to(e.out, static_cast<const float*>(data) + i, n, buf.data());
        sink(buf.data(), buf.size());
      }
    }
  }

  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace oomb_trainer
