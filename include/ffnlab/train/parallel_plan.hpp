// ParallelPlan: how the ranks of a training run share its work (docs/distributed.md). It checks
// that every rank was started alike, splits the expert groups, says which experts this rank
// holds, sums the gradients over the ranks, and keeps the other ranks' experts out of memory
// between the moments that need them. One process has the empty plan: no group, every expert
// here.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/parallel/group.hpp"
#include "ffnlab/train/data.hpp"
#include "ffnlab/train/grad_sync.hpp"
#include "ffnlab/train/optimizer.hpp"

namespace ffnlab {

struct TrainConfig;  // train_config.hpp

// Data parallelism: the ranks of a group train one model, each on its slice of every batch
// (batch / ranks sequences; the windows one process would take), with gradients summed over the
// group in buckets of `bucket_elements` while backward runs, so that every rank makes the same
// update. MoE routing statistics, losses and capacity are those of the whole batch; evaluation
// is split over the ranks; rank 0 alone writes checkpoints.
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

// What every rank must share, compared over the group (rank 0's sent to all; a rank that differs
// fails saying what differs): the model, the training settings, the data and the settings of
// `parallel`. run_training checks it before it builds a model, ParallelPlan again.
void check_same_setup(ProcessGroup& group, const LMConfig& model, const TrainConfig& train,
                      const Corpus& corpus, const DataParallel& parallel);

// The layout's rules, which run_training checks before it builds a model (so that a memory
// check of a model that would never split does not hide them) and ParallelPlan again: the batch
// splits over the ranks; with expert_parallel, the model is an MoE whose routing splits its
// experts, the expert group divides the ranks and the experts split over the group. UsageError
// naming the command's flag (--batch, --experts, --expert-group). Checked after
// check_same_setup, so that ranks started differently hear that first.
void check_parallel_layout(const FFNConfig& ffn, std::int64_t batch, int ranks,
                           const DataParallel& parallel);

// Whether this rank's model holds the experts it may, checked alone (no exchange): every expert
// unless it trains expert parallel under a group, and then those of its place in its expert
// group (held_by_rank(E, G, rank % G)). Error naming what it holds and what it may. Trainer
// checks it before the ranks first meet, where a rank that fails it fails every rank;
// ParallelPlan again, alone.
void check_holds_its_experts(const TransformerLM& model, const DataParallel& parallel);

// What of the other ranks' experts a refresh brings and a release gives back.
enum class ExpertState : std::uint8_t { weights, with_moments };

class ParallelPlan {
 public:
  // Checks the layout: a model that holds only some experts trains expert parallel, and with a
  // group (collective) every rank was given the same model, training settings and data ("[dist]
  // ..." naming the difference otherwise), the batch splits over the ranks and the experts over
  // the expert group. Then splits the expert groups, points the model's layers at the groups,
  // and takes the other ranks' experts out of the optimizer and out of memory.
  ParallelPlan(TransformerLM& model, Optimizer& optimizer, const Corpus& corpus,
               const TrainConfig& config, DataParallel parallel);
  // The model's layers no longer point at the groups this plan made.
  ~ParallelPlan();
  ParallelPlan(const ParallelPlan&) = delete;
  ParallelPlan& operator=(const ParallelPlan&) = delete;

  ProcessGroup* group() const { return parallel_.group; }  // null: one process
  int ranks() const { return parallel_.group ? parallel_.group->size() : 1; }
  int rank() const { return parallel_.group ? parallel_.group->rank() : 0; }
  // The groups split from the data-parallel one (expert groups, their replicas): their traffic
  // is apart from the group's (ProcessGroup::payload_bytes).
  std::vector<const ProcessGroup*> subgroups() const;
  // Expert parallel: the ranks this rank's experts are split over (the whole group, or its
  // expert group); each expert has one holder in it.
  ProcessGroup& expert_group() const;
  // Expert groups: the ranks that hold this rank's experts in the other groups (null without).
  ProcessGroup* replicas() const { return replicas_.get(); }

  // The model holds only this rank's experts (TransformerLM's `held`): no other rank's expert
  // is ever here, evaluation exchanges rows as training does, checkpoints are written in parts.
  bool own_experts_only() const { return own_experts_only_; }
  // Expert parallel: the elements of every MoE layer's experts (empty otherwise).
  const std::vector<std::pair<std::int64_t, std::int64_t>>& expert_ranges() const {
    return expert_ranges_;
  }
  // Expert parallel, holding every expert: the elements of the experts other ranks hold (here as
  // copies, neither trained nor kept in memory between refreshes).
  const std::vector<std::pair<std::int64_t, std::int64_t>>& unheld() const { return unheld_; }
  // Whether a parameter lies in the experts' elements (expert parallel).
  bool is_expert(const Parameter& p) const;

  // The gradient sums over the ranks (collective): elements [first, end) of the gradient buffer
  // are final (TransformerLM::backward's report), then everything is, once finish returns.
  void gradients_ready(std::int64_t first) { sync_->ready(first); }
  void finish_gradients();
  // The global norm of the summed gradients (collective when expert parallel: each rank adds
  // its own experts' part).
  double gradient_norm() const;

  // Expert parallel: every rank's copy of every expert (weights; with_moments: the optimizer's
  // moments too) from the rank that holds it. Collective; changes this rank's copies.
  void refresh_experts(ExpertState what);
  // Expert parallel: gives the memory of the other ranks' experts (weights, gradients;
  // with_moments: the moments) back to the system, except at or after the last step (`step` of
  // the run's config.steps), when sampling and the caller may read every expert.
  void release_unheld_experts(ExpertState what, std::int64_t step);

 private:
  TransformerLM& model_;
  Optimizer& optimizer_;
  DataParallel parallel_;
  std::int64_t steps_;  // the run's last step
  std::unique_ptr<GradientSync> sync_;
  // Expert groups (DataParallel::expert_group < ranks): this rank's expert group, the ranks that
  // hold the same experts in the other groups, and the sum of the experts' gradients over them.
  std::unique_ptr<ProcessGroup> experts_group_, replicas_;
  std::unique_ptr<GradientSync> expert_sync_;
  std::vector<TransformerLM::ExpertSpan> expert_spans_;
  // Element ranges [begin, end) of the flat parameter buffer.
  std::vector<std::pair<std::int64_t, std::int64_t>> expert_ranges_, unheld_;
  bool own_experts_only_ = false;
};

}  // namespace ffnlab
