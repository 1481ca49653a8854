// How both C-ABI libraries of the Python package (oomb_c.h, oomb_cuda.h) report failures: every
// entry point runs its body through guarded(), which catches what the library throws, keeps the
// message for the calling thread and returns -1 (0 on success), so no C++ exception crosses into
// ctypes. Each library has its own message (hidden visibility: one copy per shared library).
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <exception>
#include <string>

namespace oomb_c_abi {

/// The calling thread's last failure message ("" after a success).
inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

template <class F>
int guarded(F&& f) noexcept {
  try {
    f();
    last_error().clear();
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
  } catch (...) {
    last_error() = "oomb: unknown C++ exception";
  }
  return -1;
}

}  // namespace oomb_c_abi
