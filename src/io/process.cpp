// Child processes without a shell: posix_spawn, a polled wait that watches the stop request and
// a deadline, bounded line reads from a pipe.
#include "ffnlab/io/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "check.hpp"
#include "ffnlab/interrupt.hpp"

extern char** environ;

namespace ffnlab {

namespace {

using clock = std::chrono::steady_clock;
constexpr int kLostStatus = -1;  // reap(): the child was reaped elsewhere; its status is unknown
constexpr auto kPoll = std::chrono::milliseconds(10);

// The environment with the changes applied, as "KEY=value" strings.
std::vector<std::string> environment(const ChildOptions& o) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    if (o.env.count(key) == 0) out.push_back(entry);
  }
  for (const auto& [key, value] : o.env)
    if (value) out.push_back(key + "=" + *value);
  return out;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Where execvp would find `name` (itself when it has a '/'); "" when nowhere.
std::string find_program(const std::string& name, bool& found_but_not_executable) {
  found_but_not_executable = false;
  auto usable = [&](const std::string& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (::access(p.c_str(), X_OK) == 0) return true;
    found_but_not_executable = true;
    return false;
  };
  if (name.find('/') != std::string::npos) return usable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (std::size_t begin = 0; begin <= dirs.size();) {
    std::size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > begin ? dirs.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (usable(candidate)) return candidate;
    begin = end + 1;
  }
  return "";
}

}  // namespace

bool program_on_path(const std::string& name) {
  bool not_executable = false;
  return !find_program(name, not_executable).empty();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* s = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by ") +
           (s ? std::string("SIG") + s : std::to_string(WTERMSIG(status)));
  }
  return "wait status " + std::to_string(status);
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const ChildOptions& o) {
  check(!argv.empty(), "[process] no program named");
  check(!(o.pipes && !o.output_file.empty()),
        "[process] pipes and an output file exclude each other");
  scope_ = o.scope;
  name_ = o.name.empty() ? argv[0] : o.name;
  bool not_executable = false;
  const std::string program = find_program(argv[0], not_executable);
  if (program.empty())
    fail_system("[{}] cannot start {}: {}", scope_, argv[0],
                not_executable                           ? "it is not executable"
                : argv[0].find('/') != std::string::npos ? "no such file"
                                                         : "not found on the PATH");
  // Everything that may throw comes before the first descriptor is opened.
  std::string path = std::filesystem::absolute(program).string();  // the folder changes
  std::vector<std::string> args = argv, env = environment(o);
  std::vector<char*> cargs, cenv;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child starts with the default signal actions and no blocked signals, whatever this
  // process ignores or blocks. (SIGXFSZ too: a child that does not check its writes, gnuplot,
  // is ended at a file-size limit rather than leaving a cut-off file behind.)
  sigset_t defaults, none;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGQUIT, SIGHUP, SIGXFSZ}) sigaddset(&defaults, s);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  int in[2] = {-1, -1}, out[2] = {-1, -1};
  const auto cleanup = [&] {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  };
  if (o.pipes) {
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      const int error = errno;
      for (int fd : {in[0], in[1], out[0], out[1]})
        if (fd >= 0) ::close(fd);
      cleanup();
      fail_errno(error, "[{}] cannot start {}: no pipe ({})", scope_, name_, std::strerror(error));
    }
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  }
  // The output file is opened before the change of folder: its name is relative to ours.
  if (!o.output_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, o.output_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  if (!o.dir.empty()) posix_spawn_file_actions_addchdir_np(&actions, o.dir.c_str());
  const int rc = posix_spawn(&pid_, path.c_str(), &actions, &attr, cargs.data(), cenv.data());
  cleanup();
  if (o.pipes) {
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  if (rc != 0) {
    pid_ = -1;
    close_fd(to_);
    close_fd(from_);
    fail_errno(rc, "[{}] cannot start {}: {}", scope_, name_, std::strerror(rc));
  }
}

ChildProcess::~ChildProcess() {
  close_fd(to_);
  close_fd(from_);
  kill_and_reap();
}

void ChildProcess::kill_and_reap() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

bool ChildProcess::reap(int& status, std::chrono::duration<double> limit, bool watch_stop) {
  const auto end = clock::now() + std::chrono::duration_cast<clock::duration>(limit);
  for (;;) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return true;
    }
    if (r < 0 && errno != EINTR) {  // not our child any more (reaped elsewhere): no status
      pid_ = -1;
      status = kLostStatus;
      return true;
    }
    if (watch_stop && stop_requested()) return false;
    if (clock::now() >= end) return false;
    std::this_thread::sleep_for(kPoll);
  }
}

void ChildProcess::terminate(std::chrono::duration<double> grace) {
  close_fd(to_);
  close_fd(from_);
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  if (reap(status, grace, false)) return;
  kill_and_reap();
}

int ChildProcess::wait(std::chrono::duration<double> limit) {
  check(pid_ > 0, "[{}] {} is not running", scope_, name_);
  int status = 0;
  if (reap(status, limit, true)) {
    // The child may have died of the same interrupt (Ctrl-C reaches the whole group): the
    // interrupt, not the child's failure, is what happened.
    if (stop_requested()) throw Interrupted(stop_reason() + " while " + name_ + " ran");
    if (status == kLostStatus)
      fail_system("[{}] {}: its exit status was lost (reaped elsewhere)", scope_, name_);
    return status;
  }
  const bool stopped = stop_requested();
  terminate();
  if (stopped) throw Interrupted(stop_reason() + " while " + name_ + " ran");
  fail_system("[{}] {}: no exit within {:.0f} s; it was ended", scope_, name_, limit.count());
}

bool ChildProcess::write_line(const std::string& line) {
  if (to_ < 0) return false;
  const std::string text = line + "\n";
  // A child that has exited makes the write fail with EPIPE and raise SIGPIPE, which would end
  // this process: SIGPIPE is blocked for the write and a pending one consumed, so that the rest
  // of the program keeps the usual behaviour (ffnlab bench | head).
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  std::size_t done = 0;
  bool ok = true;
  while (done < text.size()) {
    const ssize_t n = ::write(to_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {  // EPIPE: the child is gone
      ok = false;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (!ok) {
    const timespec now{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &now) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

std::string ChildProcess::read_line(std::chrono::duration<double> limit, std::size_t max_bytes) {
  check(from_ >= 0, "[{}] {}: no pipe to read", scope_, name_);
  const auto end = clock::now() + std::chrono::duration_cast<clock::duration>(limit);
  for (;;) {
    const auto nl = buffered_.find('\n');
    if (nl != std::string::npos && nl <= max_bytes) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (buffered_.size() > max_bytes)
      fail_system("[{}] {}: a reply line longer than {} bytes", scope_, name_, max_bytes);
    if (stop_requested()) throw Interrupted(stop_reason() + " while waiting for " + name_);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
    if (left.count() <= 0)
      fail_system("[{}] {}: no reply within {:.0f} s", scope_, name_, limit.count());
    pollfd p{from_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 50)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int error = errno;
      fail_errno(error, "[{}] {}: cannot wait for its reply ({})", scope_, name_,
                 std::strerror(error));
    }
    if (r == 0) continue;  // nothing yet: check the stop request and the deadline again
    char chunk[4096];
    const ssize_t n = ::read(from_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      const std::string how =
          reap(status, std::chrono::milliseconds(200), false) && status != kLostStatus
              ? describe_status(status)
              : "";
      fail_system("[{}] {}: stopped answering{}", scope_, name_,
                  how.empty() ? "" : " (" + how + ")");
    }
    buffered_.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace ffnlab
