// Signal handling: the library's stop request set by the first SIGINT/SIGTERM, the default
// action on the second. The handler only stores a number (async-signal-safe); all work happens
// where the command checks the request.
#include "interrupt.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

namespace ffnlab::cli {

namespace {

struct sigaction g_old_int, g_old_term;
std::atomic<bool> g_nonblocking_on_stop{false};

extern "C" void on_signal(int sig) {
  if (stop_requested()) {  // the second signal: do what it would have done without us
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  request_stop(sig);
  if (g_nonblocking_on_stop.load()) {  // fcntl is async-signal-safe; errno is kept
    const int saved = errno;
    for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
      if (const int flags = fcntl(fd, F_GETFL); flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    errno = saved;
  }
}

}  // namespace

void InterruptGuard::nonblocking_output_on_stop() {
  g_nonblocking_on_stop.store(true);
}

InterruptGuard::InterruptGuard() {
  clear_stop();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

}  // namespace ffnlab::cli
