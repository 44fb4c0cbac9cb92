// ffnlab's exceptions. Messages start with the thing that failed, in brackets:
// "[moe] top_k = 9 exceeds num_experts = 8". The command line prints them as one line, and its
// exit status tells the two apart (docs/hardening.md, "Exit status"):
//   Error        the input is refused: a config, file, shape or value makes no sense (exit 1)
//   UsageError   a setting the caller gave conflicts with another or with the run it continues
//                (exit 2, as a malformed flag)
//   SystemError  the system failed: a write, a read, memory (exit 3)
// A message is one line whatever the input put into it: a control byte (a NUL, a newline) in a
// value the message quotes is kept as \xNN, so that nothing cuts the line short.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ffnlab {

// `text` with every control byte (below 0x20, and 0x7f) written as \xNN.
inline std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  explicit Error(std::string_view what) : std::runtime_error(one_line(what)) {}
  explicit Error(const std::string& what) : Error(std::string_view(what)) {}
  explicit Error(const char* what) : Error(std::string_view(what)) {}
};

class UsageError : public Error {
 public:
  using Error::Error;
};

class SystemError : public Error {
 public:
  using Error::Error;
  // `error_number`: the errno of the system call that failed, where one says why.
  explicit SystemError(std::string_view what, int error_number)
      : Error(what), errno_(error_number) {}
  int error_number() const { return errno_; }  // 0: no call's errno says why

 private:
  int errno_ = 0;
};

}  // namespace ffnlab
