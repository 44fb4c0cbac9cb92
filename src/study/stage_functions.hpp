// The functions of each stage, for the table in stages.cpp: run (compute into study.results and
// write its CSV), json (its results.json entry, null when it did not run), markdown (its
// section's body) and draw (a figure). Each stage's are defined in the file named beside it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ffnlab/study/stages.hpp"
#include "ffnlab/study/study.hpp"

namespace ffnlab::study {

using json = nlohmann::ordered_json;

// report.cpp: the summary, the data, the real models, corrections, recommendations
json data_json(const Results& r);
std::string data_markdown(const Study& st, const Sections& sec);
// The answer in one sentence and one table: every comparison with ReLU (the training stage's
// variants and MoE at equal compute) with its costs, difference, interval and verdict.
std::string summary_markdown(const Study& st, const Sections& sec);
void run_zoo(Study& st);
json zoo_json(const Results& r);
std::string zoo_markdown(const Study& st, const Sections& sec);
void run_corrections(Study& st);
json corrections_json(const Results& r);
std::string corrections_markdown(const Study& st, const Sections& sec);
void run_recommendations(Study& st);
json recommendations_json(const Results& r);
std::string recommendations_markdown(const Study& st, const Sections& sec);
// What the run can and cannot say: scale, recipe, seeds, where its speeds hold.
std::string limitations_markdown(const Study& st, const Sections& sec);
// The papers behind each variant and routing feature (a fixed list).
std::string references_markdown(const Study& st, const Sections& sec);

// costs.cpp
void run_costs(Study& st);
json costs_json(const Results& r);
std::string costs_markdown(const Study& st, const Sections& sec);
void run_equal_budget(Study& st);
json equal_budget_json(const Results& r);
std::string equal_budget_markdown(const Study& st, const Sections& sec);

// speed.cpp
void run_speed(Study& st);
json speed_json(const Results& r);
std::string speed_markdown(const Study& st, const Sections& sec);

// training.cpp: the tutorial's toy run and the LM study
void run_toy(Study& st);
json toy_json(const Results& r);
std::string toy_markdown(const Study& st, const Sections& sec);
std::int64_t training_steps(const Study& st);
void run_training(Study& st);
json training_json(const Results& r);
std::string training_markdown(const Study& st, const Sections& sec);
// An interval as JSON: [low, high], or null where there is none (one seed).
json interval_json(double low, double high);
// A member of every run labelled `label` (of the training or moe_axes stage), seed 1 first
// (e.g. &RunRecord::val_bits_per_byte).
std::vector<double> per_seed(const Study& st, std::string_view label, double RunRecord::*value);
// Validation per seed against a reference's (the same seeds, in order), over the seeds both
// have (values past the reference's are left out, so that the mean, the spread and the seeds
// counted are those of the pairs): mean, spread, the paired difference with its intervals, and
// the verdict by the study's rules: the sequential design's (compare_sequential) when `design`
// is given, else the fixed intervals (compare_paired).
VariantOutcome paired_outcome(std::string name, std::vector<double> values,
                              const std::vector<double>& reference, double margin,
                              const SequentialDesign* design = nullptr);
// A sequential comparison against ReLU at the seeds trained so far (values and ReLU's, seed 1
// first): paired_outcome by the design, narrow_by_chance against the pooled spread of the
// other comparisons it is made beside, and holds_for_all_comparisons with the error shared
// (Bonferroni) over `comparisons`.
VariantOutcome sequential_outcome(std::string label, std::vector<double> values,
                                  const std::vector<double>& relu, double margin,
                                  const SequentialDesign& design, double others_spread,
                                  int comparisons);
// The paired spread of several comparisons' differences, pooled (the sample variances weighted
// by their degrees of freedom); 0 when there is none.
double pooled_paired_spread(const std::vector<std::vector<double>>& differences);
// One look of sequential comparisons against ReLU (their outcomes, ReLU's own left out, and the
// seeds ReLU has): the next round's runs, (label, seed): one more seed of each comparison still
// undecided below the cap, then ReLU's seeds they pair with; the runs still planned, at an
// upper bound on the spread; and the look as a line ("gelu undecided, swiglu better ...").
struct NextRound {
  std::vector<std::pair<std::string, int>> runs;
  std::int64_t planned_runs = 0;
  std::string looked;
};
NextRound next_round(const std::vector<VariantOutcome>& outcomes, int relu_seeds,
                     const SequentialDesign& design);
// The outcome of a sequential comparison of the run (a variant of the training stage, or an
// MoE of the moe_axes stage, against ReLU) at the seeds trained so far: paired_outcome by the
// design, with narrow_by_chance (against the other comparisons' pooled spread) and
// holds_for_all_comparisons, and the throughput.
VariantOutcome comparison_outcome(const Study& st, const std::string& label);
// Every comparison with ReLU still undecided when the study ends (the training stage's, MoE at
// equal compute, each cell across sizes and tasks), each with about how many seeds would decide
// it (values_to_decide: the mean as seen, the spread at its upper bound; a planning figure):
// "swiglu at s, masked: about 41 seeds would decide it".
std::vector<std::string> undecided_comparisons(const Study& st);
// The labels of the run's sequential comparisons, ReLU first.
std::vector<std::string> comparison_labels(const Study& st);
// Throughput over seeds (each run's median tokens/s, seed 1 first): the median, its ratio to
// the reference's median, and the noise test: the spread of the ratios to the reference's run
// of the same seed, or for the reference itself (`reference`) of its runs against their median.
void set_throughput(VariantOutcome& outcome, const std::vector<double>& tokens_per_second,
                    const std::vector<double>& reference_tokens_per_second, bool reference = false);
// "38,812 (0.96×)", or "38,812 (noisy: spread 14 % over seeds)".
std::string tokens_per_second_cell(const VariantOutcome& outcome);
// A FLOP utilisation as a percentage, or "not measured" (NaN: not timed, or above 100 %).
std::string utilisation_cell(double utilisation);
// The verdict: for a sequential comparison with the seeds it was decided at (or "inconclusive
// at the cap"), for an inconclusive fixed one about how many seeds would decide it.
std::string verdict_cell(const VariantOutcome& outcome);
// "+0.0123 [−0.0100, +0.0346]", or without the interval for one seed.
std::string difference_cell(const VariantOutcome& outcome);

// sparsity.cpp
void run_sparsity(Study& st);
json sparsity_json(const Results& r);
std::string sparsity_markdown(const Study& st, const Sections& sec);

// moe.cpp
std::int64_t moe_steps(const Study& st);
// The balancing runs' settings: half the study's steps, no periodic evaluations.
TrainConfig balancing_settings(const Study& st);
void run_moe(Study& st);
json moe_json(const Results& r);
std::string moe_markdown(const Study& st, const Sections& sec);

// evolution.cpp: the tutorial's walk, its three dimensions and the choice by situation, read
// through the numbers of the stages before it (it computes nothing of its own)
std::string evolution_markdown(const Study& st, const Sections& sec);

// literature.cpp: this run beside Shazeer 2020's Table 1
void run_literature(Study& st);
json literature_json(const Results& r);
std::string literature_markdown(const Study& st, const Sections& sec);

// The probes (study.hpp's Probe), each beside the stage that reads what it gathered; made by
// train_runs where the run trains. census (study.cpp): seed 1 of a training-stage variant;
// take_census puts what it gathered into Study::census_init, census_trained, expert_classes.
std::unique_ptr<RunProbe> census_probe(const Study& st, const RunJob& job);
void take_census(Study& st, const RunRecord& record);
// moe.cpp: the balancing settings' load as they train.
std::unique_ptr<RunProbe> load_trace_probe(const Study& st, const RunJob& job);

// moe_axes.cpp: MoE at equal parameters and at equal compute
std::int64_t moe_axes_steps(const Study& st);
// The configurations of the stage's LM runs (kHeadlineMoE, and moe_compute with --full; none
// without moe), and the run of one for a seed: the training stage trains them in its pool, as
// sequential comparisons against ReLU (Study::axes_runs).
std::vector<std::string> moe_axes_labels(const Study& st);
RunJob moe_axes_job(const Study& st, const std::string& label, int seed);
// The headline MoE's FFN (kHeadlineMoE: 16 experts of a quarter of ReLU's width, top-3, one
// shared expert of a quarter) in the study's LM of width d_model.
FFNConfig headline_moe_ffn(std::int64_t d_model);
void run_moe_axes(Study& st);
json moe_axes_json(const Results& r);
std::string moe_axes_markdown(const Study& st, const Sections& sec);

// routing.cpp: every routing family against token-choice top-k
std::int64_t routing_steps(const Study& st);
// The stage's LM runs, each with its behaviour probe: the training stage trains them in its
// pool (Study::routing_runs).
std::vector<RunJob> routing_jobs(const Study& st);
std::unique_ptr<RunProbe> routing_behaviour_probe(const Study& st, const RunJob& job);
// What that probe gathers (RunRecord::gathered) from what a run's layers did.
nlohmann::json routing_behaviour_json(const RoutingBehaviour& behaviour);
void run_routing(Study& st);
json routing_json(const Results& r);
std::string routing_markdown(const Study& st, const Sections& sec);

// scaling.cpp: every variant at every size of the ladder and on every task
// How the report refers to the stage's section (unnumbered: it runs only when asked for).
inline constexpr std::string_view kScalingSection = "the section \"Across model sizes and tasks\"";
// Whether the stage runs (Options::sizes or tasks given), and the sizes and tasks it trains.
bool trains_scaling(const Options& options);
std::vector<ModelSize> scaling_sizes(const Options& options);
std::vector<std::string> scaling_tasks(const Options& options);
// The LM of a size (ReLU's FFN, causal) and its settings: the study's, with steps grown as its
// parameters over the study's LM's (never fewer than the study's), no periodic evaluations.
LMConfig size_model(const Scale& scale, const ModelSize& size);
TrainConfig size_settings(const Scale& scale, const ModelSize& size);
// The LM of a task: as it is for "causal"; bidirectional with [MASK] and RoPE for "masked" (as
// `ffnlab train --objective masked` builds it).
LMConfig task_model(LMConfig model, bool masked);
// The labels each cell compares (ReLU first): the variants, and the headline MoE at equal
// compute beside them on the causal task; the dense variants alone on the masked one.
std::vector<std::string> scaling_labels(const Study& st, const std::string& task);
// One run of a cell: its LM, settings and label ("xs/masked/swiglu").
RunJob scaling_job(const Study& st, const ModelSize& size, const std::string& task,
                   const std::string& variant, int seed);
std::int64_t scaling_steps(const Study& st);
void run_scaling(Study& st);
// The stage's result from the runs trained (run_scaling trains them, then reads them so).
ScalingResult scaling_result(const Study& st);
json scaling_json(const Results& r);
std::string scaling_markdown(const Study& st, const Sections& sec);
// The scaling rows of "Choosing by situation" (evolution.cpp): by size and by task, each
// {situation, the tutorial says, this run's choice, rests on}; empty when the stage did not run.
std::vector<std::vector<std::string>> scaling_choice_rows(const Study& st, const Sections& sec);

// sweep.cpp
std::int64_t sweep_steps(const Study& st);
// ReLU and SwiGLU (at ReLU's parameters) at each d_ff / d_model ratio, in that order.
std::vector<RunJob> sweep_jobs(const Study& st);
void run_sweep(Study& st);
json sweep_json(const Results& r);
std::string sweep_markdown(const Study& st, const Sections& sec);

// figures.cpp
void draw_ffn_performance(const Study& st);
void draw_training_dynamics(const Study& st);
void draw_activation_comparison(const Study& st);
void draw_activation_sparsity(const Study& st);
void draw_moe_expert_load(const Study& st);
void draw_moe_specialisation(const Study& st);
void draw_sweep(const Study& st);
void draw_moe_pareto(const Study& st);
void draw_routing_families(const Study& st);
void draw_scaling(const Study& st);

// runs.cpp: the messages between rank 0 and the ranks that serve runs (serve_runs), each the
// CBOR of a JSON object, by their tags.
enum RunMessage : int {
  kJob = 1,     // 0 → r: {"index", "job", "data", "bare"}: train this run
  kStep = 2,    // r → 0: {"index", "steps", "log"}: steps done so far, the last one's log
  kDone = 3,    // r → 0: {"index", "record"}
  kFailed = 4,  // r → 0: {"index", "failure"}: a Failure, raised on rank 0 as its kind
  kStop = 5,    // 0 → r: abandon the run in hand (another failed)
  kFinish = 6,  // 0 → r: the study is over
};

// plan.cpp: throws "[evolve] ..." when the corpus's training or validation part is shorter
// than one sequence of `seq` and its next byte (before any stage runs, or the plan's timing).
void check_corpus_holds(const Corpus& corpus, std::int64_t seq);

// A stage's JSON of an optional result: null when the stage did not run.
template <class T, class F>
json json_if(const std::optional<T>& result, F&& write) {
  return result ? json(write(*result)) : json(nullptr);
}

}  // namespace ffnlab::study
