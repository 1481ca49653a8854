// oomb trainer — the oomb-train command: arguments in, an exit status out, what a user reads on the
// way. main.cpp adds the signals and the build's GPU; the tests drive it as it is.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <csignal>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "trainer/trainers/trainer.hpp"

namespace oomb_trainer {

/// An exception's message as a user of the command reads it: the library's "oomb: " prefix and its
/// " [file:line]" source locations removed (kept with `debug`, for reports).
std::string user_message(const std::exception& e, bool debug);

/// What oomb-train does with `args`: --help; --plan (exit 0 when the run fits, 1 when it does not);
/// else the training run, `started` called once it is set up (main.cpp installs its signal handlers
/// there) and stopping at a step boundary once *stop is set. Output to `out`, errors to `err`.
/// Exit status: 0 done, 1 the run failed (or the plan does not fit), 2 bad arguments, 128 + the
/// signal that stopped it.
int run_cli(const std::vector<std::string>& args, const trainer_factory& device, volatile std::sig_atomic_t* stop,
            const std::function<void()>& started, std::FILE* out, std::FILE* err);

}  // namespace oomb_trainer
