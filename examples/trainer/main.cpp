// oomb-train: chunk-recurrent training of an HF decoder on the CPU or a GPU (see --help).
// SPDX-License-Identifier: Apache-2.0
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "trainer/app/cli.hpp"

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
  return oomb_trainer::run_cli(std::vector<std::string>(argv + 1, argv + argc), device_of_this_build(), &stop_signal,
                               [] {
                                 std::signal(SIGINT, request_stop);
                                 std::signal(SIGTERM, request_stop);
                               },
                               stdout, stderr);
}
