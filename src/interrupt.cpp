// The stop request: one signal number, written by a signal handler, read by the work.
#include "ffnlab/interrupt.hpp"

#include <atomic>
#include <csignal>

namespace ffnlab {

namespace {
// Written by a signal handler on whichever thread the signal lands, read by every thread:
// lock-free atomics are what is both async-signal-safe and visible across threads.
std::atomic<int> g_stop{-1};  // -1: none; 0: a request without a signal
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

void request_stop(int signal) noexcept {
  int none = -1;
  g_stop.compare_exchange_strong(none, signal);  // the first request wins
}

bool stop_requested() noexcept {
  return g_stop.load() >= 0;
}

std::string stop_reason() {
  const int s = g_stop.load();
  return s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "an interrupt";
}

void clear_stop() noexcept {
  g_stop.store(-1);
}

}  // namespace ffnlab
