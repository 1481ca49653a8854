// A small mutation-fuzzing driver for machines without libFuzzer (CI has only g++): runs the
// target over its seeds and the files given, then over seeded random mutations of them until a
// run count or a time limit. Deterministic for a given --seed and --runs (the time limit only
// cuts the sequence short). Any crash, sanitizer report or escaping exception fails the run; the
// offending input is written to --crash-dir (default: the working folder) first.
// SPDX-License-Identifier: Apache-2.0
//
// Usage: fuzz_<target> [--runs N] [--seconds S] [--seed K] [--max-len B] [--crash-dir DIR]
//                      [--write-seeds DIR] [FILE...]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz_target.hpp"

namespace {

struct options {
  std::uint64_t runs = 100000;
  double seconds = 3.0;
  std::uint64_t seed = 1;
  std::size_t max_len = 1 << 16;
  std::string crash_dir = ".";
  std::string write_seeds;
  std::vector<std::string> files;
};

std::string current;  // the input being run, saved if it brings the process down via an exception
std::string crash_path;

void save_current(const char* why) {
  std::ofstream out(crash_path, std::ios::binary);
  out.write(current.data(), static_cast<std::streamsize>(current.size()));
  std::cerr << "fuzz: " << why << "; input (" << current.size() << " bytes) saved to " << crash_path << "\n";
}

void run_one(const std::string& input) {
  current = input;
  try {
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  } catch (const std::exception& e) {
    save_current("unexpected exception");
    std::cerr << "fuzz: " << e.what() << "\n";
    std::exit(1);
  } catch (...) {
    save_current("unexpected non-std exception");
    std::exit(1);
  }
}

class mutator {
 public:
  mutator(std::uint64_t seed, std::vector<std::string> dict, std::size_t max_len)
      : rng_(seed), dict_(std::move(dict)), max_len_(max_len) {}

  std::string mutate(std::string s, const std::vector<std::string>& pool) {
    const int n = 1 + static_cast<int>(below(4));
    for (int k = 0; k < n; ++k) once(s, pool);
    if (s.size() > max_len_) s.resize(max_len_);
    return s;
  }

 private:
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_); }
  std::size_t pos(const std::string& s) { return static_cast<std::size_t>(below(s.size() + 1)); }

  void once(std::string& s, const std::vector<std::string>& pool) {
    static const std::uint64_t interesting[] = {0, 1, 2, 7, 8, 31, 32, 33, 0x7f, 0x80, 0xff, 0x7fffffff, 0x80000000,
                                                0xffffffff, 0x100000000ull, 0x7fffffffffffffffull,
                                                0x8000000000000000ull, ~0ull};
    switch (below(10)) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos(s) % s.size()] ^= static_cast<char>(1u << below(8));
        break;
      case 1:  // set a byte
        if (!s.empty()) s[pos(s) % s.size()] = static_cast<char>(interesting[below(11)] & 0xff);
        break;
      case 2:  // insert random bytes
        s.insert(pos(s), std::string(1 + below(4), static_cast<char>(below(256))));
        break;
      case 3: {  // erase a range
        const std::size_t p = pos(s);
        s.erase(p, 1 + below(16));
        break;
      }
      case 4:  // truncate
        s.resize(pos(s));
        break;
      case 5: {  // duplicate a range
        if (s.empty()) break;
        const std::size_t p = pos(s) % s.size();
        const std::string piece = s.substr(p, 1 + below(32));
        s.insert(pos(s), piece);
        break;
      }
      case 6: {  // overwrite a little-endian integer (lengths, counts, offsets)
        const std::uint64_t v = interesting[below(std::size(interesting))] + (below(4) == 0 ? s.size() : 0);
        const std::size_t width = below(2) ? 8 : 4;
        if (s.size() < width) break;
        const std::size_t p = static_cast<std::size_t>(below(s.size() - width + 1));
        for (std::size_t i = 0; i < width; ++i) s[p + i] = static_cast<char>((v >> (8 * i)) & 0xff);
        break;
      }
      case 7: {  // change a digit run (JSON numbers)
        std::vector<std::size_t> digits;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (s[i] >= '0' && s[i] <= '9') digits.push_back(i);
        if (digits.empty()) break;
        const std::size_t p = digits[below(digits.size())];
        static const char* repl[] = {"0", "1", "9", "-1", "65536", "4294967295", "18446744073709551616", "2.5", "1e3"};
        s.replace(p, 1, repl[below(std::size(repl))]);
        break;
      }
      case 8:  // splice a dictionary word
        if (!dict_.empty()) {
          const std::string& w = dict_[below(dict_.size())];
          if (below(2) && s.size() >= w.size())
            s.replace(static_cast<std::size_t>(below(s.size() - w.size() + 1)), w.size(), w);
          else
            s.insert(pos(s), w);
        }
        break;
      default: {  // cross over with another input
        if (pool.empty()) break;
        const std::string& o = pool[below(pool.size())];
        const std::size_t cut = pos(s);
        s = s.substr(0, cut) + o.substr(std::min(o.size(), cut));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> dict_;
  std::size_t max_len_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "fuzz: cannot read " << path << "\n";
    std::exit(2);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "fuzz: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") o.runs = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--seconds") o.seconds = std::strtod(value().c_str(), nullptr);
    else if (a == "--seed") o.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--max-len") o.max_len = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--crash-dir") o.crash_dir = value();
    else if (a == "--write-seeds") o.write_seeds = value();
    else if (a == "--help" || a == "-h") {
      std::cout << "usage: " << argv[0]
                << " [--runs N] [--seconds S] [--seed K] [--max-len B] [--crash-dir DIR] [--write-seeds DIR] [FILE...]\n";
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "fuzz: unknown option " << a << "\n";
      return 2;
    } else {
      o.files.push_back(a);
    }
  }
  crash_path = o.crash_dir + "/fuzz-crash-seed" + std::to_string(o.seed) + ".bin";

  std::vector<std::string> pool = fuzz_seeds();
  if (!o.write_seeds.empty()) {  // a starting corpus for libFuzzer
    for (std::size_t i = 0; i < pool.size(); ++i) {
      std::ofstream out(o.write_seeds + "/seed" + std::to_string(i), std::ios::binary);
      out.write(pool[i].data(), static_cast<std::streamsize>(pool[i].size()));
    }
    return 0;
  }
  for (const auto& f : o.files) pool.push_back(read_file(f));
  const std::size_t base = pool.size();
  for (const auto& s : pool) run_one(s);

  mutator m(o.seed, fuzz_dictionary(), o.max_len);
  std::mt19937_64 pick(o.seed ^ 0x9e3779b97f4a7c15ull);
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t runs = 0;
  for (; runs < o.runs; ++runs) {
    if ((runs & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > o.seconds)
      break;
    const std::string& parent = pool[std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(pick)];
    std::string input = m.mutate(parent, pool);
    run_one(input);
    // Keep a bounded set of mutants to mutate further (deeper, multi-step changes).
    if (pool.size() < base + 512) pool.push_back(std::move(input));
    else pool[base + (runs % 512)] = std::move(input);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "fuzz: " << base << " seed inputs and " << runs << " mutations in " << secs
            << " s, no crash and no unexpected exception (seed " << o.seed << ")\n";
  return 0;
}
