// ffnlab's exceptions. Messages start with the thing that failed, in brackets:
// "[moe] top_k = 9 exceeds num_experts = 8". The command line prints them as one line, and its
// exit status tells the two apart (docs/hardening.md, "Exit status"):
//   Error        the input is refused: a config, file, shape or value makes no sense (exit 1)
//   SystemError  the system failed: a write, a read, memory (exit 3)
#pragma once

#include <stdexcept>
#include <string>

namespace ffnlab {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SystemError : public Error {
 public:
  using Error::Error;
};

}  // namespace ffnlab
