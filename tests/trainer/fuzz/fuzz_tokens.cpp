// Fuzz target: the token-file reader must reject any malformed input with oomb::format_error and
// serve windows of any input it accepts, without crashing or undefined behaviour.
// SPDX-License-Identifier: Apache-2.0
#include <cstring>

#include "fuzz_target.hpp"
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
      const std::size_t seq = 1 + static_cast<std::size_t>(all[0] % 7);
      if (seq + 1 <= r.size()) {
        token_windows w(r, seq, true);
        for (int k = 0; k < 5; ++k)
          if (w.next().size() != seq + 1) __builtin_trap();
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
  return {token_file_bytes(a, 10, 1000), token_file_bytes(b, 3, 0), token_file_bytes(c, 0, 0),
          token_file_bytes(c, 1, 1)};
}

std::vector<std::string> fuzz_dictionary() {
  return {"OOMBTOKS", std::string("\x01\x00\x00\x00", 4), std::string("\x20\x00\x00\x00", 4),
          std::string("\xff\xff\xff\xff", 4), std::string("\x00\x00\x00\x80", 4),
          std::string("\xe8\x03\x00\x00", 4)};
}
