// The contract between a fuzz target and its drivers (libFuzzer, or fuzz_driver.cpp with g++).
// SPDX-License-Identifier: Apache-2.0
//
// A target defines LLVMFuzzerTestOneInput, which feeds the bytes to a reader and swallows only
// oomb::format_error: any other exception escapes and is a finding, as is any crash or sanitizer
// report. It also defines fuzz_seeds(): well-formed inputs made with the project's own writers,
// so the seeds always match the current format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

/// Valid inputs to start mutating from.
std::vector<std::string> fuzz_seeds();

/// Words the driver splices into inputs (format keywords, interesting numbers).
std::vector<std::string> fuzz_dictionary();
