// One training run from its settings to its summary: the driver behind `ffnlab train`,
// `ffnlab.train` and the study's runs (`ffnlab evolve`). It resolves a resumed run (the
// checkpoint's model, settings and data, and what the caller may change), checks the data and
// the output folder, builds or takes the model, trains it with the Trainer, writes the run
// folder (logs, checkpoint, sample, summary.json) and measures the run's FLOP utilisation with
// the one formula of analysis/speed.hpp. The front ends only turn their arguments into a
// RunRequest and show what a RunObserver hears.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab {

// How the caller's user names what an error message points at: the command line's flags (the
// defaults) or Python's keyword arguments.
struct RunNames {
  std::string out = "--out", data = "--data", steps = "--steps";
  std::string val_fraction = "--val-fraction";  // empty: the caller cannot set it
  std::string force = "use --force";            // how the user insists
  std::string resume = "--resume";
  std::string sample = "--sample", prompt = "--prompt";  // (sample: the sample's flags given)
  std::string no_sample = "--sample 0";
};

// A training setting the caller set (a key of train_config_to_json), as its user wrote it
// ("--lr 0.01", "lr = 0.01"). When resuming, one that differs from the checkpoint's needs force.
struct GivenSetting {
  std::string key, as_written;
};

struct RunRequest {
  LMConfig model;  // a new run's; a resumed run's model is its checkpoint's
  TrainConfig train;
  std::vector<GivenSetting> given;  // the training settings the caller set (see above)
  // The data: a text file or a folder, its last val_fraction for validation. A resumed run
  // reads the checkpoint's, split as it was, where the caller did not give them.
  std::string data = kDefaultCorpus;
  double val_fraction = kDefaultValFraction;
  bool data_given = true, val_fraction_given = true;
  const Corpus* corpus = nullptr;  // data already loaded (the study's runs share theirs)
  // The run folder (logs, checkpoint/, sample.txt, summary.json). Empty: the resumed run's own
  // folder when resuming, else none (nothing is written).
  std::string out;
  // False: `out` is the command's default folder, a scratch folder each new run starts over in;
  // a named one that holds an earlier run is refused (unless `force`).
  bool out_named = true;
  std::string resume;  // the folder of the run to continue ("": a new run)
  // Resume on other data or with other training settings; without `resume`, start over in a
  // named `out` that holds an earlier run (refused otherwise).
  bool force = false;
  // Bytes to sample after training (a causal model holding every expert), from `prompt`.
  std::int64_t sample = 0;
  float temperature = 0.8f;
  std::string prompt = "\n";
  // The caller set the sample's settings (a sample of more than 0 bytes, its prompt or its
  // temperature): refused for a masked model.
  bool sample_given = false;
  DataParallel parallel;  // one process unless it names a group (mpirun)
  // The yardstick of FLOP utilisation: the bare products of the model's shapes, measured by
  // the caller (the study times them before its pool of runs); else timed here at start-up on
  // this rank's micro-batch, unless measure_bare is off.
  std::optional<ModelProducts> bare;
  bool measure_bare = true;
  bool validate_at_end = false;        // a last evaluation on the whole validation part
  std::int64_t validation_tokens = 0;  // ... or on its first this many tokens (0: all of it)
  RunNames names;
};

// What the run is about to do, once everything is checked and the model is built (and loaded).
struct RunStart {
  const LMConfig& model;
  const TrainConfig& train;
  const Corpus& corpus;
  std::int64_t params;     // closed form (transformer_cost)
  std::int64_t from_step;  // 0, or the checkpoint's step
  const ModelProducts& bare;
  std::int64_t tokens;             // of this rank's micro-batch (what `bare` timed)
  HeldExperts held;                // the experts this rank holds ({}: every expert)
  std::string schedule_note = {};  // RunOutcome::schedule_note
};

// What a run tells its caller as it goes. Only the lead rank (rank 0, or the one process)
// hears started/step/evaluated; every rank is asked stop().
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void started(const RunStart& /*start*/, TransformerLM& /*model*/) {}
  virtual void step(const StepLog& /*step*/, const TransformerLM& /*model*/) {}
  virtual void evaluated(const EvalLog& /*eval*/) {}
  // Asked after every step: yes checkpoints (when there is a folder) and ends the run early.
  virtual bool stop() { return false; }
};

// Bytes handed to exchanges per step and the time spent in them, by exchange (rank 0's; data
// parallel runs only).
struct RunTraffic {
  double bytes_per_step = 0, seconds_per_step = 0;
  std::map<std::string, std::pair<double, double>> by_exchange;  // bytes, seconds per step
};

struct RunOutcome {
  LMConfig model;
  TrainConfig train;
  std::string out;  // the run folder written ("": none)
  std::int64_t params = 0, first_step = 0, step = 0;
  bool already_finished = false;  // resumed in its own folder at its last step: nothing done
  bool finished = false;          // every step done (false: stopped, checkpointed)
  // Not empty: a resume given another number of steps, whose schedule gives the steps the
  // checkpoint trained other learning rates; the run will not equal an uninterrupted one.
  std::string schedule_note;
  HeldExperts held;
  std::vector<StepLog> steps;         // this process's (a resumed run's since the checkpoint)
  std::vector<EvalLog> evaluations;   // the whole run's: a resumed run's earlier ones first
  std::optional<EvalLog> validation;  // validate_at_end's
  std::vector<FFNStats> last_step_stats;
  double median_tokens_per_second = 0;
  ModelProducts bare;
  double matrix_gflops = 0;    // the median step's matrix work per second (per rank)
  double utilisation = 0;      // flop_utilisation: NaN where not measured or disturbed
  nlohmann::json routing;      // routing_summary (null for a dense model)
  std::string sample;          // empty: none
  std::string sample_skipped;  // why no sample was taken although one was asked for
  // A stop came while sampling: the run is finished and written, its sample shorter than asked.
  bool sample_stopped = false;
  nlohmann::json summary;  // summary.json's content (lead rank, when trained)
  std::optional<RunTraffic> traffic;
};

// Runs one training run (see the top of this file). `model`: the caller's model to train (its
// config is the run's; a resumed checkpoint must fit it); null: the run builds its own (the
// request's model, or the resumed checkpoint's), after checking that its memory fits. Errors:
// UsageError for settings that conflict with the checkpoint or the data (force overrides),
// Error for refused input, SystemError for failed writes. A stop request returns with
// finished == false after the checkpoint is written.
RunOutcome run_training(const RunRequest& request, RunObserver& observer,
                        TransformerLM* model = nullptr);

// Over ranks, what each rank checks alone before the ranks first compare their setup (its
// settings, flags and checkpoint, rank 0's output folder, the data) fails every rank together
// (fail_together_around), the others with this line, naming the rank, rather than waiting for it.
// run_training's checks say it; so does a front end that checks a checkpoint before calling it.
inline constexpr const char* kRankFailedItsChecks =
    "[train] rank {} failed its checks before the ranks compared their setup (its message says "
    "why)";

// The experts this rank of an expert-parallel run holds: its place in its expert group of G
// consecutive ranks (every rank when G is 0). All of them ({}) where the layout does not split
// (the trainer then says why) or the model has no experts to split.
HeldExperts held_by_this_rank(const LMConfig& model, const ProcessGroup& group, int expert_group);

}  // namespace ffnlab
