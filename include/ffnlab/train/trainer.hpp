// Trainer: trains a TransformerLM on a byte corpus. One step = `accumulate` micro-batches of
// forward + backward (gradients summed with weight 1/accumulate), clipping by global norm, the
// optimizer update at the scheduled learning rate, then the MoE balancing-bias update. All
// randomness (batch windows, dropout, MoE noise) is a function of (seed, step), so the state of
// a run is its weights, optimizer moments and step: a resumed run continues bit-identically.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/parallel/group.hpp"
#include "ffnlab/train/checkpoint.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/optimizer.hpp"
#include "ffnlab/train/parallel_plan.hpp"
#include "ffnlab/train/schedule.hpp"
#include "ffnlab/train/step_log.hpp"
#include "ffnlab/train/train_config.hpp"

namespace ffnlab {

// StepLog and EvalLog (what run() reports) are in step_log.hpp.

// What the Trainer checks: the configs, seq within the model's context, a training part longer
// than one sequence and, when it `evaluates` (run() does), a validation part holding one window
// and no byte outside the vocabulary (train_step on given batches reads neither).
// The command line calls it before building the model, so that nothing is allocated for a run
// that cannot finish.
void check_training_setup(const LMConfig& model, const Corpus& corpus, const TrainConfig& config,
                          bool evaluates = true);

// Steps and evaluates: the work of one rank. How the ranks share it is its ParallelPlan (data and
// expert parallelism, docs/distributed.md), how it is saved and resumed its CheckpointIO.
class Trainer {
 public:
  // With a group (collective): a rank that fails what it sets up alone (the settings checked
  // for its model and data, the experts its model holds, its optimizer's state) fails every
  // rank, the others with "[train] rank R could not set up its training ..."; then checks that
  // every rank was given the same model, training settings and data, and throws "[dist] ..."
  // naming the difference otherwise.
  Trainer(TransformerLM& model, const Corpus& corpus, const TrainConfig& config,
          DataParallel parallel = {});
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from the current step to config.steps. Evaluates every eval_every steps and at the
  // end, and checkpoints to `checkpoint_dir` (if not empty) every checkpoint_every steps and at
  // the end. A non-finite loss or gradient stops training before the update with an Error naming
  // the step and the checkpoint left to resume from, which stays as it is; any other failure
  // names it too, and stays of its kind (with a directory set; with a group, rank 0's whole
  // path on every rank). `stop` (optional) is asked after every step: when it says yes, run
  // checkpoints (when a directory is set) and returns false before config.steps; run returns
  // true when all steps are done. With a group, every rank calls run (it starts with an
  // exchange), and a callback or `stop` that throws on one rank fails every rank once the step's
  // evaluation, if it has one, is done ("[train] rank R failed after step S ...", of the
  // failure's kind).
  bool run(const std::function<void(const StepLog&)>& on_step,
           const std::function<void(const EvalLog&)>& on_eval,
           const std::string& checkpoint_dir = "", const std::function<bool()>& stop = {});

  // One step on `accumulate` batches drawn from the training part (used by run); returns its
  // log. Throws on a non-finite loss or gradient.
  StepLog train_step();
  // One step on the given micro-batches (each config.seq-token sequences). Data parallel: each
  // rank passes its own batch/ranks sequences of every micro-batch (collective).
  StepLog train_step(std::span<const Batch> batches);
  // Mean loss over the validation part's first max_tokens tokens, rounded down to whole windows
  // of seq (at least one; 0: every whole window, the last bytes short of a window unscored).
  EvalLog evaluate(std::int64_t max_tokens);

  // The checkpoint of the current step to DIR (CheckpointIO::save; collective).
  void save(const std::string& dir) { checkpoints_.save(dir, step_); }
  // Loads weights, optimizer state and step from DIR (CheckpointIO::load).
  void load(const std::string& dir) { step_ = checkpoints_.load(dir); }

  std::int64_t step() const { return step_; }
  // The FFN statistics of the last training step's last forward (per block; empty before a
  // step): what routing_summary reads, untouched by the evaluations since.
  const std::vector<FFNStats>& last_step_stats() const { return last_step_stats_; }
  const TrainConfig& config() const { return config_; }
  TransformerLM& model() { return model_; }
  Optimizer& optimizer() { return optimizer_; }
  const ParallelPlan& plan() const { return plan_; }

 private:
  TransformerLM& model_;
  const Corpus& corpus_;
  TrainConfig config_;
  Schedule schedule_;
  Optimizer optimizer_;
  ParallelPlan plan_;
  CheckpointIO checkpoints_;
  std::int64_t step_ = 0;
  std::vector<FFNStats> last_step_stats_;
};

// Generates n bytes after `prompt` by sampling softmax(logits / temperature) over the bytes
// (greedy at 0; the ids of a vocab larger than 256 are not text and never drawn), with the
// context cut to the model's last `context` bytes; fewer when `stop` (asked before each byte:
// one forward pass of the model) says to stop.
std::string sample_text(TransformerLM& model, const std::string& prompt, std::int64_t n,
                        float temperature, std::uint64_t seed,
                        const std::function<bool()>& stop = {});

}  // namespace ffnlab
