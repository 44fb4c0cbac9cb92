// Progress on long work: a line redrawn in place on a terminal, plain lines otherwise (logs, CI).
// A progress line that cannot be written (stdout closed: mpirun ending the job stops forwarding
// the ranks' output) never stops the work it reports on; the program's last flush still reports
// the lost output (main.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace ffnlab::cli {

class Progress {
 public:
  // "label done/total text": `every`: without a terminal, one line per `every` updates (and
  // the last).
  Progress(std::string label, std::int64_t total, std::int64_t every);

  // Step `done` of total; `text` follows the bar; `eta_seconds` < 0 hides the ETA.
  void update(std::int64_t done, const std::string& text, double eta_seconds);
  // A total that changed with the plan (the study's, after each look at its comparisons).
  void set_total(std::int64_t total) { total_ = total; }
  // A line of its own (an evaluation, a stage), above the bar.
  void message(const std::string& line);
  // Ends the bar's line (call before printing anything else, or on error).
  void finish();
  // Whether a bar would be redrawn in place (stdout a terminal, not under mpirun) rather than
  // written as lines.
  static bool redraws();

 private:
  void emit(const std::string& text);
  std::string label_;
  std::int64_t total_, every_;
  bool tty_;
  bool open_ = false;
};

}  // namespace ffnlab::cli
