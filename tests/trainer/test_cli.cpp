// The oomb-train command as a user meets it (app/cli.hpp): messages without the library's source
// locations and repeated prefixes (kept with --debug), the exit statuses (bad arguments 2, a plan
// that does not fit 1), the token file's hint, checkpoint folders with ordinary permissions.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/app/cli.hpp"
#include "trainer/io/atomic_write.hpp"
#include "training_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using training_test::temp_dir;

const std::string tiny = std::string(OOMB_TRAINER_SOURCE_DIR) + "/configs/tiny.json";

/// A FILE* to hand run_cli, and what was written to it.
struct captured {
  std::FILE* f = std::tmpfile();
  ~captured() { std::fclose(f); }
  std::string text() const {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
    return s;
  }
};

struct cli_result {
  int status;
  std::string out, err;
};

cli_result run(const std::vector<std::string>& args) {
  captured out, err;
  volatile std::sig_atomic_t stop = 0;
  const int status = oomb_trainer::run_cli(args, {}, &stop, {}, out.f, err.f);
  return {status, out.text(), err.text()};
}

std::string raised_message() {
  try {
    OOMB_EXPECTS(1 + 1 == 3, "--chunk must be a multiple of --page, got ", 17);
  } catch (const oomb::error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("cli: a message loses the library's prefix and source locations, --debug keeps them") {
  const std::string raw = raised_message();
  REQUIRE(raw.rfind("oomb: ", 0) == 0);
  REQUIRE(raw.find("test_cli.cpp:") != std::string::npos);
  CHECK(oomb_trainer::user_message(std::runtime_error(raw), false) == "--chunk must be a multiple of --page, got 17");
  CHECK(oomb_trainer::user_message(std::runtime_error(raw), true) == raw);
  // A message quoting another: every location and every quoted prefix go, other brackets stay.
  const std::runtime_error nested("oomb: checkpoint 'a': oomb: range [0, 5) is past the end [x/y/tensor.hpp:12] [run.cpp:7]");
  CHECK(oomb_trainer::user_message(nested, false) == "checkpoint 'a': range [0, 5) is past the end");
  CHECK(oomb_trainer::user_message(std::runtime_error("no prefix [see: above]"), false) == "no prefix [see: above]");
}

TEST_CASE("cli: bad arguments exit 2 with a readable message; --help exits 0") {
  const cli_result bad = run({"--config", tiny, "--chunk", "seventeen"});
  CHECK(bad.status == 2);
  CHECK(bad.err.rfind("oomb-train: ", 0) == 0);
  CHECK(bad.err.find("--chunk") != std::string::npos);
  CHECK(bad.err.find("oomb: ") == std::string::npos);
  CHECK(bad.err.find(".hpp:") == std::string::npos);
  CHECK(bad.err.find("--help") != std::string::npos);
  const cli_result debug = run({"--config", tiny, "--chunk", "seventeen", "--debug"});
  CHECK(debug.status == 2);
  CHECK(debug.err.find(".hpp:") != std::string::npos);
  const cli_result help = run({"--help"});
  CHECK(help.status == 0);
  CHECK(help.out.find("--debug") != std::string::npos);
}

TEST_CASE("cli: --plan exits 0 when the run fits, 1 with the largest that fits when it does not") {
  temp_dir tmp("cli-plan");
  const std::vector<std::string> base{"--config", tiny, "--synthetic", "kv-recall", "--seq-len", "4096", "--chunk", "16",
                                      "--steps", "1", "--out", (tmp.path / "out").string(), "--plan"};
  std::vector<std::string> fits = base, tight = base;
  fits.insert(fits.end(), {"--host-memory", "8G"});
  tight.insert(tight.end(), {"--host-memory", "4M"});
  const cli_result a = run(fits), b = run(tight);
  CHECK(a.status == 0);
  CHECK(a.out.find("memory plan:") != std::string::npos);
  CHECK(a.out.find("does not fit") == std::string::npos);
  CHECK(b.status == 1);
  CHECK(b.out.find("does not fit: the largest --seq-len that fits is") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "out"));  // a plan writes nothing
}

TEST_CASE("cli: a run that fails exits 1 and names the problem, not the source line") {
  temp_dir tmp("cli-fail");
  const cli_result r = run({"--config", tiny, "--data", (tmp.path / "missing.tokens").string(), "--seq-len", "64",
                            "--chunk", "16", "--steps", "1", "--out", (tmp.path / "out").string(), "--quiet"});
  CHECK(r.status == 1);
  CHECK(r.err.rfind("oomb-train: error: ", 0) == 0);
  CHECK(r.err.find("missing.tokens") != std::string::npos);
  CHECK(r.err.find("oomb: ") == std::string::npos);
  CHECK(r.err.find(".hpp:") == std::string::npos);
}

TEST_CASE("cli: a folder written atomically (a checkpoint) gets what mkdir gives, not mkdtemp's 0700") {
  temp_dir tmp("cli-mode");
  const mode_t mask = ::umask(022);  // a known mask for the test; the previous one put back below
  const std::string path = (tmp.path / "checkpoint-1").string();
  {
    oomb_trainer::atomic_directory d(path);
    std::FILE* f = std::fopen((fs::path(d.temporary_path()) / "x").c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
    d.commit();
  }
  ::umask(mask);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);
}
