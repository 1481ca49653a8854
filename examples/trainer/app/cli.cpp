// oomb trainer — the oomb-train command (app/cli.hpp), compiled into oomb::trainer_cpu.
// SPDX-License-Identifier: Apache-2.0
#include "trainer/app/cli.hpp"

#include <cctype>

#include <fmt/core.h>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"

namespace oomb_trainer {

namespace {

/// Whether s[b, e) reads "path:digits", a non-empty path without spaces or brackets: the location
/// OOMB_CHECK appends.
bool is_location(const std::string& s, std::size_t b, std::size_t e) {
  if (s.find_first_of(" [", b) < e) return false;
  const std::size_t colon = s.rfind(':', e - 1);
  if (colon == std::string::npos || colon <= b || colon + 1 >= e) return false;
  for (std::size_t i = colon + 1; i < e; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

}  // namespace

std::string user_message(const std::exception& e, bool debug) {
  std::string s = e.what();
  if (debug) return s;
  // Every " [path:line]" (a message may quote another one's), then every "oomb: " that starts the
  // message or one it quotes after ": ".
  for (std::size_t open = s.find(" ["); open != std::string::npos; open = s.find(" [", open)) {
    const std::size_t close = s.find(']', open);
    if (close != std::string::npos && is_location(s, open + 2, close)) s.erase(open, close + 1 - open);
    else open += 2;
  }
  const std::string prefix = "oomb: ";
  if (s.compare(0, prefix.size(), prefix) == 0) s.erase(0, prefix.size());
  for (std::size_t at = s.find(": " + prefix); at != std::string::npos; at = s.find(": " + prefix, at))
    s.erase(at + 2, prefix.size());
  return s;
}

int run_cli(const std::vector<std::string>& args, const trainer_factory& device, volatile std::sig_atomic_t* stop,
            const std::function<void()>& started, std::FILE* out, std::FILE* err) {
  train_options options;
  bool debug = false;
  for (const std::string& a : args) debug = debug || a == "--debug";
  try {
    options = parse_train_options(args);
  } catch (const std::exception& e) {
    fmt::print(err, "oomb-train: {} (--help lists the options)\n", user_message(e, debug));
    return 2;
  }
  if (options.help) {
    fmt::print(out, "{}", help_text());
    return 0;
  }
  try {
    if (options.plan) {
      const memory_plan p = training_run::plan(options, device);
      fmt::print(out, "{}", training_run::plan_text(options, device));
      return p.fits() ? 0 : 1;
    }
    training_run run(options, [out](const std::string& line) {
      fmt::print(out, "{}\n", line);
      std::fflush(out);
    }, device);
    if (started) started();
    const int signal = run.run(stop);
    if (signal != 0) return 128 + signal;  // 130 for SIGINT, 143 for SIGTERM, as a shell reports them
  } catch (const std::exception& e) {
    fmt::print(err, "oomb-train: error: {}\n", user_message(e, options.debug));
    return 1;
  }
  return 0;
}

}  // namespace oomb_trainer
