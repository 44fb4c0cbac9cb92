// Progress display.
#include "progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common.hpp"
#include "ffnlab/parallel/mpi.hpp"

namespace ffnlab::cli {

Progress::Progress(std::string label, std::int64_t total, std::int64_t every)
    : label_(std::move(label)),
      total_(total),
      every_(std::max<std::int64_t>(1, every)),
      tty_(redraws()) {}

// Under mpirun a rank's output reaches the terminal (or a file) through the launcher's
// pseudo-terminal: lines, not a bar redrawn every step.
bool Progress::redraws() {
  return isatty(fileno(stdout)) != 0 && !mpi_launched();
}

void Progress::update(std::int64_t done, const std::string& text, double eta_seconds) {
  const std::string eta = eta_seconds >= 0 ? " | ETA " + duration(eta_seconds) : "";
  if (tty_) {
    const int width = 24;
    // (A plan's total may fall short of the steps done: the bar is then full.)
    const int filled = static_cast<int>(
        std::clamp<std::int64_t>(width * done / std::max<std::int64_t>(1, total_), 0, width));
    emit(fmt::format("\r[{}{}] {} {}/{} {}{}   ", std::string(filled, '#'),
                     std::string(width - filled, '.'), label_, done, total_, text, eta));
    open_ = true;
  } else if (done % every_ == 0 || done == total_) {
    emit(fmt::format("{} {}/{} {}{}\n", label_, done, total_, text, eta));
  }
}

void Progress::message(const std::string& line) {
  emit(fmt::format("{}{}\n", tty_ && open_ ? "\r\033[K" : "", line));
}

void Progress::finish() {
  if (tty_ && open_) emit("\n");
  open_ = false;
}

void Progress::emit(const std::string& text) {
  // fputs and fflush report a failure by their return value; it is left for main's last flush.
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace ffnlab::cli
