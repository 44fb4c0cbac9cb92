// Argument checks for the public boundary of the library (not for inner loops).
#pragma once

#include <fmt/format.h>

#include "ffnlab/error.hpp"

namespace ffnlab {

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// A failure of the system rather than of the input: a write or read that failed, memory.
template <typename... Args>
[[noreturn]] void fail_system(fmt::format_string<Args...> format, Args&&... args) {
  throw SystemError(fmt::format(format, std::forward<Args>(args)...));
}

// The same for a system call that failed with errno `error`, which the error keeps (Python
// raises it as the OSError of that errno).
template <typename... Args>
[[noreturn]] void fail_errno(int error, fmt::format_string<Args...> format, Args&&... args) {
  throw SystemError(fmt::format(format, std::forward<Args>(args)...), error);
}

template <typename... Args>
void check(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ffnlab
