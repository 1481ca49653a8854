// oomb-train: chunk-recurrent training of a Qwen2 model on the CPU or a GPU (see --help).
// SPDX-License-Identifier: Apache-2.0
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "trainer/app/options.hpp"
#include "trainer/app/run.hpp"

#ifdef OOMB_TRAINER_CUDA
#include "trainer/trainers/cuda_factory.hpp"  // oomb::trainer_cuda
#endif

namespace {

/// What --device cuda runs on in this build (none without CUDA: training_run says so).
oomb_trainer::trainer_factory device_of_this_build() {
#ifdef OOMB_TRAINER_CUDA
  return oomb_trainer::cuda_trainer_factory();
#else
  return {};
#endif
}

/// The first SIGINT / SIGTERM: its number, for training_run::run to stop at the next step boundary
/// (saving a checkpoint); a second one of either ends the process at once (the default action).
volatile std::sig_atomic_t stop_signal = 0;

extern "C" void request_stop(int sig) {
  stop_signal = sig;
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace

int main(int argc, char** argv) {
  oomb_trainer::train_options options;
  try {
    options = oomb_trainer::parse_train_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    fmt::print(stderr, "oomb-train: {}\n", e.what());
    return 2;
  }
  if (options.help) {
    fmt::print("{}", oomb_trainer::help_text());
    return 0;
  }
  try {
    if (options.plan) {
      fmt::print("{}", oomb_trainer::training_run::plan_text(options, device_of_this_build()));
      return 0;
    }
    oomb_trainer::training_run run(options, [](const std::string& line) {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }, device_of_this_build());
    std::signal(SIGINT, request_stop);
    std::signal(SIGTERM, request_stop);
    const int signal = run.run(&stop_signal);
    if (signal != 0) return 128 + signal;  // 130 for SIGINT, 143 for SIGTERM, as a shell reports them
  } catch (const std::exception& e) {
    fmt::print(stderr, "oomb-train: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
