// What kind of failure an exception is, in one place: the command line's exit status and error
// line come from it (tools/ffnlab/common.cpp, report_error), and so does what one MPI rank tells
// another of a failure, so that the rank that reports it raises the same kind of error and the
// job ends with the status it would end with alone; Python's exceptions come from it too. The
// kinds and statuses: include/ffnlab/error.hpp and interrupt.hpp.
#pragma once

#include <cstdint>
#include <exception>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace ffnlab {

class ProcessGroup;

struct Failure {
  enum class Kind : std::int64_t {
    none = 0,         // no failure
    input = 1,        // refused input: Error (exit 1)
    usage = 2,        // UsageError (exit 2)
    system = 3,       // SystemError, memory, a file-system or other system error (exit 3)
    interrupted = 4,  // Interrupted (exit 130)
  };
  Kind kind = Kind::none;
  int error_number = 0;  // the errno that says why (0: none does)
  std::string message;   // the error line's text

  // ffnlab's errors as their class says; std::bad_alloc is the system's ("out of memory", ENOMEM);
  // a file-system error is refused input when its path leads nowhere (path_leads_nowhere), else the
  // system's; a JSON error (nlohmann's) is refused input; any other std::system_error or
  // exception is the system's.
  static Failure of(const std::exception& e);
  bool failed() const { return kind != Kind::none; }
  // Throws the failure as the exception of its kind, with `prefix` before its message and
  // `suffix` after it (what a caller adds: what the run kept, where to look), errno unchanged.
  [[noreturn]] void raise(std::string_view prefix = {}, std::string_view suffix = {}) const;

  // For a message between ranks: {"kind", "errno", "message"} (an unknown kind reads as system).
  nlohmann::json to_json() const;
  static Failure from_json(const nlohmann::json& j);
};

// Whether any rank of `group` failed in a part every rank takes (collective; `mine` is this
// rank's, none when it did not fail): the highest-numbered rank that failed (-1: none), its kind
// and errno (its message stays with it), and the highest-numbered rank a stop ended (-1: none).
struct RanksFailure {
  int rank = -1;
  Failure::Kind kind = Failure::Kind::none;
  int error_number = 0;
  int stopped_rank = -1;
};
RanksFailure any_rank_failed(ProcessGroup& group, const Failure& mine, const char* exchange);

// The same exchange, then: a rank that failed raises its own failure; when another did, every
// other rank raises a stop if a stop ended any rank's part, else an error of the failed rank's
// kind and errno, with `others` as its message and that rank in place of its {} (the stopped
// one for a stop). So that no rank is left waiting in the next exchange for one that failed,
// and the job ends with its status.
void fail_together(ProcessGroup& group, const Failure& mine, const char* exchange,
                   std::string_view others);

// `part`, which a rank does alone: under a group (not null) its failure as a Failure instead of
// its throw (none when it did not fail), kept for an exchange every rank reaches; without a group
// an exception propagates as thrown. A throw of something that is not an exception is the
// system's ("unknown exception", as the command line prints it).
template <typename Part>
Failure failure_of(ProcessGroup* group, Part&& part) {
  try {
    part();
  } catch (const std::exception& e) {
    if (!group) throw;
    return Failure::of(e);
  } catch (...) {
    if (!group) throw;
    return {Failure::Kind::system, 0, "unknown exception"};
  }
  return {};
}

// `part`, which each rank does alone (no exchange in it), then fail_together: over `group` a
// failure on any rank fails every rank, each raising the error of its kind (Failure::raise: the
// failed rank its own message, in the class of its kind rather than the original's); without a
// group (null) an exception propagates as thrown (failure_of).
template <typename Part>
void fail_together_around(ProcessGroup* group, const char* exchange, std::string_view others,
                          Part&& part) {
  const Failure mine = failure_of(group, part);
  if (group) fail_together(*group, mine, exchange, others);
}

}  // namespace ffnlab
