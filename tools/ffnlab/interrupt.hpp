// SIGINT and SIGTERM for long commands (train, evolve): the first signal asks the command to
// stop at its next safe point (train: after the current step, with a checkpoint); a second one
// ends the process at once, as if no handler were installed.
#pragma once

#include <string>

#include "ffnlab/error.hpp"

namespace ffnlab::cli {

// Thrown where a command stops on a signal; main() prints it and exits with status 130.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// Installs the handlers for its lifetime; the previous ones come back afterwards.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // Whether a signal has arrived, and its name ("SIGINT").
  static bool requested();
  static std::string signal_name();
};

}  // namespace ffnlab::cli
