// LMConfig validation, names and JSON.
#include "ffnlab/layers/lm_config.hpp"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "json_keys.hpp"

namespace ffnlab {

namespace {
// Every key of c in its row's range (defined below, with the key table).
void check_ranges(const LMConfig& c);
}  // namespace

void validate(const LMConfig& c) {
  check_range(c.vocab, 1, limits::kWidth, "lm", "vocab");
  check_range(c.d_model, 1, limits::kWidth, "lm", "d_model");
  check_ranges(c);
  check(c.d_model % c.heads == 0, "[lm] d_model = {} is not a multiple of heads = {}", c.d_model,
        c.heads);
  check(c.positions != PositionKind::rope || (c.d_model / c.heads) % 2 == 0,
        "[lm] rope needs an even head size, got {}", c.d_model / c.heads);
  check(std::isfinite(c.norm_eps) && c.norm_eps > 0.f, "[lm] norm_eps = {} must be positive",
        c.norm_eps);
  check(std::isfinite(c.rope_theta) && c.rope_theta > 0.f, "[lm] rope_theta = {} must be positive",
        c.rope_theta);
  check(c.ffn.d_model == c.d_model, "[lm] ffn d_model = {} differs from d_model = {}",
        c.ffn.d_model, c.d_model);
  validate(c.ffn);
  check(!(c.causal && c.ffn.kind == FFNKind::moe && looks_at_whole_sequence(c.ffn.moe.routing)),
        "[lm] {} routing looks at the whole sequence, so in a causal model the future would reach "
        "every position through it: make the model bidirectional (causal false) and train it "
        "on the masked objective (--objective masked; Python: objective=\"masked\")",
        enum_name(c.ffn.moe.routing));
}

LMConfig tutorial_encoder_config() {
  LMConfig c;
  c.vocab = 256;
  c.d_model = 512;
  c.layers = 6;
  c.heads = 8;
  c.context = 100;
  c.pre_norm = false;
  c.final_norm = false;
  c.causal = false;
  c.positions = PositionKind::sinusoidal;
  c.ffn = variant_config("relu", 512, 2048, true);
  return c;
}

namespace {

using json = nlohmann::json;

using Flag = KeyFlag;
constexpr std::array kLMKeys{
    field<LMConfig, &LMConfig::vocab>("vocab"),
    field<LMConfig, &LMConfig::d_model>("d_model"),  // its flag is the FFN's --d-model
    field<LMConfig, &LMConfig::layers>("layers", Flag{.name = "--layers",
                                                      .help = "Transformer blocks",
                                                      .lo = 1,
                                                      .hi = static_cast<double>(limits::kLayers)}),
    field<LMConfig, &LMConfig::heads>("heads", Flag{.name = "--heads",
                                                    .help = "attention heads",
                                                    .lo = 1,
                                                    .hi = static_cast<double>(limits::kWidth)}),
    field<LMConfig, &LMConfig::context>("context", Flag{.name = "--context",
                                                        .help = "longest sequence",
                                                        .lo = 1,
                                                        .hi = static_cast<double>(limits::kWidth)}),
    field<LMConfig, &LMConfig::positions>(
        "positions",
        Flag{.name = "--positions", .help = "{names} (default with --objective masked: rope)"}),
    field<LMConfig, &LMConfig::rope_theta>("rope_theta"),
    field<LMConfig, &LMConfig::norm>("norm", Flag{.name = "--norm", .help = "{names or}"}),
    field<LMConfig, &LMConfig::norm_eps>("norm_eps"),
    field<LMConfig, &LMConfig::pre_norm>(
        "pre_norm", Flag{.name = "--post-norm",
                         .help = "norm after each residual add (default: pre-norm)",
                         .negated = true}),
    field<LMConfig, &LMConfig::final_norm>(
        "final_norm",
        Flag{.name = "--no-final-norm", .help = "no norm before the LM head", .negated = true}),
    field<LMConfig, &LMConfig::tied_head>(
        "tied_head", Flag{.name = "--untied",
                          .help = "an LM head of its own (default: tied to the embedding)",
                          .negated = true}),
    field<LMConfig, &LMConfig::attn_bias>(
        "attn_bias",
        Flag{.name = "--no-attn-bias", .help = "no biases in q/k/v/o", .negated = true}),
    field<LMConfig, &LMConfig::causal>("causal"),  // set by the training objective
    field<LMConfig, &LMConfig::dropout>("dropout",
                                        Flag{.name = "--dropout",
                                             .help = "dropout on embeddings and residual branches",
                                             .lo = 0,
                                             .hi = 1,
                                             .hi_open = true}),
    field<LMConfig, &LMConfig::init_std>(
        "init_std", Flag{.name = "--init-std",
                         .help = "matrices N(0, s), biases 0 (GPT-2); 0: torch.nn defaults",
                         .lo = 0,
                         .hi = 1e3}),
    // Read after d_model (table order): an FFN that does not name its d_model takes the
    // model's, and one without d_ff the variant's default width at it (ffnlab train's).
    JsonKey<LMConfig>{"ffn", [](LMConfig& c, const json& j) { c.ffn = ffn_in_model(j, c.d_model); },
                      [](const LMConfig& c) { return config_to_json(c.ffn); }},
};

void check_ranges(const LMConfig& c) {
  check_key_ranges(kLMKeys, c, "lm");
}

}  // namespace

FFNConfig ffn_in_model(const json& ffn, std::int64_t d_model) {
  json f = ffn;
  const bool width = f.is_object() && !f.contains("d_ff");
  if (f.is_object() && !f.contains("d_model")) f["d_model"] = d_model;
  FFNConfig c = config_from_json(f);
  if (width) c.d_ff = default_d_ff(c);
  return c;
}

LMConfig lm_config_from_json(const nlohmann::json& j) {
  LMConfig c;
  read_keys(kLMKeys, c, j, "lm");
  if (j.is_object() && !j.contains("ffn"))  // ffnlab train's default: ReLU, 4·d_model
    c.ffn = variant_config("relu", c.d_model, 4 * c.d_model, true);
  validate(c);
  return c;
}

nlohmann::json lm_config_to_json(const LMConfig& c) {
  return write_keys(kLMKeys, c);
}

std::vector<ConfigFlag> lm_config_flags() {
  return flags_of(kLMKeys, LMConfig{});
}

}  // namespace ffnlab
