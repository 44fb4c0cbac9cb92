// What `ffnlab train` prints: the run's header, progress and evaluations as it goes (an
// observer of the run driver), and its outcome.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>

#include "ffnlab/parallel/group.hpp"
#include "ffnlab/train/run.hpp"
#include "progress.hpp"

namespace ffnlab::cli {

// The command's settings the printing shows.
struct TrainPrinting {
  std::int64_t print_every = 0;  // without a terminal: a line every N steps (0: steps/20)
  bool expert_parallel = false;
  int expert_group = 0;
  std::int64_t sample = 0;
  float temperature = 0;
};

// What the command shows as the run goes: its header, log lines, progress, evaluations.
class PrintingObserver final : public RunObserver {
 public:
  PrintingObserver(const TrainPrinting& p, const ProcessGroup* group) : p_(p), group_(group) {}

  void started(const RunStart& s, TransformerLM& model) override;
  void step(const StepLog& s, const TransformerLM& model) override;
  void evaluated(const EvalLog& e) override;
  bool stop() override;

  // Ends the progress line (before anything else is printed, or on error).
  void finish() {
    if (progress_) progress_->finish();
  }

 private:
  const TrainPrinting& p_;
  const ProcessGroup* group_;
  std::optional<Progress> progress_;
  double tokens_per_step_ = 0, tokens_ = 0, seconds_ = 0, last_val_ = std::nan("");
  std::int64_t total_ = 0, first_step_ = 0;
  std::chrono::steady_clock::time_point start_;
  bool masked_ = false;
};

// The run's outcome as rank 0 prints it: nothing to do, the sample, utilisation and speed.
// Throws Interrupted (on every rank) for a run stopped by a signal, naming its checkpoint.
void print_outcome(const RunOutcome& r, const TrainPrinting& p, const ProcessGroup* group);

}  // namespace ffnlab::cli
