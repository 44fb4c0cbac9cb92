// The study's scale, progress and formatting helpers.
#include "study.hpp"

#include <fmt/format.h>

#include <cmath>

#include "../common.hpp"
#include "../interrupt.hpp"
#include "ffnlab/io/safetensors.hpp"

namespace ffnlab::cli::evolve {

Scale make_scale(const Options& o) {
  Scale s;
  // The study's LM: the reference configuration, measured against PyTorch (docs/training.md).
  s.model.d_model = o.quick ? 32 : 128;
  s.model.layers = o.quick ? 2 : 4;
  s.model.heads = o.quick ? 2 : 4;
  s.train.seq = o.quick ? 32 : 128;
  s.model.context = s.train.seq;
  s.train.batch = o.quick ? 8 : 16;
  s.train.steps = o.steps > 0 ? o.steps : (o.quick ? 40 : 600);
  s.train.warmup = std::min<std::int64_t>(50, s.train.steps / 10);
  s.train.eval_every = std::max<std::int64_t>(1, s.train.steps / 6);
  s.eval_tokens = o.quick ? 2048 : 32768;
  s.train.eval_tokens = s.eval_tokens;
  s.census_tokens = o.quick ? 2048 : 65536;
  s.seeds = o.seeds > 0 ? o.seeds : (o.quick ? 2 : 3);
  s.toy_seeds = o.quick ? 2 : 5;
  s.toy_iterations = o.quick ? 20 : 100;
  s.speed_budget = o.quick ? 0.02 : 0.3;
  s.speed_tokens = o.quick ? 64 : 2048;
  s.sweep_ratios = {1, 2, 4, 8};
  return s;
}

void Study::stage(const std::string& name) const {
  check_interrupt();
  progress->message(fmt::format("== {}", name));
}

void check_interrupt() {
  if (InterruptGuard::requested())
    throw Interrupted(
        fmt::format("{}: evolve stopped; nothing was written (an earlier report in "
                    "the output folder is unchanged)",
                    InterruptGuard::signal_name()));
}

void Study::step_done(const StepLog& s, const std::string& what) {
  ++done_steps;
  step_seconds += s.seconds;
  const double per_step = step_seconds / static_cast<double>(done_steps);
  // Evaluations and the stages after training add about a tenth to the steps' time.
  const double eta = 1.1 * per_step * static_cast<double>(planned_steps - done_steps);
  progress->update(done_steps, fmt::format("{} step {} loss {:.3f}", what, s.step, s.loss), eta);
}

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "n/a";
  return fmt::format("{:.{}f}", value, decimals);
}

std::string percent(double fraction, int decimals) {
  if (!std::isfinite(fraction)) return "n/a";
  return fmt::format("{:.{}f} %", 100.0 * fraction, decimals);
}

}  // namespace ffnlab::cli::evolve
