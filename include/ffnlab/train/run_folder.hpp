// A training run's folder (`ffnlab train --out`, ffnlab.train(out=...)): train_log.csv and
// eval_log.csv (a row a step, a row an evaluation), summary.json at the end, checkpoint/
// (trainer.hpp); and resuming from it: the checkpoint's model and settings, merged with what the
// new run asks for, on the data it was trained on.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab {

// The names a run writes in its folder (and a new run there removes): "checkpoint" (a folder),
// the summary, the sample and the logs.
const std::vector<std::string>& run_file_names();

// Why DIR cannot hold a run that reads `data` ("" when it can): DIR is the data or lies inside
// it, so the run's logs would become part of its data; or the data is one of the run's own files
// (run_file_names), which the run would write or remove. `out_name` and `data_name` are how the
// caller's user names the two ("--out" and "--data" on the command line).
std::string run_folder_conflict(const std::string& dir, const std::string& data,
                                std::string_view out_name, std::string_view data_name);

// Creates DIR for a run that passed every check (or keeps it) and removes the files a run killed
// while writing them left half-written (their temporaries). Unless the run continues the one in
// DIR (`continued`), also the earlier run's summary, sample and checkpoint: a new run that stops
// before its own would otherwise leave them beside its logs, and a resume would read them.
void open_run_folder(const std::string& dir, bool continued);

class TrainLogs {
 public:
  // DIR/train_log.csv and DIR/eval_log.csv: new (their headers only), or, with `continued`, the
  // logs of a run resumed in its own folder from step `from_step`: rows after that step were
  // written by a run that died after its last checkpoint, and are dropped (the resumed run
  // writes them again). With `layers`, also DIR/layer_log.csv: the per-layer diagnostics of
  // the steps that carry them (TrainConfig::diagnostics_every). A row the earlier run was
  // writing when it died (no line end) is dropped too. Throws SystemError when they cannot be
  // opened, and add() when a row cannot be written (a full disk), naming the file and the
  // system's reason: a log that silently stops is lost data.
  TrainLogs(const std::string& dir, bool continued, std::int64_t from_step, bool layers = false);
  void add(const StepLog& step);
  void add(const EvalLog& eval);
  // The evaluations a continued log kept (those up to `from_step`), so that the summary of a
  // resumed run lists every evaluation, as an uninterrupted run's does.
  const std::vector<EvalLog>& earlier_evaluations() const { return earlier_; }

 private:
  std::ofstream steps_, evals_, layers_;
  std::string dir_;
  std::vector<EvalLog> earlier_;
};

// summary.json: the configs, the data, the steps done, the median tokens per second, every
// evaluation and the sample.
struct RunSummary {
  LMConfig model;
  TrainConfig train;
  std::int64_t params = 0, steps = 0;
  double median_tokens_per_second = 0;
  // Model FLOP utilisation: the matrix work the median step did per second (per rank), and the
  // rate of the bare products of the model's own shapes measured at start-up (0: not measured).
  double matrix_gflops = 0, bare_products_gflops = 0;
  std::vector<EvalLog> evaluations;
  std::string sample;  // raw bytes (invalid UTF-8 becomes U+FFFD in the JSON)
  // MoE (null for dense models): the experts a token took, measured (routing_summary).
  nlohmann::json routing;
};
// The "routing" part of summary.json (null for a dense model): the experts a token took, as
// the mean over MoE layers and over the last quarter of the steps this process ran (`steps`,
// a model-wide mean per step), and per layer (`layers`, the stats of the last training
// forward: the mean and how many tokens took 0, 1, …, k experts); with ReLU routing the L1
// coefficient at the end.
// The experts a token took, as the mean of the steps' experts_per_token over the last quarter of
// `steps` (at least one; 0 for none): routing_summary's "experts_per_token".
double late_experts_per_token(const std::vector<StepLog>& steps);
nlohmann::json routing_summary(const std::vector<StepLog>& steps,
                               const std::vector<FFNStats>& layers);
// summary.json's content; write_summary writes it into DIR (atomically).
nlohmann::json summary_json(const RunSummary& summary, const Corpus& corpus);
void write_summary(const std::string& dir, const nlohmann::json& summary);
// DIR/summary.json as written; null when it is missing or cannot be read as a JSON object.
nlohmann::json read_summary(const std::string& dir);

// Whether DIR holds a run finished at `step` of `steps`: its last step done and its summary of
// `steps` written (a run killed while sampling has no summary yet; one extended with --steps and
// killed before its new summary has the shorter run's). Resuming it in DIR has nothing to do.
bool run_finished(const std::string& dir, std::int64_t step, std::int64_t steps);

// Where a run resumes: DIR/checkpoint's checkpoint.json and the model it holds (errors name the
// file).
struct ResumePoint {
  std::string checkpoint_dir;
  nlohmann::json info;
  LMConfig model;
};
ResumePoint read_resume_point(const std::string& run_dir);

// A training setting that the resumed run asks for and the checkpoint was trained without.
struct SettingChange {
  std::string key;
  nlohmann::json saved, given;
};
// The checkpoint's training settings with `given`'s values laid over them for `keys` (the
// settings the user gave). `steps` sets the new total and is not a change; every other key whose
// value differs is listed in `changes` (which a caller refuses unless told to go on).
TrainConfig resumed_settings(const ResumePoint& point, const TrainConfig& given,
                             std::span<const std::string> keys,
                             std::vector<SettingChange>& changes);

// The data a resumed run reads unless told otherwise: the checkpoint's path (or source) and its
// validation fraction.
std::string checkpoint_data_path(const ResumePoint& point, const std::string& fallback);
double checkpoint_val_fraction(const ResumePoint& point, double fallback);

// Empty when `corpus` is the data the checkpoint was trained on (its fingerprint, and a training
// part of the same size, so that the batches are the same); else what differs.
struct DataMismatch {
  std::string what;         // empty: none
  bool split_only = false;  // the bytes are the same, the split is not (another val_fraction)
};
DataMismatch data_mismatch(const ResumePoint& point, const Corpus& corpus);

}  // namespace ffnlab
