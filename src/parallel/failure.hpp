// A failure on one rank as another rank raises it. A rank that reports another's failure must
// raise the same kind of error (include/ffnlab/error.hpp): the kind is the exit status (1 refused
// input, 2 usage, 3 the system, 130 a stop) and, in Python, the exception; a SystemError keeps its
// errno. The distributed checkpoint and the study's MPI work queue send failures this way.
#pragma once

#include <cstdint>
#include <exception>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace ffnlab {

struct RankFailure {
  enum class Kind : std::int64_t { none = 0, input = 1, usage = 2, system = 3, interrupted = 4 };
  Kind kind = Kind::none;
  int error_number = 0;  // a SystemError's errno (0: none says why)
  std::string message;

  // The kind as the command line classes it (tools/ffnlab/common.cpp, report_error): a path
  // that leads nowhere is refused input, any other file-system error, memory or unknown
  // exception is the system.
  static RankFailure of(const std::exception& e);
  bool failed() const { return kind != Kind::none; }
  // Throws the failure as the exception of its kind, with `prefix` before its message.
  [[noreturn]] void raise(std::string_view prefix = {}) const;

  // For a message between ranks: {"kind", "errno", "message"}.
  nlohmann::json to_json() const;
  static RankFailure from_json(const nlohmann::json& j);
};

}  // namespace ffnlab
