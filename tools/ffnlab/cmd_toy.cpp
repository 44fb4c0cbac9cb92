// ffnlab toy: the tutorial's toy experiment for each FFN variant (train/toy.hpp), loss and gradient
// norm per iteration to CSV, and a summary table.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/toy.hpp"
#include "interrupt.hpp"
#include "key_flags.hpp"
#include "launch.hpp"
#include "progress.hpp"

namespace ffnlab::cli {

namespace {

struct ToyOptions {
  ToyConfig toy;
  KeyFlags ffn;  // the tutorial's d_model 512, d_ff 2048 for every variant
  std::string config_file;
  std::string variants = "relu,gelu,glu,gated,moe", out = "toy_log.csv";
  CLI::Option* variants_flag = nullptr;
  int threads = 0;
};

// The layers to run: every variant of --variants, or the one layer of --ffn-config (under its
// own name), with the flags checked against it.
std::vector<std::pair<std::string, FFNConfig>> toy_layers(const ToyOptions& o) {
  std::vector<std::pair<std::string, FFNConfig>> layers;
  if (o.config_file.empty()) {
    const std::vector<std::string> names = variant_list(o.variants);
    refuse_flags_no_variant_reads(o.ffn, names);
    for (const std::string& name : names)
      layers.emplace_back(name, layer_config(o.ffn, "", "", name));
    return layers;
  }
  const FFNConfig c = layer_config(o.ffn, "", o.config_file, "");
  refuse_flags_beside_layer_file(o.ffn, *o.variants_flag, o.config_file, c);
  layers.emplace_back(variant_name(c), c);
  return layers;
}

void run_toy_command(const ToyOptions& o) {
  InterruptGuard interrupts;  // Ctrl-C stops between iterations; nothing is written then
  apply_threads(o.threads);
  const std::vector<std::pair<std::string, FFNConfig>> layers = toy_layers(o);
  check_output_path(o.out, "toy");                      // before the work, not after it
  const std::int64_t tokens = o.toy.batch * o.toy.seq;  // (at most 2^40: the flags' ranges)
  for (const auto& [name, c] : layers) {
    check_memory(toy_memory_bytes(c, o.toy), "toy",
                 fmt::format("{}: a layer of {} parameters on {} tokens (weights, gradients, "
                             "Adam's state and activations)",
                             name, count_params(c), tokens));
  }
  std::string csv = "variant,iteration,loss,grad_norm\n";
  const FFNConfig& first = layers.front().second;
  fmt::print(
      "The tutorial's toy run: d_model {}, d_ff {}, batch {} x seq {}, dropout {}, Adam lr {}, "
      "{} iterations, seed {}, fixed random inputs and targets, MSE\n\n",
      first.d_model, first.d_ff, o.toy.batch, o.toy.seq, o.toy.dropout, o.toy.lr, o.toy.iterations,
      o.toy.seed);
  fmt::print("{:<10} {:>12} {:>12} {:>9} {:>14} {:>13}\n", "variant", "first loss", "last loss",
             "fall", "mean |grad|", "std |grad|");
  std::fflush(stdout);  // the header before the first (perhaps long) variant
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point from) {
    return std::chrono::duration<double>(Clock::now() - from).count();
  };
  for (const auto& [name, c] : layers) {
    // On a terminal, a bar under the table while a variant trains, at most ten redraws a
    // second; elsewhere (logs) the rows alone are the progress.
    std::optional<Progress> bar;
    if (Progress::redraws()) bar.emplace(name, o.toy.iterations, o.toy.iterations);
    const auto start = Clock::now();
    auto drawn = start;
    std::vector<ToyStep> steps;
    try {
      steps = run_toy(
          c, o.toy, [] { return InterruptGuard::requested(); },
          [&](int done, const ToyStep& s) {
            if (!bar || seconds(drawn) < 0.1) return;
            drawn = Clock::now();
            bar->update(done, fmt::format("loss {:.4f}", s.loss),
                        seconds(start) / done * (o.toy.iterations - done));
          });
    } catch (...) {
      if (bar) bar->finish();  // the error on a line of its own
      throw;
    }
    std::vector<double> norms;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      csv += fmt::format("{},{},{:.6f},{:.6f}\n", name, i + 1, steps[i].loss, steps[i].grad_norm);
      norms.push_back(steps[i].grad_norm);
    }
    const double mean = ffnlab::mean(norms), sd = population_std(norms);
    const std::string row = fmt::format(
        "{:<10} {:>12.4f} {:>12.4f} {:>8.2f}% {:>14.4f} {:>13.4f}", name, steps.front().loss,
        steps.back().loss, 100.0 * (1.0 - steps.back().loss / steps.front().loss), mean, sd);
    if (bar)
      bar->message(row);  // in the bar's place
    else
      fmt::print("{}\n", row);
    std::fflush(stdout);
  }
  write_file_atomic(o.out, csv.data(), csv.size());
  fmt::print("\nper-iteration loss and gradient norm: {}\n", o.out);
}

}  // namespace

void add_toy_command(CLI::App& app) {
  auto o = std::make_shared<ToyOptions>();
  auto* cmd = app.add_subcommand(
      "toy",
      "The tutorial's toy experiment: each FFN variant alone, Adam on one fixed random batch with "
      "MSE.\nIt measures memorisation of batch x seq random vectors (8 at the defaults), not "
      "language modelling.");
  o->variants_flag = add_variants_flag(*cmd, o->variants);
  add_layer_flags(*cmd, o->ffn, o->config_file, "FFN");
  cmd->add_option("--batch", o->toy.batch, "batch")
      ->capture_default_str()
      ->check(int_in(1, 1 << 20));
  cmd->add_option("--seq", o->toy.seq, "sequence length")
      ->capture_default_str()
      ->check(int_in(1, 1 << 20));
  cmd->add_option("--dropout", o->toy.dropout, "dropout on the layer input")
      ->capture_default_str()
      ->check(real_in(0, 1, true));
  cmd->add_option("--lr", o->toy.lr, "Adam learning rate")
      ->capture_default_str()
      ->check(real_in(0, 1e30));
  cmd->add_option("--iterations", o->toy.iterations, "iterations")
      ->capture_default_str()
      ->check(int_in(1, 100000000));
  cmd->add_option("--seed", o->toy.seed, "seed of weights, data and dropout")
      ->capture_default_str()
      ->check(any_count());
  cmd->add_option("--out", o->out, "CSV of every iteration")
      ->capture_default_str()
      ->check(named_path());
  add_threads_option(*cmd, o->threads);
  cmd->callback([o] {
    require_one_process("toy");
    run_toy_command(*o);
  });
}

}  // namespace ffnlab::cli
