// make-tokens: converts a raw array of little-endian uint32 token ids into an OOMBTOKS token file
// (docs/formats.md), checking every id against the vocabulary size.
// SPDX-License-Identifier: Apache-2.0
//
//   make-tokens --input ids.u32 --output train.tokens [--vocab 151936]
// A raw file comes from e.g. numpy: np.asarray(ids).astype("<u4").tofile("ids.u32").
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "trainer/io/tokens.hpp"

namespace {

void usage(std::ostream& os) {
  os << "usage: make-tokens --input RAW --output FILE [--vocab V]\n"
        "  RAW    little-endian uint32 token ids, nothing else (numpy: a.astype('<u4').tofile(RAW))\n"
        "  FILE   the token file to write (atomically: a temporary renamed into place)\n"
        "  V      vocabulary size recorded in the header and checked for every id (default 0 = unknown)\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, output;
  unsigned long long vocab = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(std::cout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::cerr << "make-tokens: " << a << " needs a value\n";
      usage(std::cerr);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--input") {
      input = v;
    } else if (a == "--output") {
      output = v;
    } else if (a == "--vocab") {
      char* end = nullptr;
      vocab = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || vocab > 0x80000000ull) {
        std::cerr << "make-tokens: --vocab must be an integer in [0, 2^31], got '" << v << "'\n";
        return 2;
      }
    } else {
      std::cerr << "make-tokens: unknown option " << a << "\n";
      usage(std::cerr);
      return 2;
    }
  }
  if (input.empty() || output.empty()) {
    usage(std::cerr);
    return 2;
  }
  try {
    const auto n = oomb_trainer::convert_raw_tokens(input, output, static_cast<std::uint32_t>(vocab));
    std::cout << "make-tokens: wrote " << n << " tokens (vocabulary " << vocab << ") to " << output << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "make-tokens: " << e.what() << "\n";
    return 1;
  }
}
