// report_error: the one line on stderr and the exit status of every kind of exception the
// program can meet, pinned. The kind comes from ffnlab::Failure::of (include/ffnlab/failure.hpp),
// which MPI ranks use too; a change there changes what the command line prints.
#include <gtest/gtest.h>

#include <cerrno>
#include <exception>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "common.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"

namespace ffnlab::cli {
namespace {

struct Case {
  const char* what;
  std::exception_ptr error;
  std::string line;  // on stderr
  int status;
};

TEST(ReportError, EveryKindOfExceptionHasItsLineAndStatus) {
  namespace fs = std::filesystem;
  const std::vector<Case> cases = {
      {"CLI11's parse error", std::make_exception_ptr(CLI::ValidationError("--x: bad value")),
       "ffnlab: usage error: --x: bad value\n", kExitUsage},
      {"usage", std::make_exception_ptr(UsageError("[train] --steps conflicts")),
       "ffnlab: usage error: [train] --steps conflicts\n", kExitUsage},
      {"interrupted", std::make_exception_ptr(Interrupted("SIGINT: stopped at step 3")),
       "ffnlab: interrupted: SIGINT: stopped at step 3\n", kExitInterrupted},
      {"system", std::make_exception_ptr(SystemError("[io] x: write failed", ENOSPC)),
       "ffnlab: error: [io] x: write failed\n", kExitSystem},
      {"input", std::make_exception_ptr(Error("[moe] top_k = 9 exceeds num_experts = 8")),
       "ffnlab: error: [moe] top_k = 9 exceeds num_experts = 8\n", kExitInput},
      {"memory", std::make_exception_ptr(std::bad_alloc()), "ffnlab: error: out of memory\n",
       kExitSystem},
      {"a path that leads nowhere",
       std::make_exception_ptr(fs::filesystem_error(
           "open", "/no/x", std::make_error_code(std::errc::no_such_file_or_directory))),
       "ffnlab: error: [io] '/no/x': No such file or directory\n", kExitInput},
      {"another file-system error",
       std::make_exception_ptr(fs::filesystem_error(
           "write", "/x", std::make_error_code(std::errc::no_space_on_device))),
       "ffnlab: error: [io] '/x': No space left on device\n", kExitSystem},
      {"a system error (fmt's failed write)",
       std::make_exception_ptr(std::system_error(std::make_error_code(std::errc::io_error), "w")),
       "ffnlab: error: [io] w: Input/output error\n", kExitSystem},
      {"a JSON error that escaped its reader's checks",
       [] {
         try {
           (void)nlohmann::json(1).get<std::string>();
         } catch (...) {
           return std::current_exception();
         }
         return std::exception_ptr();
       }(),
       "ffnlab: error: [json] type must be string, but is number\n", kExitInput},
      {"another exception", std::make_exception_ptr(std::logic_error("odd")),
       "ffnlab: error: odd\n", kExitSystem},
      {"not an exception", std::make_exception_ptr(42), "ffnlab: error: unknown exception\n",
       kExitSystem},
      {"a message of two lines", std::make_exception_ptr(std::runtime_error("first\nsecond")),
       "ffnlab: error: first\n", kExitSystem},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    testing::internal::CaptureStderr();
    const int status = report_error(c.error);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), c.line);
    EXPECT_EQ(status, c.status);
  }
}

}  // namespace
}  // namespace ffnlab::cli
