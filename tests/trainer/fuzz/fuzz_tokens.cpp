// Fuzz target: the token-file reader (versions 1 and 2) must reject any malformed input with
// oomb::format_error and serve windows, document starts, masks and packed sequences of any input
// it accepts, without crashing or undefined behaviour.
// SPDX-License-Identifier: Apache-2.0
#include <cstring>

#include "fuzz_target.hpp"
#include "trainer/data/token_sequences.hpp"
#include "trainer/io/tokens.hpp"

using namespace oomb_trainer;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (std::uint32_t model_vocab : {0u, 1000u}) {
    try {
      const auto r = token_reader::from_memory("fuzz.tokens", data, size, model_vocab);
      if (r.size() == 0) continue;
      const auto all = r.read(0, static_cast<std::size_t>(r.size()));
      for (std::int32_t t : all)
        if (t < 0 || (r.vocab_size() != 0 && static_cast<std::uint32_t>(t) >= r.vocab_size()) ||
            (model_vocab != 0 && static_cast<std::uint32_t>(t) >= model_vocab))
          __builtin_trap();  // an id the reader should have refused
      const auto mask = r.read_mask(0, static_cast<std::size_t>(r.size()));
      for (std::uint8_t m : mask)
        if (m > 1) __builtin_trap();  // a mask byte the reader should have refused
      const auto& starts = r.document_starts();
      if (r.has_documents() && (starts.empty() || starts[0] != 0)) __builtin_trap();
      for (std::size_t d = 0; d < starts.size(); ++d)
        if (starts[d] >= r.size() || (d > 0 && starts[d] <= starts[d - 1])) __builtin_trap();
      const std::size_t seq = 1 + static_cast<std::size_t>(all[0] % 7);
      if (seq + 1 <= r.size()) {
        token_windows w(r, seq, true);
        for (int k = 0; k < 5; ++k)
          if (w.next().size() != seq + 1) __builtin_trap();
      }
      if (seq + 1 <= r.size()) {
        for (const packing_kind p : {packing_kind::none, packing_kind::documents}) {
          if (p == packing_kind::documents && !r.has_documents()) continue;
          token_sequences s(r, std::int64_t(seq + 1), p, 7);
          for (int k = 0; k < 5; ++k) {
            try {
              const sequence q = s.next();
              q.validate();
              if (q.size() != std::int64_t(seq + 1) || q.counted_targets() == 0) __builtin_trap();
            } catch (const oomb::invalid_argument&) {  // nothing in the file counts: refused by name
              break;
            }
          }
        }
      }
    } catch (const oomb::format_error&) {
    }
  }
  return 0;
}

std::vector<std::string> fuzz_seeds() {
  const std::uint32_t a[10] = {0, 1, 2, 3, 999, 5, 6, 7, 8, 9};
  const std::uint32_t b[3] = {70000, 1, 2};
  const std::uint32_t c[1] = {0};
  const std::uint8_t m[10] = {0, 1, 1, 0, 1, 1, 1, 0, 0, 1};
  return {token_file_bytes(a, 10, 1000), token_file_bytes(b, 3, 0), token_file_bytes(c, 0, 0),
          token_file_bytes(c, 1, 1), token_file_bytes(a, 10, 1000, {0, 3, 4, 8}, m),
          token_file_bytes(a, 9, 0, {0, 5}, nullptr), token_file_bytes(b, 3, 0, {0}, m),
          token_file_bytes(c, 0, 0, {}, nullptr)};
}

std::vector<std::string> fuzz_dictionary() {
  return {"OOMBTOKS", std::string("\x01\x00\x00\x00", 4), std::string("\x02\x00\x00\x00", 4),
          std::string("\x20\x00\x00\x00", 4), std::string("\x40\x00\x00\x00", 4),
          std::string("\xff\xff\xff\xff", 4), std::string("\x00\x00\x00\x80", 4),
          std::string("\xe8\x03\x00\x00", 4), std::string("\x00\x00\x00\x00\x00\x00\x00\x00", 8),
          std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8)};
}
