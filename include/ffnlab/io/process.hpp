// Child processes (gnuplot for figures, PyTorch for bench): started without a shell, waited for
// with a deadline and with the stop request (ffnlab/interrupt.hpp) checked while waiting, and
// killed and reaped on every way out, so that no child outlives its parent's work and no
// interrupt is lost while one runs.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ffnlab {

struct ChildOptions {
  std::string dir;          // working folder ("" : this process's)
  std::string output_file;  // stdout and stderr go to this file ("" : inherited)
  bool pipes = false;       // stdin and stdout are pipes to this process (stderr inherited);
                            // not with output_file
  // Environment changes: a value sets the variable, std::nullopt removes it.
  std::map<std::string, std::optional<std::string>> env;
  // Messages read "[scope] name: ...": the caller's scope and the child's name ("" : argv[0]).
  std::string scope = "process";
  std::string name;
};

class ChildProcess {
 public:
  // Starts argv[0] (looked up on the PATH when it has no '/'). Throws SystemError
  // "[process] cannot start ..." when it cannot be started (not found, not executable).
  ChildProcess(const std::vector<std::string>& argv, const ChildOptions& options);
  // Kills (SIGKILL) and reaps the child if it still runs.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Waits until the child exits and returns its wait status. Before the deadline passes or when
  // a stop is requested, the child is killed (SIGTERM, then SIGKILL after a grace period) and
  // reaped: a stop throws Interrupted, a deadline throws SystemError "[process] NAME: no exit
  // within S s".
  int wait(std::chrono::duration<double> limit);

  // With pipes: writes a line (a '\n' is added); false when the child no longer reads. A
  // child that stops reading with the pipe full blocks this until it exits or is ended: the
  // requests written are a line each, far below a pipe's capacity.
  bool write_line(const std::string& line);
  // With pipes: the next line from the child's stdout, without its '\n'. Throws SystemError
  // "[process] NAME: ..." when no whole line comes within the limit, when the line exceeds
  // max_bytes, or when the child closes its stdout; Interrupted on a stop request.
  std::string read_line(std::chrono::duration<double> limit, std::size_t max_bytes);

  // Ends the child now: closes the pipes, SIGTERM, then SIGKILL after `grace`, and reaps it.
  void terminate(std::chrono::duration<double> grace = std::chrono::seconds(2));
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

 private:
  bool reap(int& status, std::chrono::duration<double> limit, bool watch_stop);
  void kill_and_reap();
  std::string scope_, name_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffered_;  // read from the child, not yet returned as a line
};

// Whether a program of that name is on the PATH (and executable).
bool program_on_path(const std::string& name);
// "exit status N", "killed by SIGKILL", ... for a wait status.
std::string describe_status(int status);

}  // namespace ffnlab
