// What `ffnlab train` prints.
#include "train_printer.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "common.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "interrupt.hpp"

namespace ffnlab::cli {

namespace {

namespace fs = std::filesystem;

// "; expert parallel: 4 experts per rank" (and ", in 2 groups of 2 ranks" with expert groups).
std::string expert_layout(int experts, int ranks, int group) {
  const int G = group > 0 ? group : ranks;
  return fmt::format("; expert parallel: {} experts per rank{}", experts / G,
                     G < ranks ? fmt::format(", in {} groups of {} ranks", ranks / G, G) : "");
}

void print_header(const LMConfig& m, const TrainConfig& t, const Corpus& corpus,
                  std::int64_t params, std::int64_t from_step) {
  fmt::print("ffnlab train: {} FFN ({}), d_model {}, {} layers, {} heads, {} parameters\n",
             variant_name(m.ffn), enum_name(m.ffn.kind), m.d_model, m.layers, m.heads, params);
  fmt::print(
      "data: {} ({} files, {} bytes, {}; {} train, {} validation; unigram entropy {:.2f} "
      "bits/byte)\n",
      corpus.source, corpus.files.size(), corpus.bytes.size(), corpus.fingerprint,
      corpus.train().size(), corpus.validation().size(), unigram_entropy_bits(corpus.train()));
  fmt::print(
      "training: {} steps from step {}, batch {} x seq {} x accumulate {}, {} lr {} "
      "(warm-up {}, {} to {}x), clip {}, {}, seed {}\n",
      t.steps, from_step, t.batch, t.seq, t.accumulate, enum_name(t.optimizer.kind), t.optimizer.lr,
      t.warmup, enum_name(t.decay), t.min_lr_ratio, t.clip, enum_name(t.precision), t.seed);
  if (t.objective == Objective::masked)
    fmt::print(
        "objective: masked bytes, {} of each sequence's {} replaced by [MASK] and predicted "
        "(bidirectional attention); validation in bits per masked byte\n",
        masked_per_sequence(t.seq, t.mask_fraction), t.seq);
  std::fflush(stdout);
}

// What rank 0 handed to the exchanges of the group and of the groups split from it (expert
// groups, their replicas) per step, by exchange, and the time spent in them (waiting for the
// other ranks included): what docs/distributed.md's model is checked against.
void print_traffic(const RunTraffic& t) {
  fmt::print("data parallel: rank 0 sent {:.3f} MB per step ({:.2f} ms per step in exchanges):",
             t.bytes_per_step / 1e6, t.seconds_per_step * 1e3);
  for (const auto& [what, v] : t.by_exchange)
    fmt::print(" {} {:.3f} MB {:.2f} ms;", what, v.first / 1e6, v.second * 1e3);
  fmt::print("\n");
}

}  // namespace

void PrintingObserver::started(const RunStart& s, TransformerLM& /*model*/) {
  print_header(s.model, s.train, s.corpus, s.params, s.from_step);
  if (!s.schedule_note.empty()) fmt::print("note: {}\n", s.schedule_note);
  if (group_)
    fmt::print("data parallel: {} ranks, {} sequences each per micro-batch{}\n", group_->size(),
               s.train.batch / group_->size(),
               p_.expert_parallel
                   ? expert_layout(s.model.ffn.moe.num_experts, group_->size(), p_.expert_group)
                   : "");
  fmt::print(
      "matrix work: {:.2f} MFLOP a token (forward and backward); the bare products of "
      "this model's shapes run at {:.1f} GFLOP/s{} here (the yardstick of its FLOP "
      "utilisation)\n",
      s.bare.flops / static_cast<double>(s.tokens) / 1e6, s.bare.gflops(), group_ ? " a rank" : "");
  tokens_per_step_ = static_cast<double>(s.train.batch * s.train.seq * s.train.accumulate);
  total_ = s.train.steps;
  first_step_ = s.from_step;
  start_ = std::chrono::steady_clock::now();
  masked_ = s.train.objective == Objective::masked;
  progress_.emplace("step", s.train.steps,
                    p_.print_every > 0 ? p_.print_every : s.train.steps / 20);
}

void PrintingObserver::step(const StepLog& s, const TransformerLM& /*model*/) {
  tokens_ += tokens_per_step_;
  seconds_ += s.seconds;
  const double mean_tps = tokens_ / seconds_;
  // The ETA from the wall time per step so far, evaluations and checkpoints included (the
  // tokens/s shown are the steps' own).
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = s.step > first_step_ ? wall / static_cast<double>(s.step - first_step_) *
                                                static_cast<double>(total_ - s.step)
                                          : 0;
  const std::string val = std::isnan(last_val_)
                              ? ""
                              : fmt::format(" val {:.3f} {}", last_val_, masked_ ? "bpmb" : "bpb");
  progress_->update(s.step,
                    fmt::format("loss {:.4f} grad_norm {:.3f} lr {:.3g}{} | {:.0f} tok/s", s.loss,
                                s.grad_norm, s.lr, val, mean_tps),
                    eta);
}

void PrintingObserver::evaluated(const EvalLog& e) {
  last_val_ = e.bits_per_byte;
  progress_->message(fmt::format("step {}: validation loss {:.4f} ({:.4f} bits per {}byte, {} {})",
                                 e.step, e.loss, e.bits_per_byte, masked_ ? "masked " : "",
                                 e.tokens, masked_ ? "masked bytes" : "tokens"));
}

bool PrintingObserver::stop() {
  return InterruptGuard::requested();
}

void print_outcome(const RunOutcome& r, const TrainPrinting& p, const ProcessGroup* group) {
  const bool lead = group == nullptr || group->rank() == 0;
  if (r.already_finished) {  // resumed in its own folder: nothing of it changed
    if (lead)
      fmt::print(
          "{} is finished at step {} of {}: nothing to do (--steps N continues it; --out OTHER "
          "--sample N samples from it)\n",
          r.out, r.step, r.train.steps);
    return;
  }
  if (!r.finished) {
    if (!lead)
      throw Interrupted(fmt::format("{} after step {}", InterruptGuard::signal_name(), r.step));
    throw Interrupted(fmt::format(
        "{} after step {} of {}; checkpoint written to {}; continue with: ffnlab train --resume {}",
        InterruptGuard::signal_name(), r.step, r.train.steps,
        (fs::path(r.out) / "checkpoint").string(), r.out));
  }
  if (!lead) return;
  if (r.traffic) print_traffic(*r.traffic);
  if (!r.sample_skipped.empty())
    fmt::print(
        "no sample: no rank holds every expert (--expert-parallel); the checkpoint in {} samples "
        "in one process: ffnlab train --resume {} --out OTHER --sample {}\n",
        (fs::path(r.out) / "checkpoint").string(), r.out, p.sample);
  else if (!r.sample.empty())
    fmt::print("sample (temperature {}):\n{}\n", p.temperature, r.sample);
  if (r.median_tokens_per_second > 0) {
    if (std::isnan(r.utilisation))
      // A step cannot outrun its own products: the timing was disturbed, and no number is given.
      fmt::print(
          "model FLOP utilisation not measured: {:.1f} GFLOP/s of matrix work{} came out above "
          "the {:.1f} of the bare products of its shapes (a disturbed timing)\n",
          r.matrix_gflops, group ? " a rank" : "", r.bare.gflops());
    else
      fmt::print(
          "model FLOP utilisation {:.0f} %: {:.1f} GFLOP/s of matrix work{} against {:.1f} for "
          "the bare products of its shapes\n",
          100.0 * r.utilisation, r.matrix_gflops, group ? " a rank" : "", r.bare.gflops());
  }
  fmt::print("median {:.0f} tokens/s; logs, checkpoint and summary in {}\n",
             r.median_tokens_per_second, r.out);
  if (r.sample_stopped)
    throw Interrupted(fmt::format(
        "{} while sampling: the run is finished and written to {}; its sample stopped after {} of "
        "{} bytes (ffnlab train --resume {} --out OTHER --sample {} samples from it)",
        InterruptGuard::signal_name(), r.out, r.sample.size(), p.sample, r.out, p.sample));
}

}  // namespace ffnlab::cli
