// TrainConfig: the training settings of a run (objective, steps, batch, optimizer, schedule,
// precision, evaluation and checkpoints), their checks and their JSON (docs/training.md).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/train/optimizer.hpp"
#include "ffnlab/train/schedule.hpp"

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
// The learning-rate schedule the settings give.
Schedule schedule_of(const TrainConfig& config);
// Why a run with `config` never reads the setting `key` (Adam's β1 under SGD, a mask fraction
// under the causal objective, ...), or "" when it does or the setting holds its default: a
// setting the caller gives that the run would ignore is refused (run_training), as it is most
// likely meant for another mode.
std::string unread_setting(const TrainConfig& config, std::string_view key);

// The model keys a caller set itself, which set_objective_keys keeps.
struct GivenModelKeys {
  bool causal = false, vocab = false, positions = false;
};
// Those a model config's JSON sets (a file, or Python's config and keys).
GivenModelKeys given_model_keys(const nlohmann::json& config);
// A new model's keys for the objective it will train on, as every front end sets them (`ffnlab
// train --objective`, ffnlab.TransformerLM(objective=), the study's masked runs): for the
// masked objective, bidirectional attention (a given causal true is an Error), the vocabulary
// with [MASK] unless given, and RoPE positions unless given (with learned ones the default
// model sat at the unigram entropy for its 600 steps: 4.79 bits per masked byte on the
// fortunes, 3.88 with RoPE). The causal objective needs nothing.
void set_objective_keys(LMConfig& model, Objective objective, GivenModelKeys given = {});
nlohmann::json train_config_to_json(const TrainConfig& config);
TrainConfig train_config_from_json(const nlohmann::json& j);
// The settings of j (as a file holds them) as train_config_to_json writes them: a float as its
// shortest form (a file may hold it as its double, 0.003000000026077032), names canonical, every
// key. Types are checked, ranges not: what a caller makes of them is validated then (a resumed
// run may replace a setting its checkpoint holds outside today's range).
nlohmann::json train_settings_as_written(const nlohmann::json& j);

}  // namespace ffnlab
