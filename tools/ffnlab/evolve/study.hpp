// ffnlab evolve: the seeds' FFN-evolution study, measured. The command (cmd_evolve.cpp) runs the
// stages in this folder in order; each adds its numbers to results.json, its section to
// REPORT.md and its figures, all inside a staging directory that replaces the report at the end.
//
//   costs.cpp     closed-form costs, equal-budget widths, the FFN's share of whole Transformers
//   speed.cpp     measured GFLOP/s of every variant against the bare products of the same shapes
//   training.cpp  the seeds' toy run over seeds, and every variant trained as a byte-level LM
//                 over paired seeds (validation bits/byte, curves, gradient norms, tokens/s)
//   sparsity.cpp  zero and near-zero fractions and dead units at initialisation and after training
//   moe.cpp       expert load over training without balancing, with the loss, with the bias
//   report.cpp    real models, corrections of the seeds, recommendations, the --sweep
//   figures.cpp   the gnuplot figures over the CSV the stages wrote
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../progress.hpp"
#include "ffnlab/analysis/sparsity.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab::cli::evolve {

using json = nlohmann::ordered_json;

struct Options {
  std::string out = "report", data = kDefaultCorpus;
  std::string variants = "relu,gelu,glu,bilinear,reglu,geglu,swiglu,gated,moe";
  bool quick = false, sweep = false;
  int seeds = 0;           // 0: 3 (2 with --quick)
  std::int64_t steps = 0;  // 0: the scale's
  int threads = 0;
};

// What --quick changes: sizes and counts, never the code path.
struct Scale {
  LMConfig model;              // the study's LM (its ffn is replaced per variant)
  TrainConfig train;           // steps, batch, seq, evaluation
  std::int64_t eval_tokens;    // validation tokens of the periodic evaluations
  std::int64_t census_tokens;  // validation tokens of the sparsity census
  int seeds;
  int toy_seeds, toy_iterations;
  double speed_budget;  // seconds per speed measurement
  std::int64_t speed_tokens;
  std::vector<int> sweep_ratios;  // d_ff / d_model of the --sweep runs
};
Scale make_scale(const Options& o);

// One LM training run's record.
struct RunRecord {
  std::string variant;
  int seed = 0;
  std::int64_t d_ff = 0, params = 0;
  std::vector<StepLog> steps;
  std::vector<EvalLog> evals;    // periodic (eval_tokens each)
  double val_bits_per_byte = 0;  // the whole validation part, at the end
  double median_tokens_per_second = 0;
};

struct Study {
  Options options;
  Scale scale;
  std::string dir;  // the staging directory: write everything here
  Corpus corpus;
  std::vector<std::string> variants;
  json results = json::object();
  std::vector<RunRecord> runs;  // every LM run, variant-major within each seed
  // Seed 1's activation census per variant and layer, at initialisation and after training.
  std::map<std::string, std::vector<UnitSparsity>> census_init, census_trained;
  std::string report;  // REPORT.md, section by section

  // Progress: stage messages, and a bar over the planned training steps with an ETA.
  std::int64_t planned_steps = 0, done_steps = 0;
  double step_seconds = 0;  // sum over done steps
  Progress* progress = nullptr;
  void stage(const std::string& name) const;
  void step_done(const StepLog& s, const std::string& what);
};

// Throws Interrupted once SIGINT or SIGTERM has arrived (checked between stages and steps).
void check_interrupt();

// The FFN of `variant` in the study's LM at (about) the parameters of the ReLU FFN of width
// 4·D: GLU kinds and the gated FFN get a narrower d_ff, MoE narrower experts (equal total).
FFNConfig study_ffn(const std::string& variant, std::int64_t d_model);
// The d_ff (a multiple of 8) that brings a config's parameters (or active parameters) closest
// to `target`; for MoE it sets the experts' width.
FFNConfig match_params(FFNConfig config, std::int64_t target, bool active);

// What a training run lets the study look at (each optional).
struct RunHooks {
  std::function<void(TransformerLM&)> on_start;  // the initialised model, before step 1
  std::function<void(const TransformerLM&, const StepLog&)> on_step;
  std::function<void(TransformerLM&)> on_end;  // the trained model
};

// Trains one LM run and records it.
RunRecord train_run(Study& study, const LMConfig& model, std::uint64_t seed,
                    const std::string& label, const RunHooks& hooks = {});

// Per layer, the hidden activations of `lm` over the first census_tokens validation tokens.
std::vector<UnitSparsity> census(const Study& study, TransformerLM& lm);

// The stages, in order.
void run_costs(Study& study);
void run_speed(Study& study);
void run_toy(Study& study);
void run_training(Study& study);
void run_sparsity(Study& study);
void run_moe(Study& study);
void run_sweep(Study& study);
void write_report(Study& study);
void write_figures(Study& study);

// Writes a file of the report (atomically).
void write_text(const std::string& path, const std::string& text);

// Formatting for the report.
std::string fixed(double value, int decimals);
std::string percent(double fraction, int decimals = 1);

}  // namespace ffnlab::cli::evolve
