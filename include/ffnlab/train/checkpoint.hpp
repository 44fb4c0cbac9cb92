// Checkpoints: DIR/checkpoint.json (configs, step, seed, the data's fingerprint and split, the
// weights file's name) and DIR/weights-<step>.safetensors (parameters and their optimizer
// moments, all by name). Each file is written to a temporary name and renamed; checkpoint.json
// is renamed last, so that a crash at any point leaves the previous checkpoint whole. A save at
// the committed checkpoint's own step writes weights-<step>-r1.safetensors (or the next number
// free): no committed file is replaced before checkpoint.json names the new ones.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/optimizer.hpp"
#include "ffnlab/train/parallel_plan.hpp"

namespace ffnlab {

struct TrainConfig;  // train_config.hpp

// The file of a checkpoint folder that names its weights and holds its configs; written last.
inline constexpr const char* kCheckpointInfo = "checkpoint.json";

// Reads DIR/checkpoint.json (the configs a checkpoint was trained with). Throws for a missing or
// corrupt file.
nlohmann::json read_checkpoint_info(const std::string& dir);

// The optimizer of a checkpoint's settings (checkpoint.json's "train"), when its state is of
// another kind than `sgd` says (SGD's momentum buffer against Adam's and AdamW's two moments);
// "" when it is of the same kind or not named. A load starts such state afresh.
std::string other_optimizer_state(const nlohmann::json& saved_train, bool sgd);

// Writes and reads the checkpoints of one training run: its model and optimizer, laid out by its
// parallel plan, with its configs and data named in checkpoint.json.
class CheckpointIO {
 public:
  CheckpointIO(TransformerLM& model, Optimizer& optimizer, ParallelPlan& plan, const Corpus& corpus,
               const TrainConfig& config)
      : model_(model), optimizer_(optimizer), plan_(plan), corpus_(corpus), config_(config) {}

  // The state after `step` steps, to DIR. Data parallel (collective): the ranks first check
  // that their weights agree, then rank 0 writes. A model that holds only this rank's experts: rank
  // q of the first expert group writes its experts to weights-<step>-experts-<q>.safetensors beside
  // rank 0's file (the dense part and rank 0's experts), which checkpoint.json lists as "shards";
  // every file and checkpoint.json carry the save's "attempt", which a load checks.
  void save(const std::string& dir, std::int64_t step);
  // Loads weights and optimizer state from DIR and returns its step. Each tensor is read by name
  // from whichever file holds it, so a checkpoint resumes on any layout. Throws
  // "[checkpoint] ..." for a missing or corrupt checkpoint or one of another model shape. Data
  // parallel (collective): each rank reads its DIR; a rank that could not fails every rank (with
  // its kind and errno), and so do ranks at other steps or holding other weights.
  std::int64_t load(const std::string& dir);
  // A model that holds only this rank's experts (collective; `dir` rank 0's folder, the same on
  // every rank): every rank that will write a part writes a file into it, and rank 0 must see
  // each, or every rank fails: a folder the ranks do not share is found before the first step,
  // not at the first checkpoint. The files are removed.
  void check_shared_folder(const std::string& dir);

 private:
  // One process's checkpoint (or rank 0's for the group): every parameter in one file.
  void write(const std::string& dir, std::int64_t step) const;
  void save_in_parts(const std::string& dir, std::int64_t step);
  // One process's load (load reads with it on each rank).
  std::int64_t read(const std::string& dir);
  // Whether every rank holds the same weights (collective): the dense part on every rank, each
  // expert on each of its holders.
  bool ranks_hold_the_same_weights();
  // A token no other save has, rank 0's, on every rank (collective).
  std::string new_token();
  // The parameters `keep` accepts, with their optimizer moments, to `path` (atomically);
  // `attempt` (when not empty) in its metadata: the save it belongs to.
  void write_weights(const std::string& path, std::int64_t step,
                     const std::function<bool(const Parameter&)>& keep,
                     const std::string& attempt = "") const;
  // DIR/checkpoint.json naming `weights` (and the expert shards beside it, and `attempt`, the
  // save every one of them carries, when not empty), written last; then removes the weights
  // files it does not name.
  void write_info(const std::string& dir, std::int64_t step, const std::string& weights,
                  const std::vector<std::string>& shards, const std::string& attempt = "") const;

  TransformerLM& model_;
  Optimizer& optimizer_;
  ParallelPlan& plan_;
  const Corpus& corpus_;
  const TrainConfig& config_;
};

}  // namespace ffnlab
