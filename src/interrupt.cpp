// The stop request: one signal number, written by a signal handler, read by the work.
#include "ffnlab/interrupt.hpp"

#include <time.h>

#include <atomic>
#include <csignal>

namespace ffnlab {

namespace {
// Written by a signal handler on whichever thread the signal lands, read by every thread:
// lock-free atomics are what is both async-signal-safe and visible across threads.
std::atomic<int> g_stop{-1};  // -1: none; 0: a request without a signal
static_assert(std::atomic<int>::is_always_lock_free);
// When the request came, in CLOCK_MONOTONIC nanoseconds (clock_gettime is async-signal-safe).
std::atomic<long long> g_stop_ns{0};
static_assert(std::atomic<long long>::is_always_lock_free);

long long now_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}
}  // namespace

void request_stop(int signal) noexcept {
  int none = -1;
  // The time first, so that a thread that sees the request never reads a time of 0.
  if (g_stop.load() < 0) g_stop_ns.store(now_ns());
  g_stop.compare_exchange_strong(none, signal);  // the first request wins
}

double seconds_since_stop() noexcept {
  if (g_stop.load() < 0) return 0;
  return static_cast<double>(now_ns() - g_stop_ns.load()) * 1e-9;
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
