// The study's results, typed: one struct per stage (stages.hpp), each written to results.json by
// one to_json and to REPORT.md by one Markdown renderer (both beside the stage, src/study/).
// Recommendations read these structs, never the report's wording.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/analysis/specialisation.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/toy.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab::study {

// A variant's validation against ReLU's, over paired seeds (analysis/stats.hpp): in the
// training and moe_axes stages by the sequential design (compare_sequential: repeated intervals
// whose error holds over every look), elsewhere by compare_paired's fixed intervals. The
// difference interval decides better and worse; "equivalent" needs the equivalence test against
// the margin stated in advance; anything else is inconclusive.
enum class Verdict {
  reference,     // ReLU itself
  better,        // the difference interval lies below 0
  worse,         // the difference interval lies above 0
  equivalent,    // neither, and the equivalence interval lies within ±margin (TOST at 5 %)
  inconclusive,  // the seeds cannot tell (in a sequential comparison: by the cap)
  one_seed,      // a single seed: no interval
};
// The verdict as results.json and the report write it, against `reference` ("better than ReLU";
// the routing stage compares with top-k).
std::string verdict_text(Verdict verdict, std::string_view reference = "ReLU");

// The corpus the study trained on.
struct DataResult {
  std::string source, fingerprint;
  std::int64_t files = 0, bytes = 0, validation_bytes = 0;
};

// One row of a cost table: a named config and its closed-form costs for the table's tokens.
struct CostRow {
  std::string name;
  FFNConfig config;
  FFNCost cost;
};

struct GrowthPoint {
  std::string variant;
  std::int64_t d_model = 0, d_ff = 0, params = 0;
  double forward_flops_per_token = 0;
};

struct CostsResult {
  std::int64_t tutorial_tokens = 0;  // the tutorial's batch: the tokens of its memory columns
  std::vector<CostRow> tutorial;     // every variant at the tutorial's d_model 512, d_ff 2048
  FFNCost moe_token, expert_token;   // top-2 MoE and one of its experts, per token
  std::int64_t study_tokens = 0;     // tokens of one training batch of the study's LM
  std::vector<CostRow> study;        // the variants as the study trains them
  std::vector<std::pair<std::string, TransformerCost>> transformer_share;
  std::vector<GrowthPoint> growth;  // d_model 128 .. 8192, by d_model then variant
  double moe_forward_matmul_over_one_expert() const;
  const CostRow* study_row(std::string_view variant) const;
  const CostRow* tutorial_row(std::string_view variant) const;
};

// Equal budgets at the tutorial's configuration: each variant's width at ReLU's parameters
// (MoE twice: equal total and equal active parameters).
struct EqualBudgetResult {
  std::int64_t target = 0, relu_d_ff = 0, tokens = 0;
  std::vector<CostRow> rows;
};

struct ActivationSpeed {
  std::string activation;
  std::int64_t elements = 0;
  double seconds = 0;
};

struct SpeedResult {
  std::int64_t tokens = 0, d_model = 0, d_ff = 0;
  double budget_seconds = 0;
  std::vector<std::pair<std::string, LayerSpeed>> variants;
  std::vector<ActivationSpeed> activations;
};

// A toy run's summary: first and last loss, relative drop, the gradient norm's mean and
// (population) standard deviation over iterations.
struct ToySummary {
  double first = 0, last = 0, drop = 0, grad_mean = 0, grad_std = 0;
};

struct ToyVariant {
  std::string variant;
  ToySummary first_seed;  // seed 42, the tutorial's own
  double final_loss_mean = 0, final_loss_std = 0, drop_mean = 0, drop_std = 0;
  double grad_norm_mean_mean = 0, grad_norm_mean_std = 0;
};

struct ToyResult {
  ToyConfig config;
  std::int64_t d_model = 0, d_ff = 0;
  int seeds = 0;
  std::vector<ToyVariant> variants;
};

// One variant of the LM study, over seeds.
struct VariantOutcome {
  std::string variant;
  std::int64_t d_ff = 0, params = 0;
  std::vector<double> val_bits_per_byte;   // per seed, seed 1 first
  double mean = 0, std = 0;                // over seeds
  double diff_mean = 0, diff_std = 0;      // paired difference to ReLU (variant − ReLU)
  double diff_low = 0, diff_high = 0;      // its interval of the difference test (95 % fixed)
  double diff_low90 = 0, diff_high90 = 0;  // its interval of the equivalence test (90 % fixed)
  Verdict verdict = Verdict::inconclusive;
  // Inconclusive: about how many seeds would decide it, planned from an upper bound on the
  // paired spread (values_to_decide); in a sequential comparison beyond the cap, cap + 1. 0
  // otherwise.
  int seeds_to_decide = 0;
  // A sequential comparison (0 otherwise): the seeds of its last look, and the nominal
  // two-sided levels of that look's two intervals (e.g. 0.994 and 0.975).
  int sequential_seeds = 0;
  double level = 0.95, equivalence_level = 0.90;
  // The verdict also holds when the error is shared over every comparison of the run
  // (Bonferroni: the look's interval at α / comparisons); set for sequential comparisons.
  bool holds_for_all_comparisons = false;
  // Its paired spread is implausibly small beside the spread of the run's other comparisons
  // (narrow_by_chance): the interval is narrow by chance, not by precision.
  bool narrow_by_chance = false;
  double tokens_per_second = 0;  // median over seeds of each run's median
  // Throughput against ReLU's: this row's tokens/s over ReLU's row's (the same statistic as the
  // table). Noisy when the ratio to ReLU's run of the same seed spreads by more than kMaxSpread
  // ((max − min) / median, analysis/speed.hpp) over seeds, or for ReLU when its own runs'
  // tokens/s spread so. No rule reads a noisy throughput.
  double tokens_per_second_over_relu = 1;
  double tokens_per_second_spread = 0;
  // The lowest and highest ratio to ReLU's run of the same seed (1 for ReLU): a rule that picks
  // by throughput decides only when the ranges do not overlap.
  double tokens_per_second_ratio_low = 1, tokens_per_second_ratio_high = 1;
  bool tokens_per_second_noisy = false;
  // The runs' model FLOP utilisation (matrix GFLOP/s over their bare products', timed alone
  // before training), median over seeds; NaN where not measured or above 1 (never printed as a
  // number then).
  double flop_utilisation = 0;
};

struct TrainingResult {
  LMConfig model;
  TrainConfig train;
  SequentialDesign design;  // first look, cap and error of every comparison against ReLU
  int comparisons = 0;      // the sequential comparisons of the run (training and moe_axes)
  // The paired spread of the run's comparisons, pooled: what narrow_by_chance compares with.
  double pooled_spread = 0;
  double margin = 0;  // the equivalence margin in bits per byte, stated before the run
  std::int64_t validation_bytes = 0;
  // The bytes every run's last evaluation read: the first of the validation part (0: all of
  // it; --quick reads fewer).
  std::int64_t final_validation_tokens = 0;
  std::vector<VariantOutcome> variants;
  const VariantOutcome* find(std::string_view variant) const;
};

struct LayerSparsity {
  std::int64_t layer = 0;
  double zero_init = 0, zero_trained = 0, near_zero_init = 0, near_zero_trained = 0;
  std::int64_t units = 0, dead_init = 0, dead_trained = 0;  // MoE: every expert's units
  // 0 or near zero on every census token (UnitSparsity::near_dead_units; dead ones included).
  std::int64_t near_dead_init = 0, near_dead_trained = 0;
};

struct SparsityResult {
  std::int64_t census_tokens = 0;
  double silu_min = 0, silu_min_at = 0;  // on the curves' grid, in ffnlab's f32 kernel
  double gelu_tanh_error = 0, gelu_tanh_at = 0, gelu_sigmoid_error = 0, gelu_sigmoid_at = 0;
  std::vector<std::pair<std::string, std::vector<LayerSparsity>>> variants;
  const std::vector<LayerSparsity>* find(std::string_view variant) const;
};

// One balancing run's expert load as the moe stage logs it: each expert's share of one step's
// assignments, per layer, at every logged step.
struct LoadSeries {
  std::vector<std::int64_t> steps;          // the logged steps, ascending
  std::vector<std::vector<double>> shares;  // [logged step][layer · E + expert]
  // The last logged step at which some share differs by more than `tolerance` from its mean
  // over the logged steps of the run's last 10 % (of `run_steps`); 0 when none does.
  std::int64_t last_moving_step(std::int64_t run_steps, double tolerance) const;
  // The logged step after last_moving_step: from there on every share stays within
  // `tolerance`; empty when the last logged step still moves, when that step lies in the last
  // 10 % itself (the window the mean is taken over), or when nothing was logged.
  std::optional<std::int64_t> settled_step(std::int64_t run_steps, double tolerance) const;
};

struct MoESetting {
  std::string name, description;
  double val_bits_per_byte = 0, load_cv = 0, max_over_mean = 0, dropped_fraction = 0,
         router_entropy = 0, tokens_per_second = 0;
  LoadSeries load;
};

struct MoEResult {
  // The z-loss ablation: the MoE LM without the router z-loss, per seed, against the study's
  // runs with it (difference: without − with).
  float z_coef = 0;  // as the router holds it (printed 0.001, not 0.0010000000474974513)
  std::optional<VariantOutcome> without_z_outcome;
  std::vector<double> with_z_bits_per_byte;
  double capacity_factor = 0;
  std::int64_t balancing_steps = 0;
  double load_tolerance = 0;  // absolute share: what "the load has settled" allows (LoadSeries)
  int experts = 0, top_k = 0;
  std::int64_t expert_d_ff = 0;
  std::vector<MoESetting> settings;
  double load_peak = 0;  // the largest expert share of any layer, setting and step drawn
  // The training stage's seed-1 MoE LM after training: per layer, the byte classes per expert.
  std::vector<ExpertSpecialisation> specialisation;
};

// One FFN of the MoE-on-both-axes comparison, in the study's LM.
struct MoEAxisRow {
  std::string name, description;
  FFNConfig ffn;
  std::int64_t params = 0;      // the LM's parameters
  std::int64_t ffn_params = 0;  // one FFN layer's
  std::int64_t ffn_active = 0;  // one FFN layer's, touched by one token
  double forward_flops = 0;     // the LM's forward FLOPs per token (transformer_cost)
  VariantOutcome outcome;       // against ReLU, paired by seed
};

// MoE at equal total parameters (the training stage's moe), at ReLU's active compute with 4×
// its FFN parameters, and fine-grained with a shared expert at the same compute.
struct MoEAxesResult {
  std::vector<MoEAxisRow> rows;  // relu first, then the MoE rows
  // What moe_pareto.png draws (moe_pareto.csv): every dense variant of the training stage and
  // the MoE rows, with the LM's costs.
  struct Point {
    std::string name;
    std::int64_t params = 0;
    double forward_flops = 0, mean = 0, std = 0;
    bool moe = false;
    // The paired difference to ReLU (variant − ReLU, by seed) and the interval its verdict
    // rests on; 0 and [0, 0] for ReLU itself.
    double difference = 0, low = 0, high = 0;
  };
  std::vector<Point> pareto;
  std::string pareto_csv() const;  // moe_pareto.csv, the figure's data
  // Top-2 at equal compute − equal parameters, paired by seed (trained with --full only).
  std::optional<VariantOutcome> compute_vs_params;
  const MoEAxisRow* find(std::string_view name) const;
};

// What a routing run's FFN layers did over the second half of its training steps (settled
// behaviour), averaged over its layers unless per layer.
struct RoutingBehaviour {
  double experts_per_token = 0;  // FFN experts a token ran (Soft MoE: E·slots/S)
  double load_cv = 0, dropped_fraction = 0, router_entropy = 0;
  double zero_computation_fraction = 0;  // MoE++: the choices that ran no FFN expert
  std::vector<double> experts_per_token_by_layer;
  // Per layer, the share of tokens that ran 0, 1, … FFN experts (empty for Soft MoE, where no
  // token runs an expert of its own).
  std::vector<std::vector<double>> experts_distribution;
};

// One routing family in one objective, against token-choice top-k of that objective.
struct RoutingRow {
  std::string name;       // "top_p", … ("topk": the reference)
  std::string objective;  // "causal" or "masked"
  std::string description;
  FFNConfig ffn;
  std::int64_t params = 0;              // the LM's
  std::int64_t ffn_params = 0;          // one FFN layer's
  double closed_experts_per_token = 0;  // what the config sets (experts_per_token in costs.hpp)
  // The LM's forward FLOPs per token at the experts a token ran (measured, seed mean).
  double active_forward_flops = 0;
  RoutingBehaviour behaviour;  // mean over seeds
  VariantOutcome outcome;      // validation against top-k's runs of the same seeds
};

// Every routing family against token-choice top-k at the headline MoE's layout (experts, width,
// shared expert) and compute: the families that decide per token on the causal LM, every one on
// the masked objective.
struct RoutingResult {
  int seeds = 0;            // each family's runs (seeds 1 to `seeds`)
  int reference_seeds = 0;  // the causal top-k runs (the moe_axes stage's)
  std::int64_t sequence = 0;
  float mask_fraction = 0;
  std::vector<RoutingRow> rows;  // causal, then masked; top-k first in each
  const RoutingRow* find(std::string_view objective, std::string_view name) const;
  std::string figure_csv() const;        // routing_families.csv: what the figure draws
  std::string distribution_csv() const;  // routing_experts_per_token.csv
};

// The study across model sizes and tasks (the scaling stage): every variant at every size of
// the ladder, on each objective, as sequential comparisons against ReLU of its own size and
// objective; and per objective and variant, how its difference to ReLU moves with training
// compute.
struct ScalingSize {
  std::string name;           // "xs", "s", ... (study.hpp's size_ladder)
  LMConfig model;             // with ReLU's FFN, causal
  TrainConfig train;          // its steps (tokens grow with the parameters)
  std::int64_t params = 0;    // the causal LM with ReLU's FFN
  double training_flops = 0;  // of one ReLU run: 3 × forward FLOPs per token × its tokens
};

struct ScalingEntry {
  VariantOutcome outcome;     // against ReLU of the same size and objective
  double training_flops = 0;  // of one run
};

struct ScalingCell {
  std::string size, task;      // "xs", "causal"
  bool from_training = false;  // the study's own LM and objective: the training stage's runs
  std::vector<ScalingEntry> variants;  // relu first
};

// How a variant's paired difference to ReLU (variant − ReLU, bits/byte) moves per tenfold
// training compute across the sizes (slope_interval over log10 of ReLU's training FLOPs).
struct ScalingTrend {
  std::string task, variant;
  SlopeInterval slope;
  // "gains on ReLU with size", "loses ground to ReLU with size", "undecided", or "no interval"
  std::string reading;
  // A decided reading that also holds with the 5 % shared over every trend with an interval
  // (Bonferroni: each at 1 − 0.05/k); false when only its own 95 % interval decides it. (True,
  // and null in results.json, for a reading that is not decided.)
  bool holds_for_all_trends = true;
};

struct ScalingResult {
  std::vector<ScalingSize> sizes;  // smallest first
  std::vector<std::string> tasks;
  SequentialDesign design;
  int comparisons = 0;             // the stage's sequential comparisons (all cells)
  std::vector<ScalingCell> cells;  // size-major, tasks in order
  std::vector<ScalingTrend> trends;
  const ScalingCell* find(std::string_view size, std::string_view task) const;
  std::string figure_csv() const;  // scaling.csv: what the figure draws
};

struct SweepPoint {
  int ratio = 0;
  std::int64_t relu_d_ff = 0, swiglu_d_ff = 0;
  double relu_bits_per_byte = 0, swiglu_bits_per_byte = 0;
};

struct SweepResult {
  std::vector<SweepPoint> points;
};

// One claim of the FFN-evolution tutorial: the report's line (brief: the claim and the right
// number), and the claim quoted beside its evidence (claim, finding) for the appendix.
struct Correction {
  std::string id, brief, claim, finding;
};

// One FFN variant in Shazeer 2020 ("GLU Variants Improve Transformer", Table 1: T5-base,
// d_model 768, held-out log-perplexity on C4) beside this run's comparison with ReLU.
struct LiteratureRow {
  std::string variant;
  double shazeer_65k = 0, shazeer_65k_std = 0;  // after 65,536 steps, with the run-to-run std
  double shazeer_524k = 0;                      // after 524,288 steps (no std given)
  double shazeer_diff_65k = 0, shazeer_diff_524k = 0;  // variant − ReLU there
  // There: better (or worse) than ReLU when both differences say so; mixed otherwise.
  enum class Direction { better, worse, mixed };
  Direction shazeer = Direction::mixed;
  std::optional<VariantOutcome> here;  // this run's paired comparison with ReLU
  // agrees: a decided verdict here with the direction there; disagrees: the opposite one;
  // undecided: this run's verdict is inconclusive, equivalent or one seed; mixed: there.
  enum class Agreement { agrees, disagrees, undecided_here, mixed_there };
  Agreement agreement = Agreement::undecided_here;
};

struct LiteratureResult {
  std::vector<LiteratureRow> rows;  // relu first
};

// The four rules of the recommendations, each with what it found.
struct Recommendations {
  std::optional<std::string> best_at_equal_parameters;  // measurably better than ReLU
  // The variant with the lowest paired difference to ReLU, whatever its verdict ("": none but
  // ReLU trained), and that difference.
  std::string lowest;
  double best_bits_per_byte = 0, lowest_difference = 0;
  std::optional<std::string> best_per_flop;  // when the study's costs ran
  double best_per_flop_bits_per_byte = 0;
  // The other candidates of each pick that these seeds cannot separate from it (their paired
  // difference to the pick has a 95 % interval that includes 0): a tie, never "the best".
  std::vector<std::string> best_at_equal_parameters_tied, best_per_flop_tied;
  std::vector<std::pair<std::string, double>> flops_over_relu;
  std::string best_per_second;  // empty: undecided
  double best_per_second_tokens = 0, best_per_second_over_relu = 0;
  // Why the per-second rule is undecided: the qualifying candidates whose throughput was noisy;
  // else the fastest by median and those that were as fast on some seed.
  std::vector<std::string> noisy_throughput;
  std::string per_second_candidate;
  std::vector<std::string> per_second_overlapping;
  struct MoE {
    double active_fraction = 0, tokens_per_second = 0, relu_tokens_per_second = 0;
    double over_relu = 1;  // its throughput ÷ ReLU's (VariantOutcome::..._over_relu)
    bool noisy = false;    // that ratio was flagged noisy
    double diff_mean = 0, diff_low = 0, diff_high = 0, margin = 0;
    Verdict verdict = Verdict::inconclusive;
    // pays off: better; on cost: equivalent (the margin's test) at more tokens per second; no:
    // worse, or equivalent and not faster; undecided: the comparison is inconclusive.
    enum class Finding { pays_off, pays_off_on_cost, does_not_pay_off, undecided };
    Finding finding = Finding::undecided;
    // At ReLU's active compute (the moe_axes stage, when it ran): the headline MoE's
    // (kHeadlineMoE) paired comparison with ReLU, what it is, and its parameters over ReLU's
    // (the LM's); beside it the other design at that compute (8 experts, top-2), reported and
    // never the basis of the finding.
    std::optional<VariantOutcome> at_equal_compute;
    std::string at_equal_compute_design;
    double compute_params_over_relu = 0;
    std::optional<VariantOutcome> at_equal_compute_other;
    std::string at_equal_compute_other_design;
  };
  std::optional<MoE> moe;  // when MoE was trained
};

// Everything one study run found. A stage that did not run leaves its member empty.
struct Results {
  std::optional<DataResult> data;
  std::optional<CostsResult> costs;
  std::optional<EqualBudgetResult> equal_budget;
  std::optional<SpeedResult> speed;
  std::optional<ToyResult> toy;
  std::optional<TrainingResult> training;
  std::optional<SparsityResult> sparsity;
  std::optional<MoEResult> moe;
  std::optional<SweepResult> sweep;
  std::optional<MoEAxesResult> moe_axes;
  std::optional<RoutingResult> routing;
  std::optional<ScalingResult> scaling;
  bool zoo = false;  // the real-model table (analysis/zoo.hpp) was reported
  std::optional<std::vector<Correction>> corrections;
  std::optional<LiteratureResult> literature;
  std::optional<Recommendations> recommendations;
  Machine machine;  // where it ran: every measured time is only true of such a machine
  int threads = 0;
  int ranks = 1;  // MPI ranks the LM runs went to (mpirun -np); their numbers do not depend on it
  bool quick = false;
  bool full = false;  // --full: every variant, the top-2 MoE at equal compute, the z-loss ablation
  double seconds = 0;
  // Wall time per stage that ran (its key), and "figures": where the run's time went.
  std::vector<std::pair<std::string, double>> stage_seconds;
};

}  // namespace ffnlab::study
