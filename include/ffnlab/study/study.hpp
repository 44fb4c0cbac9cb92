// The FFN-evolution study as a library: ReLU → GELU → GLU family → multi-branch gated FFN → MoE,
// costed, timed, trained as byte-level language models over paired seeds, and analysed. One call
// (run_study) runs the stages of stages.hpp in order and writes a report folder: REPORT.md,
// results.json, figures with their CSV. The command line (`ffnlab evolve`), Python
// (`ffnlab.evolve`) and the notebook all call it.
//
//   results.hpp  the typed results of every stage
//   stages.hpp   the stage table: names, planned work, figures, report sections
//   this file    options, scale, the run's shared state, and run_study
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ffnlab/analysis/sparsity.hpp"
#include "ffnlab/analysis/specialisation.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/parallel/group.hpp"
#include "ffnlab/study/results.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab::study {

// The variants the study trains unless told otherwise: one per step of the evolution (relu,
// gelu, swiglu, gated, moe); with `full`, every named variant (the whole GLU family).
std::vector<std::string> default_variants(bool full = false);
struct Options;
// The variants a study of `options` trains: the given ones (default_variants when none), ReLU
// first, the others in their order (every comparison, table and ratio is against ReLU, the first).
std::vector<std::string> study_variants(const Options& options);

// The front ends that run a study: `ffnlab evolve` and Python's ffnlab.evolve.
enum class FrontEnd { command_line, python };

struct Options {
  std::string out = "report", data = kDefaultCorpus;
  // Must include relu; empty: default_variants(full).
  std::vector<std::string> variants;
  // The whole study: every variant (unless `variants` names them), MoE with top-2 at equal
  // compute beside the fine-grained design, and the router z-loss ablation. The default run
  // leaves these out (and the routing families on the masked objective) to end within about 45
  // minutes on 2 cores.
  bool full = false;
  bool quick = false, sweep = false;
  // The sequential design of every comparison against ReLU (training.cpp): each trains `seeds`
  // paired seeds first, then one more per round while it is undecided, up to `max_seeds`.
  int seeds = 0;      // 0: 3 (2 with quick)
  int max_seeds = 0;  // 0: 6 (3 with quick); never fewer than `seeds`
  // Seeds of each routing family (the routing stage; at most `seeds`, since the causal families
  // pair with the fine-grained MoE's runs). 0: 1, or `seeds` with `full`.
  int routing_seeds = 0;
  std::int64_t steps = 0;  // 0: the scale's
  // The equivalence margin in bits per byte: a variant is "equivalent" to ReLU only when the
  // data show their difference is within it (training.cpp, compare_paired).
  double margin = 0.02;
  // Where every finished LM run is kept (RunStore); empty: `out` + ".runs", beside the report.
  std::string runs;
  // Take the runs the store kept instead of training them again (a study that stopped, or one
  // with more seeds or variants than an earlier one).
  bool resume = false;
  // Without `resume`: discard the runs the store keeps and start over. A store that keeps runs
  // is refused without one of the two, so that no finished run is lost to a forgotten flag.
  bool force = false;
  // The study across model sizes and objectives (the scaling stage, scaling.cpp): sizes of the
  // ladder (size_ladder's names) and tasks ("causal", "masked"). Both empty: the stage does not
  // run; one empty: {"s"} (the study's own LM) or {"causal"}.
  std::vector<std::string> sizes, tasks;
  // A wall-time budget in seconds (0: none): plan_study chooses the sizes (unless `sizes` names
  // them), the seeds and the steps (unless given) so that the study ends within it.
  double budget_seconds = 0;
  // Which front end runs the study: its messages and the report's first line name the options
  // in that front end's words (option_name, call_text).
  FrontEnd front_end = FrontEnd::command_line;
};

// The study's options as both front ends take them, one row each (options.cpp): the flag of
// `ffnlab evolve` (ffnlab.evolve's argument is its name with '_' for '-': argument_name), the
// field of Options it sets, how it takes its value, a number's range, and its help. The command
// adds a flag per row, Python's evolve reads an argument per row, check_options checks the
// numbers by them, and the messages name them in the caller's words (option_name, call_text).
struct OptionRow {
  enum class Value : std::uint8_t {
    path,      // a file or folder name
    on,        // a switch: given (True in Python), the field is true
    count,     // an integer in [lo, hi] (0 in the field: the default)
    real,      // a number in (lo, hi]
    names,     // comma-separated names (a list in Python)
    duration,  // seconds, or "90s", "30m", "2h" (parse_duration); 0 in the field: none
  };
  using Field =
      std::variant<std::string Options::*, bool Options::*, int Options::*, std::int64_t Options::*,
                   double Options::*, std::vector<std::string> Options::*>;
  std::string flag;  // "--max-seeds"
  Field field;
  Value value = Value::path;
  double lo = 0, hi = 0;
  std::string help;
  // It sets what the study measures (quick, full, seeds, steps, sizes, tasks, margin, sweep):
  // the report's first line and its advice name it when it is not at its default (scale_call).
  bool sets_scale = false;
};
const std::vector<OptionRow>& option_rows();
// The row of a flag of `ffnlab evolve` (std::logic_error for one the table lacks: a typo in
// the code that names it).
const OptionRow& option_row(std::string_view flag);
// ffnlab.evolve's argument for a flag: "--max-seeds" -> "max_seeds".
std::string argument_name(std::string_view flag);

// One size of the ladder: "s" is the study's own LM, the others double or halve d_model, with
// depth and heads grown alongside. --quick shrinks every size (the same names).
struct ModelSize {
  std::string_view name;
  std::int64_t d_model;
  int layers, heads;
};
const std::vector<ModelSize>& size_ladder(bool quick);
// The tasks the scaling stage knows: "causal" (next byte) and "masked" (a bidirectional LM).
const std::vector<std::string>& task_names();

// What quick changes: sizes and counts, never the code path.
struct Scale {
  LMConfig model;              // the study's LM (its ffn is replaced per variant)
  TrainConfig train;           // steps, batch, seq, evaluation
  std::int64_t eval_tokens;    // validation tokens of the periodic evaluations
  std::int64_t census_tokens;  // validation tokens of the sparsity census
  // Validation tokens of every run's last evaluation, the number each comparison reads: 0, the
  // whole validation part; --quick, its first 32768 (the pipeline's check needs no more, and
  // over the whole part a quick run spent most of its time validating).
  std::int64_t validation_tokens;
  // The comparisons against ReLU: first look, cap, error (design.first is the seeds every
  // comparison trains; routing_seeds of the routing families).
  SequentialDesign design;
  int seeds, routing_seeds;
  int toy_seeds, toy_iterations;
  double speed_budget;  // seconds per speed measurement
  std::int64_t speed_tokens;
  std::vector<int> sweep_ratios;  // d_ff / d_model of the sweep runs
};
Scale make_scale(const Options& options);

// The MoE the report headlines at equal active compute: fine-grained with a shared expert
// (DeepSeekMoE's design, the field's current one), "moe_fine_shared" of the moe_axes stage.
inline constexpr std::string_view kHeadlineMoE = "moe_fine_shared";
// What the study tells whoever runs it. Every call comes from the thread that called run_study.
class Observer {
 public:
  virtual ~Observer() = default;
  // Before the first stage: the training steps planned in all, and where the report goes.
  virtual void begin(std::int64_t /*planned_steps*/, const std::string& /*line*/) {}
  // A stage starting, or a line about a finished run.
  virtual void message(const std::string& /*line*/) {}
  // After each training step: steps done of those planned, what ran, the ETA in seconds.
  virtual void step(std::int64_t /*done*/, std::int64_t /*planned*/, const std::string& /*text*/,
                    double /*eta_seconds*/) {}
  // After the last stage, or when the run fails or stops (before the exception leaves).
  virtual void end() {}
};

// One LM training run's record.
struct RunRecord {
  std::string variant;
  int seed = 0;
  std::int64_t d_ff = 0, params = 0;
  std::vector<StepLog> steps;
  std::vector<EvalLog> evals;    // periodic (eval_tokens each)
  double val_bits_per_byte = 0;  // the whole validation part, at the end
  double median_tokens_per_second = 0;
  // Model FLOP utilisation: the matrix work of the median step per second, and the rate of the
  // bare products of the run's model shapes (Study::bare_products).
  double matrix_gflops = 0, bare_products_gflops = 0;
  // What the job's probe gathered as the run trained (null: no probe); its stage reads it.
  nlohmann::json gathered;
};

// Where finished runs are kept, one file each (<run_key>.cbor: the job, the data's fingerprint
// and the record), so that a study that stopped resumes and trains only what it lacks, and a
// larger study (more seeds, more variants) reuses the runs it shares with an earlier one.
class RunStore {
 public:
  RunStore() = default;  // none: nothing is kept
  // Creates `dir` (marked as a run store). With `resume` its records are kept for find();
  // without, they are removed: the study starts over (check_run_store refuses that unless
  // forced). Error for a folder that holds other files.
  RunStore(std::string dir, bool resume, std::string data_fingerprint);
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  // The record of a finished run of this job (job_to_json) on these data, if kept.
  std::optional<RunRecord> find(const nlohmann::json& job) const;
  // Keeps a finished run (written atomically).
  void put(const nlohmann::json& job, const RunRecord& record) const;
  // The finished runs the store holds now (those kept and those put since).
  std::int64_t size() const;

 private:
  void index_older_records() const;
  std::string dir_, fingerprint_;
  // The records found when the store was opened, by their file's name (the key their job had
  // when written), and, once a run is not found so, by the key of their job today: their files.
  std::map<std::string, std::string> kept_;
  mutable std::map<std::string, std::string> older_;
  mutable bool older_indexed_ = false;
};

// The state the stages share while the study runs.
struct Study {
  Options options;
  Scale scale;
  std::string dir;  // the staging directory: every file goes here
  Corpus corpus;
  std::vector<RunRecord> runs;  // every LM run of the training stage, variant-major per seed
  // The moe_axes stage's runs: trained with the training stage's, in one pool, so that no core
  // waits for the last run of one stage while the next stage has runs to start.
  std::vector<RunRecord> axes_runs;
  // The routing stage's runs, with what each one's layers did (its probe's): trained with the
  // training stage's too.
  std::vector<RunRecord> routing_runs;
  // The scaling stage's runs (labelled "size/task/variant"), but those of the study's own LM
  // and objective, which are the training stage's.
  std::vector<RunRecord> scaling_runs;
  // Seed 1's activation census per variant and layer, at initialisation and after training.
  std::map<std::string, std::vector<UnitSparsity>> census_init, census_trained;
  // Seed 1's MoE LM after training: per layer, which byte classes each expert takes.
  std::vector<ExpertSpecialisation> expert_classes;
  Results results;

  // The rate of the bare products of each configuration's shapes (GFLOP/s, by run label), timed
  // before the first pool that trains it starts, alone on the machine: the yardstick of FLOP
  // utilisation that runs training beside each other cannot disturb.
  std::map<std::string, ModelProducts> bare_products;

  Observer* observer = nullptr;
  int concurrent_runs = 1;  // LM runs trained at once (train_runs): the run's OpenMP threads
  std::int64_t planned_steps = 0, done_steps = 0;
  std::int64_t kept_steps = 0;  // of done_steps, those of runs the store kept (no time spent)
  std::int64_t kept_runs = 0;   // the runs taken from the store
  RunStore store;               // where finished runs are kept (none: Options::runs empty)
  // Under mpirun: the ranks that serve runs (serve_runs) beside this one, rank 0, and how long
  // one may stay silent while it trains before the study fails.
  ProcessGroup* ranks = nullptr;
  double rank_timeout = 300;
  double training_seconds = 0;  // wall time spent in train_runs so far
  std::string plan_why;         // with a budget: what the planner chose and why (plan_study)

  bool has_variant(std::string_view variant) const;
  // A stage starts: checks for a stop request, then tells the observer.
  void stage(const std::string& what) const;
  void message(const std::string& line) const;
  // `steps` training steps done (the last one's log: s), by the run `what`.
  void step_done(const StepLog& s, const std::string& what, std::int64_t steps = 1);
  // Writes a file of the report folder (atomically).
  void write(const std::string& name, const std::string& text) const;
};

// Throws Interrupted once a stop was requested (ffnlab/interrupt.hpp); checked between stages
// and after every training step.
void check_stop();

// The FFN of `variant` in the study's LM at (about) the parameters of the ReLU FFN of width
// 4·D: the GLU kinds and the gated FFN get a narrower d_ff, MoE narrower experts (equal total).
FFNConfig study_ffn(const std::string& variant, std::int64_t d_model);

// What a run gathers as it trains, beside its record. A probe is named, not a function, so
// that a job is data: it can train wherever its study's data are, and what the probe gathered
// comes back in the record (RunRecord::gathered) for the stage that asked for it to read.
enum class Probe : std::uint8_t {
  none,
  census,             // training stage, seed 1: the activation census before and after training
  load_trace,         // moe stage: the experts' load as the balancing settings train
  routing_behaviour,  // routing stage: the experts a token ran, over the second half of training
  count,
};
}  // namespace ffnlab::study

// A probe's name in a run's record (the run store's file), as every enum's (names.hpp).
template <>
struct ffnlab::EnumNames<ffnlab::study::Probe> {
  using Probe = study::Probe;
  static constexpr auto table =
      name_table<Probe>("evolve", "probe",
                        {{Probe::none, "none"},
                         {Probe::census, "census"},
                         {Probe::load_trace, "load_trace"},
                         {Probe::routing_behaviour, "routing_behaviour"}});
};
static_assert(ffnlab::EnumNames<ffnlab::study::Probe>::table.complete());

namespace ffnlab::study {

// A probe while its run trains: called on the thread that trains the run, beside other runs.
class RunProbe {
 public:
  virtual ~RunProbe() = default;
  virtual void start(TransformerLM& /*initialised*/) {}
  virtual void step(const TransformerLM& /*model*/, const StepLog& /*log*/) {}
  virtual void end(TransformerLM& /*trained*/) {}
  // What it gathered, exactly (doubles round-trip through JSON's CBOR form).
  virtual nlohmann::json gathered() const = 0;
};

// One LM training run a stage asks for: everything that decides its numbers.
struct RunJob {
  LMConfig model;
  std::uint64_t seed = 1;  // initialisation and batches
  std::string label;       // the record's variant and the progress line's name
  Probe probe = Probe::none;
  std::optional<TrainConfig> settings;  // empty: the study's training settings (seed replaced)
  // Time the bare products of its shapes before its pool, the yardstick of its FLOP
  // utilisation (the training stage's comparisons report it). Changes no number of the run, so
  // it is not part of the job's JSON or its key.
  bool utilisation = false;
};

// A run as data (run_io.cpp), for the run store and for other ranks: the job with its
// settings resolved ({"label", "seed", "probe", "model", "train"}), and its record, exactly
// (every double round-trips; send it as CBOR where NaN may occur). run_key names a finished
// run by its job and the data's fingerprint.
nlohmann::json job_to_json(const Study& study, const RunJob& job);
RunJob job_from_json(const nlohmann::json& j);
nlohmann::json record_to_json(const RunRecord& record);
RunRecord record_from_json(const nlohmann::json& j);
std::string run_key(const nlohmann::json& job, const std::string& data_fingerprint);
// A job as this ffnlab writes it: its model and settings read and written again, so that a job
// an older ffnlab wrote (floats in another form, without a key added since: its default) names
// the same run. One that no longer reads (a key since removed) is returned as it is.
nlohmann::json job_as_written_now(const nlohmann::json& job);

// Trains the jobs and returns their records in the jobs' order. As many runs go at once as the
// study has threads, each on one OpenMP thread of its own, so that a run's numbers depend on its
// seed, the build and the CPU, never on --threads or on which runs share the machine. Under
// mpirun (Study::ranks) the other ranks take jobs from the same queue, one at a time each, and
// send back their records. Runs the store kept are taken, not trained. Progress
// and a line per finished run reach the observer from the calling thread. The first failure, or
// a stop request, ends the other runs at their next step and is thrown.
std::vector<RunRecord> train_runs(Study& study, std::vector<RunJob> jobs);

// Per layer, the hidden activations of `lm` over the first census_tokens validation tokens.
// MoE layers count each expert's units apart (analysis/sparsity.hpp's add_expert_hidden).
std::vector<UnitSparsity> census(const Study& study, TransformerLM& lm);
// Per MoE layer, which byte classes each expert takes over the same tokens.
std::vector<ExpertSpecialisation> expert_census(const Study& study, TransformerLM& lm);

// Under mpirun: what every rank but rank 0 does while rank 0 runs run_study with the ranks: it
// trains the runs rank 0 sends it, one at a time on one thread, until release_ranks (rank 0,
// after run_study) tells it the study is over. Every rank reads the same data and options.
void serve_runs(const Options& options, ProcessGroup& ranks);
void release_ranks(ProcessGroup& ranks);

// The run store's folder: options.runs, or options.out + ".runs".
std::string runs_dir(const Options& options);
// How a message names one of the study's options to the user of options.front_end: the flag of
// `ffnlab evolve` ("--resume", "--max-seeds"), or ffnlab.evolve's argument ("resume=True",
// "max_seeds="). `flag` is the command line's.
std::string option_name(const Options& options, std::string_view flag);
// How the user of options.front_end takes the runs a stopped or failed study kept: "the same
// command with --resume", "... in place of --force", and for a budgeted study "... in place of
// --budget, the sizes, seeds and steps it chose" (each of the two refuses --resume beside it).
std::string resume_call(const Options& options);
// A call of the study as `front_end` writes it, from (flag, value) pairs, a switch with an empty
// value: "ffnlab evolve --full --out r" or "ffnlab.evolve(full=True, out='r')".
std::string call_text(FrontEnd front_end,
                      const std::vector<std::pair<std::string, std::string>>& args);
// The call that names this study's scale (quick, full, seeds, steps, sizes, tasks, margin,
// sweep) in its front end's words, as the report's first line gives it.
std::string scale_call(const Options& options);
// The command that trains the full study at this study's scale into its report and run store,
// taking the runs the store keeps: "ffnlab evolve --full --resume" with this study's --quick,
// seeds, steps, sizes, tasks, --out, --runs and --data. The report names options as the command
// line does, whichever front end wrote it.
std::string full_study_call(const Options& options);
// Refuses (UsageError) a study that would discard the finished runs its store keeps: without
// `resume` or `force`; and (Error) a run store folder that holds other files. Checked before
// anything is read or trained.
void check_run_store(const Options& options);

// What a study will cost before it runs (plan.cpp): every LM run's time from a cost model timed
// on this machine (a few training steps of each size's ReLU LM on one thread, and an
// evaluation), scaled by each variant's FLOPs; the runs of the first look and of the cap (when
// no comparison decides early); and the wall time on a number of workers, each run on one, the
// runs of each round handed out longest first as they free (the study's queue).
struct PlannedSize {
  std::string name;
  LMConfig model;  // with ReLU's FFN
  std::int64_t steps = 0;
  double step_seconds = 0;           // measured: one training step of ReLU's LM on one thread
  double run_seconds = 0;            // predicted: one ReLU run with its evaluations
  int runs_first = 0, runs_cap = 0;  // the LM runs at this size (all stages, all tasks)
};
struct StudyPlan {
  Options options;  // the study as planned (with a budget: as chosen)
  Scale scale;
  std::vector<PlannedSize> sizes;  // every size that trains (the study's own LM among them)
  // The runs by round, their predicted seconds each: rounds run one after another, the runs of
  // a round side by side. `first` if every comparison decides at its first look, `cap` if none
  // decides before the cap.
  std::vector<std::vector<double>> first, cap;
  double other_seconds = 0;  // the stages that train nothing, and the figures
  std::string why;           // with a budget: what was chosen and why
  double core_seconds(bool at_cap) const;
  // Predicted wall time on `workers` runs at once (this machine: its threads, plus one per
  // other rank under mpirun).
  double wall_seconds(int workers, bool at_cap) const;
};
// Measures the cost model (a few seconds; longer for large sizes) and plans `options`; with a
// budget, first chooses what fits on `workers`. Error when even the smallest choice does not fit.
StudyPlan plan_study(const Options& options, int workers, const Corpus& corpus);
// The same on the study's data (options.data), split as run_study splits it: what `ffnlab evolve
// --plan` and Python's ffnlab.plan print.
StudyPlan plan_study(const Options& options, int workers);
// The plan as the command line prints it: per size, the runs and their predicted time; the
// core-hours; the wall time on this machine's workers and on each of `cores`.
std::string plan_text(const StudyPlan& plan, int workers, const std::vector<int>& cores);
// The plan as data (Python's ffnlab.plan): the same numbers, and `text`, plan_text's.
nlohmann::json plan_to_json(const StudyPlan& plan, int workers, const std::vector<int>& cores);

// Throws UsageError for options run_study would refuse (before any work): variants, seeds,
// steps, margin, sizes, tasks, budget. `variants` must be filled (default_variants when not given).
void check_options(const Options& options);

// A duration as --budget takes it: "90s", "30m", "2h", "1.5h" or plain seconds ("600").
double parse_duration(std::string_view text);

// Runs every stage and writes the report folder options.out (REPORT.md, results.json, figures
// and their CSV): checked before any work (staged_dir.hpp), replaced only when the new report
// is complete. Throws Error for bad options (before any work), Interrupted when a stop is
// requested (the earlier report, if any, unchanged).
// `ranks` (under mpirun; null: one process): the LM runs go to every rank (serve_runs), which
// changes none of their numbers; a rank silent for `rank_timeout` seconds while it trains fails
// the study, naming the run.
Results run_study(const Options& options, Observer& observer, ProcessGroup* ranks = nullptr,
                  double rank_timeout = 300);

// results.json: every stage's results under its key, in the stage table's order.
nlohmann::ordered_json to_json(const Results& results);

}  // namespace ffnlab::study
