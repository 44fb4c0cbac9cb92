// The training settings: their checks and their JSON form (docs/config.md).
#include "ffnlab/train/train_config.hpp"

#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/data.hpp"
#include "json_keys.hpp"

namespace ffnlab {

using json = nlohmann::json;

std::string unread_setting(const TrainConfig& c, std::string_view key) {
  // At its default a setting changes nothing whoever reads it: a run's stored settings, which
  // hold every key, can be given back as they are.
  const json now = train_config_to_json(c), defaults = train_config_to_json(TrainConfig{});
  const std::string k(key);
  if (!now.contains(k) || now[k] == defaults[k]) return {};
  const bool sgd = c.optimizer.kind == OptimizerKind::sgd;
  if (sgd && (key == "beta1" || key == "beta2" || key == "eps"))
    return "an Adam setting, which the sgd optimizer does not read (it reads momentum)";
  if (!sgd && key == "momentum")
    return fmt::format(
        "an SGD setting, which the {} optimizer does not read (its momentum is "
        "beta1)",
        enum_name(c.optimizer.kind));
  if (c.objective != Objective::masked && key == "mask_fraction")
    return "a setting of the masked objective, which the causal objective does not read";
  if (c.decay == DecayKind::constant && key == "min_lr_ratio")
    return "the cosine decay's floor, which the constant decay does not read (it holds the "
           "peak learning rate)";
  return {};
}

namespace {

// A key of TrainConfig; the optimizer's sit inside TrainConfig::optimizer, and are top-level
// keys in JSON all the same.
template <auto... Path>
constexpr JsonKey<TrainConfig> train(const char* name, KeyFlag flag) {
  return field<TrainConfig, Path...>(name, flag);
}
constexpr double kSteps = limits::kSteps, kTokens = limits::kTokens;

// In the order of the help.
constexpr std::array kTrainKeys{
    train<&TrainConfig::steps>(
        "steps", {.name = "--steps",
                  .help = "optimizer steps in all (with --resume: the checkpoint's, unless given)",
                  .hi = kSteps}),
    train<&TrainConfig::batch>(
        "batch", {.name = "--batch", .help = "sequences per micro-batch", .lo = 1, .hi = kTokens}),
    train<&TrainConfig::seq>("seq", {.name = "--seq",
                                     .help = "tokens (bytes) per sequence",
                                     .lo = 1,
                                     .hi = static_cast<double>(limits::kWidth)}),
    train<&TrainConfig::accumulate>(
        "accumulate",
        {.name = "--accumulate", .help = "micro-batches per step", .lo = 1, .hi = kTokens}),
    train<&TrainConfig::optimizer, &OptimizerConfig::kind>(
        "optimizer", {.name = "--optimizer", .help = "{names}"}),
    train<&TrainConfig::optimizer, &OptimizerConfig::lr>(
        "lr", {.name = "--lr", .help = "peak learning rate", .hi = 1e30}),
    train<&TrainConfig::optimizer, &OptimizerConfig::beta1>(
        "beta1", {.name = "--beta1", .help = "Adam β1", .hi = 1, .hi_open = true}),
    train<&TrainConfig::optimizer, &OptimizerConfig::beta2>(
        "beta2", {.name = "--beta2", .help = "Adam β2", .hi = 1, .hi_open = true}),
    train<&TrainConfig::optimizer, &OptimizerConfig::eps>(
        "eps", {.name = "--eps", .help = "Adam ε", .lo = 1e-30, .hi = 1}),
    train<&TrainConfig::optimizer, &OptimizerConfig::weight_decay>(
        "weight_decay", {.name = "--weight-decay",
                         .help = "weight decay on matrices (AdamW: decoupled; Adam, SGD: L2)",
                         .hi = 1e3}),
    train<&TrainConfig::optimizer, &OptimizerConfig::momentum>(
        "momentum", {.name = "--momentum", .help = "SGD momentum", .hi = 1, .hi_open = true}),
    train<&TrainConfig::warmup>("warmup",
                                {.name = "--warmup", .help = "linear warm-up steps", .hi = kSteps}),
    train<&TrainConfig::decay>("decay", {.name = "--decay", .help = "after warm-up: {names or}"}),
    train<&TrainConfig::min_lr_ratio>(
        "min_lr_ratio",
        {.name = "--min-lr-ratio", .help = "cosine floor as a fraction of --lr", .hi = 1}),
    train<&TrainConfig::clip>(
        "clip", {.name = "--clip", .help = "max global gradient norm (0: off)", .hi = 1e30}),
    train<&TrainConfig::seed>("seed",
                              {.name = "--seed", .help = "initialisation, batches and dropout"}),
    train<&TrainConfig::objective>(
        "objective",
        {.name = "--objective",
         .help = "causal (the next byte; a causal model) or masked (masked bytes, like BERT: a "
                 "bidirectional model with [MASK] as id 256; validation in bits per masked "
                 "byte; positions default to rope). Expert-choice and Soft MoE routing need "
                 "masked"}),
    train<&TrainConfig::mask_fraction>("mask_fraction",
                                       {.name = "--mask-fraction",
                                        .help = "masked: the share of each sequence's bytes masked",
                                        .hi = 1,
                                        .lo_open = true}),
    train<&TrainConfig::precision>(
        "precision",
        {.name = "--dtype", .help = "product precision: f32, or bf16 with f32 master weights"}),
    train<&TrainConfig::eval_every>("eval_every",
                                    {.name = "--eval-every",
                                     .help = "validate every N steps (0: only at the end)",
                                     .hi = kSteps}),
    train<&TrainConfig::eval_tokens>("eval_tokens",
                                     {.name = "--eval-tokens",
                                      .help = "validation tokens per evaluation, in whole "
                                              "windows of --seq (at least one; 0: all)",
                                      .hi = kSteps}),
    train<&TrainConfig::checkpoint_every>("checkpoint_every",
                                          {.name = "--checkpoint-every",
                                           .help = "checkpoint every N steps (0: only at the end)",
                                           .hi = kSteps}),
    train<&TrainConfig::diagnostics_every>(
        "diagnostics_every",
        {.name = "--diagnostics",
         .help = "every N steps (and at step 1), per layer into layer_log.csv: activation RMS, "
                 "attention entropy, gradient norms, router entropy, logit spread, expert "
                 "output RMS (0: none)",
         .hi = kSteps}),
};

}  // namespace

json train_config_to_json(const TrainConfig& c) {
  return write_keys(kTrainKeys, c);
}

std::vector<ConfigFlag> train_config_flags() {
  return flags_of(kTrainKeys, TrainConfig{});
}

void validate(const TrainConfig& c) {
  check_key_ranges(kTrainKeys, c, "train");
  check(checked_mul(c.batch, c.seq, "[train] batch × seq") <= limits::kTokens,
        "[train] batch × seq = {} × {} tokens is more than 2^32", c.batch, c.seq);
  // The micro-batches of the run (they number the dropout streams) and the tokens of one step:
  // each range allows more than a 64-bit count of the two together holds.
  checked_mul(c.steps, c.accumulate, "[train] steps × accumulate");
  checked_mul(c.batch * c.seq, c.accumulate, "[train] batch × seq × accumulate");
}

TrainConfig train_config_from_json(const json& j) {
  TrainConfig c;
  read_keys(kTrainKeys, c, j, "train");
  validate(c);
  return c;
}

json train_settings_as_written(const json& j) {
  TrainConfig c;
  read_keys(kTrainKeys, c, j, "train");
  return write_keys(kTrainKeys, c);
}

GivenModelKeys given_model_keys(const nlohmann::json& config) {
  const auto sets = [&](const char* key) { return config.is_object() && config.contains(key); };
  return {.causal = sets("causal"), .vocab = sets("vocab"), .positions = sets("positions")};
}

void set_objective_keys(LMConfig& model, Objective objective, GivenModelKeys given) {
  if (objective != Objective::masked) return;
  check(!given.causal || !model.causal,
        "[train] the masked objective predicts bytes from both sides: it trains a bidirectional "
        "model, not one with causal true");
  model.causal = false;
  if (!given.vocab) model.vocab = kMaskToken + 1;
  if (!given.positions) model.positions = PositionKind::rope;
}

Schedule schedule_of(const TrainConfig& c) {
  return {c.optimizer.lr, c.warmup, c.steps, c.min_lr_ratio, c.decay};
}

}  // namespace ffnlab
