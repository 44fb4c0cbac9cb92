// SIGINT and SIGTERM for long commands (train, evolve): the first signal asks the command to
// stop at its next safe point (train: after the current step, with a checkpoint; evolve: at the
// next step, or at once when a child such as gnuplot runs); a second one ends the process at
// once, as if no handler were installed. The request itself is the library's
// (ffnlab/interrupt.hpp), so that library code waiting on a child sees it too.
#pragma once

#include <string>

#include "ffnlab/interrupt.hpp"

namespace ffnlab::cli {

// Thrown where a command stops on a signal; main() prints it and exits with status 130.
using ffnlab::Interrupted;

// Installs the handlers for its lifetime; the previous ones come back afterwards.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // Whether a signal has arrived, and its name ("SIGINT").
  static bool requested() { return stop_requested(); }
  static std::string signal_name() { return stop_reason(); }

  // Under mpirun: when the stop signal arrives, stdout and stderr become non-blocking (mpirun,
  // ending the job, stops reading them; a rank blocked on a full pipe would never reach its
  // checkpoint). Until then they stay as they are.
  static void nonblocking_output_on_stop();
};

}  // namespace ffnlab::cli
