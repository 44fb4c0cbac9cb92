// Signal handling: the library's stop request set by the first SIGINT/SIGTERM, the default
// action on the second. All work happens where the command checks the request.
//
// The signals are blocked in every thread the command runs (the mask is set before any
// compute thread starts, and threads inherit it) and taken by one watcher thread with
// sigwait. A signal handler may run on any thread that does not block the signal, at any
// instruction: one that landed in oneDNN's products corrupted the heap about once in thirty
// interrupted runs (glibc: "corrupted size vs. prev_size", in dnnl_primitive_execute's free).
// With the watcher no compute thread is ever interrupted. The handler stays installed for a
// thread that does not block the signals (one started before the guard), and does only
// async-signal-safe work. Under mpirun the ranks keep the handler alone: with the watcher, ranks
// that mpirun ended (SIGTERM, then SIGKILL a second later) did not reach their checkpoint in
// that second (Distributed.InterruptingMpirunKeepsTheStepItStoppedAt), for a reason not yet
// found.
#include "interrupt.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab::cli {

namespace {

struct sigaction g_old_int, g_old_term;
sigset_t g_old_mask;
pthread_t g_watcher;
bool g_watching = false;
std::atomic<bool> g_nonblocking_on_stop{false};
std::atomic<bool> g_closing{false};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// Async-signal-safe: fcntl, errno kept.
void make_output_nonblocking() {
  const int saved = errno;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
    if (const int flags = fcntl(fd, F_GETFL); flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  errno = saved;
}

// The second signal does what it would have done without us: its default action.
void end_by(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
}

void take(int sig) {
  if (stop_requested()) {
    end_by(sig);
    return;
  }
  request_stop(sig);
  if (g_nonblocking_on_stop.load()) make_output_nonblocking();
}

extern "C" void on_signal(int sig) {
  take(sig);
}

extern "C" void* watch(void*) {
  const sigset_t set = stop_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (g_closing.load()) return nullptr;  // the guard's own wake-up
    take(sig);
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
  if (mpi_launched()) return;
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, &g_old_mask);
  g_closing.store(false);
  g_watching = pthread_create(&g_watcher, nullptr, watch, nullptr) == 0;
  if (!g_watching) pthread_sigmask(SIG_SETMASK, &g_old_mask, nullptr);  // the handler, then
}

InterruptGuard::~InterruptGuard() {
  if (g_watching) {
    g_closing.store(true);
    pthread_kill(g_watcher, SIGTERM);  // wakes its sigwait; it leaves without a request
    pthread_join(g_watcher, nullptr);
    g_watching = false;
    pthread_sigmask(SIG_SETMASK, &g_old_mask, nullptr);
  }
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

}  // namespace ffnlab::cli
