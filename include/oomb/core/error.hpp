// oomb — the error hierarchy and the check macros that raise it.
// SPDX-License-Identifier: Apache-2.0
//
// Contract: host code reports failure by throwing a subclass of oomb::error whose message says
// what was asked, what was available and where (file:line). Nothing in the library calls exit()
// or abort(). A throwing call leaves its object usable and unchanged unless its documentation says
// otherwise (strong guarantee). Kernels never throw: their launchers check and throw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "oomb/core/version.hpp"

OOMB_NAMESPACE_BEGIN

/// Base of every exception oomb throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A pool, resource or tier could not provide what was asked (names both numbers).
class out_of_memory : public error {
 public:
  using error::error;
};

/// A caller broke a documented precondition: bad sizes, ids not owned, mismatched shapes.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A CUDA runtime or driver call failed; the message carries CUDA's own error text.
class cuda_error : public error {
 public:
  using error::error;
};

/// A file or serialised structure is malformed (safetensors, token files, configs).
class format_error : public error {
 public:
  using error::error;
};

namespace detail {

/// Builds "oomb: <parts...> [file:line]" with operator<< and throws it as E.
template <class E, class... Args>
[[noreturn]] void raise(const char* file, int line, Args&&... parts) {
  std::ostringstream os;
  os << "oomb: ";
  (os << ... << std::forward<Args>(parts));
  os << " [" << file << ':' << line << ']';
  throw E(os.str());
}

}  // namespace detail

OOMB_NAMESPACE_END

/// Throws `ErrorType` with the streamed message parts when `cond` is false.
/// `OOMB_CHECK(n > 0, oomb::invalid_argument, "layers must be positive, got ", n);`
#define OOMB_CHECK(cond, ErrorType, ...)                                 \
  do {                                                                   \
    if (!(cond)) ::OOMB_NAMESPACE::detail::raise<ErrorType>(__FILE__, __LINE__, __VA_ARGS__); \
  } while (false)

/// Shorthand for the most common precondition check.
#define OOMB_EXPECTS(cond, ...) OOMB_CHECK(cond, ::OOMB_NAMESPACE::invalid_argument, __VA_ARGS__)

/// Unconditionally throws `ErrorType` with the streamed message parts.
#define OOMB_FAIL(ErrorType, ...) ::OOMB_NAMESPACE::detail::raise<ErrorType>(__FILE__, __LINE__, __VA_ARGS__)
