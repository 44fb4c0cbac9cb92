// The stop request: one signal number, written by a signal handler, read by the work.
#include "ffnlab/interrupt.hpp"

#include <csignal>

namespace ffnlab {

namespace {
volatile std::sig_atomic_t g_stop = -1;  // -1: none; 0: a request without a signal
}  // namespace

void request_stop(int signal) noexcept {
  if (g_stop < 0) g_stop = signal;
}

bool stop_requested() noexcept {
  return g_stop >= 0;
}

std::string stop_reason() {
  const int s = g_stop;
  return s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "an interrupt";
}

void clear_stop() noexcept {
  g_stop = -1;
}

}  // namespace ffnlab
