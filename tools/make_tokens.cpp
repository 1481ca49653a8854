// make-tokens: converts raw arrays of token ids (and, for version 2, document starts and a loss
// mask) into an OOMBTOKS token file (docs/formats.md), checking every value; --inspect prints what
// the trainer's reader reads from a token file, as JSON.
// SPDX-License-Identifier: Apache-2.0
//
//   make-tokens --input ids.u32 --output train.tokens [--vocab 151936] [--documents starts.u64 [--mask mask.u8]]
//   make-tokens --inspect train.tokens [--vocab V] [--dump]
// Raw files come from e.g. numpy: np.asarray(ids).astype("<u4").tofile("ids.u32"),
// np.asarray(starts).astype("<u8").tofile("starts.u64"), np.asarray(mask).astype("u1").tofile("mask.u8").
// Text and chat JSONL become token files through tools/prepare_data.py instead.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/io/tokens.hpp"

namespace {

void usage(std::ostream& os) {
  os << "usage: make-tokens --input RAW --output FILE [--vocab V] [--documents STARTS [--mask MASK]]\n"
        "       make-tokens --inspect FILE [--vocab V] [--dump]\n"
        "  RAW     little-endian uint32 token ids, nothing else (numpy: a.astype('<u4').tofile(RAW))\n"
        "  FILE    the token file to write (atomically: a temporary renamed into place)\n"
        "  V       vocabulary size recorded in the header and checked for every id (default 0 = unknown);\n"
        "          with --inspect, the model's vocabulary size to check the ids against\n"
        "  STARTS  little-endian uint64 document starts: each document's first token index, 0 first,\n"
        "          strictly increasing (numpy: s.astype('<u8').tofile(STARTS)); writes a version 2 file\n"
        "  MASK    one byte per token, 1 where predicting the token counts in the loss, 0 where not\n"
        "  --inspect  reads FILE as oomb-train does (every field and id checked) and prints JSON: version,\n"
        "          tokens, vocab_size, documents, mask, mask_ones; --dump adds the ids, the document\n"
        "          starts and the mask\n";
}

int inspect(const std::string& path, std::uint32_t vocab, bool dump) {
  const auto r = oomb_trainer::token_reader::open(path, vocab);
  nlohmann::json j = {{"path", path},
                      {"version", r.version()},
                      {"tokens", r.size()},
                      {"vocab_size", r.vocab_size()},
                      {"documents", r.document_count()},
                      {"mask", r.has_mask()},
                      {"mask_ones", r.mask_ones().value_or(0)}};
  if (dump) {
    const auto n = static_cast<std::size_t>(r.size());
    j["ids"] = r.read(0, n);
    j["document_starts"] = r.document_starts();
    if (r.has_mask()) j["loss_mask"] = r.read_mask(0, n);
  }
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, output, documents, mask, inspect_path;
  bool dump = false;
  unsigned long long vocab = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(std::cout);
      return 0;
    }
    if (a == "--dump") {
      dump = true;
      continue;
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
    } else if (a == "--documents") {
      documents = v;
    } else if (a == "--mask") {
      mask = v;
    } else if (a == "--inspect") {
      inspect_path = v;
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
  const bool writing = !input.empty() || !output.empty() || !documents.empty() || !mask.empty();
  if (inspect_path.empty() ? (input.empty() || output.empty() || dump) : writing) {
    usage(std::cerr);
    return 2;
  }
  if (!mask.empty() && documents.empty()) {
    std::cerr << "make-tokens: --mask needs --documents (a loss mask is part of a version 2 file)\n";
    return 2;
  }
  try {
    if (!inspect_path.empty()) return inspect(inspect_path, static_cast<std::uint32_t>(vocab), dump);
    const auto n = documents.empty()
                       ? oomb_trainer::convert_raw_tokens(input, output, static_cast<std::uint32_t>(vocab))
                       : oomb_trainer::convert_raw_documents(input, documents, mask, output,
                                                             static_cast<std::uint32_t>(vocab));
    std::cout << "make-tokens: wrote " << n << " tokens (vocabulary " << vocab << (documents.empty() ? ", version 1" : ", version 2")
              << (mask.empty() ? "" : ", loss mask") << ") to " << output << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "make-tokens: " << e.what() << "\n";
    return 1;
  }
}
