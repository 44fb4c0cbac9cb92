// The training settings: their checks and their JSON form (docs/config.md).
#include <cmath>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/trainer.hpp"
#include "json_keys.hpp"

namespace ffnlab {

using json = nlohmann::json;

void validate(const TrainConfig& c) {
  check_range(c.steps, 0, limits::kSteps, "train", "steps");
  check_range(c.batch, 1, limits::kTokens, "train", "batch");
  check_range(c.seq, 1, limits::kWidth, "train", "seq");
  check_range(c.accumulate, 1, limits::kTokens, "train", "accumulate");
  check(checked_mul(c.batch, c.seq, "[train] batch × seq") <= limits::kTokens,
        "[train] batch × seq = {} × {} tokens is more than 2^32", c.batch, c.seq);
  check_range(c.warmup, 0, limits::kSteps, "train", "warmup");
  check_range(c.eval_every, 0, limits::kSteps, "train", "eval_every");
  check_range(c.eval_tokens, 0, limits::kSteps, "train", "eval_tokens");
  check_range(c.checkpoint_every, 0, limits::kSteps, "train", "checkpoint_every");
  check_range(c.diagnostics_every, 0, limits::kSteps, "train", "diagnostics_every");
  check(c.min_lr_ratio >= 0.f && c.min_lr_ratio <= 1.f,
        "[train] min_lr_ratio = {} must be in [0, 1]", c.min_lr_ratio);
  check(std::isfinite(c.clip) && c.clip >= 0.f, "[train] clip = {} must be >= 0", c.clip);
  const OptimizerConfig& o = c.optimizer;
  check(std::isfinite(o.lr) && o.lr >= 0.f, "[train] lr = {} must be >= 0", o.lr);
  check(std::isfinite(o.eps) && o.eps > 0.f, "[train] eps = {} must be positive", o.eps);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.f,
        "[train] weight_decay = {} must be >= 0", o.weight_decay);
  check(o.beta1 >= 0.f && o.beta1 < 1.f && o.beta2 >= 0.f && o.beta2 < 1.f,
        "[train] beta1 = {} and beta2 = {} must be in [0, 1)", o.beta1, o.beta2);
  check(std::isfinite(c.mask_fraction) && c.mask_fraction > 0.f && c.mask_fraction <= 1.f,
        "[train] mask_fraction = {} must be in (0, 1]", c.mask_fraction);
  check(o.momentum >= 0.f && o.momentum < 1.f, "[train] momentum = {} must be in [0, 1)",
        o.momentum);
}

namespace {

// The optimizer's fields sit inside TrainConfig::optimizer; in JSON they are top-level keys.
template <auto Member>
constexpr JsonKey<TrainConfig> optimizer_field(const char* name) {
  return {name,
          [](TrainConfig& c, const json& j) {
            auto& f = c.optimizer.*Member;
            f = json_value<std::remove_cvref_t<decltype(f)>>(j);
          },
          [](const TrainConfig& c) { return json_of(c.optimizer.*Member); }};
}

constexpr std::array kTrainKeys{
    field<TrainConfig, &TrainConfig::steps>("steps"),
    field<TrainConfig, &TrainConfig::batch>("batch"),
    field<TrainConfig, &TrainConfig::seq>("seq"),
    field<TrainConfig, &TrainConfig::accumulate>("accumulate"),
    optimizer_field<&OptimizerConfig::kind>("optimizer"),
    optimizer_field<&OptimizerConfig::lr>("lr"),
    optimizer_field<&OptimizerConfig::beta1>("beta1"),
    optimizer_field<&OptimizerConfig::beta2>("beta2"),
    optimizer_field<&OptimizerConfig::eps>("eps"),
    optimizer_field<&OptimizerConfig::weight_decay>("weight_decay"),
    optimizer_field<&OptimizerConfig::momentum>("momentum"),
    field<TrainConfig, &TrainConfig::warmup>("warmup"),
    field<TrainConfig, &TrainConfig::min_lr_ratio>("min_lr_ratio"),
    field<TrainConfig, &TrainConfig::decay>("decay"),
    field<TrainConfig, &TrainConfig::clip>("clip"),
    field<TrainConfig, &TrainConfig::seed>("seed"),
    field<TrainConfig, &TrainConfig::precision>("precision"),
    field<TrainConfig, &TrainConfig::eval_every>("eval_every"),
    field<TrainConfig, &TrainConfig::eval_tokens>("eval_tokens"),
    field<TrainConfig, &TrainConfig::checkpoint_every>("checkpoint_every"),
    field<TrainConfig, &TrainConfig::diagnostics_every>("diagnostics_every"),
    field<TrainConfig, &TrainConfig::objective>("objective"),
    field<TrainConfig, &TrainConfig::mask_fraction>("mask_fraction"),
};

}  // namespace

json train_config_to_json(const TrainConfig& c) {
  return write_keys(kTrainKeys, c);
}

TrainConfig train_config_from_json(const json& j) {
  TrainConfig c;
  read_keys(kTrainKeys, c, j, "train");
  validate(c);
  return c;
}

}  // namespace ffnlab
