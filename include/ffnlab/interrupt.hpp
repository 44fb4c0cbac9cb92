// A process-wide request to stop long work (training, the study) at its next safe point. The
// command line's SIGINT/SIGTERM handlers set it; any caller may (request_stop(0)).
// Work that waits on a child process checks it while waiting, so that an interrupt is never lost
// behind a child (std::system would ignore SIGINT in the parent while the child runs).
#pragma once

#include <string>

#include "ffnlab/error.hpp"

namespace ffnlab {

// Thrown where work stops on request; the command line exits with status 130.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// Async-signal-safe: only stores the signal number (the first request wins).
void request_stop(int signal) noexcept;
bool stop_requested() noexcept;
// Seconds since the stop request (0 when there is none).
double seconds_since_stop() noexcept;
// "SIGINT", "SIGTERM", or "an interrupt" for a request without a signal (signal 0).
std::string stop_reason();
// Forgets the request (a new run in the same process).
void clear_stop() noexcept;

}  // namespace ffnlab
