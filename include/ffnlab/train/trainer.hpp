// Trainer: trains a TransformerLM on a byte corpus. One step = `accumulate` micro-batches of
// forward + backward (gradients summed with weight 1/accumulate), clipping by global norm, the
// optimizer update at the scheduled learning rate, then the MoE balancing-bias update. All
// randomness (batch windows, dropout, MoE noise) is a function of (seed, step), so the state of
// a run is its weights, optimizer moments and step: a resumed run continues bit-identically.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/parallel/group.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/grad_sync.hpp"
#include "ffnlab/train/optimizer.hpp"
#include "ffnlab/train/schedule.hpp"
#include "ffnlab/train/step_log.hpp"

namespace ffnlab {

// What the model learns to predict (docs/training.md).
enum class Objective : std::uint8_t {
  causal,  // the next byte at every position (a causal model)
  masked,  // the masked bytes of every sequence (a bidirectional model, vocabulary 257)
  count
};
template <>
struct EnumNames<Objective> {
  static constexpr auto table = name_table<Objective>(
      "train", "objective", {{Objective::causal, "causal"}, {Objective::masked, "masked"}});
};
static_assert(EnumNames<Objective>::table.complete());

struct TrainConfig {
  Objective objective = Objective::causal;
  float mask_fraction = 0.15f;  // masked: the share of each sequence's bytes masked (BERT's)
  std::int64_t steps = 600;
  std::int64_t batch = 16;      // sequences per micro-batch
  std::int64_t seq = 128;       // tokens per sequence
  std::int64_t accumulate = 1;  // micro-batches per step
  OptimizerConfig optimizer;
  std::int64_t warmup = 50;
  float min_lr_ratio = 0.1f;
  DecayKind decay = DecayKind::cosine;
  float clip = 1.0f;       // max global gradient norm; 0: no clipping
  std::uint64_t seed = 1;  // model initialisation, batches, dropout
  Precision precision = Precision::f32;
  std::int64_t eval_every = 100;      // 0: only at the end
  std::int64_t eval_tokens = 0;       // validation tokens per evaluation; 0: the whole part
  std::int64_t checkpoint_every = 0;  // 0: only at the end (when a directory is set)
  // Per-layer diagnostics (StepLog::layers) every N steps and at step 1; 0: none. They read the
  // activations and gradients already there (no extra pass) and change nothing in training.
  std::int64_t diagnostics_every = 0;
};

void validate(const TrainConfig& config);
nlohmann::json train_config_to_json(const TrainConfig& config);
TrainConfig train_config_from_json(const nlohmann::json& j);

// StepLog and EvalLog (what run() reports) are in step_log.hpp.

// What the Trainer checks: the configs, seq within the model's context, a training part longer
// than one sequence and, when it `evaluates` (run() does), a validation part holding one window
// and no byte outside the vocabulary (train_step on given batches reads neither).
// The command line calls it before building the model, so that nothing is allocated for a run
// that cannot finish.
void check_training_setup(const LMConfig& model, const Corpus& corpus, const TrainConfig& config,
                          bool evaluates = true);

// Data parallelism (docs/distributed.md): the ranks of a group train one model, each on its
// slice of every batch (batch / ranks sequences; the windows one process would take), with
// gradients summed over the group in buckets of `bucket_elements` while backward runs, so that
// every rank makes the same update. MoE routing statistics, losses and capacity are those of the
// whole batch; evaluation is split over the ranks; rank 0 alone writes checkpoints.
//
// With expert_parallel, the MoE layers' experts are split over the ranks as well (each rank
// computes its share of the experts for every rank's tokens, ffnlab/layers/expert_exchange.hpp):
// expert gradients are then not all-reduced (each has one holder), the gradient norm adds every
// holder's part; a rank neither updates nor keeps in memory the other ranks' experts (their
// pages are released), and refreshes them from their holders before an evaluation or a
// checkpoint (after the last step, every rank keeps every expert).
//
// Expert groups (expert_group = G < P): the experts are split over G consecutive ranks, and the
// P/G groups are data-parallel replicas of each other: the all-to-alls run within a group, an
// expert's gradients are summed over its P/G holders (one in each group), the rest over all P.
struct DataParallel {
  ProcessGroup* group = nullptr;  // null: one process
  std::int64_t bucket_elements = std::int64_t{1} << 20;
  bool expert_parallel = false;
  // Further settings every rank must share, by name (the command line's flags as given): the
  // start-up check compares them with the model, training settings, data and the two above.
  std::map<std::string, std::string> agreed;
  int expert_group = 0;  // expert parallel: ranks the experts are split over (0: all of them)
};

class Trainer {
 public:
  // With a group (collective): checks that every rank was given the same model, training
  // settings and data, and throws "[dist] ..." naming the difference otherwise.
  Trainer(TransformerLM& model, const Corpus& corpus, const TrainConfig& config,
          DataParallel parallel = {});
  // Data parallel: the model's layers no longer point at the group or the expert groups this
  // trainer made.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // The groups split from the data-parallel one (expert groups, their replicas): their traffic
  // is apart from the group's (ProcessGroup::payload_bytes).
  std::vector<const ProcessGroup*> subgroups() const {
    std::vector<const ProcessGroup*> out;
    for (const auto* g : {experts_group_.get(), replicas_.get()})
      if (g) out.push_back(g);
    return out;
  }

  // Trains from the current step to config.steps. Evaluates every eval_every steps and at the
  // end, and checkpoints to `checkpoint_dir` (if not empty) every checkpoint_every steps and at
  // the end. A non-finite loss or gradient stops training before the update with an Error naming
  // the step and the checkpoint left to resume from, which stays as it is. `stop` (optional) is
  // asked after every step: when it says yes, run checkpoints (when a directory is set) and
  // returns false before config.steps; run returns true when all steps are done.
  bool run(const std::function<void(const StepLog&)>& on_step,
           const std::function<void(const EvalLog&)>& on_eval,
           const std::string& checkpoint_dir = "", const std::function<bool()>& stop = {});

  // One step on `accumulate` batches drawn from the training part (used by run); returns its
  // log. Throws on a non-finite loss or gradient.
  StepLog train_step();
  // One step on the given micro-batches (each config.seq-token sequences). Data parallel: each
  // rank passes its own batch/ranks sequences of every micro-batch (collective).
  StepLog train_step(std::span<const Batch> batches);
  // Mean loss over the first max_tokens tokens of the validation part (0: all of it).
  EvalLog evaluate(std::int64_t max_tokens);

  // Data parallel: the ranks first check that their weights agree. Checkpoint: DIR/checkpoint.json
  // (configs, step, seed, the data's fingerprint and split, the weights file's name) and
  // DIR/weights-<step>.safetensors (parameters by name, optimizer moments). Each file is
  // written to a temporary name and renamed; checkpoint.json is renamed last, so that a crash
  // at any point leaves the previous checkpoint whole.
  void save(const std::string& dir);
  // Loads weights, optimizer state and step from DIR. Throws "[checkpoint] ..." for a missing
  // or corrupt checkpoint or one of another model shape.
  void load(const std::string& dir);

  std::int64_t step() const { return step_; }
  // The FFN statistics of the last training step's last forward (per block; empty before a
  // step): what routing_summary reads, untouched by the evaluations since.
  const std::vector<FFNStats>& last_step_stats() const { return last_step_stats_; }
  const TrainConfig& config() const { return config_; }
  TransformerLM& model() { return model_; }
  Optimizer& optimizer() { return *optimizer_; }

 private:
  TransformerLM& model_;
  const Corpus& corpus_;
  TrainConfig config_;
  Schedule schedule_;
  void write_checkpoint(const std::string& dir) const;
  // The parameters `keep` accepts, with their optimizer moments, to `path` (atomically).
  void write_weights(const std::string& path,
                     const std::function<bool(const Parameter&)>& keep) const;
  // DIR/checkpoint.json naming `weights` (and the expert shards beside it), written last; then
  // removes the weights files it does not name.
  void write_checkpoint_info(const std::string& dir, const std::string& weights,
                             const std::vector<std::string>& shards) const;
  // A sharded model's checkpoint: the first expert group's ranks each write their experts.
  void save_sharded(const std::string& dir);
  // Whether a parameter is one of this rank's experts (expert parallel).
  bool is_expert(const Parameter& p) const;
  // What of the other ranks' experts a refresh brings and a release gives back.
  enum class ExpertState { weights, with_moments };
  // Expert parallel: every rank's copy of every expert (weights; with_moments: the optimizer's
  // moments too) from the rank that holds it. Collective; changes this rank's copies.
  void refresh_experts(ExpertState what);
  // Expert parallel: gives the memory of the other ranks' experts (weights, gradients;
  // with_moments: the moments) back to the system, except after the last step (sampling and
  // the caller may then read every expert).
  void release_foreign_experts(ExpertState what);
  double gradient_norm() const;
  // Expert parallel: the ranks this rank's experts are split over (the whole group, or its
  // expert group).
  ProcessGroup& expert_group() const { return experts_group_ ? *experts_group_ : *parallel_.group; }

  std::unique_ptr<Optimizer> optimizer_;
  std::int64_t step_ = 0;
  std::vector<FFNStats> last_step_stats_;
  DataParallel parallel_;
  std::unique_ptr<GradientSync> sync_;
  // Expert groups (DataParallel::expert_group < ranks): this rank's expert group, the ranks that
  // hold the same experts in the other groups, and the sum of the experts' gradients over them.
  std::unique_ptr<ProcessGroup> experts_group_, replicas_;
  std::unique_ptr<GradientSync> expert_sync_;
  // Expert parallel only: the experts' spans, the same as ranges, and the part other ranks hold.
  std::vector<TransformerLM::ExpertSpan> expert_spans_;
  std::vector<std::pair<std::int64_t, std::int64_t>> expert_ranges_, foreign_;
  // The model holds only this rank's experts (TransformerLM's `held`): no other rank's expert
  // is ever here, evaluation exchanges rows as training does, checkpoints are written in parts.
  bool sharded_ = false;
};

// The file of a checkpoint folder that names its weights and holds its configs; written last.
inline constexpr const char* kCheckpointInfo = "checkpoint.json";

// Reads DIR/checkpoint.json (the configs a checkpoint was trained with). Throws for a missing or
// corrupt file.
nlohmann::json read_checkpoint_info(const std::string& dir);

// Generates n bytes after `prompt` by sampling softmax(logits / temperature) (greedy at 0),
// with the context cut to the model's last `context` bytes.
std::string sample_text(TransformerLM& model, const std::string& prompt, std::int64_t n,
                        float temperature, std::uint64_t seed);

}  // namespace ffnlab
